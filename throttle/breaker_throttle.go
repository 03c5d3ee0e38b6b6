package throttle

import (
	"strconv"
	"time"
)

// openBreaker opens d's breaker locally and in the shared state. d.mu held.
func (t *Throttle) openBreaker(d *dest, now time.Time, from string) {
	failures := d.failures
	fn := func(s *DestState, now time.Time) bool {
		if s.BreakerAt(now) == BreakerOpen {
			return false
		}
		s.Breaker, s.BreakerUntil = BreakerOpen, now.Add(t.cfg.BreakerCooldown)
		return true
	}
	fn(&d.state, now)
	d.failures = 0
	d.pending |= pendBreaker
	reason := strconv.Itoa(failures) + " consecutive failed attempts"
	if from == BreakerHalfOpen {
		reason = "probe failed"
	}
	t.enqueue(op{d: d, change: "breaker-open", flag: pendBreaker, fn: fn, after: func(b, a DestState) {
		t.transition(d.name, "breaker", b.BreakerAt(a.UpdatedAt), BreakerOpen, reason+"; until "+a.BreakerUntil.Format(time.RFC3339))
	}})
}

// closeBreaker closes d's breaker after a successful probe. d.mu held.
func (t *Throttle) closeBreaker(d *dest, now time.Time) {
	fn := func(s *DestState, now time.Time) bool {
		if s.BreakerAt(now) != BreakerHalfOpen {
			return false
		}
		s.Breaker, s.BreakerUntil = BreakerClosed, time.Time{}
		return true
	}
	fn(&d.state, now)
	d.pending |= pendBreaker
	t.enqueue(op{d: d, change: "breaker-close", flag: pendBreaker, fn: fn, after: func(b, a DestState) {
		t.transition(d.name, "breaker", BreakerHalfOpen, BreakerClosed, "probe succeeded")
		if !a.Suspended(a.UpdatedAt) {
			t.recovered(d, a, "breaker closed")
		}
	}})
}

// breakerRefusal refuses an admission at now while d's breaker is open
// (reason "breaker-open") or half-open with its probe out
// ("breaker-half-open"); probe is when an attempt could next be let
// through: the end of the cooling period, or a cooldown from now while a
// probe is out. A few envelopes (probeSpares, per worker) are told to
// come back then, so that there is one to probe with; the others are held
// (holding) past it for up to holdMax: a backlog costs about holdBudget
// returns a second in total, not one per envelope per cooldown (2,000
// queued made 660 a second), and when a probe closes the breaker the
// recovery releases them (Config.OnRecover: serve re-times the
// destination's deferred mail at its rate, oldest first). d.mu held.
func (t *Throttle) breakerRefusal(d *dest, reason string, probe, now time.Time) Refusal {
	for i := range d.probeAt {
		if !d.probeAt[i].After(now) {
			d.probeAt[i] = probe
			return Refusal{Until: probe, Reason: reason, Detail: "kept for the probe at " + probe.UTC().Format(time.RFC3339Nano)}
		}
	}
	until, h := d.room.place(now, probe, t.cfg.BreakerCooldown, holdMax)
	return Refusal{Until: until, Reason: reason, Detail: "probe at " + probe.UTC().Format(time.RFC3339Nano) +
		": held " + h.Round(time.Millisecond).String() + "+ past it for the recovery release, " + d.room.held()}
}
