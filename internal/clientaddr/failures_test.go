package clientaddr

import (
	"net/netip"
	"testing"
	"time"
)

// TestFailuresWindow: a key's count runs over a fixed window from its
// first failure; at the limit Wait is the window's rest; keys are apart.
func TestFailuresWindow(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	f := NewFailures[string](2, time.Minute)
	f.Now = func() time.Time { return now }
	if f.Fail("a") != 1 || f.Wait("a") != 0 {
		t.Fatal("one failure of two is at the limit")
	}
	now = now.Add(50 * time.Second)
	if f.Fail("a") != 2 || f.Wait("a") != 10*time.Second || f.Wait("b") != 0 {
		t.Fatalf("at the limit: wait %v, another key's %v", f.Wait("a"), f.Wait("b"))
	}
	now = now.Add(10 * time.Second)
	if f.Wait("a") != 0 || f.Fail("a") != 1 {
		t.Fatal("the window did not end a minute after the first failure")
	}
}

// TestFailuresBounded: a flood of keys does not grow the table past its
// bound.
func TestFailuresBounded(t *testing.T) {
	f := NewFailures[netip.Prefix](1, time.Minute)
	for i := range maxFailureKeys + 10 {
		f.Fail(Prefix(netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)})))
	}
	if n := len(f.keys); n > maxFailureKeys {
		t.Errorf("%d keys tracked, want at most %d", n, maxFailureKeys)
	}
}
