package worker

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
)

// chanSuppressor hands every Add to a channel.
type chanSuppressor chan queue.Suppression

func (c chanSuppressor) AddFirst(_ context.Context, s queue.Suppression) (bool, error) {
	c <- s
	return true, nil
}

func (c chanSuppressor) Suppressed(context.Context, string, string) (*queue.Suppression, error) {
	return nil, nil
}

func TestRecipientHardBounceIsSuppressed(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		if stage == fakemx.StageDot {
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "message refused by policy"}
		}
		return nil
	})
	sup := make(chanSuppressor, 8)
	e.startPool(func(c *Config) { c.Suppressions = sup })
	id := e.submit("gone@dest.test", "ok@dest.test")
	e.waitEvent(id, queue.EventBounced)
	select {
	case s := <-sup:
		if s.Tenant != "t1" || s.Address != "gone@dest.test" || s.Source != queue.SuppressBounce || !strings.Contains(s.Reason, "no such user") {
			t.Fatalf("suppression %+v", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the hard bounce was not suppressed")
	}
	// ok@ was refused too, at DATA, for the message's content: that says
	// nothing about the address, so it is not suppressed. Both bounces are
	// recorded before the envelope ends, so by then every Add has run.
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.q.Find(context.Background(), id); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("envelope not finished")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case s := <-sup:
		t.Fatalf("message-scope bounce suppressed %+v", s)
	default:
	}
}

// TestBlockedAtRcptIsNotSuppressed: a destination that refuses our sending
// address at RCPT (a blocklist listing, 554 5.7.1, which the catch-all rule
// scopes to the recipient) bounces the recipient but does not put it on
// the list: the address is fine, and suppressing on such replies struck
// whole destinations off a tenant's list for good.
func TestBlockedAtRcptIsNotSuppressed(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt {
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Service unavailable; Client host [127.0.0.1] blocked using zen.spamhaus.org"}
		}
		return nil
	})
	sup := make(chanSuppressor, 8)
	e.startPool(func(c *Config) { c.Suppressions = sup })
	id := e.submit("bob@dest.test")
	e.waitEvent(id, queue.EventBounced)
	select {
	case s := <-sup:
		t.Fatalf("a blocklist refusal suppressed %+v", s)
	default:
	}
}
