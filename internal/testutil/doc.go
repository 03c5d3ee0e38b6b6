// Package testutil is in charge of the helpers that tests of several
// packages share: a goroutine-safe log buffer, an SMTP send, a sampler of
// a resource's peak under load (Peak), and a direct JetStream client for
// looking at streams and consumers from outside the queue. It imports
// nothing of outflow's, so the queue's own tests use it too; a queue
// connected in process is testqueue's. Tests and the benchmark tool import it, nothing that ships.
package testutil
