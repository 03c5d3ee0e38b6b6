package coordinator

import (
	"sort"
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

// slotGrace is how late a deferred envelope may come back and still claim
// the slot its refusal reserved (JetStream schedule and worker latency).
// An unclaimed slot then lapses: its token is spent, so a lost envelope
// can only make a worker send less than its share, never more.
const slotGrace = time.Second

// slots are reservations handed out as Refusal{Reason: "rate"} times,
// sorted. Any admission of the destination at (or within MaxWait before)
// a slot's time claims it instead of taking a new token, so envelopes
// deferred by the rate come back spaced exactly at the rate and are not
// charged twice.
type slots []time.Time

// add inserts a reserved time, keeping the slice sorted.
func (s *slots) add(at time.Time) {
	i := sort.Search(len(*s), func(i int) bool { return (*s)[i].After(at) })
	*s = append(*s, time.Time{})
	copy((*s)[i+1:], (*s)[i:])
	(*s)[i] = at
}

// claim drops lapsed slots and takes the earliest slot due by now+maxWait.
func (s *slots) claim(now time.Time, maxWait time.Duration) (time.Time, bool) {
	n := 0
	for n < len(*s) && (*s)[n].Before(now.Add(-slotGrace)) {
		n++
	}
	if n > 0 {
		*s = append((*s)[:0], (*s)[n:]...)
	}
	if len(*s) == 0 || (*s)[0].After(now.Add(maxWait)) {
		return time.Time{}, false
	}
	at := (*s)[0]
	*s = append((*s)[:0], (*s)[1:]...)
	return at, true
}
