package backoff

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Lane names. A lane is a queue of deferred messages with its own backoff
// parameters: transient failures go to the retry lane, throttled ones to the
// slower rate-limit lane. They are defined here, once: package queue names
// its lanes (queue.LaneRetry, queue.LaneRateLimit), streams and subjects
// after them, and backoff, which imports nothing of outflow's, is the one
// package both it and the callers of ForLane can depend on.
const (
	LaneRetry     = "retry"
	LaneRateLimit = "ratelimit"
)

// Backoff is the parameter set of one lane. The zero value is not useful;
// start from DefaultRetry or DefaultRateLimit and override fields.
type Backoff struct {
	// Lane names the lane these parameters belong to ("retry" or
	// "ratelimit"); it is informational and ends up in the decision record.
	Lane string

	// Base is the nominal delay of a hypothetical attempt 0: attempt n's
	// nominal delay is Base * Multiplier^n, so with the retry defaults
	// (5 s, ×2) the first retry is drawn from [0, 10 s). Must be > 0.
	Base time.Duration

	// Min is the floor of the jittered delay (before the offset): a full
	// jitter draw below it is raised to it, so that no retry comes back
	// sooner than Min after a failure. 0 allows immediate retries.
	Min time.Duration

	// Cap bounds both the jitter range and the jittered delay: no draw is
	// taken from a range wider than [0, Cap) however many attempts have
	// failed. Must be > 0 and >= Min. The per-worker offset and a server's
	// retry hint come on top of it.
	Cap time.Duration

	// Multiplier is the growth factor per attempt, applied in float
	// seconds. Must be finite and >= 1; 2 doubles the range each attempt.
	Multiplier float64

	// ContentionWindow is the span the per-worker offset is spread over:
	// each worker adds a fixed Offset(workerID, ContentionWindow) in
	// [0, ContentionWindow) to every delay it computes. 0 disables it.
	ContentionWindow time.Duration
}

// DefaultRetry returns the retry lane's parameters, for transient failures
// (4xx, connection refused, DNS temporary failure):
//
//   - Base 5 s, Multiplier 2: the first retry lands within about ten
//     seconds, which clears most greylisting-free transient errors (a
//     restarting MX, a full connection table) without hammering; senders
//     commonly use a 1-10 s base and doubling.
//   - Min 1 s: a retry never comes back within the same second as the
//     failure, whatever the draw.
//   - Cap 15 min: after attempt 7 (nominal 640 s) every retry is drawn from
//     [1 s, 15 min), about one try every 7.5 minutes on average; common
//     senders cap at 10-30 minutes. RFC 5321 §4.5.4.1 asks for 30 minutes
//     "in general" but allows variable strategies when the client knows why
//     delivery failed; outflow does (throttles go to the rate-limit lane,
//     failing destinations trip a breaker), so this lane retries sooner.
//   - ContentionWindow 2 s: enough to spread the retries that the Min clamp
//     piles onto the same instant (see docs/benchmarks.md) while adding at
//     most 2 s to any delay.
func DefaultRetry() Backoff {
	return Backoff{
		Lane:             LaneRetry,
		Base:             5 * time.Second,
		Min:              time.Second,
		Cap:              15 * time.Minute,
		Multiplier:       2,
		ContentionWindow: 2 * time.Second,
	}
}

// DefaultRateLimit returns the rate-limit lane's parameters, for replies
// that say "slow down" (Gmail 4.7.28, Yahoo TSS04, 421 too many
// connections …). It is slower and wider than the retry lane, because the
// receiver has told us that the problem is our rate, and retrying all
// throttled messages within a few seconds of each other is the rate problem:
//
//   - Base 30 s, Multiplier 2: the first retry is drawn from [15 s, 60 s);
//     providers' throttles typically last minutes, not seconds.
//   - Min 15 s: never retry a throttled message sooner.
//   - Cap 30 min: the top of the usual 10-30 minute range; throttles that
//     last longer are handled by destination suspension, not per message.
//   - ContentionWindow 30 s: the wider jitter. Workers spread their
//     throttled retries over half a minute, so a fleet that was throttled
//     together does not come back together.
//
// A server hint ("try again in 92 seconds") longer than the computed delay
// wins (see Decide).
func DefaultRateLimit() Backoff {
	return Backoff{
		Lane:             LaneRateLimit,
		Base:             30 * time.Second,
		Min:              15 * time.Second,
		Cap:              30 * time.Minute,
		Multiplier:       2,
		ContentionWindow: 30 * time.Second,
	}
}

