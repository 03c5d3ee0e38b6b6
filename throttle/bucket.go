package throttle

import (
	"math"
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

// refund gives back a token whose reservation was not used.
func (b *bucket) refund() {
	b.tokens++
	if b.tokens > bucketBurst {
		b.tokens = bucketBurst
	}
}

// Slots. Each live worker paces its share of a destination's rate with its
// own bucket, and two buckets know nothing of each other's phase: two
// workers whose turns fall a few milliseconds apart send two messages at
// once on every turn, whatever the rate. A provider whose burst is about
// one message throttles each such pair, every throttle cuts the learned
// rate, and a cut changes both workers' periods alike, so the pairs stay
// paired down to a fraction of the real limit.
//
// So the fleet shares one grid of send slots per destination, on the NATS
// server's clock (the one clock every worker measures itself against,
// clock.go): slot k falls at k periods of 1/rate after the Unix epoch, and
// the worker ranked r among the n live ones (registry keys in sorted
// order) takes the slots with k mod n = r. The fleet's sends then come
// evenly spaced, interleaved worker by worker, as one sender's would. A
// worker's bucket still decides how many it may take; the grid only says
// when.

// minSlot is the shortest slot worth aligning to: below it, timers and
// the network scatter sends by more than the grid would order them.
const minSlot = 2 * time.Millisecond

// slotAt is the first of this worker's slots at or after at (a local wall
// clock time): the fleet's rate is rate, live workers n, this worker's
// rank r, and the server's clock is offset ahead of the local one.
func slotAt(at time.Time, rate float64, n, r int, offset time.Duration) time.Time {
	if n <= 1 || rate <= 0 || rate > float64(time.Second/minSlot) {
		return at
	}
	// In whole nanoseconds, so that every worker computes the same grid.
	period := int64(math.Round(float64(time.Second) / rate))
	server := at.Add(offset).UnixNano()
	k := (server + period - 1) / period
	k += (int64(r) - k%int64(n) + int64(n)) % int64(n)
	return time.Unix(0, k*period).Add(-offset)
}
