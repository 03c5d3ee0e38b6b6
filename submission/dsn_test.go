package submission

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/queue"
)

// TestDSNParameters: DSN is advertised; RET, ENVID, NOTIFY and ORCPT are
// stored with the submission (xtext decoded), recipients without them have
// no entry, and an ENVID past RFC 3461's bound is refused with 501 5.5.4.
func TestDSNParameters(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	c := ts.dial(t)
	if ok, _ := c.Extension("DSN"); !ok {
		t.Fatal("DSN not advertised")
	}
	if err := c.Auth(sasl.NewPlainClient("", testUser, testPassword)); err != nil {
		t.Fatal(err)
	}

	var se *smtp.SMTPError
	if err := c.Mail("app@example.com", &smtp.MailOptions{EnvelopeID: strings.Repeat("x", 101)}); !errors.As(err, &se) ||
		se.Code != 501 || se.EnhancedCode != (smtp.EnhancedCode{5, 5, 4}) {
		t.Fatalf("MAIL with a 101-character ENVID: %v", err)
	}
	if err := c.Mail("app@example.com", &smtp.MailOptions{Return: smtp.DSNReturnFull, EnvelopeID: "env+1 x"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("a@example.org", &smtp.RcptOptions{Notify: []smtp.DSNNotify{smtp.DSNNotifySuccess, smtp.DSNNotifyFailure},
		OriginalRecipientType: smtp.DSNAddressTypeRFC822, OriginalRecipient: "Orig+A@example.org"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("b@example.org", &smtp.RcptOptions{Notify: []smtp.DSNNotify{smtp.DSNNotifyNever}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("c@example.org", nil); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(testMessage)); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	subs := q.got()
	if len(subs) != 1 {
		t.Fatalf("%d submissions", len(subs))
	}
	s := subs[0]
	want := &queue.DSNParams{Ret: "FULL", EnvID: "env+1 x", Rcpts: map[string]queue.RcptDSN{
		"a@example.org": {Notify: []string{"SUCCESS", "FAILURE"}, ORcpt: "Orig+A@example.org"},
		"b@example.org": {Notify: []string{"NEVER"}},
	}}
	if s.Source != queue.SourceSMTP || !reflect.DeepEqual(s.DSN, want) {
		t.Fatalf("source %q dsn %+v, want %+v", s.Source, s.DSN, want)
	}

	// The next transaction starts without the last one's parameters.
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("a@example.org", nil); err != nil {
		t.Fatal(err)
	}
	w, _ = c.Data()
	_, _ = w.Write([]byte(testMessage))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if subs := q.got(); len(subs) != 2 || subs[1].DSN != nil {
		t.Fatalf("second submission carries DSN parameters: %+v", subs[len(subs)-1].DSN)
	}
}
