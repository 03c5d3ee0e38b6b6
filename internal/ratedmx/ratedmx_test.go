package ratedmx

import (
	"errors"
	"strings"
	"testing"

	"github.com/emersion/go-smtp"
)

// send delivers one message to rcpt and returns the RCPT reply's error.
func send(t *testing.T, addr, rcpt string) error {
	t.Helper()
	c, err := smtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail("a@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt(rcpt, nil); err != nil {
		return err
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("Subject: x\r\n\r\nx\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return c.Quit()
}

// Only the recipients Limited picks meet the limit; the rest pass and are
// not counted as arrivals.
func TestLimitedPicksRecipients(t *testing.T) {
	p := Start(t, Options{Rate: 0.001, Burst: 1, Limited: func(rcpt string) bool { return strings.HasSuffix(rcpt, "@limited.test") }})
	for range 3 {
		if err := send(t, p.Addr(), "r@free.test"); err != nil {
			t.Fatalf("an unlimited recipient: %v", err)
		}
	}
	if err := send(t, p.Addr(), "r@limited.test"); err != nil {
		t.Fatalf("the first limited recipient (the burst): %v", err)
	}
	var se *smtp.SMTPError
	if err := send(t, p.Addr(), "r@limited.test"); !errors.As(err, &se) || se.Code != 421 {
		t.Fatalf("the second limited recipient: %v, want 421", err)
	}
	if n := len(p.Arrivals()); n != 1 {
		t.Errorf("%d arrivals, want the 1 limited recipient accepted", n)
	}
	if n := len(p.Throttles()); n != 1 {
		t.Errorf("%d throttles, want 1", n)
	}
	if n := len(p.Messages()); n != 4 {
		t.Errorf("%d messages at the server, want 4", n)
	}
}

// SetLimit replaces the burst too: the tokens of the old one are gone.
func TestSetLimitReplacesTheBurst(t *testing.T) {
	p := Start(t, Options{Rate: 1000})
	p.SetLimit(0.001, 1)
	if err := send(t, p.Addr(), "r@x.test"); err != nil {
		t.Fatalf("the first message (a burst of one): %v", err)
	}
	var se *smtp.SMTPError
	if err := send(t, p.Addr(), "r@x.test"); !errors.As(err, &se) || se.Code != 421 {
		t.Fatalf("the second message: %v, want 421: the burst of the old rate (200) is still there", err)
	}
}
