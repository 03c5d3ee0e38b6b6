package throttle

import (
	"slices"
	"time"
)

// Clocks. Suspensions, open breakers and the other ends in DestState are
// absolute wall-clock times, written by one worker (or an operator's
// command) on its clock and read by every worker on its own. Compared
// as they are, a reader whose clock is ahead by S ends another worker's
// suspension or breaker S early, and one behind holds it S longer.
//
// The NATS server is the one clock every worker shares: it stamps each KV
// entry it stores (KeyValueEntry.Created). A state's UpdatedAt is its
// writer's now at the write, so Created - UpdatedAt is how far the writer's
// clock was from the server's, and the ends in the state are on the server's
// clock once moved by it. This worker measures its own distance from the
// server the same way, from its registry heartbeat (the record's At against
// the entry's Created), and moves them once more onto its own clock. A
// suspension then ends, on every worker, when its writer meant it to,
// within the latency of a KV write, whichever clocks are off; what a
// worker writes is on its own clock, UpdatedAt included, so the next
// reader can do the same.
//
// Without a registry the worker cannot measure itself and takes its clock
// to be the server's: writers' skew is still corrected, its own is not.
// Differences under shiftTolerance are left alone (write latency and the
// measurement's own noise), except in a learned rate's grid of send
// slots (DestState.Grid), which is moved by the difference whatever its
// size, as the configured rate's epoch grid is by this worker's offset
// (turn.next): two workers 250 ms apart under a grid of 4/s, one slot,
// took their turns together, the pairs a grid exists to keep apart. A
// state this worker wrote itself is on its own clock already: a small
// difference there is the measurement's noise, and its grid stays. Token
// buckets, waits and timeouts are local and use the monotonic clock; none
// of this concerns them.

// shiftTolerance is the smallest clock difference that moves a state's
// times onto this worker's clock.
const shiftTolerance = time.Second

// frame is one worker's clock: its now, how far the server's clock is
// ahead of it (offset: server minus local), and the worker's id (self; ""
// for an operator's command), whose own writes are on this clock.
type frame struct {
	now    func() time.Time
	offset time.Duration
	self   string
}

// toLocal moves the times in s, stored by the server at created, from its
// writer's clock onto f's. A state without UpdatedAt or created is kept.
func (f frame) toLocal(s DestState, created time.Time) DestState {
	if s.UpdatedAt.IsZero() || created.IsZero() {
		return s
	}
	// writer + (server - writer) = server; server - offset = local.
	shift := created.Sub(s.UpdatedAt) - f.offset
	small := shift > -shiftTolerance && shift < shiftTolerance
	if len(s.Grid) > 0 && shift != 0 && !(small && f.self != "" && s.UpdatedBy == f.self) {
		s.Grid = slices.Clone(s.Grid) // shared with the state it came from
		for i := range s.Grid {
			s.Grid[i].From = s.Grid[i].From.Add(shift).UTC()
		}
	}
	if small {
		return s
	}
	for _, p := range []*time.Time{&s.SuspendedUntil, &s.FactorUntil, &s.RateUntil, &s.ConnsUntil, &s.BreakerUntil,
		&s.LearnedHold, &s.LearnedNext, &s.LearnedProbeAt, &s.LearnedConnsHold, &s.LearnedConnsNext, &s.LearnedConnsProbeAt,
		&s.LearnedSince, &s.LearnedCutAt, &s.UpdatedAt} {
		if !p.IsZero() && !p.Equal(SuspendForever) {
			*p = p.Add(shift).UTC()
		}
	}
	if len(s.Rules) > 0 {
		rules := make(map[string]time.Time, len(s.Rules)) // the map is shared too
		for name, end := range s.Rules {
			rules[name] = end.Add(shift).UTC()
		}
		s.Rules = rules
	}
	return s
}

// now is this worker's wall clock (Config.Now).
func (t *Throttle) now() time.Time { return t.cfg.Now() }

// frame is this worker's clock with its last measured offset (zero until
// measured).
func (t *Throttle) frame() frame {
	return frame{now: t.cfg.Now, offset: time.Duration(t.offset.Load()), self: t.cfg.WorkerID}
}

// measureOffset records the server's clock minus this worker's from this
// worker's own registry record: at is the worker's now when it wrote the
// record, created the server's when it stored it. The write's latency
// makes the server look that much ahead, a few milliseconds.
func (t *Throttle) measureOffset(at, created time.Time) {
	if at.IsZero() || created.IsZero() {
		return
	}
	off := created.Sub(at)
	prev := time.Duration(t.offset.Swap(int64(off)))
	known := t.offsetKnown.Swap(true)
	if d := off - prev; !known && (off >= shiftTolerance || off <= -shiftTolerance) || known && (d >= shiftTolerance || d <= -shiftTolerance) {
		t.log.Warn().Dur("offset", off).Msg("this worker's clock differs from the NATS server's; shared destination times are moved onto it")
	}
}

// ClockOffset is how far the NATS server's clock is ahead of this worker's
// (negative: behind), as measured from the registry heartbeat; known is
// false until the first measurement (and always without a registry). A
// schedule fires on the server's clock: add the offset to a time on this
// worker's clock to get the time to write.
func (t *Throttle) ClockOffset() (offset time.Duration, known bool) {
	return time.Duration(t.offset.Load()), t.offsetKnown.Load()
}
