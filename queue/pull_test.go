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

// TestWaitingEnvelopesGivenBack: envelopes fetched while every worker is
// busy wait in the process, and the server's ack wait runs from the
// fetch. One not taken within half the ack wait is given back unstarted,
// so the copy a worker later takes is the only one. Left waiting, the
// server handed each out again after the ack wait while its stale copy
// was still to be taken, and both copies were sent.
func TestWaitingEnvelopesGivenBack(t *testing.T) {
	const ackWait = time.Second
	q, _ := startQueueWith(t, Options{AckWait: ackWait})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range []string{"a@one.example", "b@one.example", "c@one.example"} {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "s@src.example", Rcpts: []string{r}, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	work, err := q.Messages(ctx, LaneWork, 3)
	if err != nil {
		t.Fatal(err)
	}
	// The one worker takes the first and is busy for three ack waits,
	// its heartbeat keeping it; the other two wait, fetched.
	held := []*Delivery{next(t, work)}
	beat := time.NewTicker(ackWait / 5)
	defer beat.Stop()
	keep := func(d time.Duration, take <-chan *Delivery) {
		for end := time.After(d); ; {
			select {
			case <-beat.C:
				for _, d := range held {
					d.InProgress()
				}
			case d := <-take:
				for _, h := range held {
					if h.Env.ID == d.Env.ID {
						t.Fatalf("%s handed out again (delivery %d) while a worker holds it", d.Env.ID, d.Deliveries)
					}
				}
				held = append(held, d)
			case <-end:
				return
			}
		}
	}
	keep(3*ackWait, nil)
	// The worker is free: it takes the other two, each once, and nothing
	// is handed out again while the three are worked on.
	keep(3*ackWait, work)
	if len(held) != 3 {
		t.Fatalf("%d envelopes taken, want 3", len(held))
	}
	if n := q.Ops()["given_back"]; n < 2 {
		t.Errorf("given back %d times, want the two waiting at least once", n)
	}
	for _, d := range held {
		if err := d.Done(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
