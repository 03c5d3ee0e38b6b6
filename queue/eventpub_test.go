package queue

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
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
		return &nats.Msg{Subject: eventSubject(ev.Type, ev.ID), Data: data, Header: nats.Header{HdrEventID: []string{ev.ID}}}
	}
	ctx := context.Background()
	run := func(b *testing.B, publish func(*nats.Msg) error) {
		b.ReportAllocs()
		defer reportCPU(b)()
		i := 0
		for b.Loop() {
			if err := publish(msg()); err != nil {
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
	b.Run("PublishMsgAsync", func(b *testing.B) {
		run(b, func(m *nats.Msg) error { _, err := q.js.PublishMsgAsync(m); return err })
	})
	b.Run("eventPublisher", func(b *testing.B) { run(b, q.ev.publish) })
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
