package throttle

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/classify"
)

var (
	t0      = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	lcTest  = learnConfig{decrease: 0.5, hold: 3 * time.Second, every: 5 * time.Second, step: 0.1, min: 0.1}
	resConn = classify.Result{Class: classify.Throttled, Scope: classify.ScopeDestination, Rule: "rate-signal", Code: 421, Enhanced: "4.7.0", Text: "Too many concurrent SMTP connections from this IP"}
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestLearnSeedFromObservedRate(t *testing.T) {
	var s DestState
	if !lcTest.cutRate(&s, t0, 24, 0, 0, "why", false) {
		t.Fatal("no seed")
	}
	if !near(s.LearnedRate, 12) || !near(s.LearnedStep, 1.2) || !s.LearnedHold.Equal(t0.Add(3*time.Second)) || !s.LearnedSince.Equal(t0) {
		t.Fatalf("seed: %+v", s)
	}
	// Nothing delivered in the window: a first-contact seed, not zero.
	var first DestState
	lcTest.cutRate(&first, t0, 0, 0, 0, "why", false)
	if first.LearnedRate != learnFirstContact || !near(first.LearnedStep, lcTest.stepOf(learnFirstContact)) {
		t.Fatalf("first contact seed %v step %v", first.LearnedRate, first.LearnedStep)
	}
}

func TestLearnOneCutPerHold(t *testing.T) {
	var s DestState
	lcTest.cutRate(&s, t0, 40, 0, 0, "why", false) // 20
	for i := 1; i <= 10; i++ {                     // a burst of throttles within the hold
		if lcTest.cutRate(&s, t0.Add(time.Duration(i)*250*time.Millisecond), 40, 0, 0, "why", false) {
			t.Fatalf("cut again %d×250ms after the seed", i)
		}
	}
	if !near(s.LearnedRate, 20) || !s.LearnedSlowStart {
		t.Fatalf("rate %v slow start %v after a burst within one hold, want 20 and true", s.LearnedRate, s.LearnedSlowStart)
	}
	// A throttle of an attempt paced at the rate the seed set: that rate
	// is too high too, and is cut within the hold.
	paced := s
	if !lcTest.cutRate(&paced, t0.Add(500*time.Millisecond), 4, 0, 0, "why", true) || !near(paced.LearnedRate, 10) {
		t.Fatalf("a paced attempt's throttle within the hold: rate %v, want 10", paced.LearnedRate)
	}
	// Also when the window still reads the 40/s the seed was taken from:
	// the seed halved that reading already, and a throttle at half of it
	// says the reading was a burst (TestLearnCutsAgainSinceTheSeed).
	burst := s
	if !lcTest.cutRate(&burst, t0.Add(500*time.Millisecond), 40, 0, 0, "why", true) || !near(burst.LearnedRate, 10) {
		t.Fatalf("a paced throttle with 40/s delivered: rate %v, want 10", burst.LearnedRate)
	}
	// Unless a step came since: then what was delivered keeps the rate,
	// with no cut and no new hold.
	kept := s
	kept.LearnedPaced = false
	if lcTest.cutRate(&kept, t0.Add(500*time.Millisecond), 40, 0, 0, "why", true) || kept.LearnedRate != s.LearnedRate || !kept.LearnedCutAt.Equal(s.LearnedCutAt) {
		t.Fatalf("a paced throttle with 40/s delivered after a step changed the state: rate %v, cut at %v", kept.LearnedRate, kept.LearnedCutAt)
	}
	// After the hold, with little delivered: a multiplicative cut.
	if !lcTest.cutRate(&s, t0.Add(3*time.Second), 4, 0, 0, "why", false) || !near(s.LearnedRate, 10) {
		t.Fatalf("after the hold: rate %v, want 10", s.LearnedRate)
	}
	if !near(s.LearnedStep, 1) || s.LearnedSlowStart {
		t.Fatalf("step %v slow start %v: want 10%% of the rate the cut set, and additive from now on", s.LearnedStep, s.LearnedSlowStart)
	}
	// The floor.
	for i := 2; i < 40; i++ {
		lcTest.cutRate(&s, t0.Add(time.Duration(i)*3*time.Second), 0, 0, 0, "why", false)
	}
	if s.LearnedRate != lcTest.min {
		t.Fatalf("rate %v after many cuts, want the floor %v", s.LearnedRate, lcTest.min)
	}
}

// TestLearnCutKeepsWhatWasAccepted: a cut never goes below 90% of what the
// fleet was being delivered at (the limit a throttling token bucket
// demonstrably accepts), never rises, and past the hold takes at least a
// tenth off, whatever the reading says.
func TestLearnCutKeepsWhatWasAccepted(t *testing.T) {
	s := DestState{LearnedRate: 24, LearnedCutAt: t0}
	lcTest.cutRate(&s, t0.Add(time.Hour), 20, 0, 0, "why", false)
	if !near(s.LearnedRate, 18) {
		t.Fatalf("cut from 24 with 20/s delivered: %v, want 18", s.LearnedRate)
	}
	s = DestState{LearnedRate: 10}
	lcTest.cutRate(&s, t0, 30, 0, 0, "why", false) // stale report above the rate
	if !near(s.LearnedRate, 9) {
		t.Fatalf("a cut past the hold with a report above the rate: %v, want 9 (never rises, never stays)", s.LearnedRate)
	}
}

func TestLearnIncreaseIsAdditiveAndPaced(t *testing.T) {
	var s DestState
	lcTest.cutRate(&s, t0, 20, 0, 0, "why", false) // seed 10, slow start
	if lcTest.raiseRate(&s, t0.Add(time.Second), 0) {
		t.Fatal("stepped up within the hold")
	}
	at := t0.Add(3 * time.Second)
	if !lcTest.raiseRate(&s, at, 0) || !near(s.LearnedRate, 20) {
		t.Fatalf("slow start: %v, want doubled to 20", s.LearnedRate)
	}
	at = at.Add(lcTest.every)
	lcTest.cutRate(&s, at, 0, 0, 0, "why", false) // 10, additive from now
	at = at.Add(lcTest.hold)
	for i := 1; i <= 6; i++ {
		if !lcTest.raiseRate(&s, at, 0) {
			t.Fatalf("step %d refused", i)
		}
		if lcTest.raiseRate(&s, at.Add(time.Second), 0) {
			t.Fatalf("step %d: a second step within LearnEvery", i)
		}
		at = at.Add(lcTest.every)
	}
	if !near(s.LearnedRate, 16) {
		t.Fatalf("after 6 steps: %v, want 16 (additive, +1 each)", s.LearnedRate)
	}
	// A throttle right after a step cuts at once: steps do not hold cuts.
	if !lcTest.cutRate(&s, at.Add(-lcTest.every+time.Millisecond), 0, 0, 0, "why", false) {
		t.Fatal("a throttle just after a step up did not cut")
	}
	if s.LearnedReason == "" {
		t.Fatal("a step without a reason")
	}
}

// TestLearnPlateauAfterACut: after a cut the steps stop under the rate the
// throttle answered and wait there, longer after each probe above it that
// meets a throttle; a throttle under it lowers it, and steps above it that
// hold forget it. Without the plateau one daemon under a 2/s limit stepped
// back over it every 10 s, a throttle for every tenth message.
func TestLearnPlateauAfterACut(t *testing.T) {
	s := DestState{LearnedRate: 20, LearnedStep: 2}
	lcTest.cutRate(&s, t0, 12, 0, 0, "why", false) // throttled at 20: cut to 90% of 12
	if !near(s.LearnedRate, 10.8) || !near(s.LearnedPlateau, 19) || s.LearnedProbes != 0 {
		t.Fatalf("cut: rate %v plateau %v probes %d, want 10.8, 19, 0", s.LearnedRate, s.LearnedPlateau, s.LearnedProbes)
	}
	if !s.LearnedProbeAt.IsZero() {
		t.Fatalf("probe at %v before the rate reached the plateau", s.LearnedProbeAt)
	}
	// climb steps every learn-every until the rate reaches the plateau,
	// or stalls there; it returns the time of the last step taken.
	climb := func(at time.Time) time.Time {
		t.Helper()
		for i := 0; i < 40 && lcTest.raiseRate(&s, at, 0); i++ {
			at = at.Add(lcTest.every)
			if s.LearnedRate >= s.LearnedPlateau-1e-9 {
				break
			}
		}
		return at
	}
	at := climb(t0.Add(lcTest.hold))
	if !near(s.LearnedRate, 19) || !strings.Contains(s.LearnedReason, "to the plateau") {
		t.Fatalf("the climb ended at %v (%s), want the plateau 19", s.LearnedRate, s.LearnedReason)
	}
	if reached := at.Add(-lcTest.every); !s.LearnedProbeAt.Equal(reached.Add(lcTest.probeWait(0))) {
		t.Fatalf("probe at %v, want %v after the step that reached the plateau (%v)", s.LearnedProbeAt, lcTest.probeWait(0), reached)
	}
	if lcTest.raiseRate(&s, at, 0) || lcTest.raiseRate(&s, s.LearnedProbeAt.Add(-time.Millisecond), 0) {
		t.Fatalf("stepped over the plateau before %v: %v", s.LearnedProbeAt, s.LearnedRate)
	}
	if !s.atPlateau(at) {
		t.Fatal("atPlateau is false at the plateau before the probe")
	}
	// Each probe over the plateau that meets a throttle doubles the wait,
	// up to learnProbeMax, and leaves the plateau where it was.
	for probes, wait := 1, 2*learnProbeWait*lcTest.every; probes <= 6; probes, wait = probes+1, min(2*wait, learnProbeMax*lcTest.every) {
		at = s.LearnedProbeAt
		if !lcTest.raiseRate(&s, at, 0) || s.LearnedRate <= 19 || !strings.Contains(s.LearnedReason, "over the plateau") {
			t.Fatalf("probe %d: no step over the plateau at its time (%v, %s)", probes, s.LearnedRate, s.LearnedReason)
		}
		cutAt := at.Add(time.Second)
		if !lcTest.cutRate(&s, cutAt, 18, 0, 0, "why", false) {
			t.Fatalf("probe %d: its throttle did not cut", probes)
		}
		if !near(s.LearnedPlateau, 19) || s.LearnedProbes != probes {
			t.Fatalf("probe %d met a throttle: plateau %v probes %d, want 19 and %d", probes, s.LearnedPlateau, s.LearnedProbes, probes)
		}
		reached := climb(s.LearnedHold).Add(-lcTest.every)
		if want := reached.Add(wait); !s.LearnedProbeAt.Equal(want) {
			t.Fatalf("probe %d: next probe at %v, want %v (a wait of %v)", probes, s.LearnedProbeAt, want, wait)
		}
	}
	// A throttle at the plateau: the limit fell. The plateau moves under
	// the rate throttled, and the waits start afresh.
	at = s.LearnedProbeAt.Add(-time.Second)
	if !s.atPlateau(at) || !lcTest.cutRate(&s, at, 15, 0, 0, "why", false) {
		t.Fatal("a throttle at the plateau did not cut")
	}
	if !near(s.LearnedPlateau, 19*0.95) || s.LearnedProbes != 0 {
		t.Fatalf("a throttle at the plateau: plateau %v probes %d", s.LearnedPlateau, s.LearnedProbes)
	}
	// Probes over the plateau that hold: the limit rose. Each becomes the
	// plateau, and the steps double while they hold; the throttle that
	// ends them keeps the last one that held.
	reached := climb(s.LearnedHold).Add(-lcTest.every)
	if !s.LearnedProbeAt.Equal(reached.Add(lcTest.probeWait(0))) {
		t.Fatalf("after the plateau fell: probe at %v, want %v after %v", s.LearnedProbeAt, lcTest.probeWait(0), reached)
	}
	at = s.LearnedProbeAt
	plateau, step := s.LearnedPlateau, s.LearnedStep
	rates := []float64{s.LearnedRate}
	for i := 0; i < 3; i++ {
		if !lcTest.raiseRate(&s, at, 0) {
			t.Fatalf("step %d over the plateau refused", i+1)
		}
		rates = append(rates, s.LearnedRate)
		if i == 0 {
			// The first probe is judged over the first plateau wait.
			if next := at.Add(lcTest.probeWait(0)); !s.LearnedNext.Equal(next) || lcTest.raiseRate(&s, next.Add(-time.Millisecond), 0) {
				t.Fatalf("the first probe's next step at %v, want %v", s.LearnedNext, next)
			}
			at = at.Add(lcTest.probeWait(0))
			continue
		}
		at = at.Add(lcTest.every)
	}
	want := []float64{plateau, plateau + step/2, plateau + step/2 + 2*step, plateau + step/2 + 6*step}
	for i := range want {
		if !near(rates[i], want[i]) {
			t.Fatalf("the rates over the plateau %v, want %v (half a step, then doubled steps once the probe held)", rates, want)
		}
	}
	if !near(s.LearnedPlateau, want[2]) || !strings.Contains(s.LearnedReason, "doubled") {
		t.Fatalf("after three steps over it the plateau is %v (%s), want %v: the last rate that held", s.LearnedPlateau, s.LearnedReason, want[2])
	}
	if !lcTest.cutRate(&s, at.Add(-lcTest.every+time.Second), 0, 0, 0, "why", false) || !near(s.LearnedPlateau, want[2]) || s.LearnedProbes != 1 {
		t.Fatalf("a throttle of the doubled step: plateau %v probes %d, want %v and 1", s.LearnedPlateau, s.LearnedProbes, want[2])
	}
	// A cut of a probe that kept the rate over the plateau: the rate waits
	// where it is, as at a plateau.
	kept := DestState{LearnedRate: 30, LearnedStep: 3, LearnedPlateau: 20}
	if !lcTest.cutRate(&kept, t0, 28, 0, 0, "why", false) || !near(kept.LearnedRate, 25.2) {
		t.Fatalf("cut from 30 with 28 delivered: %v, want 25.2", kept.LearnedRate)
	}
	if !near(kept.LearnedPlateau, 25.2) || kept.LearnedProbes != 1 || !kept.atPlateau(kept.LearnedHold) ||
		!kept.LearnedProbeAt.Equal(kept.LearnedHold.Add(lcTest.probeWait(1))) {
		t.Fatalf("a cut over the plateau: plateau %v probes %d probe at %v", kept.LearnedPlateau, kept.LearnedProbes, kept.LearnedProbeAt)
	}
	// forget clears it with the rest.
	lcTest.plateau(&s, 10, 0)
	if !forgetLearned(&s) || s.LearnedPlateau != 0 || !s.LearnedProbeAt.IsZero() {
		t.Fatalf("forget kept the plateau: %v", s.LearnedPlateau)
	}
}

// TestLearnStepAtLowRates: at low rates the step is still a tenth of the
// rate the cut set, down to 0.1/s. A fixed 0.5/s step took a rate cut to 90% of
// a 2/s limit 15% over it at the first step, and of a 1/s limit 40% over:
// a cut every other step, 43% of the attempts throttled.
func TestLearnStepAtLowRates(t *testing.T) {
	for _, limit := range []float64{1, 2, 3} {
		s := DestState{LearnedRate: 1.5 * limit}
		lcTest.cutRate(&s, t0, limit, 0, 0, "why", false) // to 90% of what was accepted
		if !near(s.LearnedRate, 0.9*limit) {
			t.Fatalf("limit %v: cut to %v, want %v", limit, s.LearnedRate, 0.9*limit)
		}
		if !lcTest.raiseRate(&s, s.LearnedHold, 0) {
			t.Fatalf("limit %v/s: no step after the hold", limit)
		}
		if s.LearnedRate > limit+1e-9 {
			t.Errorf("limit %v/s: the first step after the cut went to %.2f/s", limit, s.LearnedRate)
		}
	}
	// The floor still climbs: from LearnMin in steps of learnMinStep.
	s := DestState{LearnedRate: 1}
	lcTest.cutRate(&s, t0, 0, 0, 0, "why", false)
	for range 3 {
		lcTest.cutRate(&s, s.LearnedHold, 0, 0, 0, "why", false)
	}
	if s.LearnedRate != lcTest.min || !near(s.LearnedStep, learnMinStep) {
		t.Fatalf("at the floor: rate %v step %v", s.LearnedRate, s.LearnedStep)
	}
}

func TestLearnCeiling(t *testing.T) {
	var s DestState
	lcTest.cutRate(&s, t0, 100, 0, 30, "why", false) // 50, capped at 30
	if s.LearnedRate != 30 {
		t.Fatalf("seed %v above the ceiling 30", s.LearnedRate)
	}
	s.LearnedRate = 29.5
	lcTest.raiseRate(&s, t0.Add(time.Minute), 30)
	if s.LearnedRate != 30 || lcTest.raiseRate(&s, t0.Add(2*time.Minute), 30) {
		t.Fatalf("raised to %v past the ceiling 30", s.LearnedRate)
	}
	// A configured rate caps a learned one in the effective fleet rate.
	th := &Throttle{}
	if r := th.fleetRate(Limits{Rate: 5}, DestState{LearnedRate: 8}, t0); r != 5 {
		t.Fatalf("fleet rate %v with 5 configured and 8 learned", r)
	}
	if r := th.fleetRate(Limits{}, DestState{LearnedRate: 8}, t0); r != 8 {
		t.Fatalf("fleet rate %v with nothing configured and 8 learned", r)
	}
	if r := th.fleetRate(Limits{}, DestState{LearnedRate: 8, RateOverride: 3}, t0); r != 3 {
		t.Fatalf("fleet rate %v: a pin must win over what was learned", r)
	}
}

func TestLearnDecayAndForget(t *testing.T) {
	var s DestState
	lcTest.cutRate(&s, t0, 20, 0, 0, "why", false)
	lcTest.cutConns(&s, t0, 8, 0, "why", false)
	if s.idle(t0.Add(2 * time.Hour)) {
		t.Fatal("a state with learned limits reads as idle and would be deleted")
	}
	if s.decayed(t0.Add(59*time.Minute), time.Hour) {
		t.Fatal("decayed before the quiet period")
	}
	if !s.decayed(t0.Add(time.Hour), time.Hour) {
		t.Fatal("not decayed after the quiet period")
	}
	if !forgetLearned(&s) || s.learned() || s.LearnedRate != 0 || s.LearnedConns != 0 || !s.LearnedSince.IsZero() {
		t.Fatalf("forget left %+v", s)
	}
	if forgetLearned(&s) {
		t.Fatal("forgetting nothing reported a change")
	}
}

func TestLearnConns(t *testing.T) {
	var s DestState
	lcTest.cutConns(&s, t0, 9, 0, "why", false)
	if s.LearnedConns != 4 {
		t.Fatalf("seed from 9 in flight: %d, want 4", s.LearnedConns)
	}
	if lcTest.cutConns(&s, t0.Add(time.Second), 9, 0, "why", false) {
		t.Fatal("cut within the hold")
	}
	lcTest.cutConns(&s, t0.Add(3*time.Second), 9, 0, "why", false)
	lcTest.cutConns(&s, t0.Add(6*time.Second), 9, 0, "why", false)
	lcTest.cutConns(&s, t0.Add(9*time.Second), 9, 0, "why", false)
	if s.LearnedConns != 1 {
		t.Fatalf("floor: %d, want 1", s.LearnedConns)
	}
	// At one, the plateau: the next step waits for it.
	if s.LearnedConnsPlateau != 1 || lcTest.raiseConns(&s, s.LearnedConnsProbeAt.Add(-time.Millisecond), 0) {
		t.Fatalf("stepped before the plateau's wait: %+v", s)
	}
	if !lcTest.raiseConns(&s, s.LearnedConnsProbeAt, 0) || s.LearnedConns != 2 {
		t.Fatalf("step up: %d", s.LearnedConns)
	}
	if c := fleetConns(Limits{Conns: 10}, DestState{LearnedConns: 3}, t0); c != 3 {
		t.Fatalf("fleet conns %d: learned 3 under a configured 10", c)
	}
	if c := fleetConns(Limits{Conns: 2}, DestState{LearnedConns: 3}, t0); c != 2 {
		t.Fatalf("fleet conns %d: a configured 2 caps a learned 3", c)
	}
}

func TestRateWindow(t *testing.T) {
	var w rateWindow
	span := 5 * time.Second
	if w.spanRate(t0, span) != 0 {
		t.Fatal("empty window has a rate")
	}
	// A burst 400 ms old: measured over 400 ms, not diluted by five
	// seconds; one 10 ms old over at least 200 ms.
	for i := range 20 {
		w.add(t0.Add(time.Duration(i)*20*time.Millisecond), 1, span)
	}
	if r := w.spanRate(t0.Add(400*time.Millisecond), span); !near(r, 50) {
		t.Fatalf("burst rate %v, want 50", r)
	}
	var b rateWindow
	for i := range 4 {
		b.add(t0.Add(time.Duration(i)*time.Millisecond), 1, span)
	}
	if r := b.spanRate(t0.Add(10*time.Millisecond), span); !near(r, 20) {
		t.Fatalf("rate of a 10 ms burst %v, want 4 over 200ms = 20", r)
	}
	// Steady 10/s for 10 s: the window's 5 s.
	var s rateWindow
	for i := range 100 {
		s.add(t0.Add(time.Duration(i)*100*time.Millisecond), 1, span)
	}
	if r := s.spanRate(t0.Add(10*time.Second-time.Millisecond), span); r < 9 || r > 11 {
		t.Fatalf("steady rate %v, want about 10", r)
	}
	// Silence longer than the slots remember.
	if r := s.spanRate(t0.Add(time.Minute), span); r != 0 {
		t.Fatalf("rate %v after a minute of silence", r)
	}
}

func TestSlotSharesTheRateBetweenTenants(t *testing.T) {
	d := &dest{}
	one := func(string) float64 { return 1 }
	// Tenant A's campaign: 1,000 envelopes at 20/s reach 50 s out.
	var last time.Time
	for range 1000 {
		last = d.slot("a", t0, t0, 20, one, 0)
	}
	if got := last.Sub(t0); got < 49*time.Second || got > 50*time.Second {
		t.Fatalf("A's last slot %s ahead, want ~50s", got)
	}
	// Tenant B's 20 messages then: B's queue is its own, at half the rate.
	var bLast time.Time
	for range 20 {
		bLast = d.slot("b", t0, t0, 20, one, 0)
	}
	if got := bLast.Sub(t0); got > 2*time.Second {
		t.Fatalf("B's 20th slot %s ahead: behind A's backlog", got)
	}
	if n := d.waiting(t0); n < 990 || n > 1030 {
		t.Fatalf("waiting %d, want about 1020", n)
	}
	// Weights: a tenant weighing 3 gets three quarters.
	w := &dest{}
	weigh := func(t string) float64 {
		if t == "vip" {
			return 3
		}
		return 1
	}
	w.slot("bulk", t0, t0, 10, weigh, 0)
	var v time.Time
	for range 3 {
		v = w.slot("vip", t0, t0, 10, weigh, 0)
	}
	if got := v.Sub(t0); !near(got.Seconds(), 2*4.0/(3*10)) {
		t.Fatalf("vip's third slot %s ahead, want %.3fs", got, 2*4.0/(3*10))
	}
}

// TestLearnedRateIsSharedAndSplit runs the learning through the KV: one
// worker's throttle seeds a rate for an unconfigured destination that the
// other worker applies at once, split in shares; a burst of throttles on
// both workers cuts once; the metric follows; Forget clears it everywhere.
func TestLearnedRateIsSharedAndSplit(t *testing.T) {
	env := startKV(t)
	reg := prometheus.NewRegistry()
	var mu sync.Mutex
	var changes []string
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Registerer = reg
		c.LearnHold = time.Hour
		c.OnLearned = func(dest, change string, s DestState) {
			mu.Lock()
			defer mu.Unlock()
			changes = append(changes, change)
		}
	})
	b := newThrottle(t, env, "b", nil)
	waitLive(t, 2, a, b)
	if got := a.Snapshot("l.test"); got.FleetRate != 0 || got.RateSource != "unlimited" {
		t.Fatalf("before: %+v", got)
	}
	// A delivers 30 in a burst, then meets a throttle, with one more
	// attempt in flight on each worker.
	for range 30 {
		attempt(t, a, "l.test", resDelivered)
	}
	inA, inB := mustAdmit(t, a, "l.test"), mustAdmit(t, b, "l.test")
	attempt(t, a, "l.test", resThrottled)
	got := a.Snapshot("l.test")
	// 30 delivered within 200 ms, times two live workers (B reported
	// nothing yet), times 0.5.
	if got.RateSource != "learned" || !near(got.LearnedRate, 150) || !strings.Contains(got.LearnedReason, "seeded") {
		t.Fatalf("A after the throttle: %+v", got)
	}
	learned := got.LearnedRate
	eventually(t, 2*time.Second, "B applies A's learned rate, split in two", func() bool {
		s := b.Snapshot("l.test")
		return s.FleetRate == learned && near(s.WorkerRate, learned/2) && s.RateSource == "learned"
	})
	// The throttles of the attempts in flight at the seed, within the
	// hold: no second cut (an attempt admitted since, at the seeded rate,
	// would cut it: TestThrottleOfAPacedAttemptCutsAgain).
	inB.Done([]classify.Result{resThrottled})
	inA.Done([]classify.Result{resThrottled})
	eventually(t, 2*time.Second, "stored", func() bool {
		st, err := GetState(ctxT(t), env.state, "l.test")
		return err == nil && st.LearnedRate == learned && st.LearnedReason != ""
	})
	if r := b.Snapshot("l.test").LearnedRate; r != learned {
		t.Fatalf("B's throttle within the hold cut %v to %v", learned, r)
	}
	eventually(t, 2*time.Second, "metric", func() bool {
		return metricValue(t, a.m.learned.WithLabelValues("l.test")) == learned
	})
	mu.Lock()
	if len(changes) != 1 || changes[0] != "learned-rate" {
		t.Fatalf("OnLearned calls: %v", changes)
	}
	mu.Unlock()
	if ok, err := Forget(ctxT(t), env.state, "l.test", "ops"); err != nil || !ok {
		t.Fatalf("Forget: %v %v", ok, err)
	}
	for _, th := range []*Throttle{a, b} {
		eventually(t, 2*time.Second, "forgotten", func() bool {
			s := th.Snapshot("l.test")
			return s.FleetRate == 0 && s.LearnedRate == 0 && s.RateSource == "unlimited"
		})
	}
}

