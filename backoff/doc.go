// Package backoff is in charge of when a deferred message comes back: the
// delay that spaces a message's retries (capped full jitter plus a
// per-worker contention offset), the retry budget that ends them, the names
// and default parameters of the two lanes deferred mail waits in, and the
// decision record that logs every timing decision so that a postmortem can
// replay it exactly.
//
// Whether a destination may be contacted at all (rates, connections,
// breakers, suspensions) is package throttle's concern, not this one's.
//
// # Backoff
//
// A retry's delay is computed in float seconds and rounded to whole
// milliseconds only at the end (a float multiplier is never applied to a
// truncated time.Duration):
//
//	nominal = Base * Multiplier^attempt            (attempt 1 = first retry)
//	draw    = u * min(nominal, Cap)                 (u uniform on [0, 1), full jitter)
//	jitter  = clamp(draw, Min, Cap)
//	delay   = max(jitter + Offset(worker, ContentionWindow), server hint)
//
// u comes from SplitMix64 seeded with the decision's jitter seed (see Draw),
// so a logged (seed, worker, attempt) and the lane's parameters give back the
// same delay forever; `outflow schedule --seed S --worker W --attempts N`
// does exactly that. docs/backoff.md explains the defaults and
// docs/benchmarks.md measures why each term is there.
//
// The package is pure: it imports nothing of outflow's and does no I/O.
package backoff
