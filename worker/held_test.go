package worker

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// heldSender stands for a destination whose MX addresses all failed to
// connect lately: its first Send dials nothing and says so
// (sender.Result.HeldUntil); the next ones go to the fake MX.
type heldSender struct {
	next  Sender
	until time.Time

	mu    sync.Mutex
	sends []time.Time
}

func (s *heldSender) Send(ctx context.Context, m *sender.Message) sender.Result {
	s.mu.Lock()
	s.sends = append(s.sends, time.Now())
	n := len(s.sends)
	s.mu.Unlock()
	if n > 1 {
		return s.next.Send(ctx, m)
	}
	res := sender.Result{HeldUntil: s.until}
	for _, r := range m.Rcpts {
		res.Rcpts = append(res.Rcpts, sender.RcptResult{Rcpt: r, Outcome: classify.Input{Stage: classify.StageConnect, Event: classify.EventTimeout,
			Text: "outflow (synthetic, no server reply): MX host mx.held.test: not connecting, every address is held after a recent connection failure"}})
	}
	return res
}

// TestHeldAddressesSpendNoAttempt: an attempt that dialled nothing, every
// address held, is deferred untried until the first hold ends: the
// message is delivered at its first attempt afterwards, with no deferred
// event, and the throttle still heard the connect failure (its breaker
// counts it). Retried as an attempt, a replay of dead letters with a small
// max-attempts spent its budget inside one hold and went back to dead
// letters without a dial.
func TestHeldAddressesSpendNoAttempt(t *testing.T) {
	e := newEnv(t, nil)
	snd := &heldSender{next: e.snd, until: time.Now().Add(1500 * time.Millisecond)}
	gate := &doneGate{done: map[string][][]classify.Result{}}
	e.startPool(func(c *Config) { c.Workers, c.Sender, c.Gate = 1, snd, gate })
	id := e.submit("bob@held.test")
	e.waitEvent(id, queue.EventDelivered)

	evs, _ := e.q.History(context.Background(), id, time.Time{})
	for _, ev := range evs {
		if ev.Type == queue.EventDelivered && ev.Attempt != 1 {
			t.Errorf("delivered at attempt %d, want 1: the held attempt was counted", ev.Attempt)
		}
		if ev.Type != queue.EventQueued && ev.Type != queue.EventDelivered {
			t.Errorf("event %s: the held attempt was recorded as an attempt", ev.Type)
		}
	}
	snd.mu.Lock()
	sends := append([]time.Time(nil), snd.sends...)
	snd.mu.Unlock()
	if len(sends) != 2 || sends[1].Before(snd.until) {
		t.Errorf("sends at %v: want two, the second after the hold's end %v", sends, snd.until)
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if rs := gate.done[""]; len(rs) != 2 || len(rs[0]) != 1 || rs[0][0].Class != classify.Transient || rs[0][0].Scope != classify.ScopeConnection {
		t.Errorf("the throttle was told %v: want the held attempt's connect failure, then the delivery", rs)
	}
}
