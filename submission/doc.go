// Package submission is in charge of the authenticated SMTP submission
// listener: it accepts mail from applications over SMTP (RFC 5321, RFC 6409),
// authenticates them with AUTH PLAIN or LOGIN (RFC 4954) against a users file
// of bcrypt hashes (read again on a reload: Server.SetUsers, which also ends
// the sessions of accounts it removed or changed), enforces the limits and input rules that keep bad input
// out of the queue (size, recipients, line length, bare LF and CR, NUL,
// malformed addresses, slow clients, connection count, AUTH brute force), and
// hands every accepted message to the queue through an Enqueuer.
//
// Failure semantics: a message is acknowledged with 250 only after
// Enqueuer.Enqueue returned nil, which means JetStream stored it. Every other
// outcome is an explicit SMTP error: 4xx when retrying may succeed (the queue
// was unavailable, a timeout, shutdown), 5xx when it will not (the message or
// an address is malformed, too big, or the client is not authorised). There
// is never an open relay: a client must AUTH, or connect from one of the
// configured trusted networks, before MAIL FROM is accepted.
//
// The listener is built on go-smtp v0.25.1. Some of its behaviour is relied
// on, and some is worked around, on purpose; each place says which. DATA
// bodies are read by dotReader (dotreader.go), which does go-smtp's
// dot-unstuffing and line counting a buffer at a time instead of an octet
// at a time, through go-smtp's private fields at their checked layout;
// under go-smtp's 4 KiB buffer the tracked connection reads a body from
// the socket up to 32 KiB at a time (listener.go, readConn). On a
// plaintext connection it also joins go-smtp's replies, which go-smtp
// writes a line at a time: a multi-line reply's lines, and the replies to
// a PIPELINING client's group of commands, leave in one write (listener.go,
// Write); under TLS a writer under go-smtp's does the same with fewer
// replies held (listener.go, tlsReplies).
// Each body is read into a pooled buffer with room in front of it, where
// the queue writes the envelope instead of copying the body
// (queue.Submission.Frame); the buffer goes back to its pool once Enqueue
// has returned nil, after which the Enqueuer holds nothing of it (body.go).
// The memory those bodies hold at once is bounded process-wide, with a
// share per tenant: each transaction is charged for its body before it
// holds it, and one that finds no room within a short wait is refused
// with 452 4.3.1, nothing queued (inflight.go, on internal/membudget).
// docs/submission.md lists every configuration field and every reply code.
package submission
