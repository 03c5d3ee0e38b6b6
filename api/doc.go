// Package api is in charge of outflow's HTTP submission API, served on
// --api-addr: it authenticates requests with per-tenant API keys (of which it
// stores only SHA-256 hashes, in a JetStream key-value bucket), turns a JSON
// message (a raw RFC 5322 message, or subject, text, HTML, headers and
// attachments it builds into MIME with go-message) into a queue.Submission,
// hands it to the same enqueue path as the SMTP submission listener, and
// answers what happened to a message from the queue's lanes and events,
// and to the tenant's mail to one address (GET /v1/events, events.go).
//
// Failure semantics, as over SMTP: 202 Accepted, with one id per
// destination, is answered only after Enqueue returned, that is after the
// envelopes (and the body) are durable; any failure to store is a 503 and
// nothing of the request may be taken as accepted. An Idempotency-Key makes
// a retry safe: its record (a hash of the request, then the ids) is kept in
// a bucket for the queue's deduplication window, the ids are derived from
// tenant, key and the key's first use in that window (queue.Enqueue), and
// the message is built identically on every try, so a repeat of an
// interrupted request stores nothing new. A 503 whose message may be
// stored all the same (queue.ErrMaybeStored) keeps the key the request's:
// its retry takes the record over, any other request is refused. Once the
// window has passed, the key makes a new message, ids and all.
// Every error is an RFC 9457 problem document (application/problem+json)
// whose type names what was wrong. The API is described in docs/openapi.yaml.
//
// Memory: a message request holds its body several times over while it is
// served, so each is charged a measured multiple of its size against a
// process-wide budget of bytes in flight, and a tenant's share of it,
// before its body is read; one that finds no room within a short wait is
// refused, unread and unstored, 503 or 429 too-much-in-flight
// (inflight.go). A look-up (GET /v1/events) reads through the events
// stream every tenant shares, unindexed, for up to SearchTimeout: a
// process runs four at once, a key one, and the keys of one tenant two,
// so that one tenant's slow look-ups cannot take them all; one past these
// is refused before it reads, 429 or 503 too-many-searches (events.go). Lists are read a page at a time: GET /v1/suppressions
// takes limit and an opaque cursor, answers next_cursor while more follow,
// and reads only the page from the store.
//
// The listener also serves the recipients' side of one-click unsubscribe
// links under /unsubscribe/ (Config.Unsubscribe, package unsubscribe),
// without a key: the token in the link is the credential.
package api
