package worker

import (
	"time"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
)

// pace replaces a throttled envelope's backoff draw with its place in the
// destination's virtual queue when the destination has a rate (configured,
// pinned or learned): the rate-limit lane then gives the destination its
// mail back at that rate, oldest first, instead of in waves.
//
// A message's first throttle is most likely its share of an overshoot the
// rate has just been cut for, so it comes back at its place in the queue.
// So does its second when it comes within Config.ThrottleHold of the
// first: the place was given at the rate of that moment, before the cut
// for the overshoot could take effect, and the same overshoot answered
// again. Otherwise, from its second throttle on, the lane's minimum delay
// (--ratelimit-min) comes first, since a destination that keeps deferring
// one message is saying more than "slower". A server's own hint ("try
// again in 90 seconds") is always honoured when later. The draw stays in
// the record beside paced_by. With egress addresses, the place is in the
// queue of the (destination, source) pair the attempt went out from.
func (w *deliverer) pace(e *queue.Envelope, source string, now time.Time, dec *backoff.Decision) (time.Time, string, bool) {
	var earliest time.Time
	if e.ThrottleCount > 1 || e.ThrottleCount == 1 && !w.sameOvershoot(e, now) {
		earliest = now.Add(time.Duration(dec.MinMs) * time.Millisecond)
	}
	at, by, ok := w.cfg.Gate.Pace(e.Dest, e.Tenant, source, earliest)
	if !ok {
		return time.Time{}, "", false
	}
	if hint := now.Add(time.Duration(dec.HintMs) * time.Millisecond); hint.After(at) {
		at = hint
	}
	ms := (at.Sub(now) + time.Millisecond - 1).Milliseconds() // whole ms, rounded up: Delay is DelayMs exactly
	dec.DelayMs, dec.Delay = ms, time.Duration(ms)*time.Millisecond
	return now.Add(dec.Delay), by, true
}

// sameOvershoot reports whether e's previous attempt was a throttle less
// than Config.ThrottleHold before now: one overshoot, answered twice.
func (w *deliverer) sameOvershoot(e *queue.Envelope, now time.Time) bool {
	if len(e.History) == 0 {
		return false
	}
	last := e.History[len(e.History)-1]
	return last.Class == classify.Throttled.String() && now.Sub(last.At) < w.cfg.ThrottleHold
}
