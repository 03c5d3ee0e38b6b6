package worker

import (
	"time"

	"github.com/outflow/outflow/queue"
)

// Clocks. A worker reads its own wall clock (Config.Now) for every
// decision, and two kinds of decision compare it with a time another
// process wrote:
//
//   - max-age: the deadline is stamped by the process that accepted the
//     message, and the age counts from the first attempt, stamped by
//     whichever worker made it. A worker whose clock is ahead by more than
//     the remaining age would send other workers' mail to dead letters.
//     expiryNow bounds the clock it uses by the server's: the time the
//     NATS server stored this delivery (queue.Delivery.Stored), minus
//     nothing and plus at most clockTolerance. A message whose deadline
//     passed by the server's clock expires on any worker, one behind
//     included; one that only a fast clock finds expired is attempted.
//   - schedules: the NATS server fires a schedule by its own clock, so a
//     time written in this worker's frame fires early or late by the
//     worker's skew. When the gate knows the skew (throttle.Throttle
//     measures it from its registry heartbeat), serverTime moves every
//     schedule into the server's frame.

// clockTolerance is how far this worker's clock may run ahead of the
// server's stamp on a delivery before an expiry stops trusting it. It must
// cover the ordinary wait between the server storing a message and a worker
// taking it; a message that waited longer (a backlog in the work lane) is
// expired one attempt later, when it comes back from a lane with a fresh
// stamp. A worker ahead by any amount can expire mail at most this early.
const clockTolerance = time.Minute

// now is this worker's wall clock.
func (p *Pool) now() time.Time { return p.cfg.Now() }

// expiryNow is the time max-age decisions use for d: this worker's now
// (on the server's clock when the gate knows the difference), but never
// earlier than the server's stamp on d (a slow clock does not keep expired
// mail) and never more than clockTolerance after it (a fast clock does not
// expire other workers' mail).
func (p *Pool) expiryNow(d *queue.Delivery, now time.Time) time.Time {
	return boundByStored(p.serverTime(now), d.Stored())
}

// boundByStored clamps now to [stored, stored+clockTolerance]; a zero
// stored leaves it alone.
func boundByStored(now, stored time.Time) time.Time {
	if stored.IsZero() {
		return now
	}
	if now.Before(stored) {
		return stored
	}
	if limit := stored.Add(clockTolerance); now.After(limit) {
		return limit
	}
	return now
}

// serverTime moves a schedule time from this worker's clock to the NATS
// server's, which fires it, when the gate has measured the difference.
func (p *Pool) serverTime(at time.Time) time.Time {
	if off, known := p.cfg.Gate.ClockOffset(); known {
		return at.Add(off)
	}
	return at
}