// TestThrottleOfAPacedAttemptCutsAgain: within the hold, the throttle of an
// attempt that was in flight when the rate was seeded changes nothing, and
// the throttle of one admitted after it, paced at the seeded rate, cuts
// that rate at once.
func TestThrottleOfAPacedAttemptCutsAgain(t *testing.T) {
	env := startKV(t)
	var ahead atomic.Int64 // this worker's clock: the real one, moved on by the test
	a := newThrottle(t, env, "a", func(c *Config) {
		c.LearnHold = time.Hour
		c.MaxWait = time.Hour
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	inFlight := mustAdmit(t, a, "h.test")
	// Past the burst's first moments, when a throttle seeds at once.
	ahead.Store(int64(2 * learnMinElapsed))
	attempt(t, a, "h.test", resThrottled) // the seed: first contact
	seeded := a.Snapshot("h.test").LearnedRate
	if seeded != learnFirstContact {
		t.Fatalf("seed %v, want %v", seeded, learnFirstContact)
	}
	inFlight.Done([]classify.Result{resThrottled})
	if r := a.Snapshot("h.test").LearnedRate; r != seeded {
		t.Fatalf("an attempt in flight at the seed cut it to %v within the hold", r)
	}
	attempt(t, a, "h.test", resThrottled) // admitted at the seeded rate
	if r := a.Snapshot("h.test").LearnedRate; !near(r, seeded*0.5) {
		t.Fatalf("a paced attempt's throttle left the rate at %v, want %v", r, seeded*0.5)
	}
}

// TestLearnedRateClimbsOnlyWhileBinding: steps up need the rate to be what
// holds traffic back; an idle destination keeps its rate.
func TestLearnedRateClimbsOnlyWhileBinding(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) {
		c.LearnHold = 20 * time.Millisecond
		c.LearnEvery = 40 * time.Millisecond
		c.MaxWait = time.Hour
	})
	attempt(t, a, "c.test", resThrottled) // first contact: 1/s
	start := a.Snapshot("c.test").LearnedRate
	if start != learnFirstContact {
		t.Fatalf("seed %v", start)
	}
	// Delivered attempts at the learned rate (each waits for its token,
	// so the rate binds): it climbs.
	eventually(t, 30*time.Second, "climbs while binding", func() bool {
		attempt(t, a, "c.test", resDelivered)
		return a.Snapshot("c.test").LearnedRate >= start+3*learnMinStep
	})
}

