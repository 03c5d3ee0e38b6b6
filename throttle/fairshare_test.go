package throttle

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// shareRun is one run of simShares: the admissions granted to each tenant
// after the warm-up, and the longest a trickle's envelope waited from its
// submission to its admission.
type shareRun struct {
	granted map[string]int
	slowest time.Duration
}

// simShares runs a worker's delivery slots against dom for dur of real
// time: each of tenants has a backlog of envelopes (every one due at
// once), and slots goroutines take them as the work lane hands them out,
// the tenants in equal turns, whatever their weights. A granted envelope
// is delivered at once; a refused one goes back to its tenant's lane
// until the refusal's time, and comes back then as the rate-limit lane
// would bring it. Tenant trickle submits one envelope every trickleEvery.
// It counts the admissions granted after warm.
func simShares(t *testing.T, th *Throttle, dom string, tenants []string, trickle string, slots int, warm, dur time.Duration) shareRun {
	t.Helper()
	return simLanes(t, th, dom, tenants, trickle, 700*time.Millisecond, 0, nil, slots, warm, dur)
}

// simLanes is simShares with the trickle's spacing, and the rate-limit
// lane's tick: with tick > 0 a refused envelope comes back at the first
// tick (counted from the start) at or after its place, with every other
// envelope due by then, as the real lane's schedules fire (in bunches
// about 250 ms apart, seen in the hunt's logs of one daemon), not each at
// its own time. 0: each at its place. queued[T] of tenant T's envelopes
// start in the virtual queue, at the places d.slot gives them (the
// tenants' in turn), as a first contact's refusals and throttles leave
// part of a backlog; the rest wait in the work lane.
func simLanes(t *testing.T, th *Throttle, dom string, tenants []string, trickle string, trickleEvery, tick time.Duration, queued map[string]int, slots int, warm, dur time.Duration) shareRun {
	t.Helper()
	type envelope struct{ due, born time.Time }
	var mu sync.Mutex
	lanes := map[string][]envelope{} // each tenant's envelopes by due time
	start := time.Now()
	for _, tn := range tenants {
		lanes[tn] = make([]envelope, 2000)
		for i := range lanes[tn] {
			lanes[tn][i] = envelope{start, start}
		}
	}
	if len(queued) > 0 {
		d := th.getDest(dom)
		fleet := th.fleetRate(d.limits, d.state, th.now())
		d.mu.Lock()
		for i := range slices.Max(slices.Collect(maps.Values(queued))) {
			for _, tn := range tenants {
				if i < queued[tn] {
					at := d.slot(tn, th.now(), th.now(), fleet, th.weight, th.horizon(d, th.now()))
					lanes[tn][i].due = start.Add(at.Sub(th.now()))
				}
			}
		}
		d.mu.Unlock()
		for _, tn := range tenants {
			q := lanes[tn]
			slices.SortStableFunc(q, func(a, b envelope) int { return a.due.Compare(b.due) })
		}
	}
	all := append(slices.Clone(tenants), trickle)
	run := shareRun{granted: map[string]int{}}
	next := 0
	take := func(now time.Time) (string, envelope, bool) {
		mu.Lock()
		defer mu.Unlock()
		if tn := trickle; tn != "" && now.Sub(start) >= warm {
			// The trickle's next envelope, submitted on time.
			if born := start.Add(warm + time.Duration(run.granted["submitted"])*trickleEvery); !born.After(now) {
				run.granted["submitted"]++
				return tn, envelope{now, born}, true
			}
		}
		for i := range all {
			tn := all[(next+i)%len(all)]
			q := lanes[tn]
			if len(q) > 0 && !q[0].due.After(now) {
				lanes[tn] = q[1:]
				next = (next + i + 1) % len(all)
				return tn, q[0], true
			}
		}
		return "", envelope{}, false
	}
	back := func(tn string, e envelope) {
		mu.Lock()
		defer mu.Unlock()
		q := lanes[tn]
		i, _ := slices.BinarySearchFunc(q, e.due, func(a envelope, b time.Time) int { return a.due.Compare(b) })
		lanes[tn] = slices.Insert(q, i, e)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dur)
	defer cancel()
	var wg sync.WaitGroup
	for range slots {
		wg.Go(func() {
			for ctx.Err() == nil {
				tn, e, ok := take(time.Now())
				if !ok {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				p, r := th.Admit(ctx, dom, tn, "")
				if p == nil {
					if r.Reason == "canceled" {
						return
					}
					e.due = r.Until
					if tick > 0 {
						n := (e.due.Sub(start) + tick - 1) / tick
						e.due = start.Add(n * tick)
					}
					back(tn, e)
					continue
				}
				now := time.Since(start)
				mu.Lock()
				if now >= warm {
					run.granted[tn]++
				}
				if tn == trickle {
					run.slowest = max(run.slowest, time.Since(e.born))
				}
				mu.Unlock()
				p.Done([]classify.Result{resDelivered})
			}
		})
	}
	wg.Wait()
	return run
}

// TestTenantWeightsShareABusyDestination: two tenants with backlogs to a
// destination limited to 20/s, asking for admission at equal rates (the
// work lane hands envelopes out in equal turns), one weighing 3: the
// admissions follow the weights, 75:25, at a configured rate and at a
// learned one alike. Before, the weight entered only the spacing of the
// virtual queue, while most admissions were granted to whichever tenant
// asked when a turn was within max-wait: the hunt's three daemons with
// `tenant-weights = { "tenant-a" = 3 }` delivered 45:55. With a third
// tenant's message every 0.7 s besides, its messages go within the
// turns already given, and the rate is still used: 95 % of it at least
// (85 to 88 % before tokenNear). Each refused envelope comes back here at
// its own place; the real lane brings them in bunches, where the one
// period tokenNear kept then lost half the rate
// (TestTrickleKeepsALearnedRateBusy).
func TestTenantWeightsShareABusyDestination(t *testing.T) {
	weights := map[string]float64{"heavy": 3}
	for _, c := range []struct {
		name    string
		rate    float64
		learned bool
		trickle string  // a third tenant's messages now and then, besides the backlogs
		used    float64 // the least share of the rate admitted
	}{
		{"configured", 20, false, "", 0.95},
		{"learned", 20, true, "", 0.95},
		// A third tenant's message now and then: the backlogs yielded
		// the tokens due next to it while it had nothing waiting, and
		// 12 to 15 % of the rate went untaken (overShare, tokenNear).
		{"learned with a trickle", 20, true, "resets", 0.95},
		{"configured with a trickle", 20, false, "resets", 0.95},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := startKV(t)
			th := newThrottle(t, env, "a", func(cfg *Config) {
				cfg.TenantWeights = weights
				if !c.learned {
					cfg.Defaults.Rate = c.rate
					cfg.NoLearn = true
				}
			})
			const dom = "weights.test"
			if c.learned {
				d := th.getDest(dom)
				now := th.now()
				d.mu.Lock()
				d.state.LearnedRate = c.rate
				d.state.LearnedHold = now.Add(time.Hour) // no step up meanwhile
				d.state.Grid = []GridSegment{{From: now.Add(-time.Minute), Rate: c.rate}}
				d.mu.Unlock()
			}
			const warm, dur = 2 * time.Second, 10 * time.Second
			secs := (dur - warm).Seconds()

			run := simShares(t, th, dom, []string{"heavy", "light"}, c.trickle, 32, warm, dur)

			got := run.granted
			total := got["heavy"] + got["light"]
			share := float64(got["heavy"]) / float64(total)
			t.Logf("heavy %d, light %d: %.1f%% to the tenant weighing 3; %d of %d trickled, the slowest after %s; %.2f/s in all",
				got["heavy"], got["light"], 100*share, got[c.trickle], got["submitted"], run.slowest.Round(time.Millisecond), float64(total+got[c.trickle])/secs)
			if n := total + got[c.trickle]; float64(n) < c.used*c.rate*secs {
				t.Errorf("%d admitted in %.0f s at %v/s: the rate is not used", n, secs, c.rate)
			}
			// 75 % in theory; a run of 10 s on the wall clock, under
			// -race on a shared machine, has seen 73 to 81 %. Without
			// the weights it is 50 %.
			if share < 0.65 || share > 0.85 {
				t.Errorf("the tenant weighing 3 of 4 had %.1f%% of the two backlogs' admissions, want 65–85%% (75 in theory)", 100*share)
			}
			// A third tenant's few messages go before both backlogs.
			if c.trickle != "" && (run.slowest > 3*time.Second || got[c.trickle] < got["submitted"]-3) {
				t.Errorf("%s: %d of %d admitted, the slowest after %s: held behind the backlogs", c.trickle, got[c.trickle], got["submitted"], run.slowest)
			}
		})
	}
}

// unweighted weighs every tenant 1.
func unweighted(string) float64 { return 1 }
