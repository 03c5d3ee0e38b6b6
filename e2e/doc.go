// Package e2e holds outflow's end-to-end tests: they build the real binary,
// start `outflow serve` on loopback ports against fake or real SMTP peers,
// and check what arrives. It has no non-test code.
package e2e
