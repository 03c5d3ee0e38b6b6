package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// TestLookUpAsksAgainAfterAnElection: an admin client's look-up whose
// first request went unanswered (a replicated stream electing a leader)
// is asked again within the caller's deadline, and answered; one that
// is refused is not asked again.
func TestLookUpAsksAgainAfterAnElection(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	tries := 0
	v, err := lookUp(ctx, func(ctx context.Context) (string, error) {
		tries++
		switch tries {
		case 1: // sent in the election: nobody answers
			<-ctx.Done()
			return "", ctx.Err()
		case 2: // the group has a leader, but not yet its API subscription
			return "", nats.ErrNoResponders
		}
		return "OUTFLOW_RATELIMIT", nil
	})
	if err != nil || v != "OUTFLOW_RATELIMIT" || tries != 3 {
		t.Fatalf("lookUp = %q, %v after %d tries; want the answer on the third", v, err, tries)
	}
	if ctx.Err() != nil {
		t.Fatal("the first try took the caller's whole deadline")
	}

	tries = 0
	_, err = lookUp(ctx, func(context.Context) (string, error) {
		tries++
		return "", jetstream.ErrStreamNotFound
	})
	if !errors.Is(err, jetstream.ErrStreamNotFound) || tries != 1 {
		t.Fatalf("a refusal: %v after %d tries; want it at once", err, tries)
	}

	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancelShort()
	start := time.Now()
	_, err = lookUp(short, func(ctx context.Context) (string, error) {
		<-ctx.Done()
		return "", ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("no answer at all: %v after %v; want the caller's deadline", err, time.Since(start))
	}
}