// TestConnectionThrottleTeachesConns: "too many connections" teaches a
// connection limit and does not cut the rate.
func TestConnectionThrottleTeachesConns(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.LearnInitial = -1 }) // six in flight at first contact
	var ps []Permit
	for range 6 {
		ps = append(ps, mustAdmit(t, a, "k.test"))
	}
	ps[0].Done([]classify.Result{resConn})
	s := a.Snapshot("k.test")
	if s.LearnedConns != 3 || s.FleetConns != 3 || s.LearnedRate != 0 || s.FleetRate != 0 {
		t.Fatalf("after a connection throttle with 6 in flight: %+v", s)
	}
	for _, p := range ps[1:] {
		p.Done([]classify.Result{resDelivered})
	}
	eventually(t, 2*time.Second, "stored", func() bool {
		st, err := GetState(ctxT(t), env.state, "k.test")
		return err == nil && st.LearnedConns == 3
	})
}

// TestPaceSpacesThrottledMail: throttled envelopes of a destination with a
// rate get consecutive places in its queue of throttled mail from the
// lane's minimum on, not backoff waves, and fresh mail refused for the rate
// does not queue behind them.
func TestPaceSpacesThrottledMail(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 10 })
	if _, _, ok := newThrottle(t, env, "solo", func(c *Config) { c.NoLearn = true }).Pace("none.test", "", "", time.Time{}); ok {
		// Nothing configured and nothing to learn: no rate to pace at.
		t.Fatal("paced a destination without a rate")
	}
	// Nothing learned yet (a throttle whose seed waits for the rest of
	// the burst): paced at the first-contact rate, not the lane's draw.
	first := newThrottle(t, env, "first", func(c *Config) { c.LearnInitial = -1 })
	p1, p2 := mustAdmit(t, first, "none.test"), mustAdmit(t, first, "none.test")
	p1.Done([]classify.Result{resThrottled})
	if at, by, ok := first.Pace("none.test", "", "", time.Time{}); !ok || by != "1.00/s first-contact" || time.Until(at) > time.Second {
		t.Fatalf("first contact: paced %v by %q, %s ahead; want 1/s", ok, by, time.Until(at))
	}
	p2.Done([]classify.Result{resDelivered})
	// Nor without a throttle waiting for a seed (TestPaceAfterAConnectionThrottle).
	if _, _, ok := first.Pace("other.test", "", "", time.Time{}); ok {
		t.Fatal("paced a destination with no rate and no seed coming")
	}
	earliest := time.Now().Add(time.Minute)
	prev := earliest
	for i := range 20 {
		at, by, ok := a.Pace("p.test", "t1", "", earliest)
		if !ok || by != "10.00/s configured" {
			t.Fatalf("pace with a configured rate: %v %q", ok, by)
		}
		if i == 0 && !at.Equal(earliest) {
			t.Fatalf("first slot %s, want the lane's minimum %s", at, earliest)
		}
		if i > 0 && !near(at.Sub(prev).Seconds(), 0.1) {
			t.Fatalf("slot %d is %s after the previous, want 100ms", i, at.Sub(prev))
		}
		prev = at
	}
	if r := a.Snapshot("p.test"); r.Deferred < 19 {
		t.Fatalf("deferred %d, want the 20 paced", r.Deferred)
	}
	d := a.getDest("p.test")
	d.mu.Lock()
	refusal := d.slot("t1", time.Now(), time.Now(), 10, a.weight, 0)
	d.mu.Unlock()
	if time.Until(refusal) > time.Second {
		t.Fatalf("a refusal's place is %s ahead: behind the throttled mail", time.Until(refusal))
	}
}

