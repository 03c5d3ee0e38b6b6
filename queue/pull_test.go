package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// silentIter is a pull iterator that lost its pull request: Next never
// yields a message, it only times out, until Stop.
type silentIter struct {
	jetstream.MessagesContext
	nexts   *atomic.Int64
	stopped chan struct{}
	once    sync.Once
}

func (it *silentIter) Next(...jetstream.NextOpt) (jetstream.Msg, error) {
	it.nexts.Add(1)
	select {
	case <-it.stopped:
		return nil, jetstream.ErrMsgIteratorClosed
	case <-time.After(5 * time.Millisecond):
		return nil, nats.ErrTimeout
	}
}

func (it *silentIter) Stop() { it.once.Do(func() { close(it.stopped) }) }

// stallConsumer hands out silent iterators and reports pending mail.
type stallConsumer struct {
	jetstream.Consumer
	pending  uint64
	full     bool          // the fleet holds MaxAckPending unacknowledged
	messages chan struct{} // one value per Messages call
	nexts    atomic.Int64
}

func (c *stallConsumer) Messages(...jetstream.PullMessagesOpt) (jetstream.MessagesContext, error) {
	c.messages <- struct{}{}
	return &silentIter{nexts: &c.nexts, stopped: make(chan struct{})}, nil
}

func (c *stallConsumer) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	ci := &jetstream.ConsumerInfo{Name: "work-app", NumPending: c.pending, Config: jetstream.ConsumerConfig{MaxAckPending: 4}}
	if c.full {
		ci.NumAckPending = 4
	}
	return ci, nil
}

func (c *stallConsumer) CachedInfo() *jetstream.ConsumerInfo {
	return &jetstream.ConsumerInfo{Name: "work-app"}
}

// A pull that receives nothing while its consumer has mail waiting starts
// a fresh iterator; one that receives nothing because there is nothing to
// receive, or because the fleet already holds the consumer's MaxAckPending,
// keeps waiting on the same iterator.
func TestPullRestartsWhenStalledWithMailWaiting(t *testing.T) {
	old := pullStallCheck
	pullStallCheck = 5 * time.Millisecond
	t.Cleanup(func() { pullStallCheck = old })
	q := &Queue{log: zerolog.Nop()}

	run := func(pending uint64, full bool) *stallConsumer {
		c := &stallConsumer{pending: pending, full: full, messages: make(chan struct{}, 16)}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); q.pull(ctx, c, LaneWork, 1, make(chan *Delivery)) }()
		t.Cleanup(func() { cancel(); <-done })
		return c
	}

	stalled := run(3, false)
	<-stalled.messages
	select {
	case <-stalled.messages:
	case <-time.After(10 * time.Second):
		t.Fatal("a pull with mail waiting and nothing arriving was never started again")
	}

	for name, c := range map[string]*stallConsumer{"nothing pending": run(0, false), "MaxAckPending reached": run(3, true)} {
		<-c.messages
		deadline := time.Now().Add(10 * time.Second)
		for c.nexts.Load() < 50 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond) // polling the iterator's wait count with a deadline
		}
		if c.nexts.Load() < 50 {
			t.Fatalf("%s: only %d waits in 10 s", name, c.nexts.Load())
		}
		select {
		case <-c.messages:
			t.Fatalf("%s: the pull was restarted", name)
		default:
		}
	}
}
