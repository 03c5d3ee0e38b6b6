package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// durableStepWindow is how long a durable step (a SENT marker, a schedule,
// a dead letter, an acknowledgement) keeps trying through a NATS outage: a
// cluster that loses a node elects new stream leaders and the client
// reconnects within seconds. Giving up sooner would leave a delivered
// envelope unrecorded, to be delivered again after the ack wait.
const durableStepWindow = 20 * time.Second

// retryStep runs step until it succeeds, fails with an error that waiting
// cannot fix, ctx ends, or durableStepWindow passes. Every step it is used
// for is idempotent: KV puts of the same key and value, publishes with a
// deduplication id, acknowledgements.
func retryStep(ctx context.Context, step func(context.Context) error) error {
	deadline := time.Now().Add(durableStepWindow)
	wait := 100 * time.Millisecond
	for {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := step(sctx)
		cancel()
		if err == nil || !transient(err) || ctx.Err() != nil || time.Now().Add(wait).After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		wait = min(wait*2, 2*time.Second)
	}
}

// transient reports whether err is the kind a NATS failover produces.
func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrNoServers)
}
