package throttle

import (
	"testing"
	"time"
)

func TestBucketReservations(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var b bucket
	b.setRate(t0, 10)
	if at := b.reserve(t0); !at.Equal(t0) {
		t.Fatalf("first token due %s, want now", at.Sub(t0))
	}
	for i := 1; i <= 5; i++ {
		if at := b.reserve(t0); !at.Equal(ms(100 * i)) {
			t.Fatalf("reservation %d due at %s, want %dms", i, at.Sub(t0), 100*i)
		}
	}
	// Halving the rate: the debt (5 tokens at 500ms) now takes 1s.
	b.setRate(ms(0), 5)
	if at := b.reserve(ms(0)); !at.Equal(ms(1200)) {
		t.Fatalf("after a rate change: %s, want 1.2s", at.Sub(t0))
	}
	b.refund()
	if at := b.reserve(ms(0)); !at.Equal(ms(1200)) {
		t.Fatalf("after a refund: %s, want 1.2s", at.Sub(t0))
	}
	// Idle for long: the bucket holds one token, no more.
	if at := b.reserve(ms(10000)); !at.Equal(ms(10000)) {
		t.Fatal("no token after idling")
	}
	if at := b.reserve(ms(10000)); !at.Equal(ms(10200)) {
		t.Fatalf("burst beyond one token: %s", at.Sub(t0))
	}
}

// TestBucketSpendAtTurn: a token used later than it was due (the worker
// waited for its turn on the grid) is owed from then: the wait earns no
// tokens for a burst afterwards.
func TestBucketSpendAtTurn(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b bucket
	b.setRate(t0, 10)
	if due := b.reserve(t0); !due.Equal(t0) {
		t.Fatalf("first token due %s", due.Sub(t0))
	}
	turn := t0.Add(time.Second)
	b.spend(turn)
	// Without spend the second, idle in the bucket's view, would make the
	// next token due at once.
	next := b.reserve(t0.Add(500 * time.Millisecond))
	if want := turn.Add(100*time.Millisecond - spendSlack); !next.Equal(want) {
		t.Fatalf("next token due %s, want %s (one period after the turn)", next.Sub(t0), want.Sub(t0))
	}
	// A turn earlier than the token's due time changes nothing.
	b.spend(t0)
	if again := b.reserve(t0.Add(500 * time.Millisecond)); !again.Equal(next.Add(100 * time.Millisecond)) {
		t.Fatalf("after an early spend: %s, want %s", again.Sub(t0), next.Add(100*time.Millisecond).Sub(t0))
	}
}
