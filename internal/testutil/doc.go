// Package testutil is in charge of the helpers that tests of several
// packages share: a goroutine-safe log buffer, an SMTP send, a queue
// connected in process to an embedded server (queue.go), and a direct
// JetStream client for looking at streams and consumers from outside the
// queue. Tests and the benchmark tool import it, nothing that ships.
package testutil