// TestOverShare: a tenant whose backlog reaches further ahead than another
// sending tenant's yields the next token; alone, or level, it does not.
func TestOverShare(t *testing.T) {
	d := &dest{}
	one := func(string) float64 { return 1 }
	d.seen("a", t0)
	for range 200 {
		d.slot("a", t0, t0, 20, one, 0) // 10 s ahead
	}
	if d.overShare("a", t0, unweighted) {
		t.Fatal("a lone tenant is over its share")
	}
	d.seen("b", t0)
	if !d.overShare("a", t0, unweighted) || d.overShare("b", t0, unweighted) {
		t.Fatalf("with b sending: a over %v, b over %v; want a yields to b", d.overShare("a", t0, unweighted), d.overShare("b", t0, unweighted))
	}
	if d.overShare("a", t0.Add(tenantActive+time.Second), unweighted) {
		t.Fatal("b stopped sending, yet a still yields to it")
	}
	// b's few envelopes wait for places beyond tenantActive (behind
	// tokens a reserved before b came): b is still sending when they
	// come back, and a still yields to it.
	later := t0.Add(tenantActive + time.Second)
	for range 5 {
		d.slot("b", later, t0, 20, one, 0)
	}
	if !d.overShare("a", later, unweighted) || d.overShare("b", later, unweighted) {
		t.Fatalf("b's envelopes waiting in the queue: a over %v, b over %v; want a yields to b", d.overShare("a", later, unweighted), d.overShare("b", later, unweighted))
	}
}

// TestLearnedRateSurvivesAndDecays: a worker that starts later (or again)
// applies what the fleet learned; after the quiet period it is forgotten
// fleet-wide, and the destination is unlimited again.
func TestLearnedRateSurvivesAndDecays(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.LearnForget = 300 * time.Millisecond })
	attempt(t, a, "d.test", resThrottled)
	if a.Snapshot("d.test").LearnedRate != learnFirstContact {
		t.Fatalf("not learned: %+v", a.Snapshot("d.test"))
	}
	eventually(t, 2*time.Second, "stored", func() bool {
		st, err := GetState(ctxT(t), env.state, "d.test")
		return err == nil && st.LearnedRate == learnFirstContact
	})
	late := newThrottle(t, env, "late", func(c *Config) { c.LearnForget = 300 * time.Millisecond })
	if s := late.Snapshot("d.test"); s.LearnedRate != learnFirstContact || s.RateSource != "learned" {
		t.Fatalf("a worker started after the learning does not apply it: %+v", s)
	}
	for _, th := range []*Throttle{a, late} {
		eventually(t, 5*time.Second, "decayed to unknown", func() bool {
			s := th.Snapshot("d.test")
			return s.LearnedRate == 0 && s.RateSource == "unlimited"
		})
	}
	st, err := GetState(ctxT(t), env.state, "d.test")
	if err != nil || st.learned() {
		t.Fatalf("stored state after decay: %+v %v", st, err)
	}
}

// TestConnSignal: replies about concurrent connections teach a connection
// limit, replies about message rate a rate. Exchange's per-source limit
// (MaxInboundConnectionPerSource) read as a rate throttle: its rate was cut
// at every reply while the connections it counts stayed as they were.
func TestConnSignal(t *testing.T) {
	conn := []string{
		"The maximum number of concurrent server connections has exceeded a per-source limit, closing transmission channel",
		"The maximum number of concurrent server connections has exceeded a limit, closing transmission channel",
		"The maximum number of concurrent connections per resource forest has exceeded a limit, closing transmission channel.",
		"Too many concurrent SMTP connections from this IP address; please try again later.",
		"mx.example.com Error: too many connections from 192.0.2.1",
		"Connection rate limit exceeded.",
		"Service unavailable, concurrency limit reached",
		"Server is not currently available, possibly due to too many connections",
	}
	rate := []string{
		"Our system has detected an unusual rate of unsolicited mail originating from your IP address.",
		"The mail server [192.0.2.1] has been temporarily rate limited due to IP reputation.",
		"[TSS04] Messages from 192.0.2.1 temporarily deferred due to unexpected volume or user complaints",
		"Too many messages, slow down",
	}
	for _, s := range conn {
		if !connSignal.MatchString(s) {
			t.Errorf("not a connection signal: %q", s)
		}
	}
	for _, s := range rate {
		if connSignal.MatchString(s) {
			t.Errorf("a connection signal: %q", s)
		}
	}
}

// TestLearnStepWaitsForItsSegment: with several workers on the grid, a
// step up is in force only from its grid segment's start (slots.go); the
// next step waits for LearnEvery of it there, and a throttle before then
// cuts from the rate that was in force. Alone (no ahead), a step is in
// force at once.
func TestLearnStepWaitsForItsSegment(t *testing.T) {
	lc := lcTest
	lc.ahead = 3 * time.Second
	var s DestState
	lc.cutRate(&s, t0, 20, 0, 0, "why", false) // seed 10, its grid from t0
	at := t0.Add(lc.hold)
	if !lc.raiseRate(&s, at, 0) || !near(s.LearnedRate, 20) {
		t.Fatalf("slow start: %v, want 20", s.LearnedRate)
	}
	from := s.Grid[len(s.Grid)-1].From
	if from.Before(at.Add(lc.ahead - time.Second)) {
		t.Fatalf("segment from %s after the step at %s, want about %s ahead", from.Sub(t0), at.Sub(t0), lc.ahead)
	}
	if !s.LearnedNext.Equal(from.Add(lc.every)) {
		t.Fatalf("next step at %s, want LearnEvery after the segment's start %s", s.LearnedNext.Sub(t0), from.Sub(t0))
	}
	if lc.raiseRate(&s, at.Add(lc.every), 0) {
		t.Fatal("stepped again before the first step was in force for LearnEvery")
	}
	if r := s.inForce(from.Add(-time.Millisecond)); !near(r, 10) {
		t.Fatalf("in force just before the segment: %v, want 10", r)
	}
	if r := s.inForce(from); !near(r, 20) {
		t.Fatalf("in force from the segment: %v, want 20", r)
	}
	// A throttle before the segment starts answered 10/s, not 20.
	cut := s
	if !lc.cutRate(&cut, from.Add(-time.Millisecond), 0, 0, 0, "why", false) || !near(cut.LearnedRate, 5) || !strings.Contains(cut.LearnedReason, "at 10.00/s") {
		t.Fatalf("cut before the segment: %v (%s), want 5 from 10", cut.LearnedRate, cut.LearnedReason)
	}
	// Alone: in force at once, the next step LearnEvery later.
	var one DestState
	lcTest.cutRate(&one, t0, 20, 0, 0, "why", false)
	at = t0.Add(lcTest.hold)
	lcTest.raiseRate(&one, at, 0)
	if !one.LearnedNext.Equal(at.Add(lcTest.every)) || !near(one.inForce(at), 20) {
		t.Fatalf("alone: next step at %s, in force %v", one.LearnedNext.Sub(t0), one.inForce(at))
	}
}

