// Package webhook is in charge of event webhooks: the endpoints tenants
// register (stored in a key-value bucket with their signing secrets), and
// their delivery, a durable JetStream consumer per endpoint on the events
// stream (filtered to its tenant's shard of the events, so that the server
// hands it its own tenant's and few others'), each event POSTed as JSON
// and signed per the Standard Webhooks
// specification (headers webhook-id, webhook-timestamp, webhook-signature).
// Store.Add creates the consumer before it stores the endpoint, so the
// endpoint's events are kept from its creation on even while no daemon
// runs; the daemons make it with the same configuration, which leaves it
// where it is.
//
// Failure semantics follow mail's: 2xx is done; 408, 429, 5xx, connection
// failures and timeouts are retried with the same full-jitter backoff and
// per-worker offset (package backoff), honouring Retry-After when it asks
// for longer; any other 4xx is permanent. A spent budget or a permanent
// refusal puts the event in the endpoint's dead letters (kept
// DefaultDeadMaxAge), which `outflow webhook replay` moves back into the
// events stream, addressed to that endpoint, so a replay needs NATS only,
// not a running daemon. 410 Gone disables the endpoint (its events wait in
// its consumer) until it is replayed. An event is acknowledged only once
// the endpoint took it or its dead letter is stored: while the dead-letter
// bucket takes no writes it goes back to the consumer at the backoff's
// pace, the endpoint stays enabled, and the write is tried again. Events
// that spend their budget in a row open the endpoint's breaker, kept in
// a bucket so that it outlives a restart and holds for the whole fleet.
// Delivery is at least once; the webhook-id of an event never changes,
// and no other event has it, even after the events stream is made again
// and its sequences start over (webhookID), so a receiver can
// deduplicate.
// Each endpoint has its own consumer and goroutine, so a slow or dead
// endpoint delays neither mail nor another endpoint.
package webhook
