package throttle

import (
	"time"
)

// bucket is a token bucket with reservations, like golang.org/x/time/rate's
// Reserve: tokens may go negative, and a reservation made while in debt is
// due when the debt is paid at the current rate. Its burst is one token, so
// a worker never sends faster than its share, even right after idling.
// Not safe for concurrent use: the dest's mutex guards it.
type bucket struct {
	rate   float64   // tokens per second; > 0 when in use
	tokens float64   // may be negative: reserved ahead
	last   time.Time // when tokens was last brought up to date
}

// bucketBurst is the bucket's capacity in tokens.
const bucketBurst = 1

// advance adds the tokens earned since last (never above the burst).
func (b *bucket) advance(now time.Time) {
	if b.last.IsZero() {
		b.last, b.tokens = now, bucketBurst
		return
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens += el * b.rate
		if b.tokens > bucketBurst {
			b.tokens = bucketBurst
		}
		b.last = now
	}
}

// setRate changes the rate from now on; tokens earned so far are kept.
func (b *bucket) setRate(now time.Time, rate float64) {
	if rate == b.rate {
		return
	}
	if b.rate > 0 {
		b.advance(now)
	}
	b.rate = rate
}

// reserve takes one token and returns when it is due (now, or later when
// the bucket is in debt). Computed in float seconds.
func (b *bucket) reserve(now time.Time) time.Time {
	b.advance(now)
	b.tokens--
	if b.tokens >= 0 {
		return now
	}
	at := b.last.Add(time.Duration(-b.tokens / b.rate * float64(time.Second)))
	if at.Before(now) {
		return now
	}
	return at
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
	at = at.Add(-spendSlack)
	if owed := at.Sub(b.last).Seconds() * b.rate; owed > -b.tokens {
		b.tokens = -owed
	}
}

// spendSlack: see spend. A microsecond early on a period of at least
// minSlot's 2 ms.
const spendSlack = time.Microsecond

// refund gives back a token whose reservation was not used.
func (b *bucket) refund() {
	b.tokens++
	if b.tokens > bucketBurst {
		b.tokens = bucketBurst
	}
}
