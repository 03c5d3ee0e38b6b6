package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/queue"
)

// TestUnstorableDeadLetterKeepsTheEvent: an event bound for the dead
// letters while the dead-letter bucket takes no writes (a leader election,
// a timeout, a full stream; here its stream is gone) is not acknowledged,
// which would lose it: it stays in the endpoint's consumer, comes back at
// the backoff's pace, and once the bucket takes writes again its dead
// letter is stored, without the endpoint being posted to again. A 410
// disables the endpoint only then, and a spent budget counts toward the
// breaker once.
func TestUnstorableDeadLetterKeepsTheEvent(t *testing.T) {
	for _, c := range []struct {
		name   string
		answer int
		posts  int // POSTs before the event is bound for the dead letters (the fixture's MaxAttempts is 4)
	}{{"refused", http.StatusBadRequest, 1}, {"gone", http.StatusGone, 1}, {"spent", http.StatusInternalServerError, 4}} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, status(c.answer))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if err := f.js.DeleteKeyValue(ctx, BucketDead); err != nil {
				t.Fatal(err)
			}
			if err := f.q.PublishEvent(ctx, queue.EventBounced, &queue.Event{ID: "m1", Tenant: "acme"}); err != nil {
				t.Fatal(err)
			}
			var first delivery
			for i := range c.posts {
				if d := f.next(t); i == 0 {
					first = d
				}
			}
			info := func() *jetstream.ConsumerInfo {
				t.Helper()
				cons, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(f.ep.ID))
				if err != nil {
					t.Fatal(err)
				}
				in, err := cons.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				return in
			}
			acked := func(in *jetstream.ConsumerInfo) bool { return in.NumAckPending == 0 && in.NumPending == 0 }
			// Either the event was let go, or its dead letter was tried
			// again on a later delivery, the event kept meanwhile.
			waitUntil(t, "the event acknowledged or its dead letter tried again", func() bool {
				return acked(info()) || strings.Count(f.logs.String(), "webhook dead letter not stored") >= 3
			})
			if in := info(); acked(in) {
				t.Fatalf("the event was acknowledged with no dead letter stored (consumer %+v)", in.AckFloor)
			}
			if ep, _, err := f.store.Get(ctx, f.ep.ID); err != nil || ep.Disabled {
				t.Fatalf("endpoint %+v (%v): disabled before its dead letter was stored", ep, err)
			}

			// The bucket takes writes again.
			if _, err := Open(ctx, f.q); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, "the dead letter stored and the event acknowledged", func() bool {
				dead, err := f.store.Dead(ctx, f.ep.ID)
				return err == nil && len(dead) == 1 && dead[0].ID == first.id && acked(info())
			})
			if c.answer == http.StatusGone {
				waitUntil(t, "the endpoint disabled", func() bool {
					ep, _, err := f.store.Get(ctx, f.ep.ID)
					return err == nil && ep.Disabled
				})
			}
			if c.answer == http.StatusInternalServerError {
				if br, err := f.store.Breaker(ctx, f.ep.ID); err != nil || br.Spent != 1 {
					t.Errorf("breaker %+v (%v): want one spent budget, counted once", br, err)
				}
			}
			f.rc.mu.Lock()
			seen := len(f.rc.seen)
			f.rc.mu.Unlock()
			if seen != c.posts {
				t.Errorf("%d POSTs, want %d: a retried dead-letter write posted the event again", seen, c.posts)
			}
		})
	}
}

// TestNewEndpointGetsEventsBeforeAnyDaemon: an endpoint's events start
// when it is added, not when a daemon first gets round to it: the events
// published while no daemon runs (`webhook add` then `webhook test` with
// every daemon down, or before the runner has started) reach it, in order,
// and a restart does not move its consumer.
func TestNewEndpointGetsEventsBeforeAnyDaemon(t *testing.T) {
	f := newFixture(t, status(http.StatusOK))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f.stop() // every daemon down
	ep, err := f.store.Add(ctx, "acme", f.ep.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	f.rc.mu.Lock()
	f.rc.secret = ep.Secret
	f.rc.mu.Unlock()
	if err := f.store.Remove(ctx, f.ep.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.q.PublishEvent(ctx, queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	if err := f.q.PublishEvent(ctx, EventTest, &queue.Event{ID: "t1", Tenant: "acme", Dest: ep.ID}); err != nil {
		t.Fatal(err)
	}

	f.start(t, nil)
	// Once the runner pulls, an event published now comes after those.
	waitUntil(t, "the runner pulling the endpoint's consumer", func() bool {
		cons, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep.ID))
		if err != nil {
			return false
		}
		in, err := cons.Info(ctx)
		return err == nil && (in.NumWaiting > 0 || in.Delivered.Consumer > 0)
	})
	if err := f.q.PublishEvent(ctx, queue.EventDelivered, &queue.Event{ID: "m2", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"m1", "t1", "m2"} {
		d := f.next(t)
		if data, _ := d.body["data"].(map[string]any); data["id"] != want {
			t.Fatalf("delivered %v, want %s: the events published before the runner started were skipped", d.body, want)
		}
	}

	// A restart (or another daemon of the fleet) makes the consumer again
	// with the same configuration: it carries on where it was. (Stopped
	// once m2 is acknowledged: the receiver hands it over before its
	// answer reaches the runner.)
	waitUntil(t, "m2 acknowledged", func() bool {
		cons, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep.ID))
		if err != nil {
			return false
		}
		in, err := cons.Info(ctx)
		return err == nil && in.NumAckPending == 0 && in.NumPending == 0
	})
	f.stop()
	if err := f.q.PublishEvent(ctx, queue.EventDelivered, &queue.Event{ID: "m3", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	f.start(t, nil)
	if d := f.next(t); d.body["data"].(map[string]any)["id"] != "m3" {
		t.Fatalf("after the restart delivered %v, want m3", d.body)
	}
}
