// Package throttle is in charge of whether a destination may be contacted
// now, for the whole fleet: each destination's configured and learned rates
// and connection limits, its circuit breaker, operator and automation
// suspensions and overrides, the provider groups and MX sites that fold
// domains into one destination (groups.go), and the registry of live workers that divides a rate among
// them.
//
// The shared state lives in two JetStream KV buckets, opened through the
// queue (OpenState, OpenRegistry in buckets.go): outflow_dest holds one
// DestState per destination and outflow_workers one heartbeat key per live
// process (its worker id and a random instance, so that two processes
// with one id are two workers; registry.go). Every Throttle watches them,
// so that a throttle, an outage or an operator's command seen by one
// worker changes what every worker does within a second (an operator's
// change is logged at Info by every worker). The hot path (Gate.Admit and
// Permit.Done) touches memory only; the buckets are written on state
// transitions, never per message, by one writer goroutine that tries a
// failed write again until it is written, needless or 10 minutes old.
//
// A fleet connection limit, configured or learned, and the first-contact
// window are divided between the live workers by place, so that the
// shares add up to the limit exactly: a worker's share may be none, and
// it refuses "conns" while the others send (shareConns).
//
// A destination without a configured rate learns one from its throttles
// (learn.go: seeded from the fleet's delivered rate, cut and probed upward
// fleet-wide, the probes after a cut held at a plateau under the rate the
// throttle answered, a cut no higher than the rate delivered between
// throttles, holds and steps judged over four deliveries at least at slow
// rates, forgotten after a quiet hour). Until it has one, a
// first-contact window holds the attempts in flight to a few, widened by
// each answer that is not a throttle (learn.go, firstWindow). Each
// worker paces its share of a rate with a chain of reservations
// (bucket.go), and its virtual queue, one tail per tenant, paces both
// the envelopes refused for the rate and those a throttle deferred
// (Gate.Pace), so that a backlog comes back at the rate, oldest first,
// and tenants share a busy destination fairly. An admission waiting for
// its token is asked again at each wake-up what a new one would be: a
// suspension or an open breaker that came meanwhile refuses it, and so
// does a rate gone down whose new turn for it lies beyond MaxWait or
// finds its tenant over its share (Throttle.admit). A virtual queue whose
// rate climbs back by itself (learned, cut by a factor, pinned for a
// while) gives places only a horizon ahead (learn_apply.go, parking).
//
// With more than one live worker, the workers take turns: each send waits
// for its worker's next slot on a grid the fleet shares per destination
// (slots.go), so that the fleet's sends arrive spaced as one sender's
// would; the learned rate's grid is kept in the shared state, in segments
// that keep the turns already reserved across a step up (after a cut they
// are taken again at the new rate), their starts moved onto each worker's
// clock however small the difference (clock.go).
//
// With egress addresses, every piece of that state is kept per
// (destination, source address) pair instead, named "DEST@SOURCE"
// (source.go, PairName), since providers limit and block per sending IP; a
// suspension of the destination itself still holds for every source, and
// its pin and connection limit hold on the total from every source, on
// top of each pair's own (own.go).
//
// A domain folded into a provider group is held to the limits set on it
// by itself (a suspension, a rate pin, a connection limit, of the domain
// or from one source) on top of the group's (own.go), which gives the
// order of all these levels.
//
// Gate (gate.go) is everything the delivery loop gets from the throttle:
// the destination's group, admission in a tenant's share and from an
// egress address, the attempt's limits on the Permit, the pace of
// throttled mail and the clock offset to the NATS server. Throttle
// implements it and OpenGate admits everything. When a destination
// recovers (a suspension ends, a breaker closes), one worker calls
// Config.OnRecover, and serve releases the deferred mail of the domains
// Throttle.Recovers names: a group's, or that of one domain suspended by
// itself inside its group, at the group's rate.
//
// File is the [throttle], [destinations.X], [[groups]] and [[automation]]
// part of the config file; Suspend, Resume, SetRate, Forget, GetState and
// ListStates are the operator's commands on the shared state (`outflow
// dest …` and the console), ListWorkers reads the registry, and AskStatus
// asks every running worker for its view of a destination.
// docs/throttling.md describes the behaviour.
//
// When a deferred message comes back is package backoff's concern, not this
// one's.
package throttle
