package bounce

import (
	"strings"
	"testing"

	"github.com/outflow/outflow/queue"
)

// A report whose status part is one recipient block with its diagnostic
// folded over 240 KiB of short lines, the shape that made reading a report
// quadratic, is read and recorded: the bounce on its recipient, with the
// diagnostic's start (its code) as the reason, cut to the 8 KiB a field
// keeps.
func TestFoldedReportRecorded(t *testing.T) {
	l := startListener(t, nil)
	msg := []byte("From: MAILER-DAEMON@mx.dest.example\r\nMIME-Version: 1.0\r\n" +
		"Content-Type: multipart/report; report-type=delivery-status; boundary=\"b\"\r\n\r\n" +
		"--b\r\nContent-Type: text/plain\r\n\r\nIt failed.\r\n" +
		"--b\r\nContent-Type: message/delivery-status\r\n\r\n" +
		"Reporting-MTA: dns; mx.dest.example\r\n\r\n" +
		"Final-Recipient: rfc822; bob@dest.example\r\nAction: failed\r\nStatus: 5.1.1\r\n" +
		"Diagnostic-Code: smtp; 550 5.1.1 user unknown" + strings.Repeat("\r\n a", 60<<10) + "\r\n" +
		"--b--\r\n")
	if err := l.send(t, []string{l.returnPath("env1")}, msg); err != nil {
		t.Fatalf("answered %v", err)
	}
	evs := l.store.events()
	if len(evs) != 1 || evs[0].Type != queue.EventBounced || len(evs[0].Recipients) != 1 || evs[0].Recipients[0] != "bob@dest.example" {
		t.Fatalf("events %+v", evs)
	}
	if r := evs[0].Reason; !strings.HasPrefix(r, "550 5.1.1 user unknown a a") || len(r) > 8<<10 {
		t.Fatalf("reason of %d bytes: %q…", len(r), r[:min(len(r), 40)])
	}
	if sup := l.sup.entries(); len(sup) != 1 || sup[0].Address != "bob@dest.example" {
		t.Fatalf("suppressions %+v", sup)
	}
}
