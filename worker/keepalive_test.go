package worker

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// slowGate is the open gate whose first admission waits, as one on a
// learned rate's grid or a fleet's share can.
type slowGate struct {
	throttle.OpenGate
	wait   time.Duration
	admits atomic.Int32
}

func (g *slowGate) Admit(ctx context.Context, domain, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if g.admits.Add(1) == 1 {
		select {
		case <-time.After(g.wait):
		case <-ctx.Done():
		}
	}
	return g.OpenGate.Admit(ctx, domain, tenant, source)
}

// TestAdmissionWaitKeptAlive: an admission wait longer than the ack wait
// (2 s here) keeps the envelope with its worker. Without a heartbeat
// during the wait, the server handed it to the other worker, which was
// admitted and sent it, and the two attempts of one step ran at once.
func TestAdmissionWaitKeptAlive(t *testing.T) {
	e := newEnv(t, nil)
	gate := &slowGate{wait: 6 * time.Second}
	e.startPool(func(c *Config) {
		c.Gate, c.Workers, c.ProgressEvery = gate, 2, 300*time.Millisecond
	})
	id := e.submit("bob@example.test")
	e.waitEvent(id, queue.EventDelivered)
	if n := gate.admits.Load(); n != 1 {
		t.Fatalf("%d admissions for one envelope's one attempt; it was handed out again during the wait", n)
	}
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("%d messages at the MX, want 1", n)
	}
}

// TestKeepAliveFollowsTheConsumersAckWait: the keep-alive follows the ack
// wait of the consumer that handed the envelope out (2 s here), not the
// process's own, a longer one (ProgressEvery 10 s: an ack wait of 40 s),
// as a daemon of the fleet started with a shorter --ack-wait sets it for
// every process. Before, the first keep-alive came after 10 s, the server
// handed the envelope to the other worker after 2 s, and both were
// admitted to send it.
func TestKeepAliveFollowsTheConsumersAckWait(t *testing.T) {
	e := newEnv(t, nil)
	gate := &slowGate{wait: 6 * time.Second}
	e.startPool(func(c *Config) {
		c.Gate, c.Workers, c.ProgressEvery = gate, 2, 10*time.Second
	})
	id := e.submit("bob@example.test")
	e.waitEvent(id, queue.EventDelivered)
	if n := gate.admits.Load(); n != 1 {
		t.Fatalf("%d admissions for one envelope's one attempt; it was handed out again during the wait", n)
	}
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("%d messages at the MX, want 1", n)
	}
}
