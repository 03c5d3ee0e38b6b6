package throttle

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// automate applies a fired automation rule's action for its duration
// and reports whether it changed anything in this worker's view of the
// state, and when not, why. A firing that changes nothing (an operator's
// cap with no end already lower, a suspension already longer) does not
// hold the rule: done starts its hold only for one that acts, so that the
// rule acts at its next firing once the cap is gone rather than stay
// silent for its for. d.mu held.
func (t *Throttle) automate(d *dest, r *autoRule, now time.Time) (bool, string) {
	until := now.Add(r.For)
	reason := "automation: " + r.Name
	lim := d.limits // read under d.mu; fn may run later, in the writer
	var act func(s *DestState, now time.Time) (bool, string)
	var change string
	var from, to func(s DestState) string
	switch r.Action {
	case ActionSuspend:
		change = "suspend"
		act = func(s *DestState, now time.Time) (bool, string) {
			if !suspendTill(until, reason)(s, now) {
				return false, "destination already suspended until " + s.SuspendedUntil.Format(time.RFC3339) + " (" + s.Reason + ")"
			}
			return true, ""
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
		act = func(s *DestState, now time.Time) (bool, string) {
			ov, ok := s.rateOverride(now)
			changed, why := narrow(&s.RateOverride, &s.RateUntil, ov, ok, t.baseRate(lim, *s), r.Value, until, fmtRateValue)
			if changed {
				s.RateBy = reason
			}
			return changed, why
		}
		from = func(s DestState) string { return fmtRate(s.rateOverride(now)) }
		to = func(s DestState) string {
			return fmtRate(s.RateOverride, true) + " until " + s.RateUntil.Format(time.RFC3339)
		}
	case ActionFactor:
		change = "factor-cut"
		act = func(s *DestState, _ time.Time) (bool, string) {
			if s.RateFactor() <= r.Value && !s.FactorUntil.Before(until) {
				return false, "factor already " + fmtFactor(s.RateFactor()) + ", held until " + s.FactorUntil.Format(time.RFC3339)
			}
			if s.RateFactor() > r.Value {
				s.FactorBy = reason
			}
			s.Factor = math.Min(s.RateFactor(), r.Value)
			if s.FactorUntil.Before(until) {
				s.FactorUntil = until
			}
			return true, ""
		}
		from = func(s DestState) string { return fmtFactor(s.RateFactor()) }
		to = func(s DestState) string { return fmtFactor(s.RateFactor()) }
	case ActionConns:
		change = "conns-override"
		n := int(r.Value)
		act = func(s *DestState, now time.Time) (bool, string) {
			// As for rate: never more connections, never an operator's
			// pin taken away.
			ov, ok := s.connsOverride(now)
			changed, why := narrow(&s.ConnsOverride, &s.ConnsUntil, ov, ok, fleetConns(lim, *s, now), n, until, strconv.Itoa)
			if changed {
				s.ConnsBy = reason
			}
			return changed, why
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
		return false, "unknown action" // validated at construction
	}
	// Fired once for the fleet: while the rule's action is in force
	// (Rules), a firing by any worker changes nothing; one that applies
	// records its end.
	apply := func(s *DestState, now time.Time) (bool, string) {
		if end := autoEnd(*s, r); now.Before(end) {
			return false, "in force until " + end.Format(time.RFC3339) + " (fired by another worker)"
		}
		if changed, why := act(s, now); !changed {
			return false, why
		}
		s.Rules = withRule(s.Rules, now, until, r.key, r.Name)
		return true, ""
	}
	return t.act(d, now, change, apply, func(b, a DestState) {
		t.transition(d.name, change, from(b), to(a), reason)
	})
}

// act applies a fired rule's change (apply) to this worker's view of d's
// state and, when it changed something, queues it for the shared state
// (where apply runs again on the state as stored) with after to log the
// transition. It reports apply's answer. d.mu held.
func (t *Throttle) act(d *dest, now time.Time, change string, apply func(s *DestState, now time.Time) (bool, string), after func(b, a DestState)) (bool, string) {
	if changed, why := apply(&d.state, now); !changed {
		return false, why
	}
	fn := func(s *DestState, now time.Time) bool {
		changed, _ := apply(s, now)
		return changed
	}
	t.enqueue(op{d: d, change: change, fn: fn, after: after})
	return true, ""
}

// automateTenant applies a fired suspend rule to tenant's part of d only
// (DestState.Tenants): the reply that fired it was about that tenant's
// own mail (classify scope tenant), and suspending the destination held
// every tenant's mail for one tenant's broken DKIM. Reported as automate.
// d.mu held.
func (t *Throttle) automateTenant(d *dest, r *autoRule, tenant string, now time.Time) (bool, string) {
	until := now.Add(r.For)
	reason := "automation: " + r.Name
	key := r.key + "/" + tenant
	apply := func(s *DestState, now time.Time) (bool, string) {
		if end := s.Rules[key]; now.Before(end) {
			return false, "in force for the tenant until " + end.Format(time.RFC3339) + " (fired by another worker)"
		}
		if h, ok := s.TenantSuspended(tenant, now); ok && !h.Until.Before(until) {
			return false, "tenant already suspended until " + h.Until.Format(time.RFC3339) + " (" + h.Reason + ")"
		}
		tenants := make(map[string]TenantHold, len(s.Tenants)+1)
		for k, h := range s.Tenants {
			if now.Before(h.Until) {
				tenants[k] = h
			}
		}
		tenants[tenant] = TenantHold{Until: until, Reason: reason}
		s.Tenants = tenants
		s.Rules = withRule(s.Rules, now, until, key, "")
		return true, ""
	}
	return t.act(d, now, "suspend-tenant", apply, func(b, a DestState) {
		from := "active"
		if h, ok := b.TenantSuspended(tenant, now); ok {
			from = "suspended until " + h.Until.Format(time.RFC3339)
		}
		t.log.Info().Str("dest", d.name).Str("tenant", tenant).Str("change", "suspend-tenant").Str("from", from).
			Str("to", "suspended until "+a.Tenants[tenant].Until.Format(time.RFC3339)).
			Str("reason", reason).Str("by", t.cfg.WorkerID).Msg("destination state changed for one tenant")
	})
}

// withRule is rules with key (and legacy, the plain name older daemons
// read, when not "") ending at until, and without the entries ended at now.
// A new map: a state's maps are never modified in place.
func withRule(rules map[string]time.Time, now, until time.Time, key, legacy string) map[string]time.Time {
	out := make(map[string]time.Time, len(rules)+2)
	for name, end := range rules {
		if now.Before(end) {
			out[name] = end
		}
	}
	out[key] = until
	if legacy != "" {
		out[legacy] = laterOf(out[legacy], until)
	}
	return out
}

// autoEnd is when r's action on the destination is in force until
// according to s.Rules: its own entry (name and definition, ruleKey); none
// when another version of the rule (the same name, another definition) is
// in force, which an edited rule is not held by; else the plain name an
// older daemon wrote, which may be this version's.
func autoEnd(s DestState, r *autoRule) time.Time {
	if end, ok := s.Rules[r.key]; ok {
		return end
	}
	prefix := r.Name + "#"
	for k := range s.Rules {
		if rest, ok := strings.CutPrefix(k, prefix); ok && !strings.Contains(rest, "/") {
			return time.Time{} // another version's: not this one's
		}
	}
	return s.Rules[r.Name]
}

// tenantRefuses refuses an admission of tenant's when a rule suspended
// its part of d (DestState.Tenants). d.mu held.
func tenantRefuses(d *dest, tenant string, now time.Time) (Refusal, bool) {
	h, ok := d.state.TenantSuspended(tenant, now)
	if !ok {
		return Refusal{}, false
	}
	until := h.Until
	if cap := now.Add(maxSuspendRefusal); until.After(cap) {
		until = cap
	}
	detail := d.name + " for tenant " + tenant
	if h.Reason != "" {
		detail += ": " + h.Reason
	}
	return Refusal{Until: until, Reason: "suspended", Detail: detail}, true
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
// *v until *end) and reports whether it changed it, and when not, why
// (values written by show). An override in force (ov, inForce) until
// changed is an operator's pin, left alone; one with an end is joined: the
// lower value until the later end. Without one, base, the limit otherwise
// in force (0 = unlimited), already at or under value leaves it alone.
func narrow[T int | float64](v *T, end *time.Time, ov T, inForce bool, base, value T, until time.Time, show func(T) string) (bool, string) {
	if inForce {
		if end.IsZero() {
			return false, "an operator's cap of " + show(ov) + " until changed is in force"
		}
		value, until = min(ov, value), laterOf(*end, until)
	} else if base > 0 && base <= value {
		return false, "the limit in force, " + show(base) + ", is already at or under the rule's " + show(value)
	}
	if value == *v && until.Equal(*end) {
		return false, "a cap of " + show(value) + " until " + until.Format(time.RFC3339) + " is in force already"
	}
	*v, *end = value, until
	return true, ""
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

func fmtRateValue(r float64) string { return strconv.FormatFloat(r, 'f', -1, 64) + "/s" }

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
