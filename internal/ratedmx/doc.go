// Package ratedmx is in charge of a scripted receiving server for tests and
// benchmarks: a fake MX (internal/fakemx) that enforces an unannounced
// token-bucket limit on accepted messages and answers Gmail's 421 4.7.28
// "rate limited" to every RCPT above it, as mailbox providers do. The limit
// can change while it runs (a provider tightening, then relaxing), and every
// accepted recipient and every throttle is recorded with its time, so a test
// can measure what a sender made of the limit it was never told.
package ratedmx
