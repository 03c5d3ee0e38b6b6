package worker

import (
	"context"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// TestRetryNeverAfterTheMessagesEnd: a server's hint of an hour, or a
// suspension of an hour, does not keep a message past its end: its next
// attempt (or pickup) comes at the end, where it expires with its notice.
// Scheduled at the hint or the suspension's end, the message stayed
// deferred that long past the Will-Retry-Until its delay notice gave.
func TestRetryNeverAfterTheMessagesEnd(t *testing.T) {
	t.Run("a server's hint past max-age", func(t *testing.T) {
		e := newEnv(t, func(stage fakemx.Stage, _ string) *smtp.SMTPError {
			if stage == fakemx.StageRcpt {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "mailbox busy, try again in 1 hour"}
			}
			return nil
		})
		e.startPool(func(c *Config) { c.Budget = backoff.Budget{MaxAttempts: 10, MaxAge: 1500 * time.Millisecond} })
		id := e.submit("bob@dest.test")
		start := time.Now()
		e.waitEvent(id, queue.EventExpired)
		if took := time.Since(start); took > 25*time.Second {
			t.Fatalf("expired after %v", took)
		}
	})
	t.Run("a suspension past the deadline", func(t *testing.T) {
		e := newEnv(t, nil)
		acc := testqueue.Connect(t, e.emb, queue.Options{DeadlineAfter: 1500 * time.Millisecond})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		ids, err := acc.Enqueue(ctx, &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"bob@blocks.test"},
			Body: []byte("Subject: hi\r\n\r\nhello\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		e.startPool(func(c *Config) { c.Gate = suspendedGate{} }) // refuses for an hour
		e.waitEvent(ids[0], queue.EventExpired)
		if n := len(e.mx.Messages()); n != 0 {
			t.Fatalf("%d messages delivered", n)
		}
	})
}
