package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outflow/outflow/coordinator"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// panickySender panics on its first panics calls, then delegates.
type panickySender struct {
	Sender
	panics   atomic.Int32
	panicked chan struct{} // closed at the first panic
}

func newPanickySender(s Sender, n int32) *panickySender {
	p := &panickySender{Sender: s, panicked: make(chan struct{})}
	p.panics.Store(n)
	return p
}

func (p *panickySender) Send(ctx context.Context, m *sender.Message) sender.Result {
	if left := p.panics.Add(-1); left >= 0 {
		if left == 0 {
			close(p.panicked)
		}
		panic("sender bug")
	}
	return p.Sender.Send(ctx, m)
}

// waitFor polls cond every 10 ms until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// newThrottle starts a coordinator on e's buckets with defaults as the
// configured limits of every destination.
func newThrottle(t *testing.T, e *env, defaults coordinator.Limits) *coordinator.Throttle {
	t.Helper()
	th, err := coordinator.NewThrottle(context.Background(), coordinator.ThrottleConfig{WorkerID: "w-test",
		State: e.q.DestKV(), Registry: e.q.WorkersKV(), Defaults: defaults})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close() })
	return th
}

// TestPanickingSendIsRedelivered: a sender that panics must neither keep
// the envelope's ack alive for ever (it would never be handed out again)
// nor keep the destination's in-flight slot (with a connection limit of
// one, the destination would refuse every later attempt).
func TestPanickingSendIsRedelivered(t *testing.T) {
	e := newEnv(t, nil)
	th := newThrottle(t, e, coordinator.Limits{Conns: 1})
	snd := newPanickySender(e.snd, 1)
	e.startPool(func(c *Config) {
		c.Sender, c.Gate = snd, th
		// A heartbeat left running would reset the 2 s ack wait many
		// times over.
		c.ProgressEvery = 50 * time.Millisecond
	})
	defer e.stopPool()
	id := e.submit("r@dest.test")
	select {
	case <-snd.panicked:
	case <-time.After(30 * time.Second):
		t.Fatal("the sender was never called")
	}
	e.waitEvent(id, queue.EventDelivered)
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("%d messages delivered, want 1", n)
	}
	waitFor(t, 10*time.Second, "in-flight count back to zero", func() bool {
		return th.Snapshot("dest.test").InFlight == 0
	})
	if st := th.Snapshot("dest.test"); st.Breaker != "closed" {
		t.Fatalf("breaker %s after a panic, want closed (a panic is no signal from the destination)", st.Breaker)
	}
}
