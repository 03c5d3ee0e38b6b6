package worker

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// skewedBy is a wall clock off by d from this machine's (and the NATS
// server's, which runs in this process).
func skewedBy(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// TestFastClockDoesNotExpireOthersMail: a worker whose clock is 30 days
// ahead (past the 5-day max-age the accepting process stamped) delivers the
// message instead of sending it to dead letters as expired.
func TestFastClockDoesNotExpireOthersMail(t *testing.T) {
	e := newEnv(t, nil)
	e.startPool(func(c *Config) {
		c.Now = skewedBy(30 * 24 * time.Hour)
		c.Budget = backoff.Budget{MaxAttempts: 4, MaxAge: 5 * 24 * time.Hour}
	})
	id := e.submit("r@dest.test")
	evs := e.waitEvent(id, queue.EventDelivered)
	for _, ev := range evs {
		if ev.Type == queue.EventExpired || ev.Type == queue.EventDead {
			t.Fatalf("events %v: the fast clock expired the message", e.events(id))
		}
	}
}

// TestSlowClockStillExpires: a message whose deadline had passed when the
// server stored it expires on a worker whose clock is 30 days behind.
func TestSlowClockStillExpires(t *testing.T) {
	e := newEnv(t, nil)
	// The accepting process gives its messages a max-age of 1 ns: the
	// deadline has passed by the time the server stores the envelope.
	acc := testqueue.Connect(t, e.emb, queue.Options{DeadlineAfter: time.Nanosecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := acc.Enqueue(ctx, &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"r@dest.test"},
		Body: []byte("Subject: hi\r\n\r\nhello\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.startPool(func(c *Config) { c.Now = skewedBy(-30 * 24 * time.Hour) })
	e.waitEvent(ids[0], queue.EventExpired)
	if n := len(e.mx.Messages()); n != 0 {
		t.Fatalf("the slow clock delivered %d expired messages", n)
	}
}

// attemptTimes is a fakemx hook that answers the first RCPT with a 451
// and records when each RCPT arrived.
type attemptTimes struct {
	mu sync.Mutex
	at []time.Time
	n  atomic.Int32
}

func (a *attemptTimes) hook(stage fakemx.Stage, _ string) *smtp.SMTPError {
	if stage != fakemx.StageRcpt {
		return nil
	}
	a.mu.Lock()
	a.at = append(a.at, time.Now())
	a.mu.Unlock()
	if a.n.Add(1) == 1 {
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
	}
	return nil
}

func (a *attemptTimes) times() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.at)
}

// skewedGate is a throttle whose clock is off by skew; it measures the
// difference from its registry heartbeat.
func skewedGate(t *testing.T, e *env, skew time.Duration) *throttle.Throttle {
	t.Helper()
	c := throttleConfig(t, e)
	c.Now = skewedBy(skew)
	th, err := throttle.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close() })
	if off, known := th.ClockOffset(); !known || (off+skew).Abs() > time.Second {
		t.Fatalf("measured offset %v (known %v), want about %v", off, known, -skew)
	}
	return th
}

// TestFastClockSchedulesOnTheServersClock: a worker an hour ahead defers
// a message by its backoff (tens of milliseconds), not by an hour more:
// the retry fires, on the server's clock, when the backoff says.
func TestFastClockSchedulesOnTheServersClock(t *testing.T) {
	var at attemptTimes
	e := newEnv(t, at.hook)
	gate := skewedGate(t, e, time.Hour)
	e.startPool(func(c *Config) { c.Now, c.Gate = skewedBy(time.Hour), gate })
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	if got := strings.Join(e.events(id), ","); got != "queued,deferred,delivered" {
		t.Fatalf("events = %s", got)
	}
}

// TestSlowClockSchedulesOnTheServersClock: a worker an hour behind does not
// retry at once; the retry waits its backoff (2 s here) on the server's
// clock.
func TestSlowClockSchedulesOnTheServersClock(t *testing.T) {
	const delay = 2 * time.Second
	var at attemptTimes
	e := newEnv(t, at.hook)
	gate := skewedGate(t, e, -time.Hour)
	e.startPool(func(c *Config) {
		c.Now, c.Gate = skewedBy(-time.Hour), gate
		c.Retry = backoff.Backoff{Lane: backoff.LaneRetry, Base: delay, Min: delay, Cap: delay, Multiplier: 2}
	})
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	ts := at.times()
	if len(ts) != 2 {
		t.Fatalf("%d attempts, want 2", len(ts))
	}
	if gap := ts[1].Sub(ts[0]); gap < delay-200*time.Millisecond {
		t.Fatalf("retried %v after the first attempt, want the %v backoff", gap, delay)
	}
}

// TestBoundByStored: the clock max-age decisions use stays within
// [stored, stored+clockTolerance].
func TestBoundByStored(t *testing.T) {
	stored := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct{ now, want time.Time }{
		{stored.Add(time.Second), stored.Add(time.Second)},
		{stored.Add(-time.Hour), stored},
		{stored.Add(30 * 24 * time.Hour), stored.Add(clockTolerance)},
	} {
		if got := boundByStored(c.now, stored); !got.Equal(c.want) {
			t.Errorf("boundByStored(%v) = %v, want %v", c.now, got, c.want)
		}
	}
	if now := stored.Add(time.Hour); !boundByStored(now, time.Time{}).Equal(now) {
		t.Error("a zero stored time changed now")
	}
}
