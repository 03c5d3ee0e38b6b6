package gcpolicy

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
)

func heapGoal() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// restore puts the collector back as the test found it.
func restore(t *testing.T) {
	old := gogc()
	t.Cleanup(func() {
		Apply(0, 0)
		debug.SetGCPercent(old)
	})
}

// waitGoal runs collections until the heap goal satisfies ok: the floor is
// set by a hook that runs after a cycle, on the finalizer goroutine.
func waitGoal(t *testing.T, what string, ok func(uint64) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		g := heapGoal()
		if ok(g) {
			return
		}
		if time.Now().After(deadline) {
			metrics.Read(liveHeap)
			t.Fatalf("heap goal %d: %s (gogc %d, live %d, set %+v)", g, what, gogc(), liveHeap[0].Value.Uint64(), cur)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A small heap's goal is held at the floor, cycle after cycle; without
// the floor it is far below. A heap above the floor is paced by the target
// alone.
func TestFloor(t *testing.T) {
	t.Setenv("GOGC", "")
	restore(t)
	const floor = 64 << 20
	hold := func(n int) [][]byte {
		live := make([][]byte, 0, 64)
		for range 64 {
			live = append(live, make([]byte, n/64))
		}
		return live
	}
	retained = hold(floor / 4) // 16 MiB: a goal of 24 MiB at 50
	if got := Apply(50, 0); got != 50 {
		t.Fatalf("Apply(50, 0) = %d", got)
	}
	waitGoal(t, "without a floor, want below half of it", func(g uint64) bool { return g < floor/2 })
	if got := Apply(50, floor); got <= 50 {
		t.Fatalf("Apply(50, floor) with a small heap = %d, want a raised target", got)
	}
	waitGoal(t, "with the floor, want at it", func(g uint64) bool { return g >= floor*9/10 && g < floor*13/10 })
	// Several cycles later the hook still holds it.
	for range 5 {
		runtime.GC()
	}
	waitGoal(t, "five cycles on, want still at the floor", func(g uint64) bool { return g >= floor*9/10 })

	// A live heap of twice the floor: the goal is live × 1.5.
	retained = hold(2 * floor)
	waitGoal(t, "with a live heap above the floor, want paced by 50%", func(g uint64) bool {
		return g >= 2*floor*14/10 && g < 2*floor*17/10
	})
	if got := gogc(); got != 50 {
		t.Fatalf("target with a heap above the floor: %d, want 50", got)
	}

	retained = hold(floor / 4)
	Apply(50, 0)
	waitGoal(t, "after the floor was dropped, want below half of it", func(g uint64) bool { return g < floor/2 })
	retained = nil
}

// retained is the test's live heap, reachable from a package variable.
var retained [][]byte

// A second Apply starts from the configured target, not from the one the
// first one's floor raised.
func TestReapply(t *testing.T) {
	t.Setenv("GOGC", "200")
	restore(t)
	debug.SetGCPercent(200)
	retained = make([][]byte, 1)
	retained[0] = make([]byte, 4<<20)
	if got := Apply(50, 256<<20); got <= 200 {
		t.Fatalf("Apply with a floor far above a small heap = %d, want above GOGC's 200", got)
	}
	if got := Apply(50, 0); got != 200 {
		t.Fatalf("Apply without a floor after one with it = %d, want GOGC's 200", got)
	}
	retained = nil
}

// GOGC in the environment wins over the configured target, and off means
// no floor either.
func TestEnvironmentWins(t *testing.T) {
	restore(t)
	t.Setenv("GOGC", "300")
	debug.SetGCPercent(300)
	if got := Apply(50, 0); got != 300 {
		t.Fatalf("Apply(50) with GOGC=300 = %d", got)
	}
	t.Setenv("GOGC", "off")
	debug.SetGCPercent(-1)
	if got := Apply(50, 1<<30); got != -1 || cur != nil {
		t.Fatalf("Apply with GOGC=off = %d, policy %v", got, cur)
	}
}

func TestTargetFor(t *testing.T) {
	for _, c := range []struct {
		percent     int
		floor, live uint64
		want        int
	}{
		{50, 128 << 20, 256 << 20, 50},   // above the floor
		{50, 128 << 20, 100 << 20, 50},   // 150 MiB goal: already above
		{50, 128 << 20, 64 << 20, 100},   // 64 MiB × 2 = the floor
		{50, 128 << 20, 16 << 20, 700},   // 16 MiB × 8
		{50, 128 << 20, 1 << 20, 900},    // capped
		{50, 128 << 20, 0, 900},          // nothing live yet
		{1000, 128 << 20, 1 << 20, 1000}, // never below the configured target
	} {
		if got := targetFor(c.percent, c.floor, c.live); got != c.want {
			t.Errorf("targetFor(%d, %d, %d) = %d, want %d", c.percent, c.floor, c.live, got, c.want)
		}
	}
}

// BenchmarkAdjust is what the hook costs the finalizer goroutine once per
// collection: a read of the live heap and, when it changed the target,
// a call into the collector's pacer.
//
//	go test -run '^$' -bench Adjust -benchmem ./internal/gcpolicy
func BenchmarkAdjust(b *testing.B) {
	defer debug.SetGCPercent(gogc())
	f := &floor{percent: 50, min: DefaultMinHeap, set: 50}
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		f.set = 0 // force the pacer call: the dearer path
		f.adjust()
		mu.Unlock()
	}
}