// ForLane returns the default parameters of the named lane ("retry" or
// "ratelimit").
func ForLane(lane string) (Backoff, error) {
	switch lane {
	case LaneRetry:
		return DefaultRetry(), nil
	case LaneRateLimit:
		return DefaultRateLimit(), nil
	}
	return Backoff{}, fmt.Errorf("unknown lane %q (want %q or %q)", lane, LaneRetry, LaneRateLimit)
}

// Validate reports every parameter that is out of range. Decide never fails
// and makes do with out-of-range values (see Decide), so call Validate where
// parameters enter the program (flags, config file).
func (b Backoff) Validate() error {
	var errs []error
	if b.Base <= 0 {
		errs = append(errs, fmt.Errorf("base %v: must be > 0", b.Base))
	}
	if b.Cap <= 0 {
		errs = append(errs, fmt.Errorf("cap %v: must be > 0", b.Cap))
	}
	if b.Min < 0 {
		errs = append(errs, fmt.Errorf("min %v: must be >= 0", b.Min))
	}
	if b.Min > b.Cap {
		errs = append(errs, fmt.Errorf("min %v: must be <= cap %v", b.Min, b.Cap))
	}
	if math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0) || b.Multiplier < 1 {
		errs = append(errs, fmt.Errorf("multiplier %v: must be finite and >= 1", b.Multiplier))
	}
	if b.ContentionWindow < 0 {
		errs = append(errs, fmt.Errorf("contention window %v: must be >= 0", b.ContentionWindow))
	}
	if len(errs) > 0 {
		return fmt.Errorf("backoff %s: %w", b.Lane, errors.Join(errs...))
	}
	return nil
}

// normalized returns b with out-of-range values replaced by the nearest
// meaningful one, so that Decide is total: negative durations become 0, a
// Min above Cap becomes Cap (Cap is the promise "never longer than"), and a
// multiplier that is NaN, infinite or below 1 becomes 1.
func (b Backoff) normalized() Backoff {
	b.Base = max(b.Base, 0)
	b.Min = max(b.Min, 0)
	b.Cap = max(b.Cap, 0)
	b.Min = min(b.Min, b.Cap)
	b.ContentionWindow = max(b.ContentionWindow, 0)
	if math.IsNaN(b.Multiplier) || math.IsInf(b.Multiplier, 0) || b.Multiplier < 1 {
		b.Multiplier = 1
	}
	return b
}

// Decision is one computed retry delay with every input and intermediate
// value needed to recompute or audit it. All *Ms fields are whole
// milliseconds; Delay equals DelayMs milliseconds exactly, so the logged
// delay_ms is the delay that was applied.
type Decision struct {
	// Attempt is the retry this decision is for: 1 is the first retry after
	// the first failed delivery attempt. It is also the exponent of the
	// nominal delay and the SplitMix64 step of the draw.
	Attempt int

	// BaseMs, MinMs, Multiplier and WindowMs are the lane parameters the
	// decision was computed with (after normalization), logged so that a
	// decision can be replayed without knowing the configuration of the
	// worker that made it.
	BaseMs     int64
	MinMs      int64
	Multiplier float64
	WindowMs   int64

	// NominalMs is Base * Multiplier^Attempt before any cap, saturated at
	// math.MaxInt64 when it overflows.
	NominalMs int64

	// CapMs is the lane's Cap.
	CapMs int64

	// JitterSeed seeds the draw (see Draw); it is fresh for each decision
	// in the daemon (NewSeed) and given by --seed in `outflow schedule`.
	JitterSeed uint64

	// JitterMs is the full-jitter draw from [0, min(nominal, cap)) after
	// clamping to [Min, Cap].
	JitterMs int64

	// OffsetMs is the worker's contention offset, Offset(worker, window).
	OffsetMs int64

	// HintMs is the server's retry hint (0 when none), rounded up to a
	// whole millisecond.
	HintMs int64

	// DelayMs is max(JitterMs + OffsetMs, HintMs): the time to wait before
	// the attempt.
	DelayMs int64

	// Delay is DelayMs as a time.Duration.
	Delay time.Duration
}

