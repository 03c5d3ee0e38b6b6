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

// TestDSNChecks: the one check of DSN parameters, shared with the HTTP API
// and `outflow submit`, stores what the listener stores and names each
// fault.
func TestDSNChecks(t *testing.T) {
	d, err := MessageDSN("full", "e1")
	if err != nil || d.Ret != "FULL" || d.EnvID != "e1" {
		t.Fatalf("MessageDSN(full, e1) = %+v, %v", d, err)
	}
	if d, err := MessageDSN("", ""); d != nil || err != nil {
		t.Fatalf("no parameters: %+v, %v", d, err)
	}
	for _, c := range []struct{ ret, envID string }{{"ALL", ""}, {"", strings.Repeat("x", 101)}, {"", "a\x01b"}} {
		if _, err := MessageDSN(c.ret, c.envID); err == nil || err.Code != 501 {
			t.Errorf("MessageDSN(%q, %q) accepted", c.ret, c.envID)
		}
	}
	p, ok, err := RecipientDSN([]string{"success", "Delay"}, "RFC822", "Orig@example.org")
	if err != nil || !ok || !reflect.DeepEqual(p, queue.RcptDSN{Notify: []string{"SUCCESS", "DELAY"}, ORcpt: "Orig@example.org"}) {
		t.Fatalf("RecipientDSN = %+v %v %v", p, ok, err)
	}
	if _, ok, err := RecipientDSN(nil, "", ""); ok || err != nil {
		t.Fatal("no parameters must give none")
	}
	for _, c := range []struct {
		notify      []string
		typ, orcpt  string
		wantMessage string
	}{
		{[]string{"NEVER", "FAILURE"}, "", "", errNotifyNever.Message},
		{[]string{"SOMETIMES"}, "", "", errNotifyValue.Message},
		{[]string{"FAILURE", "failure"}, "", "", errNotifyTwice.Message},
		{nil, "rfc 822", "a@b", errORcptForm.Message},
		{nil, "rfc822", strings.Repeat("a", 501), errORcptTooLong.Message},
	} {
		if _, _, err := RecipientDSN(c.notify, c.typ, c.orcpt); err == nil || err.Message != c.wantMessage {
			t.Errorf("RecipientDSN(%v, %q, %q) = %v, want %q", c.notify, c.typ, c.orcpt, err, c.wantMessage)
		}
	}
	if typ, addr, err := ParseORcpt("rfc822;a@b"); err != nil || typ != "rfc822" || addr != "a@b" {
		t.Fatalf("ParseORcpt = %q %q %v", typ, addr, err)
	}
	if _, _, err := ParseORcpt("a@b"); err == nil {
		t.Fatal("ParseORcpt without a type accepted")
	}
}
