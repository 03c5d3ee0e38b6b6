package throttle

import (
	"testing"
	"time"
)

// TestTrickleKeepsALearnedRateBusy: two tenants' backlogs at a learned
// 20/s, a third tenant's message every second, and refused envelopes
// coming back as the real rate-limit lane brings them, in bunches 250 ms
// apart. The hunt's daemon delivered 19–21/s before the trickle and 8–9/s
// while it sent (9–12/s with weights of 3:1, split 4.5:5): each backlog's
// admission yielded its token to the trickle, which had nothing waiting,
// whenever the destination was booked more than one period ahead, which
// it is whenever another admission waits in process for its turn; the
// one admission of each bunch took a token, and the rest of the bunch
// was parked again. With each envelope back at its own time (simShares)
// the admissions came one a period and the loss did not show.
func TestTrickleKeepsALearnedRateBusy(t *testing.T) {
	for _, c := range []struct {
		name     string
		weights  map[string]float64
		min, max float64 // the first backlog's part of the two backlogs' admissions
	}{
		{"equal weights", nil, 0.35, 0.65},
		{"weights 3:1", map[string]float64{"heavy": 3}, 0.65, 0.85},
	} {
		t.Run(c.name, func(t *testing.T) {
			env := startKV(t)
			th := newThrottle(t, env, "a", func(cfg *Config) { cfg.TenantWeights = c.weights })
			const dom, rate = "trickle.test", 20.0
			d := th.getDest(dom)
			now := th.now()
			d.mu.Lock()
			d.state.LearnedRate = rate
			d.state.LearnedHold = now.Add(time.Hour) // no step up meanwhile
			d.state.Grid = []GridSegment{{From: now.Add(-time.Minute), Rate: rate}}
			d.mu.Unlock()
			const warm, dur = 2 * time.Second, 12 * time.Second
			secs := (dur - warm).Seconds()

			run := simLanes(t, th, dom, []string{"heavy", "light"}, "resets", time.Second, 250*time.Millisecond, map[string]int{"heavy": 60, "light": 60}, 32, warm, dur)

			got := run.granted
			total := got["heavy"] + got["light"]
			share := float64(got["heavy"]) / float64(max(total, 1))
			t.Logf("heavy %d, light %d (%.1f%%); %d of %d trickled, the slowest after %s; %.2f/s in all",
				got["heavy"], got["light"], 100*share, got["resets"], got["submitted"], run.slowest.Round(time.Millisecond), float64(total+got["resets"])/secs)
			if n := total + got["resets"]; float64(n) < 0.95*rate*secs {
				t.Errorf("%d admitted in %.0f s at %v/s (%.0f%%): the trickle's yields left the rate unused", n, secs, rate, 100*float64(n)/(rate*secs))
			}
			if share < c.min || share > c.max {
				t.Errorf("heavy had %.1f%% of the backlogs' admissions, want %.0f–%.0f%%", 100*share, 100*c.min, 100*c.max)
			}
			if run.slowest > 3*time.Second || got["resets"] < got["submitted"]-3 {
				t.Errorf("resets: %d of %d admitted, the slowest after %s: held behind the backlogs", got["resets"], got["submitted"], run.slowest)
			}
		})
	}
}

// TestEqualTenantsShareWhereverTheirBacklogsWait: two tenants of one
// weight with backlogs to a learned 20/s, one of them with part of its
// backlog in the virtual queue (a first contact's refusals and throttles
// left it there), the other's all in the work lane, the refused mail
// coming back in the lane's bunches. The hunt's daemon gave one tenant 1
// of the first 600 deliveries, and in another run each had 10 s
// stretches alone: the tenant whose places reached further ahead yielded
// every token to the other, whose backlog in the work lane counted only
// its admissions waiting in process (32 slots, 1.6 s at most), and each
// yield parked its envelope further ahead still.
func TestEqualTenantsShareWhereverTheirBacklogsWait(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	const dom, rate = "equal.test", 20.0
	d := th.getDest(dom)
	now := th.now()
	d.mu.Lock()
	d.state.LearnedRate = rate
	d.state.LearnedHold = now.Add(time.Hour)
	d.state.Grid = []GridSegment{{From: now.Add(-time.Minute), Rate: rate}}
	d.mu.Unlock()
	const warm, dur = 2 * time.Second, 12 * time.Second
	secs := (dur - warm).Seconds()

	run := simLanes(t, th, dom, []string{"parked", "lane"}, "", 0, 250*time.Millisecond, map[string]int{"parked": 100}, 32, warm, dur)

	got := run.granted
	total := got["parked"] + got["lane"]
	share := float64(got["parked"]) / float64(max(total, 1))
	t.Logf("parked %d, lane %d (%.1f%%); %.2f/s in all", got["parked"], got["lane"], 100*share, float64(total)/secs)
	if float64(total) < 0.95*rate*secs {
		t.Errorf("%d admitted in %.0f s at %v/s: the rate is not used", total, secs, rate)
	}
	if share < 0.35 || share > 0.65 {
		t.Errorf("the tenant with places in the virtual queue had %.1f%% of the admissions, want 35–65%% (50 in theory)", 100*share)
	}
}