// TestFleetCutHoldsFromItsSegment: with several workers a cut's grid
// segment starts gridReach ahead (a step's, max-wait more), and until then
// the workers send at the cut's rate on the old grid's slots. The hold runs
// LearnHold from the segment's start, so a throttle of an attempt sent
// there does not cut again (two daemons under a 6/s limit went from 5/s
// to 2.75 this way, 2.2 s after a cut whose segment started at 3 s); an
// attempt paced on the segment still cuts at once. A step taken meanwhile
// is not in force before the cut's segment has started, nor is the rate
// before the cut.
func TestFleetCutHoldsFromItsSegment(t *testing.T) {
	lc := lcTest
	cfg := (&Config{MaxWait: 2 * time.Second}).learn()
	lc.ahead, lc.cutAhead = cfg.ahead, cfg.cutAhead
	if lc.cutAhead >= lc.ahead {
		t.Fatalf("a cut's segment %s ahead, a step's %s: the cut's turns are taken again, it need not wait max-wait", lc.cutAhead, lc.ahead)
	}
	var s DestState
	lc.cutRate(&s, t0, 20, 0, 0, "why", false) // seed 10
	s.LearnedSlowStart = false
	cutAt := t0.Add(time.Minute)
	if !lc.cutRate(&s, cutAt, 0, 0, 0, "why", false) || !near(s.LearnedRate, 5) {
		t.Fatalf("cut: %v, want 5", s.LearnedRate)
	}
	from := s.Grid[len(s.Grid)-1].From
	if from.Sub(cutAt) != lc.cutAhead || !s.LearnedHold.Equal(from.Add(lc.hold)) {
		t.Fatalf("segment from +%s, hold until +%s: want the hold LearnHold after the segment's start", from.Sub(cutAt), s.LearnedHold.Sub(cutAt))
	}
	late := cutAt.Add(lc.hold + time.Millisecond) // past LearnHold after the cut, before the segment's
	if again := s; lc.cutRate(&again, late, 0, 0, 0, "why", false) {
		t.Fatalf("a throttle %s after the cut, its segment at +%s, cut again to %v", late.Sub(cutAt), from.Sub(cutAt), again.LearnedRate)
	}
	if paced := s; !lc.cutRate(&paced, from.Add(time.Millisecond), 0, 0, 0, "why", true) || !near(paced.LearnedRate, 2.5) {
		t.Fatalf("a paced attempt's throttle on the cut's segment: %v, want 2.5", paced.LearnedRate)
	}
	// A step before the cut's segment: 5 is in force until the cut's
	// segment, and after it until the step's own.
	s.LearnedHold, s.LearnedNext = cutAt, cutAt
	if !lc.raiseRate(&s, cutAt.Add(time.Second), 0) || !near(s.LearnedRate, 5.5) {
		t.Fatalf("step: %v, want 5.5", s.LearnedRate)
	}
	step := s.Grid[len(s.Grid)-1].From
	for _, c := range []struct {
		at   time.Time
		want float64
	}{{cutAt.Add(time.Second), 5}, {from, 5}, {step.Add(-time.Millisecond), 5}, {step, 5.5}} {
		if r := s.inForce(c.at); !near(r, c.want) {
			t.Fatalf("in force at +%s after the cut: %v, want %v", c.at.Sub(cutAt), r, c.want)
		}
	}
}

// TestRateWindowSpanRate: spanRate reads a steady rate as itself wherever
// in a second it is read (the count over the window's span alone read it
// about half early in a second).
func TestRateWindowSpanRate(t *testing.T) {
	span := 2 * time.Second
	steady := func(until time.Time) *rateWindow { // 10/s from t0 to until
		var w rateWindow
		for at := t0; !at.After(until); at = at.Add(100 * time.Millisecond) {
			w.add(at, 1, span)
		}
		return &w
	}
	for _, ms := range []int{9950, 9500, 9050} {
		now := t0.Add(time.Duration(ms) * time.Millisecond)
		if r := steady(now).spanRate(now, span); r < 9 || r > 11 {
			t.Fatalf("spanRate at +%dms: %v, want about 10", ms, r)
		}
	}
}

// TestRateWindowTrickle: mail that comes further apart than the window's
// span reads as what it is. Each delivery starts a new "burst" (add), and
// the count over a longer span divided by the time since the last one read
// one delivery every 2 to 3 s as 5 to 15/s; and a lone delivery is not a
// rate the binding test can count (sustainedRate; a seed reads it over its
// time since, spanRate).
func TestRateWindowTrickle(t *testing.T) {
	for _, every := range []time.Duration{2100 * time.Millisecond, 3 * time.Second} {
		var w rateWindow
		for i := range 6 {
			now := t0.Add(time.Duration(i) * every)
			w.add(now, 1, 2*time.Second)
			for _, span := range []time.Duration{2 * time.Second, 10 * time.Second, 15 * time.Second} {
				truth := 1 / every.Seconds()
				if r := w.sustainedRate(now, span); r > 1.01/span.Seconds()+truth {
					t.Fatalf("one delivery every %v, the %dth: spanRate over %v = %.2f/s", every, i+1, span, r)
				}
			}
		}
	}
}

// TestLearnedStepOnTrickle: a learned rate is not raised by mail that
// trickles at a twentieth of it.
func TestLearnedStepOnTrickle(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	d := th.getDest("b.test")
	d.mu.Lock()
	defer d.mu.Unlock()
	now := th.now()
	d.state.LearnedRate, d.state.Grid = 10, []GridSegment{{From: now.Add(-time.Minute), Rate: 10}}
	for at := now.Add(-8 * time.Second); !at.After(now); at = at.Add(2 * time.Second) {
		d.delivered.add(at, 1, th.cfg.LearnWindow)
	}
	th.raiseLearned(d, now, time.Time{})
	if d.pending&pendLearn != 0 {
		t.Fatal("stepped up a 10/s learned rate on 0.5/s of mail")
	}
}

// TestLearnedStepNeedsTheRateReached: a step up tests the rate in force,
// so it needs this worker's deliveries at (nearly) its share of it; mail
// at half the rate does not raise it, whatever waited for a token.
func TestLearnedStepNeedsTheRateReached(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	d := th.getDest("b.test")
	d.mu.Lock()
	d.state.LearnedRate, d.state.Grid = 10, []GridSegment{{From: th.now().Add(-time.Minute), Rate: 10}}
	d.mu.Unlock()
	// Two attempts back to back: the second waits for its token.
	mustAdmit(t, th, "b.test").Done(nil)
	mustAdmit(t, th, "b.test").Done(nil)
	d.mu.Lock()
	defer d.mu.Unlock()
	now := th.now()
	deliver := func(every time.Duration) {
		d.delivered = rateWindow{}
		for at := now.Add(-3 * time.Second); !at.After(now); at = at.Add(every) {
			d.delivered.add(at, 1, th.cfg.LearnWindow)
		}
	}
	deliver(200 * time.Millisecond) // 5/s
	th.raiseLearned(d, now, time.Time{})
	if d.pending&pendLearn != 0 {
		t.Fatal("stepped up at half the learned rate")
	}
	deliver(100 * time.Millisecond) // 10/s
	th.raiseLearned(d, now, time.Time{})
	if d.pending&pendLearn == 0 {
		t.Fatal("no step at the learned rate")
	}
}

// TestLearnSeedWaitsForTheBurst: a throttle that is a burst's first reply,
// while the rest of it is in flight, does not seed the first-contact rate:
// the next reply seeds from what was delivered meanwhile. Past
// learnMinElapsed into the burst it seeds as before.
func TestLearnSeedWaitsForTheBurst(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", func(c *Config) { c.LearnInitial = 3 }) // a burst of three
	p1, p2, p3 := mustAdmit(t, th, "s.test"), mustAdmit(t, th, "s.test"), mustAdmit(t, th, "s.test")
	p1.Done([]classify.Result{resThrottled})
	if r := th.Snapshot("s.test").LearnedRate; r != 0 {
		t.Fatalf("seeded %v at a burst's first reply, the rest in flight", r)
	}
	p2.Done([]classify.Result{resDelivered})
	p3.Done([]classify.Result{resThrottled})
	// One delivery over learnMinElapsed: 5/s, times 0.5.
	if r := th.Snapshot("s.test").LearnedRate; !near(r, 2.5) {
		t.Fatalf("seed %v, want 2.5 from the burst's delivery", r)
	}

	q1, q2 := mustAdmit(t, th, "late.test"), mustAdmit(t, th, "late.test")
	d := th.getDest("late.test")
	d.mu.Lock()
	d.burstFrom = th.now().Add(-time.Second)
	d.mu.Unlock()
	q1.Done([]classify.Result{resThrottled})
	if r := th.Snapshot("late.test").LearnedRate; r != learnFirstContact {
		t.Fatalf("a second into the burst: seed %v, want first contact %v", r, learnFirstContact)
	}
	q2.Done(nil)
}

