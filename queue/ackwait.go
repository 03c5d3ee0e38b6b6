package queue

import (
	"cmp"
	"context"
	"sync"
	"time"
)

// The ack wait the server goes by is the consumer's, and every daemon of a
// fleet sets it to its own --ack-wait at start (setup: the lanes'
// consumers and every tenant's), so the last one started wins. A worker
// that reported progress every quarter of its own ack wait therefore sent
// too few keep-alives for a consumer another daemon had given a shorter
// one, and its long sends were handed out again and went out twice. So
// a Delivery says its consumer's ack wait (AckWait), as this process
// last learned it from the server: at setup, and by asking the server
// about a consumer it has not learned of or learned of longer than
// ackWaitRefresh ago.

// ackWaitRefresh is how long this process goes by the ack wait it learned
// of a consumer before it asks the server again: within it, a daemon
// started with a shorter --ack-wait shortens this process's keep-alives.
// The question is asked behind the answer, which stays the one learned
// until it comes.
const ackWaitRefresh = time.Minute

// ackWaitRetry is how soon a question that failed is asked again.
const ackWaitRetry = 5 * time.Second

// ackWaitAsk bounds one question about a consumer's ack wait, and so how
// long the first Delivery.AckWait of a consumer not yet learned of waits.
const ackWaitAsk = 2 * time.Second

// ackWaits are the consumers' ack waits as the server last gave them, by
// stream and consumer name.
type ackWaits struct {
	mu        sync.Mutex
	m         map[string]*ackWait
	lastSweep time.Time
	// refresh is ackWaitRefresh, unless a test sets its own.
	refresh time.Duration
}

// ackWait is what this process knows of one consumer's ack wait.
type ackWait struct {
	d      time.Duration // 0: not known (every question failed)
	at     time.Time     // when it was learned, or last asked in vain
	failed bool          // the last question failed
	known  bool          // a question was answered or failed: d is the answer
	// asking is closed when the question under way is answered; nil
	// while none is.
	asking chan struct{}
}

func ackWaitKey(stream, consumer string) string { return stream + "/" + consumer }

// learn records the ack wait d of the consumer, as the server just gave it.
func (a *ackWaits) learn(stream, consumer string, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := a.entry(ackWaitKey(stream, consumer), time.Now())
	w.d, w.at, w.failed, w.known = d, time.Now(), false, true
}

// stale reports whether w is to be asked about again at now, under a.mu.
func (a *ackWaits) stale(w *ackWait, now time.Time) bool {
	if !w.known {
		return true
	}
	if w.failed {
		return now.Sub(w.at) > ackWaitRetry
	}
	return now.Sub(w.at) > cmp.Or(a.refresh, ackWaitRefresh)
}

// entry is key's record, made when missing, under a.mu. Making one sweeps
// away, at most once a refresh, the records of consumers no delivery has
// asked about for a day (tenants that stopped sending: the server removes
// their consumers after tenantIdle).
func (a *ackWaits) entry(key string, now time.Time) *ackWait {
	if w := a.m[key]; w != nil {
		return w
	}
	if a.m == nil {
		a.m = map[string]*ackWait{}
	}
	if now.Sub(a.lastSweep) > ackWaitRefresh {
		a.lastSweep = now
		for k, w := range a.m {
			if w.asking == nil && now.Sub(w.at) > tenantIdle {
				delete(a.m, k)
			}
		}
	}
	w := &ackWait{}
	a.m[key] = w
	return w
}

// AckWait is the ack wait of the consumer that handed d out, as the server
// last gave it to this process: how long d may go without a keep-alive
// (InProgress) before the server hands it out again. It is the consumer's,
// which the last daemon of the fleet started set, not this process's
// Options.AckWait. The first call for a consumer not yet learned of asks
// the server (up to ackWaitAsk); later ones answer from memory and ask
// again behind the answer once it is ackWaitRefresh old. 0 when not known.
func (d *Delivery) AckWait() time.Duration {
	if d.msg == nil || d.q == nil {
		return 0
	}
	md, err := d.msg.Metadata()
	if err != nil {
		return 0
	}
	return d.q.consumerAckWait(md.Stream, md.Consumer)
}

// consumerAckWait is the consumer's ack wait, for Delivery.AckWait.
func (q *Queue) consumerAckWait(stream, consumer string) time.Duration {
	a := &q.ackWaits
	now := time.Now()
	a.mu.Lock()
	w := a.entry(ackWaitKey(stream, consumer), now)
	if w.asking == nil && a.stale(w, now) {
		w.asking = make(chan struct{})
		go q.askAckWait(stream, consumer, w)
	}
	if w.known {
		d := w.d
		a.mu.Unlock()
		return d
	}
	asking := w.asking
	a.mu.Unlock()
	<-asking // within ackWaitAsk
	a.mu.Lock()
	defer a.mu.Unlock()
	return w.d
}

// askAckWait asks the server for the consumer's ack wait and records the
// answer in w; a question that fails keeps what w knew, and is asked
// again after ackWaitRetry.
func (q *Queue) askAckWait(stream, consumer string, w *ackWait) {
	ctx, cancel := context.WithTimeout(context.Background(), ackWaitAsk)
	defer cancel()
	var d time.Duration
	c, err := q.js.Consumer(ctx, stream, consumer)
	if err == nil {
		if ci := c.CachedInfo(); ci != nil {
			d = ci.Config.AckWait
		}
	}
	a := &q.ackWaits
	a.mu.Lock()
	defer a.mu.Unlock()
	w.at, w.failed, w.known = time.Now(), err != nil || d <= 0, true
	if !w.failed {
		w.d = d
	}
	close(w.asking)
	w.asking = nil
}
