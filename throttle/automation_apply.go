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
		fn = suspendTill(until, reason)
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
			ov, ok := s.rateOverride(now)
			return narrow(&s.RateOverride, &s.RateUntil, ov, ok, t.baseRate(lim, *s), r.Value, until)
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
			ov, ok := s.connsOverride(now)
			return narrow(&s.ConnsOverride, &s.ConnsUntil, ov, ok, fleetConns(lim, *s, now), n, until)
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

// suspendTill is the state change of a suspension until until for reason,
// made by a rule or a block of a source address (sourceblock.go): none
// when the destination is already suspended at least as long, so that a
// suspension is never shortened.
func suspendTill(until time.Time, reason string) func(s *DestState, now time.Time) bool {
	return func(s *DestState, _ time.Time) bool {
		if !s.SuspendedUntil.Before(until) {
			return false
		}
		s.SuspendedUntil, s.Reason = until, reason
		return true
	}
}

// narrow applies a rule's limit value until until to an override (value
// *v until *end) and reports whether it changed it. An override in force
// (ov, inForce) until changed is an operator's pin, left alone; one with an
// end is joined: the lower value until the later end. Without one, base,
// the limit otherwise in force (0 = unlimited), already at or under value
// leaves it alone.
func narrow[T int | float64](v *T, end *time.Time, ov T, inForce bool, base, value T, until time.Time) bool {
	if inForce {
		if end.IsZero() {
			return false
		}
		value, until = min(ov, value), laterOf(*end, until)
	} else if base > 0 && base <= value {
		return false
	}
	if value == *v && until.Equal(*end) {
		return false
	}
	*v, *end = value, until
	return true
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
