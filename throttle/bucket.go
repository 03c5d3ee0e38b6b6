package throttle

import (
	"time"
)

// bucket paces one worker's share of a destination's rate. It is a token
// bucket of one token kept as a chain of reservations (the generic cell
// rate algorithm): next is when the next token is due, and each
// reservation takes the later of now and next and moves next one period
// on. Its burst is one token, so a worker never sends faster than its
// share, even right after idling. Not safe for concurrent use: the dest's
// mutex guards it.
//
// A chain rather than a count of tokens in debt, because the rate changes
// while reservations wait. Reservations due at the old spacing keep their
// times; a debt of n tokens repaid at a faster rate would make the first
// reservation after a step up due less than one new period after the last
// one before it, by n old periods less n new ones. Against a provider
// whose burst is one message that pair is a throttle on every step up, and
// one worker's learned rate went round a cycle of cuts at 88 % of a 2/s
// limit. A chain puts the next reservation one period of the new rate
// after the last.
//
// A slower rate also restarts the chain from now (one new period ahead)
// and counts in gen: reservations already made are due at the old
// spacing, and an admission waiting for one checks gen when it wakes and
// reserves again rather than send at a rate that was just cut
// (Throttle.admit).
type bucket struct {
	rate float64   // tokens per second; > 0 when in use
	next time.Time // when the next token is due; zero: one is ready now
	// last is the time of the latest reservation (or the turn it was
	// spent at) and prev the chain's next before it, so that a refund of
	// the latest reservation can undo it.
	last, prev time.Time
	gen        uint64 // counts the times the rate went down
}

// period is one token's time at the bucket's rate.
func (b *bucket) period() time.Duration {
	return time.Duration(float64(time.Second) / b.rate)
}

// setRate changes the rate from now on. A faster rate moves the next
// token to one new period after the latest reservation; a slower one
// restarts the chain at one new period from now, or from the latest
// reservation if that is already past, and reports true.
func (b *bucket) setRate(now time.Time, rate float64) (slower bool) {
	if rate == b.rate {
		return false
	}
	slower = b.rate > 0 && rate < b.rate
	b.rate = rate
	if b.next.IsZero() || b.last.IsZero() {
		return slower
	}
	from := b.last
	if slower {
		b.gen++
		from = earlierOf(b.last, now)
	}
	b.next = from.Add(b.period())
	b.prev = b.next
	return slower
}

// startAfter starts a bucket that had no rate from the send at sent: the
// first token is due one period after it, not at once. A destination's
// first rate comes from a throttle, usually milliseconds after the last
// send; a full bucket sent the next message beside it, into the same
// refusal.
func (b *bucket) startAfter(sent time.Time) {
	if b.rate > 0 && b.last.IsZero() && !sent.IsZero() {
		b.last, b.prev = sent, time.Time{}
		b.next = sent.Add(b.period())
	}
}

// reserve takes one token and returns when it is due: now, or the next
// token's time when that is later.
func (b *bucket) reserve(now time.Time) time.Time {
	due := laterOf(now, b.next)
	b.prev, b.last = b.next, due
	b.next = due.Add(b.period())
	return due
}

// spend moves the token the last reserve took to at, the time it is
// really used, when that is later than it was due: the next token then
// comes one period after at. A worker whose sends wait for their turns on
// the fleet's grid (slots.go) would otherwise earn tokens while it waits,
// and spend them in a burst at the bucket's rate when the grid next gets
// finer than the bucket, as a learned rate's grid does after a step up
// that a cut followed.
//
// The bucket and the grid space a worker's sends by the same period in
// different arithmetic (float seconds, whole nanoseconds per slot), so the
// next token may come due a hair after the next turn; it is owed from
// spendSlack before at, so the turn is not missed for it.
func (b *bucket) spend(at time.Time) {
	if n := at.Add(b.period() - spendSlack); n.After(b.next) {
		b.next = n
	}
	if at.After(b.last) {
		b.last = at
	}
}

// spendSlack: see spend. A microsecond early on a period of at least
// minSlot's 2 ms.
const spendSlack = time.Microsecond

// refund gives back the token of the reservation at (its due time, or the
// turn it was spent at) when it is still the latest: the next reservation
// may then take its place. A refund of an older one changes nothing; the
// chain keeps its gap, which errs on the slow side.
func (b *bucket) refund(at time.Time) {
	if !at.Equal(b.last) {
		return
	}
	b.next, b.last = b.prev, time.Time{}
	if !b.prev.IsZero() {
		b.last = b.prev.Add(-b.period())
	}
}

// earlierOf is the earlier of a and b.
func earlierOf(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
