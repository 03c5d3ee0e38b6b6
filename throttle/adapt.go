package throttle

import (
	"math"
	"time"
)

// cutFactor is the multiplicative decrease after a throttled reply to an
// attempt admitted at factor admitted. It cuts only from that factor: if
// the factor is already below it, locally or in the shared state, another
// worker (or this one) cut it since the attempt went out, for the same
// overload, which is not punished twice. The reply's own admission is
// what counts, not what this worker has seen by the time the reply came:
// another worker's cut that arrives while the attempt is in flight would
// otherwise be taken as the base of a second one. d.mu held.
func (t *Throttle) cutFactor(d *dest, now time.Time, admitted float64) {
	fn := func(s *DestState, now time.Time) bool {
		f := s.RateFactor()
		if f < admitted-1e-9 {
			return false
		}
		s.Factor = math.Max(t.cfg.MinFactor, f*t.cfg.DecreaseFactor)
		s.FactorBy = "" // a throttle's cut now, not a rule's
		// Never sooner than an automation rule's factor asked to hold.
		s.FactorUntil = laterOf(s.FactorUntil, now.Add(t.cfg.DecreaseFor))
		return true
	}
	fn(&d.state, now)
	d.pending |= pendCut
	t.enqueue(op{d: d, change: "factor-cut", flag: pendCut, fn: fn, after: func(b, a DestState) {
		t.transition(d.name, "rate-factor", fmtFactor(b.RateFactor()), fmtFactor(a.RateFactor()),
			"throttled reply; ramp back from "+a.FactorUntil.Format(time.RFC3339))
	}})
}

// rampFactor is one additive step back towards the configured rate. The
// shared write happens only if no other worker stepped within
// IncreaseEvery (FactorUntil is the next step's earliest time). Not applied
// locally first: the watcher brings it back within milliseconds. d.mu held.
func (t *Throttle) rampFactor(d *dest) {
	fn := func(s *DestState, now time.Time) bool {
		f := s.RateFactor()
		if f >= 1 || now.Before(s.FactorUntil) {
			return false
		}
		if nf := f + t.cfg.IncreaseStep; nf < 1-1e-9 {
			s.Factor, s.FactorUntil = nf, now.Add(t.cfg.IncreaseEvery)
		} else {
			s.Factor, s.FactorUntil, s.FactorBy = 1, time.Time{}, ""
		}
		return true
	}
	d.pending |= pendRamp
	t.enqueue(op{d: d, change: "factor-ramp", flag: pendRamp, fn: fn, after: func(b, a DestState) {
		t.transition(d.name, "rate-factor", fmtFactor(b.RateFactor()), fmtFactor(a.RateFactor()), "sustained success")
	}})
}