// TestFirstContactWindow: a destination with no rate starts at
// LearnInitial attempts in flight, one more for each delivered attempt; a
// throttle seeds a rate, which paces from then on instead.
func TestFirstContactWindow(t *testing.T) {
	env := startKV(t)
	const initial = 4
	a := newThrottle(t, env, "a", func(c *Config) { c.MaxWait = time.Hour; c.LearnInitial = initial })
	var ps []Permit
	for range initial {
		ps = append(ps, mustAdmit(t, a, "f.test"))
	}
	p, r := a.Admit(ctxT(t), "f.test", "", "")
	if p != nil || r.Reason != "window" || time.Until(r.Until) > windowRetry {
		t.Fatalf("attempt %d at first contact: %+v, want refused for the window", initial+1, r)
	}
	ps[0].Done([]classify.Result{resDelivered}) // 3 in flight, window 5
	ps = ps[1:]
	ps = append(ps, mustAdmit(t, a, "f.test"), mustAdmit(t, a, "f.test"))
	if _, r := a.Admit(ctxT(t), "f.test", "", ""); r.Reason != "window" {
		t.Fatalf("a sixth in flight after one delivery: %+v, want refused for the window", r)
	}
	if s := a.Snapshot("f.test"); s.FirstWindow != initial+1 || s.InFlight != 5 {
		t.Fatalf("window %d in flight %d, want %d and 5", s.FirstWindow, s.InFlight, initial+1)
	}
	// The first throttle seeds a rate: the rate paces, the window is gone.
	for _, p := range ps[:4] {
		p.Done([]classify.Result{resDelivered})
	}
	ps[4].Done([]classify.Result{resThrottled})
	if s := a.Snapshot("f.test"); s.LearnedRate <= 0 {
		t.Fatalf("not seeded: %+v", s)
	}
	for range 3 {
		p, r := a.Admit(ctxT(t), "f.test", "", "")
		if p == nil {
			if r.Reason == "window" {
				t.Fatalf("refused for the window with a learned rate: %+v", r)
			}
			continue
		}
		defer p.Done(nil)
	}
	if s := a.Snapshot("f.test"); s.FirstWindow != 0 {
		t.Fatalf("window %d with a learned rate, want 0 (not in use)", s.FirstWindow)
	}

	// Split between live workers; none with a configured rate or without
	// learning.
	quiet := func() bool { return false }
	for place, want := range []int{2, 1, 1} {
		if w, on := (&dest{}).firstWindow(&Config{LearnInitial: 4}, 0, 3, func() int { return place }, quiet); !on || w != want {
			t.Fatalf("share of 4 for 3 workers at place %d: %d (%v), want %d", place, w, on, want)
		}
	}
	for _, c := range []struct {
		cfg   Config
		fleet float64
	}{{Config{LearnInitial: 4}, 10}, {Config{LearnInitial: 4, NoLearn: true}, 0}, {Config{LearnInitial: -1}, 0}} {
		if w, on := (&dest{}).firstWindow(&c.cfg, c.fleet, 1, func() int { return 0 }, quiet); on {
			t.Fatalf("%+v at %v/s: window %d, want none", c.cfg, c.fleet, w)
		}
	}
}

// TestFirstContactWindowWidensOnAnswers: the first-contact window widens
// on every attempt the server answers with other than a throttle, not on
// deliveries alone: a destination that greylists or bounces most of what
// it is sent opens up round trip by round trip as one that delivers does.
// Before, it stayed at LearnInitial (2) in flight fleet-wide for good:
// 4,000 answered attempts left the window at 2. A throttle, about the
// destination, a mailbox or connections, does not widen it.
func TestFirstContactWindowWidensOnAnswers(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.MaxWait = time.Hour }) // LearnInitial 2
	bounce := classify.Result{Class: classify.Permanent, Scope: classify.ScopeRecipient, Rule: "user-unknown", Code: 550}
	grey := classify.Result{Class: classify.Transient, Scope: classify.ScopeRecipient, Rule: "greylist", Code: 450}
	mailbox := classify.Result{Class: classify.Throttled, Scope: classify.ScopeRecipient, Rule: "mailbox-rate", Code: 452}
	want := DefaultLearnInitial
	for _, c := range []struct {
		res    classify.Result
		widens bool
	}{{bounce, true}, {grey, true}, {mailbox, false}, {resConn, false}, {resConnFail, false}, {resDelivered, true}} {
		attempt(t, a, "g.test", c.res)
		if c.widens {
			want++
		}
		if s := a.Snapshot("g.test"); s.FirstWindow != want {
			t.Fatalf("after %s: window %d, want %d", c.res.Rule, s.FirstWindow, want)
		}
		if c.res.Text == resConn.Text {
			time.Sleep(connsRetry) // no new connection at once after it (connPaused)
		}
	}

	// Round trips of answers that deliver nothing: the window doubles on
	// each, as it does on deliveries, and is soon wider than a worker's
	// delivery slots.
	for round := range 5 {
		var ps []Permit
		for {
			p, r := a.Admit(ctxT(t), "b.test", "", "")
			if p == nil {
				if r.Reason != "window" {
					t.Fatalf("refused %+v, want the window", r)
				}
				break
			}
			ps = append(ps, p)
		}
		if want := DefaultLearnInitial << round; len(ps) != want {
			t.Fatalf("round %d: %d admitted, want %d", round, len(ps), want)
		}
		for i, p := range ps {
			p.Done([]classify.Result{[]classify.Result{bounce, grey}[i%2]})
		}
	}
	if s := a.Snapshot("b.test"); s.FirstWindow < 64 {
		t.Fatalf("window %d after five round trips of bounces and greylisting, want 64", s.FirstWindow)
	}
}

// twoWorkers starts two workers on one KV store, both live.
func twoWorkers(t *testing.T) (a, b *Throttle) {
	env := startKV(t)
	a, b = newThrottle(t, env, "a", nil), newThrottle(t, env, "b", nil)
	waitLive(t, 2, a, b)
	return a, b
}

// TestSeedFromOneDeliveryIsThisWorkers: with a peer that has not reported
// yet, this worker's delivered rate stands for each live worker's, but not
// when it is one delivery: the provider took that one from this worker.
// (Within a burst's first learnMinElapsed such a seed waits for the
// others: TestFleetFirstThrottleWaitsForTheDelivery.)
func TestSeedFromOneDeliveryIsThisWorkers(t *testing.T) {
	a, _ := twoWorkers(t)
	attempt(t, a, "one.test", resDelivered)
	d := a.getDest("one.test")
	d.mu.Lock()
	d.burstFrom = a.now().Add(-time.Second)
	d.mu.Unlock()
	attempt(t, a, "one.test", resThrottled)
	// One delivery over learnMinElapsed (5/s), times 0.5.
	if r := a.Snapshot("one.test").LearnedRate; !near(r, 2.5) {
		t.Fatalf("seed from one delivery with two live workers: %v, want 2.5", r)
	}
	attempt(t, a, "two.test", resDelivered)
	attempt(t, a, "two.test", resDelivered)
	attempt(t, a, "two.test", resThrottled)
	// Two (10/s), times two workers, times 0.5.
	if r := a.Snapshot("two.test").LearnedRate; !near(r, 10) {
		t.Fatalf("seed from two deliveries with two live workers: %v, want 10", r)
	}
}

// TestFleetFirstThrottleWaitsForTheDelivery: two workers each start a new
// destination with one attempt in flight, widening by one per delivery,
// and the provider takes what its burst allows. A worker whose throttle
// comes with no delivery of its own, or one, and no report from the other
// yet, does not seed from that at once (1/s, or 5/s times 0.5 under a
// 20/s limit that took four at once): it takes no attempt for windowRetry,
// a seed from the worker with more deliveries comes meanwhile, and
// otherwise its own is applied when the wait is over, without another
// throttle. Past learnMinElapsed into the burst it seeds at once.
func TestFleetFirstThrottleWaitsForTheDelivery(t *testing.T) {
	a, b := twoWorkers(t)
	attempt(t, b, "f.test", resThrottled)
	if r := b.Snapshot("f.test").LearnedRate; r != 0 {
		t.Fatalf("B seeded %v at once, with no delivery of its own", r)
	}
	if p, r := b.Admit(ctxT(t), "f.test", "", ""); p != nil || r.Reason != "window" {
		t.Fatalf("B after its seedless throttle: permit %v, refusal %+v; want the window shut", p != nil, r)
	}
	attempt(t, a, "f.test", resDelivered)
	attempt(t, a, "f.test", resDelivered)
	attempt(t, a, "f.test", resThrottled)
	// Two deliveries within learnMinElapsed (10/s), times two workers, times 0.5.
	if r := a.Snapshot("f.test").LearnedRate; !near(r, 10) {
		t.Fatalf("A's seed from its two deliveries: %v, want 10", r)
	}
	eventually(t, 2*time.Second, "B takes A's seed", func() bool { return near(b.Snapshot("f.test").LearnedRate, 10) })
	// B's own seed, due when its wait is over, does not undo A's.
	shutOver(b, "f.test")
	mustAdmit(t, b, "f.test").Done(nil)
	if r := b.Snapshot("f.test").LearnedRate; !near(r, 10) {
		t.Fatalf("B's deferred seed replaced A's: %v", r)
	}
	d := b.getDest("f.test")
	d.mu.Lock()
	kept := d.deferred != nil
	d.mu.Unlock()
	if kept {
		t.Fatal("B kept its deferred seed after A's came: it would seed when the rate is forgotten")
	}

	// One delivery each: both wait, and the first to admit after the
	// wait seeds from its own delivery (5/s, times 0.5).
	attempt(t, a, "one.test", resDelivered)
	attempt(t, a, "one.test", resThrottled)
	if r := a.Snapshot("one.test").LearnedRate; r != 0 {
		t.Fatalf("A seeded %v from its one delivery, B not heard from", r)
	}
	shutOver(a, "one.test")
	mustAdmit(t, a, "one.test").Done(nil)
	if r := a.Snapshot("one.test").LearnedRate; !near(r, 2.5) {
		t.Fatalf("A's deferred seed: %v, want 2.5", r)
	}

	// Later in the burst the throttle seeds first contact.
	attempt(t, b, "late.test", resDelivered) // opens the burst; not counted...
	d = b.getDest("late.test")
	d.mu.Lock()
	d.burstFrom, d.delivered = b.now().Add(-time.Second), rateWindow{} // ...and a second ago
	d.mu.Unlock()
	attempt(t, b, "late.test", resThrottled)
	if r := b.Snapshot("late.test").LearnedRate; r != learnFirstContact {
		t.Fatalf("a second into the burst: seed %v, want first contact %v", r, learnFirstContact)
	}
}