// At returns the time the attempt is due when the decision is taken at now.
func (d Decision) At(now time.Time) time.Time { return now.Add(d.Delay) }

// Decide computes the delay before attempt number attempt (1 = the first
// retry after the first failure; values below 1 are treated as 1), for the
// worker workerID, from the random seed seed and the server's retry hint
// (0 when there is none).
//
// It is pure and deterministic: the same parameters, attempt, worker, seed
// and hint always give the same Decision, on any machine and Go version.
// The computation, in float seconds:
//
//	nominal = Base * Multiplier^attempt
//	draw    = Draw(seed, attempt) * min(nominal, Cap), truncated to ms
//	jitter  = clamp(draw, Min, Cap)
//	delay   = max(jitter + Offset(workerID, ContentionWindow), hint)
//
// Out-of-range parameters are normalized rather than rejected (negative
// durations count as 0, Min above Cap as Cap, a Multiplier below 1 or not
// finite as 1); use Validate to reject them up front.
func (b Backoff) Decide(attempt int, workerID string, seed uint64, hint time.Duration) Decision {
	n := b.normalized()
	if attempt < 1 {
		attempt = 1
	}
	nominal := n.Base.Seconds() * math.Pow(n.Multiplier, float64(attempt)) // +Inf on overflow
	capS := n.Cap.Seconds()
	span := math.Min(nominal, capS)
	minMs, capMs := n.Min.Milliseconds(), n.Cap.Milliseconds()

	jitterMs := msFloor(Draw(seed, attempt) * span)
	jitterMs = min(max(jitterMs, minMs), capMs)
	offsetMs := Offset(workerID, n.ContentionWindow).Milliseconds()

	var hintMs int64
	if hint > 0 {
		hintMs = int64((hint + time.Millisecond - 1) / time.Millisecond)
	}
	delayMs := max(jitterMs+offsetMs, hintMs)

	return Decision{
		Attempt:    attempt,
		BaseMs:     n.Base.Milliseconds(),
		MinMs:      minMs,
		Multiplier: n.Multiplier,
		WindowMs:   n.ContentionWindow.Milliseconds(),
		NominalMs:  msFloor(nominal),
		CapMs:      capMs,
		JitterSeed: seed,
		JitterMs:   jitterMs,
		OffsetMs:   offsetMs,
		HintMs:     hintMs,
		DelayMs:    delayMs,
		Delay:      time.Duration(delayMs) * time.Millisecond,
	}
}

// msFloor converts float seconds to whole milliseconds, rounding down and
// saturating at math.MaxInt64 (and at 0 below).
func msFloor(seconds float64) int64 {
	ms := math.Floor(seconds * 1000)
	switch {
	case !(ms > 0): // also NaN
		return 0
	case ms >= math.MaxInt64: // the float nearest MaxInt64 is 2^63
		return math.MaxInt64
	}
	return int64(ms)
}

// splitMixGamma is SplitMix64's increment, 2^64 divided by the golden ratio
// (Steele, Lea, Flood, "Fast splittable pseudorandom number generators",
// OOPSLA 2014).
const splitMixGamma = 0x9e3779b97f4a7c15

