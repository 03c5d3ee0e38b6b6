package throttle

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// TestSlotAt: a worker's slots are the grid's slots of its rank, on the
// server's clock, at or after the time asked for.
func TestSlotAt(t *testing.T) {
	const rate = 10.0 // a slot every 100 ms
	base := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		at     time.Duration // after base
		n, r   int
		offset time.Duration
		want   time.Duration
	}{
		{at: 0, n: 1, r: 0, want: 0},                                         // one worker: no grid
		{at: 30 * time.Millisecond, n: 1, r: 0, want: 30 * time.Millisecond}, // nor delay
		{at: 0, n: 2, r: 0, want: 0},                                         // slot 18e9 is even
		{at: 0, n: 2, r: 1, want: 100 * time.Millisecond},
		{at: 1 * time.Millisecond, n: 2, r: 0, want: 200 * time.Millisecond},
		{at: 250 * time.Millisecond, n: 3, r: 2, want: 500 * time.Millisecond},          // 18e9+5 ≡ 2 mod 3
		{at: 0, n: 2, r: 1, offset: 30 * time.Millisecond, want: 70 * time.Millisecond}, // the server is 30 ms ahead
	} {
		got := slotAt(base.Add(tc.at), rate, tc.n, tc.r, tc.offset).Sub(base)
		if got != tc.want {
			t.Errorf("slotAt(+%v, n=%d, r=%d, offset %v) = +%v, want +%v", tc.at, tc.n, tc.r, tc.offset, got, tc.want)
		}
	}
	// Above 500/s the grid is finer than timers keep: left alone.
	if at := base.Add(time.Millisecond / 3); !slotAt(at, 1000, 2, 1, 0).Equal(at) {
		t.Error("a 1 ms grid was applied")
	}
}

// TestFleetSendsInterleave: two workers sharing a destination's rate send
// in turn, one slot apart, instead of each on its own phase. Before the
// grid both sent at once as they started (each bucket holds a token), and
// then on every turn that their phases happened to share; a provider with
// a one-message burst throttles each such pair.
func TestFleetSendsInterleave(t *testing.T) {
	env := startKV(t)
	const rate = 20.0 // fleet-wide: a slot every 50 ms
	mod := func(c *Config) { c.Defaults.Rate = rate; c.MaxWait = 10 * time.Second }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)

	type send struct {
		at     time.Time
		worker int
	}
	var mu sync.Mutex
	var sends []send
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var wg sync.WaitGroup
	for i, th := range []*Throttle{a, b} {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					p, _ := th.Admit(ctx, "grid.test")
					if p == nil {
						continue
					}
					mu.Lock()
					sends = append(sends, send{time.Now(), i})
					mu.Unlock()
					p.Done([]classify.Result{resDelivered})
				}
			}()
		}
	}
	wg.Wait()
	slices.SortFunc(sends, func(x, y send) int { return x.at.Compare(y.at) })
	if len(sends) < 20 {
		t.Fatalf("%d sends in 1.5 s at %v/s", len(sends), rate)
	}
	period := time.Duration(float64(time.Second) / rate)
	var closest time.Duration = time.Hour
	alternating := 0
	for i := 1; i < len(sends); i++ {
		closest = min(closest, sends[i].at.Sub(sends[i-1].at))
		if sends[i].worker != sends[i-1].worker {
			alternating++
		}
	}
	t.Logf("%d sends, closest pair %v apart, %d of %d neighbours from different workers", len(sends), closest, alternating, len(sends)-1)
	// Half a slot of slack for timers on a busy machine.
	if closest < period/2 {
		t.Errorf("two sends %v apart; the grid spaces the fleet's sends %v apart", closest, period)
	}
	if alternating < (len(sends)-1)*9/10 {
		t.Errorf("only %d of %d neighbouring sends came from different workers", alternating, len(sends)-1)
	}
}