// shutOver ends th's first-contact wait on domain, as windowRetry would.
func shutOver(th *Throttle, domain string) {
	d := th.getDest(domain)
	d.mu.Lock()
	if d.deferred != nil {
		d.deferred.until = th.now().Add(-time.Millisecond)
	}
	d.mu.Unlock()
}

// TestOverShareCountsWaitingAdmissions: a tenant whose admissions fill the
// delivery slots, waiting in process for their turns, has a backlog too,
// though none of it is in the virtual queue (32 turns 1.6 s ahead at 20/s
// never reach max-wait): another tenant that starts sending gets the next
// tokens. Before, it got every other token, and tenant B's p99 in
// scenario 6.4 went from 3.3 to 5.8 s.
func TestOverShareCountsWaitingAdmissions(t *testing.T) {
	d := &dest{}
	d.bucket.setRate(t0, 20)
	d.seen("a", t0)
	for range 32 {
		d.hold("a", 1)
	}
	if d.overShare("a", t0, unweighted) {
		t.Fatal("a lone tenant is over its share")
	}
	d.seen("b", t0)
	d.hold("b", 1)
	if !d.overShare("a", t0, unweighted) || d.overShare("b", t0, unweighted) {
		t.Fatalf("a with 32 waiting, b with 1: a over %v, b over %v; want a yields to b", d.overShare("a", t0, unweighted), d.overShare("b", t0, unweighted))
	}
	// a's turns come and go: with 20 waiting it is within a second of b.
	for range 12 {
		d.hold("a", -1)
	}
	if d.overShare("a", t0, unweighted) {
		t.Fatal("a yields with 20 waiting against b's 1 (a second of turns)")
	}
}

// TestLearnJudgedOverRepliesAtLowRates: under 2/s a hold after a cut and a
// step's judgement last learnSpanMsgs deliveries of the new rate, not
// LearnEvery: at 0.25/s a step judged over 2 s rested on no reply.
func TestLearnJudgedOverRepliesAtLowRates(t *testing.T) {
	s := DestState{LearnedRate: 0.6}
	if !lcTest.cutRate(&s, t0, 0, 0, 0, "why", false) || !near(s.LearnedRate, 0.3) {
		t.Fatalf("cut to %v", s.LearnedRate)
	}
	if h := lcTest.at(0.3).hold; h < 13*time.Second || h > 14*time.Second {
		t.Fatalf("hold at 0.3/s %v, want learnSpanMsgs / 0.3 s", h)
	}
	if want := t0.Add(lcTest.at(0.3).hold); !s.LearnedHold.Equal(want) {
		t.Fatalf("hold until %v, want %v (learnSpanMsgs at 0.3/s)", s.LearnedHold.Sub(t0), want.Sub(t0))
	}
	at := s.LearnedHold
	if !lcTest.raiseRate(&s, at, 0) {
		t.Fatal("no step after the hold")
	}
	if want := at.Add(lcTest.at(s.LearnedRate).every); !s.LearnedNext.Equal(want) {
		t.Fatalf("next step at %v, want %v", s.LearnedNext.Sub(at), want.Sub(at))
	}
	// At 2/s and above the defaults stand.
	fast := DestState{LearnedRate: 40}
	lcTest.cutRate(&fast, t0, 0, 0, 0, "why", false)
	if !fast.LearnedHold.Equal(t0.Add(lcTest.hold)) {
		t.Fatalf("hold at 20/s until %v, want %v", fast.LearnedHold.Sub(t0), lcTest.hold)
	}
}

// TestDrainMarks: the delivered rate between throttles counts from the
// oldest throttle within drainHorizon that another throttle followed, and
// gives no reading on fewer than drainMin deliveries.
func TestDrainMarks(t *testing.T) {
	var m drainMarks
	m.mark(t0, 100)
	if r := m.drained(t0.Add(40*time.Second), 120); r != 0 {
		t.Fatalf("no throttle between: reading %v, want none", r)
	}
	m.mark(t0.Add(20*time.Second), 110)
	if r := m.drained(t0.Add(40*time.Second), 121); !near(r, 20.0/40) {
		t.Fatalf("21 deliveries over 40 s: %v, want (21-1)/40", r)
	}
	if r := m.drained(t0.Add(40*time.Second), 105); r != 0 {
		t.Fatalf("5 deliveries: reading %v, want none", r)
	}
	// The first mark out of the horizon: the second has no throttle after it.
	if r := m.drained(t0.Add(drainHorizon+time.Second), 200); r != 0 {
		t.Fatalf("past the horizon: %v, want none", r)
	}
	// Throttles closer than drainHorizon/8 share a mark.
	m.mark(t0.Add(21*time.Second), 111)
	if last := m.marks[len(m.marks)-1].at; last != t0.Add(20*time.Second) {
		t.Fatalf("a second mark a second after the last: %v", last.Sub(t0))
	}
}

// TestLearnCutToTheRateBetweenThrottles: over a bucket with a burst, what
// the learning window saw delivered is the burst; the rate between
// throttles is a floor under the limit, and the cut and the plateau go to
// it (never below DecreaseFactor of the rate throttled).
func TestLearnCutToTheRateBetweenThrottles(t *testing.T) {
	base := DestState{LearnedRate: 0.9, LearnedHold: t0}
	s := base
	lcTest.cutRate(&s, t0, 0.9, 0, 0, "why", false)
	if !near(s.LearnedRate, 0.81) || !near(s.LearnedPlateau, 0.855) {
		t.Fatalf("without a reading: rate %v plateau %v, want 0.81 and 0.855", s.LearnedRate, s.LearnedPlateau)
	}
	s = base
	lcTest.cutRate(&s, t0, 0.9, 0.6, 0, "why", false)
	if !near(s.LearnedRate, 0.57) || !near(s.LearnedPlateau, 0.6) || !strings.Contains(s.LearnedReason, "between throttles") {
		t.Fatalf("0.6/s between throttles: rate %v plateau %v (%s), want 0.57 and 0.6", s.LearnedRate, s.LearnedPlateau, s.LearnedReason)
	}
	s = base
	lcTest.cutRate(&s, t0, 0.9, 0.2, 0, "why", false)
	if !near(s.LearnedRate, 0.45) {
		t.Fatalf("0.2/s between throttles: rate %v, want DecreaseFactor of 0.9", s.LearnedRate)
	}
}

// TestThrottlesMarkTheRateBetweenThem: a worker's throttled replies after
// the first cut mark its delivered count, and alone it reads the rate
// between them as its own (drainedRate); with a peer live that has not
// reported the destination, times the live workers.
func TestThrottlesMarkTheRateBetweenThem(t *testing.T) {
	env := startKV(t)
	var ahead atomic.Int64
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Now = func() time.Time { return time.Now().Add(time.Duration(ahead.Load())) }
	})
	ahead.Store(int64(2 * learnMinElapsed))
	attempt(t, a, "m.test", resThrottled) // the seed: not marked
	attempt(t, a, "m.test", resThrottled) // paced at the seed: a cut, the end of the doubling
	attempt(t, a, "m.test", resDelivered)
	attempt(t, a, "m.test", resThrottled) // marked
	d := a.getDest("m.test")
	d.mu.Lock()
	marked, total := d.drains.throttles, d.delivered.total
	now := a.now()
	// Two throttles 20 s and 40 s ago, 21 deliveries since the first.
	d.drains = drainMarks{}
	d.drains.mark(now.Add(-40*time.Second), 0)
	d.drains.mark(now.Add(-20*time.Second), 10)
	d.delivered.total = 21
	alone := a.drainedRate(d, now)
	d.mu.Unlock()
	if marked != 1 || total != 1 {
		t.Fatalf("after a throttle and a delivery: %d throttles marked, %d deliveries counted", marked, total)
	}
	if !near(alone, 20.0/40) {
		t.Fatalf("alone: %v, want (21-1)/40", alone)
	}
	newThrottle(t, env, "b", nil)
	waitLive(t, 2, a)
	d.mu.Lock()
	fleet := a.drainedRate(d, now)
	d.mu.Unlock()
	if !near(fleet, 2*20.0/40) {
		t.Fatalf("a peer that has not reported m.test: %v, want twice this worker's", fleet)
	}
}