// mix64 is SplitMix64's output function: a bijection on uint64 whose every
// output bit depends on every input bit.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// Draw is the jitter PRNG: the uniform number in [0, 1) that a decision
// with jitter seed seed uses for attempt attempt. It is the attempt-th
// output (counting from 1) of SplitMix64 seeded with seed, taking the top 53
// bits as a float64:
//
//	u = mix64(seed + attempt*0x9e3779b97f4a7c15 mod 2^64) >> 11) / 2^53
//
// Mixing the attempt in means that one seed gives independent-looking draws
// for every attempt, so `outflow schedule --seed S` prints a realistic
// timeline and still reproduces the decision logged for attempt n with seed
// S. SplitMix64 is fixed here in a few lines, not taken from a library, so
// that a seed maps to the same draw forever.
func Draw(seed uint64, attempt int) float64 {
	z := mix64(seed + uint64(attempt)*splitMixGamma)
	return float64(z>>11) * 0x1p-53
}

// NewSeed returns a fresh random jitter seed for one decision. It comes
// from math/rand/v2's process-wide generator (ChaCha8, randomly seeded at
// start), so seeds differ across workers and restarts without a system
// call per decision.
func NewSeed() uint64 { return rand.Uint64() }

// Offset returns the contention offset of worker workerID in a window of
// the given width: hash(workerID) mod window, in whole milliseconds, in
// [0, window). The hash is FNV-1a 64 of the id's bytes, passed through
// SplitMix64's mixer so that ids differing only in their last character
// ("host/1", "host/2") still land far apart. It depends on nothing but the
// id, so a worker keeps its offset across restarts, and over many ids the
// offsets cover the window evenly. A window below 1 ms gives 0.
func Offset(workerID string, window time.Duration) time.Duration {
	w := window.Milliseconds()
	if w <= 0 {
		return 0
	}
	const (
		fnvOffset = 14695981039346656037
		fnvPrime  = 1099511628211
	)
	h := uint64(fnvOffset)
	for i := 0; i < len(workerID); i++ {
		h ^= uint64(workerID[i])
		h *= fnvPrime
	}
	return time.Duration(mix64(h)%uint64(w)) * time.Millisecond
}

// Budget limits how long a message keeps trying; whichever limit is reached
// first sends it to the dead letters with its evidence.
type Budget struct {
	// MaxAttempts is the number of delivery attempts (the first one
	// included) after which a message is given up. 0 means no limit.
	MaxAttempts int

	// MaxAge is how long after its first attempt a message is given up,
	// by the wall clock. 0 means no limit. The deadline counted from
	// submission is the other wall-clock limit (queue.Options.DeadlineAfter).
	MaxAge time.Duration
}

// DefaultBudget returns the default budget: 24 hours or 250 attempts.
//
// The wall clock is the limit a sender can promise ("your mail is delivered
// or bounced within a day"); 24 h suits transactional mail, whose value
// decays within hours (RFC 5321 §4.5.4.1's 4-5 days is meant for
// person-to-person mail; raise MaxAge for it). With the retry defaults a
// message makes about 200 attempts in 24 h (the range grows for seven
// retries, about 11 minutes in all, then one retry every 7.5 min on
// average), so the attempt limit of 250 is normally not the one that ends
// it: it is a safety net against a misconfiguration that makes delays tiny
// and would otherwise burn through a day of retries in minutes.
func DefaultBudget() Budget {
	return Budget{MaxAttempts: 250, MaxAge: 24 * time.Hour}
}

// Exhausted reports whether a message that has made attempts delivery
// attempts, the first at first, has spent its budget at now, and which
// limit ended it ("max-attempts" or "max-age"; "" when not exhausted).
func (b Budget) Exhausted(attempts int, first, now time.Time) (bool, string) {
	if b.MaxAttempts > 0 && attempts >= b.MaxAttempts {
		return true, "max-attempts"
	}
	if b.MaxAge > 0 && !first.IsZero() && now.Sub(first) >= b.MaxAge {
		return true, "max-age"
	}
	return false, ""
}
