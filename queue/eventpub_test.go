package queue

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
)

// Events are stored, Flush waits for their acknowledgements, and a refused
// event is logged.
func TestEventPublisherStoresAndCompletes(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 500 {
		q.Event(EventQueued, &Event{ID: "ev" + strconv.Itoa(i), Tenant: "t1"})
	}
	if err := q.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	q.ev.mu.Lock()
	n := len(q.ev.pending)
	q.ev.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d events pending after Flush", n)
	}
	info, err := q.events.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 500 {
		t.Fatalf("events stream holds %d, want 500", info.State.Msgs)
	}
	evs, err := q.History(ctx, "ev7", time.Time{})
	if err != nil || len(evs) != 1 || evs[0].Type != EventQueued {
		t.Fatalf("History(ev7) = %v, %v", evs, err)
	}
}

// An event the server does not store (here: larger than the stream's
// limit) is logged, and no longer counts as pending.
func TestEventNotStoredIsLogged(t *testing.T) {
	var logs testutil.SyncBuffer
	q, _ := startQueue(t)
	q.ev.log = zerolog.New(&logs) // connectTo gives the queue a Nop logger
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := q.events.CachedInfo().Config
	cfg.MaxMsgSize = 16 // every event is larger: the stream refuses it
	if _, err := q.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	q.Event(EventQueued, &Event{ID: "lost1"})
	if err := q.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if out := logs.String(); !strings.Contains(out, "events not confirmed as stored") || !strings.Contains(out, `"events":1`) {
		t.Fatalf("log: %s", out)
	}
}

// go test -run '^$' -bench EventPublish -benchmem -count 3 ./queue
//
// An event's publish and its acknowledgement (the embedded server's CPU
// included): through nats.go's async publisher as before, and through
// eventPublisher.
func BenchmarkEventPublish(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ev := &Event{Type: EventDelivered, Time: time.Now().UTC(), ID: "28kyZUjPp0excjVOwZna1y", MsgID: "28kyZUjPp0excjVOwZna1y", Tenant: "trusted", Dest: "example.com", Attempt: 1, Worker: "bench/31"}
	data, _ := ev.appendJSON(nil)
	msg := func() *nats.Msg {
		return &nats.Msg{Subject: eventSubject(ev.Type, ev.Tenant, ev.ID), Data: data, Header: nats.Header{HdrEventID: []string{ev.ID}}}
	}
	ctx := context.Background()
	run := func(b *testing.B, publish func() error) {
		b.ReportAllocs()
		defer reportCPU(b)()
		i := 0
		for b.Loop() {
			if err := publish(); err != nil {
				b.Fatal(err)
			}
			if i++; i%256 == 0 {
				if err := q.asyncStored(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := q.asyncStored(ctx); err != nil {
			b.Fatal(err)
		}
	}
	// A message already encoded, through nats.go's publisher and through
	// the queue's own.
	b.Run("PublishMsgAsync", func(b *testing.B) {
		run(b, func() error { _, err := q.js.PublishMsgAsync(msg()); return err })
	})
	b.Run("eventPublisher", func(b *testing.B) { run(b, func() error { return q.ev.publish(msg()) }) })
	// Queue.Event: the encoding, a pooled message and the publish.
	b.Run("Event", func(b *testing.B) {
		run(b, func() error {
			e := *ev
			q.Event(EventDelivered, &e)
			return nil
		})
	})
}

// An event whose acknowledgement never comes (a stream leader that took
// the request and died) is counted as not stored after eventAckTimeout,
// and stops holding its place: a Flush waiting for it returns.
func TestEventWithoutAckExpires(t *testing.T) {
	var logs testutil.SyncBuffer
	q, _ := startQueue(t)
	p := q.ev
	p.log = zerolog.New(&logs)
	sent := time.Now()
	p.mu.Lock()
	p.pending[1<<60] = &pendingEvent{m: &nats.Msg{Subject: "outflow.events.queued.x"}, at: sent}
	p.mu.Unlock()
	done := p.complete()
	p.expire(sent.Add(eventAckTimeout - time.Millisecond))
	select {
	case <-done:
		t.Fatal("expired before eventAckTimeout")
	default:
	}
	p.expire(sent.Add(eventAckTimeout))
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a Flush would still wait for the unacknowledged event")
	}
	if out := logs.String(); !strings.Contains(out, "events not confirmed as stored") || !strings.Contains(out, `"events":1`) {
		t.Fatalf("log: %s", out)
	}
}

// Pooled events go back to the pool once stored and are reused at once:
// many publishers at a time, each event of its own length, must each be
// stored with its own id, header and content.
func TestPooledEventsKeepTheirContent(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const publishers, each = 8, 300
	reason := func(id string) string { return strings.Repeat(id+";", 1+len(id)%7*40) }
	var wg sync.WaitGroup
	for p := range publishers {
		wg.Go(func() {
			for i := range each {
				id := "pool" + strconv.Itoa(p) + "x" + strconv.Itoa(i)
				q.Event(EventDeferred, &Event{ID: id, Tenant: "t1", Reason: reason(id)})
			}
		})
	}
	wg.Wait()
	if err := q.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := q.events.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < publishers*each {
		batch, err := c.Fetch(500, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var ev Event
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatalf("stored event %q: %v", m.Data(), err)
			}
			if h := m.Headers().Get(HdrEventID); h != ev.ID || m.Subject() != eventSubject(EventDeferred, "t1", ev.ID) ||
				ev.Reason != reason(ev.ID) || ev.Type != EventDeferred {
				t.Fatalf("stored event %s on %s with header %q: %+v", ev.ID, m.Subject(), h, ev)
			}
			if seen[ev.ID] {
				t.Fatalf("event %s stored twice", ev.ID)
			}
			seen[ev.ID] = true
		}
		if n == 0 {
			t.Fatalf("%d of %d events stored", len(seen), publishers*each)
		}
	}
}
