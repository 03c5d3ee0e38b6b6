package gcpolicy

import (
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// Defaults of serve's --gc-percent and --gc-min-heap.
const (
	DefaultPercent = 100
	DefaultMinHeap = 48 << 20
)

// maxPercent bounds the target the floor may set. Between the end of a
// cycle and the hook that reads its live heap the previous target still
// applies; with a heap that grew fast that target is the one that matters,
// and this keeps the goal within 10 times the live heap meanwhile.
const maxPercent = 900

// policy is the one in effect; the collector's hook reads it.
var (
	mu       sync.Mutex
	cur      *floor
	liveHeap = []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
)

type floor struct {
	percent int    // the configured target
	min     uint64 // the floor under the goal, bytes
	set     int    // the target last set
}

// sentinel is allocated for the collector to find unreachable: its
// finalizer runs once per cycle. It names the policy that armed it, so a
// replaced policy's hook stops; holding a pointer also keeps it out of
// the tiny allocator, whose objects may never be finalized.
type sentinel struct{ f *floor }

// Apply sets the collector's target to percent and keeps minHeap bytes as
// the floor under its heap goal. GOGC in the environment wins over
// percent, as Go documents, and the floor then uses GOGC's value; GOGC=off
// or a percent not positive leaves the target alone and sets no floor, as
// does a minHeap not positive. A second call replaces the first. It
// returns the target in effect now.
func Apply(percent int, minHeap int64) int {
	mu.Lock()
	defer mu.Unlock()
	if cur != nil {
		// Back to the target the replaced policy started from, so that
		// what is read below is a configured target, not one it raised.
		debug.SetGCPercent(cur.percent)
		cur = nil
	}
	if os.Getenv("GOGC") == "" && percent > 0 {
		debug.SetGCPercent(percent)
	}
	base := gogc()
	if base <= 0 || minHeap <= 0 {
		return base
	}
	cur = &floor{percent: base, min: uint64(minHeap), set: base}
	cur.adjust()
	runtime.SetFinalizer(&sentinel{cur}, onCycle)
	return cur.set
}

// onCycle runs after each collection: it sets the next cycle's target and
// arms itself for the one after, until Apply replaces the policy.
func onCycle(s *sentinel) {
	mu.Lock()
	defer mu.Unlock()
	if s.f != cur {
		return
	}
	cur.adjust()
	runtime.SetFinalizer(&sentinel{cur}, onCycle)
}

// adjust sets the target so the goal is max(live × (1 + percent/100),
// min). Called with mu held.
func (f *floor) adjust() {
	metrics.Read(liveHeap)
	if liveHeap[0].Value.Kind() != metrics.KindUint64 {
		return // a runtime without the metric: the target stays as set
	}
	want := targetFor(f.percent, f.min, liveHeap[0].Value.Uint64())
	if want != f.set {
		debug.SetGCPercent(want)
		f.set = want
	}
}

// targetFor is the target that makes the goal of a live heap of live
// bytes at least min, and never below percent.
func targetFor(percent int, floorBytes, live uint64) int {
	if live*uint64(100+percent)/100 >= floorBytes {
		return percent
	}
	if live == 0 {
		return max(percent, maxPercent)
	}
	return max(percent, min(int(floorBytes*100/live)-100, maxPercent))
}

// gogc is the collector's target in effect (-1: off).
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 100
	}
	if v := s[0].Value.Uint64(); v <= math.MaxInt32 {
		return int(v)
	}
	return -1 // off, reported as a negative number's bits
}
