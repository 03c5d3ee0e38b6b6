package backoff

import (
	"container/heap"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// The retry herd simulation: herdMessages messages fail at the same instant
// (t = 0, a destination that was down comes back) and retry under four
// policies. The destination then accepts herdCapacity messages per second
// and refuses the rest with a transient error, which sends them round
// again. Time is simulated in whole milliseconds; nothing sleeps.
//
// Reproduce the figures in docs/benchmarks.md with:
//
//	go test -race -shuffle=on -run TestRetryHerd -v ./backoff/
const (
	herdMessages = 10000
	herdCapacity = 500 // accepted per second once the destination is back
	herdWorkers  = 64  // 8 processes × 8 delivery goroutines
)

// herdEvent is one delivery attempt at a simulated time.
type herdEvent struct {
	atMs    int64
	msg     int
	attempt int // 1 = first retry
}

type herdQueue []herdEvent

func (q herdQueue) Len() int { return len(q) }
func (q herdQueue) Less(i, j int) bool {
	if q[i].atMs != q[j].atMs {
		return q[i].atMs < q[j].atMs
	}
	return q[i].msg < q[j].msg
}
func (q herdQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *herdQueue) Push(x any)   { *q = append(*q, x.(herdEvent)) }
func (q *herdQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// herdResult is what one policy did to the destination.
type herdResult struct {
	policy      string
	peak        int   // most retries in one wall-clock second
	peakSecond  int64 // which second (since the failure)
	retries     int   // retries made in all
	refused     int   // retries refused because the destination was at capacity
	p50Ms       int64 // median delivery time since the failure
	lastMs      int64 // when the last message was delivered
	busySeconds int   // seconds with more retries than the capacity
}

// simulateHerd runs the herd under delay, which returns the delay in ms
// before attempt of msg.
func simulateHerd(name string, delay func(msg, attempt int) int64) herdResult {
	q := make(herdQueue, 0, herdMessages)
	for m := range herdMessages {
		q = append(q, herdEvent{atMs: delay(m, 1), msg: m, attempt: 1})
	}
	heap.Init(&q)
	perSecond := map[int64]int{}
	accepted := map[int64]int{}
	delivered := make([]int64, 0, herdMessages)
	r := herdResult{policy: name}
	for q.Len() > 0 {
		e := heap.Pop(&q).(herdEvent)
		s := e.atMs / 1000
		perSecond[s]++
		r.retries++
		if accepted[s] < herdCapacity {
			accepted[s]++
			delivered = append(delivered, e.atMs)
			continue
		}
		r.refused++
		heap.Push(&q, herdEvent{atMs: e.atMs + delay(e.msg, e.attempt+1), msg: e.msg, attempt: e.attempt + 1})
	}
	for s, n := range perSecond {
		if n > r.peak || (n == r.peak && s < r.peakSecond) {
			r.peak, r.peakSecond = n, s
		}
		if n > herdCapacity {
			r.busySeconds++
		}
	}
	// delivered is in time order: events pop in time order.
	r.p50Ms = delivered[len(delivered)/2]
	r.lastMs = delivered[len(delivered)-1]
	return r
}

// herdPolicies returns the four policies at the documented retry defaults:
// (a) a fixed delay of Base, (b) plain exponential min(Base*2^n, Cap),
// (c) full jitter clamped to [Min, Cap], (d) (c) plus the per-worker offset.
// Each decision draws a fresh seed, as the daemon does, from a fixed
// generator so that the figures are reproducible.
func herdPolicies() []struct {
	name  string
	delay func(msg, attempt int) int64
} {
	b := DefaultRetry()
	noOffset := b
	noOffset.ContentionWindow = 0
	seeds := rand.New(rand.NewPCG(2024, 4))
	workers := make([]string, herdWorkers)
	for i := range workers {
		workers[i] = fmt.Sprintf("outflow-%d/%d", i/8, i%8)
	}
	return []struct {
		name  string
		delay func(msg, attempt int) int64
	}{
		{"(a) fixed delay", func(int, int) int64 { return b.Base.Milliseconds() }},
		{"(b) plain exponential", func(_, attempt int) int64 {
			return min(b.Decide(attempt, "", 0, 0).NominalMs, b.Cap.Milliseconds())
		}},
		{"(c) full jitter", func(msg, attempt int) int64 {
			return noOffset.Decide(attempt, workers[msg%herdWorkers], seeds.Uint64(), 0).DelayMs
		}},
		{"(d) full jitter + offset", func(msg, attempt int) int64 {
			return b.Decide(attempt, workers[msg%herdWorkers], seeds.Uint64(), 0).DelayMs
		}},
	}
}

// TestRetryHerd asserts that the peak retries per second fall from (a) to
// (d), with (d) at least 5 times below (a), and prints the table kept in
// docs/benchmarks.md.
func TestRetryHerd(t *testing.T) {
	var res []herdResult
	for _, p := range herdPolicies() {
		res = append(res, simulateHerd(p.name, p.delay))
	}
	var tbl strings.Builder
	fmt.Fprintf(&tbl, "| policy | peak retries/s | peak at | retries | refused | seconds over capacity | median delivered | last delivered |\n")
	fmt.Fprintf(&tbl, "|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range res {
		fmt.Fprintf(&tbl, "| %s | %d | %ds | %d | %d | %d | %v | %v |\n", r.policy, r.peak, r.peakSecond,
			r.retries, r.refused, r.busySeconds,
			(time.Duration(r.p50Ms) * time.Millisecond).Round(time.Second),
			(time.Duration(r.lastMs) * time.Millisecond).Round(time.Second))
	}
	t.Logf("%d messages, capacity %d/s, %d workers, DefaultRetry %+v\n%s", herdMessages, herdCapacity, herdWorkers, DefaultRetry(), tbl.String())

	a, b, c, d := res[0], res[1], res[2], res[3]
	// Without jitter every message of the herd retries in the same second,
	// however the delay grows: (a) and (b) both peak at the whole herd.
	if a.peak != herdMessages || b.peak != herdMessages {
		t.Errorf("unjittered peaks %d and %d, want the whole herd (%d)", a.peak, b.peak, herdMessages)
	}
	if !(a.peak >= b.peak && b.peak > c.peak && c.peak > d.peak) {
		t.Errorf("peaks not in order (a) >= (b) > (c) > (d): %d, %d, %d, %d", a.peak, b.peak, c.peak, d.peak)
	}
	if d.peak*5 > a.peak {
		t.Errorf("full jitter + offset peaks at %d/s, not 5 times below the fixed delay's %d/s", d.peak, a.peak)
	}
}
