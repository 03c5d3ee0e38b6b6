// Package testutil is in charge of the helpers that tests of several
// packages share: a goroutine-safe log buffer, an SMTP send, a sampler of
// a resource's peak under load (Peak), a poll with a deadline (WaitFor),
// a section of a doc that a test holds the code to (DocSection), the
// process's CPU time for benchmarks (ProcessCPU), and a
// direct JetStream client for looking at streams and consumers from
// outside the queue. Tests and the benchmark tool import it, nothing that
// ships. It imports nothing of outflow's, so that the queue's own tests
// can use it; a queue connected in process is package testqueue's.
package testutil
