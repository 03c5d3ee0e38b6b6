package bounce

import (
	"strings"
	"testing"

	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/queue"
)

// TestOriginalRecipientInXText: an asynchronous bounce from an MTA that
// copies the ORCPT parameter's xtext into Original-Recipient
// ("ann+2Bnews@..." for "ann+news@..."), with a Final-Recipient the
// envelope was not delivered to (the mailbox it forwarded to), names the
// recipient ann+news@: its bounced event is recorded. An Original-Recipient
// that names a delivered recipient as written is taken as written, before
// its decoding.
func TestOriginalRecipientInXText(t *testing.T) {
	for _, c := range []struct {
		name      string
		delivered []string
		original  string
		want      string
	}{
		{"xtext", []string{"ann+news@dest.example", "carl@dest.example"}, "ann+2Bnews@dest.example", "ann+news@dest.example"},
		{"decoded", []string{"ann+news@dest.example", "carl@dest.example"}, "ann+news@dest.example", "ann+news@dest.example"},
		{"as written first", []string{"a+b@dest.example", "a+2Bb@dest.example"}, "a+2Bb@dest.example", "a+2bb@dest.example"},
	} {
		t.Run(c.name, func(t *testing.T) {
			l := startListener(t, nil)
			l.addEnvelope("env3", c.delivered...)
			msg := failureDSN(t, dsn.Recipient{Final: "ann@mbox.internal.example", Original: c.original, OriginalType: "rfc822",
				Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 user unknown"})
			if line := "\r\nOriginal-Recipient: rfc822;" + c.original + "\r\n"; !strings.Contains(string(msg), line) {
				t.Fatalf("report lacks %q:\n%s", line, msg)
			}
			if err := l.send(t, []string{l.returnPath("env3")}, msg); err != nil {
				t.Fatalf("answered %v", err)
			}
			evs := l.store.events()
			if len(evs) != 1 || evs[0].Type != queue.EventBounced || evs[0].ID != "env3" || len(evs[0].Recipients) != 1 || evs[0].Recipients[0] != c.want {
				t.Fatalf("events %+v, want one bounce of %s", evs, c.want)
			}
		})
	}
}
