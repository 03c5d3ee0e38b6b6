package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// emptyBatch is a pull request that ended without a message: what a
// worker sees when its request expired, or when a failover lost it.
type emptyBatch struct{ jetstream.MessageBatch }

func (emptyBatch) Messages() <-chan jetstream.Msg {
	ch := make(chan jetstream.Msg)
	close(ch)
	return ch
}

func (emptyBatch) Error() error { return nil }

// countingConsumer records every pull request made on it.
type countingConsumer struct {
	jetstream.Consumer
	fetches chan struct{} // one value per pull request
}

func (c *countingConsumer) Fetch(n int, opts ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	select {
	case c.fetches <- struct{}{}:
	default: // the test has seen enough; never block the pull loop
	}
	return emptyBatch{}, nil
}

func (c *countingConsumer) Messages(...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	panic("pull must not keep a long-lived iterator: one that goes silent in a failover never recovers")
}

// A lane's pull is a series of pull requests, each with an expiry: when one
// ends without mail (expired, or lost in a failover) the next goes out at
// once, on the same consumer, without the pause that follows a failure.
func TestPullIssuesFreshRequests(t *testing.T) {
	q := &Queue{log: zerolog.Nop()}
	c := &countingConsumer{fetches: make(chan struct{}, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); q.pull(ctx, c, LaneWork, 4, make(chan *Delivery)) }()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.After(10 * time.Second)
	for i := range 20 {
		select {
		case <-c.fetches:
		case <-deadline:
			t.Fatalf("only %d pull requests in 10 s", i)
		}
	}
}