// TestLearnCutsAgainSinceTheSeed: from the seed on, a paced throttle of
// the rate the last paced cut (or the seed) set halves it when the window
// read at least that rate (first contact's burst), and keeps 90 % of what
// the window saw delivered when it read less. Once a step has come, paced
// cuts keep the floor again.
func TestLearnCutsAgainSinceTheSeed(t *testing.T) {
	var s DestState
	lcTest.cutRate(&s, t0, 100, 0, 0, "why", false) // seed 50 from a burst read as 100/s
	if !s.LearnedPaced {
		t.Fatal("the seed starts no chain of paced cuts")
	}
	// The first paced cut. Before, its floor was 90 % of the window's
	// reading, the burst the seed was halved from, which kept the rate
	// whole until the hold ran out: two daemons under a bucket of 20 at
	// 0.5/s met 60 throttles at the seed's rate in those three seconds.
	at := t0.Add(100 * time.Millisecond)
	if !lcTest.cutRate(&s, at, 90, 0, 0, "why", true) || !near(s.LearnedRate, 25) || !strings.Contains(s.LearnedReason, "again") {
		t.Fatalf("first paced cut: %v (%s), want half of 50", s.LearnedRate, s.LearnedReason)
	}
	at = at.Add(100 * time.Millisecond)
	if !lcTest.cutRate(&s, at, 53, 0, 0, "why", true) || !near(s.LearnedRate, 12.5) || !strings.Contains(s.LearnedReason, "again") {
		t.Fatalf("second paced cut: %v (%s), want half of 25", s.LearnedRate, s.LearnedReason)
	}
	// A window that read less than the rate throttled is not the burst:
	// its floor stands.
	under := s
	if !lcTest.cutRate(&under, at.Add(100*time.Millisecond), 10, 0, 0, "why", true) || !near(under.LearnedRate, 9) {
		t.Fatalf("paced cut at 12.5 with 10/s delivered: %v, want 90%% of 10", under.LearnedRate)
	}
	// A step ends the chain: a paced cut after it keeps the floor.
	if !lcTest.raiseRate(&s, s.LearnedHold, 0) || s.LearnedPaced {
		t.Fatalf("step: paced %v", s.LearnedPaced)
	}
	from := s.LearnedRate
	at = s.LearnedNext.Add(-time.Millisecond)
	if !lcTest.cutRate(&s, at, from, 0, 0, "why", true) || !near(s.LearnedRate, 0.9*from) {
		t.Fatalf("paced cut after a step: %v, want 90%% of %v", s.LearnedRate, from)
	}
	if lcTest.cutRate(&s, at.Add(time.Millisecond), from, 0, 0, "why", true) || !near(s.LearnedRate, 0.9*from) {
		t.Fatalf("second paced cut after a step: %v, want the floor to keep 90%% of %v", s.LearnedRate, from)
	}
}

// TestPacedAtTheTurn: a throttled attempt reserved before a cut's grid
// segment starts and sent on it was paced at the cut's rate; one sent
// before the segment, or reserved when another cut was the last, was not.
func TestPacedAtTheTurn(t *testing.T) {
	lc := lcTest
	lc.cutAhead = time.Second
	var s DestState
	lc.cutRate(&s, t0, 100, 0, 0, "why", false) // seed 50
	cut := t0.Add(100 * time.Millisecond)
	lc.cutRate(&s, cut, 10, 0, 0, "why", true) // halved on no burst's reading: its segment a second on
	from := s.Grid[len(s.Grid)-1].From
	if !from.After(cut) {
		t.Fatalf("segment from %v after a cut at %v", from, cut)
	}
	if !s.pacedAt(from.Add(10*time.Millisecond), s.LearnedCutAt) {
		t.Fatal("an attempt sent on the cut's segment is not paced")
	}
	if s.pacedAt(from.Add(-10*time.Millisecond), s.LearnedCutAt) {
		t.Fatal("an attempt sent before the cut's segment counts as paced")
	}
	if s.pacedAt(from.Add(10*time.Millisecond), t0) {
		t.Fatal("an attempt reserved when the seed was the last cut counts as paced at the cut")
	}
}

// TestFirstContactHalvingsStartAtOnce: in a fleet a cut's grid segment
// starts a second after it, except a halving of first contact's chain,
// whose rate is still far over the limit: its segment starts at once, and
// the next paced throttle can halve it again within milliseconds.
func TestFirstContactHalvingsStartAtOnce(t *testing.T) {
	lc := lcTest
	lc.cutAhead = time.Second
	var s DestState
	lc.cutRate(&s, t0, 100, 0, 0, "why", false) // seed 50 from a burst read as 100/s
	cut := t0.Add(100 * time.Millisecond)
	if !lc.cutRate(&s, cut, 100, 0, 0, "why", true) || !strings.Contains(s.LearnedReason, "again") {
		t.Fatalf("no halving: %v (%s)", s.LearnedRate, s.LearnedReason)
	}
	if from := s.Grid[len(s.Grid)-1].From; from.After(cut) {
		t.Fatalf("a halving of the chain starts its segment %v after the cut", from.Sub(cut))
	}
	next := cut.Add(50 * time.Millisecond)
	if !s.pacedAt(next, s.LearnedCutAt) || !lc.cutRate(&s, next, 100, 0, 0, "why", true) || !near(s.LearnedRate, 12.5) {
		t.Fatalf("a throttle sent 50 ms after the halving: rate %v, want 12.5", s.LearnedRate)
	}
	// Off the chain (the window reads less than the rate throttled), the
	// segment waits its second.
	off := next.Add(50 * time.Millisecond)
	if !lc.cutRate(&s, off, 5, 0, 0, "why", true) || strings.Contains(s.LearnedReason, "again") {
		t.Fatalf("a cut on a reading under the rate: %v (%s)", s.LearnedRate, s.LearnedReason)
	}
	if from := s.Grid[len(s.Grid)-1].From; !from.After(off) {
		t.Fatalf("a cut off the chain starts its segment at %v, the cut at %v", from, off)
	}
}

// TestLearnedReasonSaysWhatDecided: a learned rate's reason prints rates
// under 1/s with three significant digits, and says when learn-min or the
// configured rate, not the cut, set the rate. A postmortem read "cut …
// at 0.12/s, times 0.50" for a rate that landed on 0.10/s, and "0.12/s"
// to "0.12/s" for 0.125 to 0.1.
func TestLearnedReasonSaysWhatDecided(t *testing.T) {
	for _, c := range []struct {
		r    float64
		want string
	}{{0.125, "0.125/s"}, {0.1, "0.100/s"}, {0.0123, "0.0123/s"}, {1.5, "1.50/s"}, {20, "20.00/s"}} {
		if got := fmtPerSec(c.r); got != c.want {
			t.Errorf("fmtPerSec(%v) = %q, want %q", c.r, got, c.want)
		}
	}
	s := DestState{LearnedRate: 0.125, LearnedStep: 0.0125, LearnedHold: t0, LearnedNext: t0}
	if !lcTest.cutRate(&s, t0.Add(time.Second), 0, 0, 0, "why", false) || !near(s.LearnedRate, lcTest.min) {
		t.Fatalf("cut 0.125/s to %v, want learn-min's %v", s.LearnedRate, lcTest.min)
	}
	if want := "cut: throttled (why) at 0.125/s, times 0.50; at least learn-min's 0.100/s"; s.LearnedReason != want {
		t.Errorf("reason %q, want %q", s.LearnedReason, want)
	}
	var seeded DestState
	lcTest.cutRate(&seeded, t0, 40, 0, 8, "why", false)
	if !near(seeded.LearnedRate, 8) || !strings.HasSuffix(seeded.LearnedReason, "; at most the configured 8.00/s") {
		t.Errorf("seed under a configured 8/s: %v, %q", seeded.LearnedRate, seeded.LearnedReason)
	}
}

// TestBlockResumesOnTheFirstDelivery: a learned rate cut from 20/s to
// 2/s by a block (a run of cuts, written to the shared state here). A
// throttle whose window saw nothing delivered starts the quiet; the first
// delivery resumeQuiet or more later resumes the rate at a quarter of the
// 20/s, fleet-wide. A delivery sooner is a limit still letting mail
// through, and resumes nothing.
func TestBlockResumesOnTheFirstDelivery(t *testing.T) {
	for _, c := range []struct {
		name  string
		quiet bool // the quiet began resumeQuiet ago
	}{{"after a quiet", true}, {"too soon", false}} {
		t.Run(c.name, func(t *testing.T) {
			env := startKV(t)
			th := newThrottle(t, env, "a", nil)
			cut := th.now().Add(-time.Minute)
			if _, _, _, _, err := updateState(ctxT(t), env.state, "blocked.test", "test", func(s *DestState, _ time.Time) bool {
				s.LearnedRate, s.LearnedStep, s.LearnedRunFrom = 2, 0.2, 20
				s.LearnedCutAt, s.LearnedHold, s.LearnedNext = cut, cut.Add(2*time.Second), cut.Add(2*time.Second)
				s.LearnedPlateau, s.LearnedSince = 2, cut
				s.Grid = []GridSegment{{From: cut, Rate: 2}}
				return true
			}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 5*time.Second, "the state seen", func() bool { return th.Snapshot("blocked.test").LearnedRate == 2 })
			d := th.getDest("blocked.test")

			attempt(t, th, "blocked.test", resThrottled)
			d.mu.Lock()
			since := d.quietSince
			if c.quiet {
				d.quietSince = since.Add(-resumeQuiet) // as if the block had lasted
			}
			d.mu.Unlock()
			if since.IsZero() {
				t.Fatal("a throttle with nothing delivered in the window started no quiet")
			}
			eventually(t, 5*time.Second, "the cut written", func() bool {
				d.mu.Lock()
				defer d.mu.Unlock()
				return d.pending&pendLearn == 0
			})
			rate := th.Snapshot("blocked.test").LearnedRate
			attempt(t, th, "blocked.test", resDelivered)
			if !c.quiet {
				// A resume is queued by Done itself (changeLearned's pending bit).
				d.mu.Lock()
				queued, r := d.pending&pendLearn != 0, d.state.LearnedRate
				d.mu.Unlock()
				if queued || r != rate {
					t.Fatalf("a change queued (%v), rate %v after a delivery within the quiet, want none and %v", queued, r, rate)
				}
				return
			}
			eventually(t, 5*time.Second, "resumed at 5/s", func() bool { return th.Snapshot("blocked.test").LearnedRate == 5 })
			s, err := GetState(ctxT(t), env.state, "blocked.test")
			if err != nil || s.LearnedRate != 5 || s.LearnedRunFrom != 0 || !strings.HasPrefix(s.LearnedReason, "resumed") ||
				s.LearnedPlateau != 20*(1-learnPlateauMargin) {
				t.Fatalf("shared state after the resume: %+v, %v", s, err)
			}
		})
	}
}
