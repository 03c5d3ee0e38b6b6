// Package worker is the delivery loop that ties outflow together: it pulls
// envelopes from the three lanes (fresh work, retry, rate limit), asks the
// throttle whether the destination may be contacted now, fetches the
// body, hands the message to the sender, classifies every recipient's reply
// and records exactly one durable outcome through package queue:
//
//	delivered  SENT marker, ack, "delivered" event
//	transient  schedule on the retry lane after the backoff delay, attempt+1
//	throttled  schedule on the rate-limit lane after its slower delay; the
//	           destination slows down for every worker; budget not spent
//	permanent  "bounced" event with the reply, a failure DSN, ack
//	unknown    policy "retry" (default: a duplicate beats a loss, RFC 5321
//	           6.1) or "hold" for an operator
//
// A message sent later (queue.Envelope.SendAt) comes off the retry lane
// when its time comes, untried; the worker moves it to its tenant's fresh
// mail (queue.Delivery.ToWork) rather than delivering it there, so that it
// waits for its tenant's turn as fresh mail does.
//
// An attempt that waited long after its first SENT check (an admission
// wait, a stopped process) checks again before it sends: the server may
// have handed the envelope to another worker meanwhile. What is left is a
// stop inside the SMTP conversation itself; the duplicates it can cause
// are bounded by the envelopes this worker held in flight. From its SENT
// check to its outcome an attempt tells the server it is still at work
// (queue.Delivery.InProgress) every Config.ProgressEvery, or every quarter
// of its consumer's ack wait when that is shorter (queue.Delivery.AckWait:
// another daemon of the fleet may have set a shorter one than this
// process's).
//
// The pool's slots are shared between tenants (slots.go): no tenant holds
// more than all but an eighth of them, nor more than its weighted share
// while others have deliveries in flight, so that a tenant whose hosts hold
// every session for minutes cannot make the others' mail wait for a slot.
// The work lane's pulls ask before they hand an envelope over
// (queue.Admission); an envelope from the retry or rate-limit lane, which
// every tenant shares, of a tenant holding all it may waits in its slot
// until one of its tenant's deliveries ends, the slot serving the other
// tenants' fresh mail meanwhile; with an eighth of the slots waiting so, it
// goes back to its lane without an attempt, for twice as long as its
// tenant's deliveries hold a slot (1 to 30 s, tenantSlots.BackFor).
//
// A graceful stop (the end of Pool.Run's context) hands back what the
// process holds and has not sent, to be handed out again at once rather
// than after the ack wait (stop.go): envelopes fetched and not yet taken,
// taken and not yet sent, and a send the end of the shutdown grace cuts
// before its final dot. A send cut after its final dot may have been
// delivered: its outcome is recorded as unknown, for the unknown policy.
//
// Before the first attempt the body is made final, and every retry sends
// the same bytes: an envelope that asks for a one-click unsubscribe link
// (one recipient each, queue.Envelope.ListUnsubscribe) gets the link's
// fields below its trace fields (Config.Unsubscribe, the same link at each
// attempt), and then the DKIM signature over them (Config.Signer), whose
// result is stored.
//
// A message whose budget (attempts or age) is spent goes to dead letters
// with its evidence. Delivery status notifications (RFC 3464 failures,
// delay warnings, relayed notices for NOTIFY=SUCCESS) are queued through
// outflow itself before the original's durable step; dsn.go says when,
// for whom, and what is never answered. A report that comes back to the
// return path after a 250 (a bounce, a delay, a success) gets its notice
// too (later.go): the delivered event keeps what it needs, and the bounce
// listener calls Pool.ReportedLater. Every decision is one JSON log line with the fields of
// backoff.Record, never sampled, and every outcome one event (deliverer.event).
//
// worker is in charge of that loop and nothing below it: it reaches
// JetStream only through queue (which translates NATS errors into its own
// sentinels, such as queue.ErrBodyMissing), and everything it gets from
// the throttle is on the throttle.Gate interface: admission, the attempt's
// limits on the permit, pacing and the clock offset.
package worker
