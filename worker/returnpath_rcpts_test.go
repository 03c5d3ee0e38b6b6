package worker

import (
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// An envelope of several recipients goes out with its own sender, not the
// return path: a return path names one envelope, and shared by two
// recipients it would let either mail a report naming the other. Such an
// envelope comes from an intake that did not split the message per
// recipient, or from before the tenant had a return path. An envelope of
// one recipient still gets its return path.
func TestReturnPathOnlyForOneRecipient(t *testing.T) {
	e := newEnv(t, nil)
	e.startPool(func(c *Config) { c.ReturnPath = prefixReturnPath{} })
	shared := e.submit("a@dest.test", "b@dest.test")
	single := e.submit("c@dest.test")
	if err := e.mx.WaitForMessages(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, m := range e.mx.Messages() {
		want := "app@src.test"
		if len(m.Rcpts) == 1 {
			want = "b." + single + "@rp.test"
		}
		if m.From != want {
			t.Errorf("MAIL FROM %q for %v, want %q (envelopes %s and %s)", m.From, m.Rcpts, want, shared, single)
		}
	}
}

// An envelope left with one recipient after an attempt that had two (the
// other delivered since) keeps its own sender: the other's delivered
// event is the same envelope's, and a report to a return path written now
// could name it. Attempt 1 defers both (451 at the dot), attempt 2
// delivers a and defers b, attempt 3 takes b alone.
func TestReturnPathNotAfterSeveralRecipients(t *testing.T) {
	var mu sync.Mutex
	dots, rcptB := 0, 0
	hook := func(st fakemx.Stage, arg string) *smtp.SMTPError {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case st == fakemx.StageDot:
			if dots++; dots == 1 {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
			}
		case st == fakemx.StageRcpt && arg == "b@dest.test":
			if rcptB++; rcptB == 2 {
				return &smtp.SMTPError{Code: 450, EnhancedCode: smtp.EnhancedCode{4, 2, 0}, Message: "mailbox busy"}
			}
		}
		return nil
	}
	e := newEnv(t, hook)
	e.startPool(func(c *Config) { c.ReturnPath = prefixReturnPath{} })
	id := e.submit("a@dest.test", "b@dest.test")
	if err := e.mx.WaitForMessages(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	msgs := e.mx.Messages()
	if len(msgs) != 2 || len(msgs[0].Rcpts) != 1 || msgs[0].Rcpts[0] != "a@dest.test" || len(msgs[1].Rcpts) != 1 || msgs[1].Rcpts[0] != "b@dest.test" {
		t.Fatalf("messages at the MX: %+v", msgs)
	}
	for _, m := range msgs {
		if m.From != "app@src.test" {
			t.Errorf("MAIL FROM %q for %v of envelope %s, want its own sender", m.From, m.Rcpts, id)
		}
	}
}
