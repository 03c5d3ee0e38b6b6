package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every 10 ms until it holds, and fails the test when
// within passes first: a test waits for an event this way, never by
// sleeping for a guess.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
