package throttle

import (
	"math"
	"slices"
	"time"
)

// Slots. Each live worker paces its share of a destination's rate with its
// own bucket, and two buckets know nothing of each other's phase: two
// workers whose turns fall a few milliseconds apart send two messages at
// once on every turn, whatever the rate. A provider whose burst is about
// one message throttles each such pair, every throttle cuts the learned
// rate, and a cut changes both workers' periods alike, so the pairs stay
// paired down to a fraction of the real limit.
//
// So the fleet shares one grid of send slots per destination, one period
// of the fleet's rate apart, and the worker ranked r among the n live ones
// (registry keys in sorted order) takes the slots numbered k with
// k mod n = r. The fleet's sends then come evenly spaced, interleaved
// worker by worker, as one sender's would. A worker's bucket still decides
// how many it may take; the grid only says when.
//
// A configured rate's grid starts at the Unix epoch on the NATS server's
// clock (the one clock every worker measures itself against, clock.go). A
// learned rate changes every few seconds, and a grid started afresh at
// each change would put one worker's turn on the new grid next to
// another's on the old one, reserved before the change. So the learned
// grid is kept in the shared state as segments (DestState.Grid): a step
// up at now starts a new segment at the old grid's last slot before now
// plus the longest wait an admission may reserve ahead (Config.MaxWait,
// and gridReach for the change to reach every worker), numbering on from
// it. Every turn reserved before the step keeps its slot, and the new
// rate's spacing applies from there. A cut (or a seed) starts its segment
// only gridReach ahead: the turns reserved before a cut are not kept, each
// worker's waiting admissions take new ones when they wake (Throttle.admit),
// so only a worker that has not heard of the cut yet still sends on the
// old grid. Until the cut's segment starts, the workers send at the cut's
// rate on the old, finer grid, where two workers' turns can fall one old
// slot apart: a pair that a provider with a burst of one throttles. With
// the segment three seconds ahead, two daemons cut to 5/s under a 6/s
// limit met seven such throttles in those three seconds. The exception is
// a halving of first contact's chain (cutRate), whose segment starts at
// once: the rate is still far over the limit, and there a second at the
// rate just cut from costs more throttles than any pair.

// minSlot is the shortest slot worth aligning to: below it, timers and
// the network scatter sends by more than the grid would order them.
const minSlot = 2 * time.Millisecond

// gridReach is what a change of the learned rate adds to Config.MaxWait
// before its segment starts: time for the change to reach every worker.
const gridReach = time.Second

// maxSegments bounds DestState.Grid; older segments are dropped.
const maxSegments = 4

// GridSegment is one piece of a learned rate's grid of send slots: from
// From on, slot Slot falls at From and the next ones one period of Rate
// apart, until the next segment's From.
type GridSegment struct {
	From time.Time `json:"from"`
	Slot int64     `json:"slot"`
	Rate float64   `json:"rate"`
}

// period is one slot of rate, in whole nanoseconds, so that every worker
// computes the same grid from the same rate.
func period(rate float64) int64 {
	return max(1, int64(math.Round(float64(time.Second)/rate)))
}

// aligned reports whether a grid of rate is worth following.
func aligned(rate float64) bool { return rate > 0 && rate <= float64(time.Second/minSlot) }

// turn is what a worker's turns on a destination's grid depend on.
type turn struct {
	segs   []GridSegment // the learned grid; nil: the epoch grid at rate
	rate   float64
	n, r   int
	offset time.Duration // the server's clock ahead of this worker's (epoch grid)
}

// next is this worker's first turn at or after at (a local wall-clock
// time); at itself with one live worker, or a grid too fine to follow.
func (k turn) next(at time.Time) time.Time {
	if k.n <= 1 {
		return at
	}
	if len(k.segs) == 0 {
		return onGrid(at, time.Unix(0, 0).Add(-k.offset), 0, k.rate, k.n, k.r)
	}
	for i, s := range k.segs {
		last := i == len(k.segs)-1
		if !last && !at.Before(k.segs[i+1].From) {
			continue
		}
		t := onGrid(laterOf(at, s.From), s.From, s.Slot, s.Rate, k.n, k.r)
		if last || t.Before(k.segs[i+1].From) {
			return t
		}
		at = k.segs[i+1].From // no turn left in this segment
	}
	return at
}

// onGrid is worker r of n's first slot at or after at on the grid whose
// slot first falls at origin.
func onGrid(at, origin time.Time, first int64, rate float64, n, r int) time.Time {
	if !aligned(rate) {
		return at
	}
	p := period(rate)
	k := first + ceilDiv(at.Sub(origin).Nanoseconds(), p)
	k += mod(int64(r)-k, int64(n))
	if slot := origin.Add(time.Duration((k - first) * p)); slot.After(at) {
		return slot
	}
	return at
}

// regrid starts a new segment of the learned grid for a change of the
// learned rate to rate at now: at the last slot, at or before now + ahead,
// of the segment in force then. The first learned rate's grid starts at
// now. The slice is built anew: DestState values share it.
func (s *DestState) regrid(now time.Time, ahead time.Duration, rate float64) {
	if len(s.Grid) == 0 {
		s.Grid = []GridSegment{{From: now.UTC(), Rate: rate}}
		return
	}
	x := now.Add(ahead)
	i := len(s.Grid) - 1
	for i > 0 && x.Before(s.Grid[i].From) {
		i--
	}
	base := s.Grid[i]
	from, slot := x, base.Slot
	if aligned(base.Rate) {
		p := period(base.Rate)
		passed := max(0, x.Sub(base.From).Nanoseconds()) / p
		from, slot = base.From.Add(time.Duration(passed*p)), base.Slot+passed
	}
	segs := append(slices.Clone(s.Grid[:i+1]), GridSegment{From: from.UTC(), Slot: slot, Rate: rate})
	// Segments that ended before now - ahead hold no reserved turn.
	for len(segs) > 1 && (len(segs) > maxSegments || segs[1].From.Before(now.Add(-ahead))) {
		segs = segs[1:]
	}
	s.Grid = segs
}

// inForce is the learned rate traffic is held to at now. The workers'
// buckets follow a cut at once, and a step up only as far as the grid
// lets them: its slots are those of the segment in force until the step's
// own segment starts. So it is the lowest of LearnedRate, the rate of the
// segment in force and the rates of the segments still to come: a step
// taken after a cut whose segment has not started yet is not in force,
// and neither is the rate before the cut.
func (s DestState) inForce(now time.Time) float64 {
	r := s.LearnedRate
	for i := len(s.Grid) - 1; i >= 0; i-- {
		r = math.Min(r, s.Grid[i].Rate)
		if !now.Before(s.Grid[i].From) {
			break
		}
	}
	return r
}

// ceilDiv is a/b rounded up, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a > 0 {
		q++
	}
	return q
}

// mod is a mod b in [0, b), for b > 0.
func mod(a, b int64) int64 { return (a%b + b) % b }

// laterOf is the later of a and b.
func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// turnOf is this worker's turn on d's grid at the fleet rate: the learned
// rate's segments, or the epoch grid. d.mu held.
func (t *Throttle) turnOf(d *dest, fleet float64, live int, now time.Time) turn {
	off, _ := t.ClockOffset()
	k := turn{rate: fleet, n: live, r: int(t.rank.Load()) % live, offset: off}
	if t.rateSource(d.limits, d.state, now) == "learned" {
		k.segs = d.state.Grid
	}
	return k
}
