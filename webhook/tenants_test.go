package webhook

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
)

// An endpoint's consumer is handed its tenant's shard of the events only:
// other tenants' events in other shards never reach it (each one would
// cost a delivery, a decode and an acknowledgement), and an event written
// in the layout before tenant shards still reaches its tenant's endpoint.
func TestEndpointIsNotHandedOtherTenantsEvents(t *testing.T) {
	f := newFixture(t, status(http.StatusNoContent))
	other := ""
	for i := range 100 {
		if c := "other" + strconv.Itoa(i); queue.EventTenantFilters(queue.EventDelivered, c)[0] != queue.EventTenantFilters(queue.EventDelivered, "acme")[0] {
			other = c
			break
		}
	}
	for i := range 50 {
		f.q.Event(queue.EventDelivered, &queue.Event{ID: "o" + strconv.Itoa(i), Tenant: other})
	}
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "mine", Tenant: "acme"})
	if d := f.next(t); d.body["data"].(map[string]any)["id"] != "mine" {
		t.Fatalf("delivered %v, want acme's event", d.body)
	}
	ctx := context.Background()
	cons, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(f.ep.ID))
	if err != nil {
		t.Fatal(err)
	}
	if n := cons.CachedInfo().Delivered.Consumer; n != 1 {
		t.Fatalf("the endpoint's consumer was handed %d events, want 1: the other tenant's reached it", n)
	}

	// A daemon of the release before tenant shards wrote acme's event on
	// outflow.events.<type>.<shard>.
	legacy := &nats.Msg{Subject: "outflow.events.delivered.abc", Header: nats.Header{queue.HdrEventID: []string{"old"}},
		Data: []byte(`{"type":"delivered","id":"old","tenant":"acme","time":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)}
	if _, err := f.js.PublishMsg(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	if d := f.next(t); d.body["data"].(map[string]any)["id"] != "old" {
		t.Fatalf("delivered %v, want acme's event in the old layout", d.body)
	}
}

// BenchmarkOtherTenantsEndpoints: what the endpoints of other tenants cost
// the delivery of one tenant's events. Each sub-benchmark registers that
// many endpoints for other tenants beside acme's, publishes b.N events of
// acme's and reports the process's CPU per event (user + system, the
// embedded server included) until acme's endpoint has them all.
func BenchmarkOtherTenantsEndpoints(b *testing.B) {
	for _, others := range []int{0, 10} {
		b.Run(strconv.Itoa(others), func(b *testing.B) {
			var n atomic.Int64
			f := newFixture(b, func(w http.ResponseWriter) { n.Add(1); w.WriteHeader(http.StatusNoContent) })
			f.rc.mu.Lock()
			f.rc.got = nil
			f.rc.mu.Unlock()
			ctx := context.Background()
			var ids []string
			for i := range others {
				ep, err := f.store.Add(ctx, "other"+strconv.Itoa(i), "http://127.0.0.1:9/hook", nil)
				if err != nil {
					b.Fatal(err)
				}
				waitUntil(b, "the other endpoint's consumer", func() bool {
					_, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep.ID))
					return err == nil
				})
				ids = append(ids, ep.ID)
			}
			cpu0 := testutil.ProcessCPU()
			b.ResetTimer()
			for i := range b.N {
				f.q.Event(queue.EventDelivered, &queue.Event{ID: "b" + strconv.Itoa(i), Tenant: "acme"})
			}
			waitUntil(b, "every event delivered", func() bool { return n.Load() >= int64(b.N) })
			for _, id := range ids {
				waitUntil(b, "the other endpoints past every event", func() bool {
					c, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(id))
					if err != nil {
						return false
					}
					ci := c.CachedInfo()
					return ci.NumPending == 0 && ci.NumAckPending == 0
				})
			}
			b.ReportMetric(float64((testutil.ProcessCPU()-cpu0).Microseconds())/float64(b.N), "cpu-µs/event")
		})
	}
}
