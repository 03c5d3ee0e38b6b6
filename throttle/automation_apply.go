package throttle

import (
	"math"
	"strconv"
	"time"
)

// automate applies a fired automation rule's action for its duration.
// d.mu held.
func (t *Throttle) automate(d *dest, r *autoRule, now time.Time) {
	until := now.Add(r.For)
	reason := "automation: " + r.Name
	lim := d.limits // read under d.mu; fn may run later, in the writer
	var fn func(s *DestState, now time.Time) bool
	var change string
	var from, to func(s DestState) string
	switch r.Action {
	case ActionSuspend:
		change = "suspend"
		fn = func(s *DestState, _ time.Time) bool {
			if !s.SuspendedUntil.Before(until) {
				return false // already suspended at least as long
			}
			s.SuspendedUntil, s.Reason = until, reason
			return true
		}
		from = func(s DestState) string { return fmtUntil(s.SuspendedUntil, now) }
		to = func(s DestState) string { return "suspended until " + s.SuspendedUntil.Format(time.RFC3339) }
	case ActionRate:
		// A rule slows a destination down; it never speeds one up, and
		// never takes an operator's pin away. An operator's pin until
		// changed (dest rate without --for) is left alone; another
		// override in force is joined (the lower rate until the later
		// end); without one, a learned or configured rate already at or
		// under the rule's value is left alone. The factor is not
		// counted: the throttle reply that fired the rule has usually
		// just cut it, for a minute, and the rule is for its for.
		change = "rate-override"
		fn = func(s *DestState, now time.Time) bool {
			value, end := r.Value, until
			if ov, ok := s.rateOverride(now); ok {
				if s.RateUntil.IsZero() {
					return false
				}
				value, end = math.Min(ov, value), laterOf(s.RateUntil, end)
			} else if base := t.baseRate(lim, *s); base > 0 && base <= value {
				return false
			}
			if value == s.RateOverride && end.Equal(s.RateUntil) {
				return false
			}
			s.RateOverride, s.RateUntil = value, end
			return true
		}
		from = func(s DestState) string { return fmtRate(s.rateOverride(now)) }
		to = func(s DestState) string {
			return fmtRate(s.RateOverride, true) + " until " + s.RateUntil.Format(time.RFC3339)
		}
	case ActionFactor:
		change = "factor-cut"
		fn = func(s *DestState, _ time.Time) bool {
			if s.RateFactor() <= r.Value && !s.FactorUntil.Before(until) {
				return false
			}
			s.Factor = math.Min(s.RateFactor(), r.Value)
			if s.FactorUntil.Before(until) {
				s.FactorUntil = until
			}
			return true
		}
		from = func(s DestState) string { return fmtFactor(s.RateFactor()) }
		to = func(s DestState) string { return fmtFactor(s.RateFactor()) }
	case ActionConns:
		change = "conns-override"
		n := int(r.Value)
		fn = func(s *DestState, now time.Time) bool {
			// As for rate: never more connections, never an operator's
			// pin taken away.
			value, end := n, until
			if ov, ok := s.connsOverride(now); ok {
				if s.ConnsUntil.IsZero() {
					return false
				}
				value, end = min(ov, value), laterOf(s.ConnsUntil, end)
			} else if cur := fleetConns(lim, *s, now); cur > 0 && cur <= value {
				return false
			}
			if value == s.ConnsOverride && end.Equal(s.ConnsUntil) {
				return false
			}
			s.ConnsOverride, s.ConnsUntil = value, end
			return true
		}
		from = func(s DestState) string {
			if ov, ok := s.connsOverride(now); ok {
				return strconv.Itoa(ov)
			}
			return "configured"
		}
		to = func(s DestState) string {
			return strconv.Itoa(s.ConnsOverride) + " until " + s.ConnsUntil.Format(time.RFC3339)
		}
	default:
		return // validated at construction
	}
	// Fired once for the fleet: while the rule's action is in force
	// (Rules), a firing by any worker changes nothing; one that applies
	// records its end.
	act := fn
	fn = func(s *DestState, now time.Time) bool {
		if end, ok := s.Rules[r.Name]; ok && now.Before(end) {
			return false
		}
		if !act(s, now) {
			return false
		}
		rules := make(map[string]time.Time, len(s.Rules)+1)
		for name, end := range s.Rules {
			if now.Before(end) {
				rules[name] = end
			}
		}
		rules[r.Name] = until
		s.Rules = rules
		return true
	}
	fn(&d.state, now)
	t.enqueue(op{d: d, change: change, fn: fn, after: func(b, a DestState) {
		t.transition(d.name, change, from(b), to(a), reason)
	}})
}

// baseRate is the rate a destination's sending comes back to without a
// temporary cut: the learned rate capped by the configured one, or the
// configured one; 0 = unlimited. effectiveRate without the factor and the
// override.
func (t *Throttle) baseRate(l Limits, s DestState) float64 {
	if s.LearnedRate > 0 && !t.cfg.NoLearn && (l.Rate <= 0 || s.LearnedRate < l.Rate) {
		return s.LearnedRate
	}
	return l.Rate
}

func fmtFactor(f float64) string { return strconv.FormatFloat(f, 'f', 3, 64) }

func fmtRate(r float64, ok bool) string {
	if !ok {
		return "configured"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "/s"
}

func fmtUntil(until, now time.Time) string {
	if now.Before(until) {
		return "suspended until " + until.Format(time.RFC3339)
	}
	return "active"
}
