package throttle

import (
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// TestLearnedConnsStepDoesNotHoldACut: a "too many connections" reply
// right after a probe up cuts at once. A step used to set the hold of the
// cuts, and for LearnEvery after each probe no throttle could cut.
func TestLearnedConnsStepDoesNotHoldACut(t *testing.T) {
	s := DestState{LearnedConns: 2, LearnedConnsHold: t0.Add(-time.Second)}
	if !lcTest.raiseConns(&s, t0, 0) || s.LearnedConns != 3 {
		t.Fatalf("no step: %+v", s)
	}
	if !lcTest.cutConns(&s, t0.Add(100*time.Millisecond), 3, 0, "too many connections", false) {
		t.Fatalf("a connection throttle 100ms after the probe to 3 did not cut (hold until %v)", s.LearnedConnsHold.Sub(t0))
	}
	if s.LearnedConns != 1 || s.LearnedConnsPlateau != 2 {
		t.Fatalf("cut at 3: %d connections, plateau %d; want 1 and 2", s.LearnedConns, s.LearnedConnsPlateau)
	}
	// A throttle at one connection cuts nothing and writes nothing.
	if lcTest.cutConns(&s, s.LearnedConnsHold, 3, 0, "too many connections", false) {
		t.Fatalf("cut from 1: %+v", s)
	}
}

// TestLearnedConnsSettleUnderAFixedCap runs the connection learning
// against a provider that takes cap connections and refuses the rest at
// the greeting, for ten simulated minutes with the limit binding: the
// limit settles at the cap, and the probes over it cost a connection
// throttle each, ever further apart (the plateau). Without the plateau,
// and with each step holding cuts back, the limit went back over the cap
// every few seconds and stayed there for a whole step: the provider
// refused more connections than it took messages.
func TestLearnedConnsSettleUnderAFixedCap(t *testing.T) {
	for _, cap := range []int{1, 2, 5, 20} {
		s := DestState{}
		const tick = 100 * time.Millisecond
		refused, atCap, ticks := 0, 0, 0
		lcTest.cutConns(&s, t0, 2*cap+2, 0, "too many connections", false) // the seed
		for now := t0; now.Before(t0.Add(10 * time.Minute)); now = now.Add(tick) {
			ticks++
			switch {
			case s.LearnedConns > cap:
				// The connection over the cap is refused at once, each
				// tick it stays over: an attempt admitted under the
				// limit in force (paced).
				refused++
				lcTest.cutConns(&s, now, s.LearnedConns+1, 0, "too many connections", true)
			default:
				lcTest.raiseConns(&s, now, 0)
			}
			if s.LearnedConns == cap {
				atCap++
			}
		}
		t.Logf("cap %d: %d connection throttles in 10 minutes, at the cap %.1f%% of the time; %s", cap, refused, 100*float64(atCap)/float64(ticks), s.LearnedConnsReason)
		if refused > 12 {
			t.Errorf("cap %d: %d connection throttles in 10 minutes", cap, refused)
		}
		if atCap < ticks*8/10 {
			t.Errorf("cap %d: at the cap %d of %d ticks", cap, atCap, ticks)
		}
	}
}

// TestConnectionThrottlePausesReconnects: after a "too many connections"
// reply the worker does not open a new attempt in the refused one's place
// for connsRetry, even within the hold of a cut, when the learner leaves
// the limit alone; the attempts still in flight keep theirs.
func TestConnectionThrottlePausesReconnects(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.LearnInitial = -1 })
	var ps []Permit
	for range 9 {
		ps = append(ps, mustAdmit(t, a, "k.test"))
	}
	ps[0].Done([]classify.Result{resConn}) // seeds 4
	for _, p := range ps[1:7] {
		p.Done([]classify.Result{resDelivered})
	}
	// Two in flight, a limit of 4; within the cut's hold another refusal
	// cuts nothing.
	ps[7].Done([]classify.Result{resConn})
	if s := a.Snapshot("k.test"); s.LearnedConns != 4 || s.InFlight != 1 {
		t.Fatalf("after a second connection throttle within the hold: %+v", s)
	}
	if p, r := a.Admit(ctxT(t), "k.test", "", ""); p != nil || r.Reason != "conns" || time.Until(r.Until) > connsRetry {
		if p != nil {
			p.Done(nil)
		}
		t.Fatalf("an attempt in the refused one's place right after its throttle: admitted %v, refusal %+v", p != nil, r)
	}
	ps[8].Done([]classify.Result{resDelivered})
	// The place of an attempt that was working is not paused.
	mustAdmit(t, a, "k.test").Done([]classify.Result{resDelivered})
	eventually(t, 2*connsRetry, "admitted again after the pause", func() bool {
		p, _ := a.Admit(ctxT(t), "k.test", "", "")
		if p == nil {
			return false
		}
		defer p.Done([]classify.Result{resDelivered})
		p2, _ := a.Admit(ctxT(t), "k.test", "", "")
		if p2 != nil {
			p2.Done([]classify.Result{resDelivered})
		}
		return p2 != nil
	})
}

// TestPaceAfterAConnectionThrottle: a destination that learned a
// connection limit and no rate paces its throttled mail at the rate the
// fleet is delivered at, within a horizon, not at first contact's 1/s:
// no rate is coming, and a connection-capped provider's backlog drained
// at 1/s for good, its places reaching as far ahead as the backlog.
func TestPaceAfterAConnectionThrottle(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.LearnInitial = -1 })
	var ps []Permit
	for range 12 {
		ps = append(ps, mustAdmit(t, a, "k.test"))
	}
	for _, p := range ps[:10] {
		p.Done([]classify.Result{resDelivered})
	}
	ps[10].Done([]classify.Result{resConn})
	ps[11].Done([]classify.Result{resConn})
	if s := a.Snapshot("k.test"); s.LearnedConns == 0 || s.LearnedRate != 0 {
		t.Fatalf("after connection throttles: %+v", s)
	}
	var last time.Time
	for i := range 100 {
		at, by, ok := a.Pace("k.test", "", "", time.Time{})
		if !ok || !strings.HasSuffix(by, "/s delivered") {
			t.Fatalf("envelope %d paced %v by %q; want the delivered rate", i, ok, by)
		}
		last = laterOf(last, at)
	}
	if ahead := time.Until(last); ahead > 2*parkHorizon+time.Second {
		t.Fatalf("the 100th throttled envelope comes back %s ahead", ahead)
	}
	// A rate throttle of first contact whose seed waits for the rest of
	// the burst still paces at first contact's rate.
	p1, p2 := mustAdmit(t, a, "f.test"), mustAdmit(t, a, "f.test")
	p1.Done([]classify.Result{resThrottled})
	if _, by, ok := a.Pace("f.test", "", "", time.Time{}); !ok || by != "1.00/s first-contact" {
		t.Fatalf("first contact: paced %v by %q", ok, by)
	}
	p2.Done([]classify.Result{resDelivered})
}
