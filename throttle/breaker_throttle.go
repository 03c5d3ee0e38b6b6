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
