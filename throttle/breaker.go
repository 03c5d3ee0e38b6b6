package throttle

import "github.com/outflow/outflow/classify"

// The circuit breaker of a destination, shared through DestState:
//
//	closed    --BreakerFailures consecutive failed attempts (one worker)-->  open
//	open      --BreakerCooldown passes-->                                    half-open
//	half-open --the probe reaches the server-->                              closed (+ OnRecover)
//	half-open --the probe fails-->                                           open (another cooldown)
//
// A failed attempt is one where no result shows the server answering and
// at least one is a transient failure about the connection or the
// destination (refused, timed out, TLS failure, 421 at greeting …). Any
// answer from the server (delivered, a bounce, a throttle, a transient
// reply about the message or a recipient) resets the count. Failures are
// counted per worker, in memory; only the open and close transitions are
// written to the shared state. Open and half-open are told apart by time
// (BreakerUntil), so the cooling period ends on every worker at once
// without a write.

// attemptOutcome summarizes one attempt's results for the breaker and the
// adaptive rate.
type attemptOutcome struct {
	reached   bool // the server answered at least one result
	failed    bool // not reached, and a connection/destination transient failure
	throttled bool // a throttled reply about the destination (cuts the rate)
	delivered bool // at least one recipient delivered
	// answered: the server answered at least one result with other than
	// a throttle (a delivery, a bounce, greylisting …): no push back
	// against what it is sent, which widens a first-contact window
	// (firstWindow).
	answered bool
	// connThrottled: a "too many connections" reply (teaches a
	// connection limit; does not cut the rate).
	connThrottled bool
	why           classify.Result // the first rate throttle, for the learned rate's reason
	connWhy       classify.Result // the first connection throttle
	// sourceBlocked: a reply about the address the attempt went out
	// from (classify.ScopeSource: a blocklist, a reverse DNS refused),
	// whatever its class; blockWhy is the first. Neither a failure nor
	// an answer: the pair's suspension (sourceblock.go) deals with it.
	sourceBlocked bool
	blockWhy      classify.Result
}

// outcomeOf folds one attempt's results. outflow's own signals are skipped.
func outcomeOf(results []classify.Result) attemptOutcome {
	var o attemptOutcome
	failure := false
	for i := range results {
		r := &results[i]
		if isLocal(*r) {
			continue
		}
		if r.Scope == classify.ScopeSource {
			if !o.sourceBlocked {
				o.blockWhy = *r
			}
			o.sourceBlocked = true
			continue
		}
		switch r.Class {
		case classify.Delivered:
			o.reached, o.answered, o.delivered = true, true, true
		case classify.Permanent:
			if r.Scope != classify.ScopeDestination && r.Scope != classify.ScopeConnection {
				o.reached, o.answered = true, true
			}
		case classify.Throttled:
			o.reached = true
			// "Too many messages on this connection" is about the
			// connection, a per-mailbox rate about one recipient, and a
			// sending quota or Gmail's "rate limited because it is
			// unauthenticated" about one tenant's account or domain:
			// none is a reason to slow the whole destination for every
			// tenant. "Too many connections" is about concurrency, not
			// rate.
			switch {
			case r.Scope == classify.ScopeRecipient, r.Scope == classify.ScopeTenant:
			case connSignal.MatchString(r.Text):
				if !o.connThrottled {
					o.connWhy = *r
				}
				o.connThrottled = true
			case r.Scope != classify.ScopeConnection:
				if !o.throttled {
					o.why = *r
				}
				o.throttled = true
			}
		case classify.Transient:
			if r.Scope == classify.ScopeConnection || r.Scope == classify.ScopeDestination {
				failure = true
			} else {
				o.reached, o.answered = true, true
			}
		}
	}
	o.failed = failure && !o.reached
	return o
}
