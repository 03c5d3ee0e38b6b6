package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// publishEvents publishes one event of typ for each id and waits for all
// of them to be stored. It waits after every 2,048: a publisher with
// eventMaxPending events unacknowledged waits at most eventStallWait for
// room and then drops the event, which a loop of publishes can outrun on
// a loaded machine.
func publishEvents(ctx context.Context, tb testing.TB, q *Queue, typ string, ids []string) {
	tb.Helper()
	for i, id := range ids {
		q.Event(typ, &Event{ID: id, Dest: "d.example"})
		if (i+1)%2048 == 0 {
			if err := q.asyncStored(ctx); err != nil {
				tb.Fatal("events not stored")
			}
		}
	}
	if err := q.asyncStored(ctx); err != nil {
		tb.Fatal("events not stored")
	}
}

// TestEventSubjectsAreSharded: however many envelopes have events, the
// events stream has at most eventIDShards subjects per type and tenant
// shard (nats-server keeps every subject in memory); the history of one id
// leaves out the other ids of its shard, and finds the id's events in
// every tenant's shard and in the layout before tenant shards.
func TestEventSubjectsAreSharded(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 3 * eventIDShards
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("id%05d", i)
	}
	publishEvents(ctx, t, q, EventQueued, ids)
	info, err := q.events.Info(ctx, jetstream.WithSubjectFilter(subjEvents+">"))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != n {
		t.Fatalf("%d events stored, want %d", info.State.Msgs, n)
	}
	if got := len(info.State.Subjects); got > eventIDShards {
		t.Fatalf("%d events made %d subjects, want at most %d", n, got, eventIDShards)
	}

	target := ids[0]
	var neighbour string
	for _, id := range ids[1:] {
		if eventIDShard(id) == eventIDShard(target) {
			neighbour = id
			break
		}
	}
	if neighbour == "" {
		t.Fatalf("no id shares %s's shard among %d", target, n)
	}
	mid := time.Now()
	publishEvents(ctx, t, q, EventDeferred, []string{target})
	publishEvents(ctx, t, q, EventDelivered, []string{target, neighbour})
	// An event of target's written by a daemon before tenant shards, and
	// one filed under a tenant (another tenant shard than the rest's).
	legacy := &nats.Msg{Subject: subjEvents + EventThrottled + "." + legacyEventShard(target), Header: nats.Header{HdrEventID: []string{target}},
		Data: []byte(`{"type":"throttled","id":"` + target + `","time":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)}
	if _, err := q.js.PublishMsg(ctx, legacy, jetstream.WithExpectStream(StreamEvents)); err != nil {
		t.Fatal(err)
	}
	if eventTenantShard("t1") == eventTenantShard("") {
		t.Fatal("t1 and no tenant share a shard: pick another tenant")
	}
	q.Event(EventDSN, &Event{ID: target, Tenant: "t1"})
	if err := q.asyncStored(ctx); err != nil {
		t.Fatal(err)
	}
	hist, err := q.History(ctx, target, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range hist {
		if ev.ID != target {
			t.Fatalf("history of %s has an event of %s", target, ev.ID)
		}
		types = append(types, ev.Type)
	}
	if want := []string{EventQueued, EventDeferred, EventDelivered, EventThrottled, EventDSN}; !slices.Equal(types, want) {
		t.Fatalf("history of %s = %v, want %v", target, types, want)
	}
	if hist, err := q.History(ctx, neighbour, time.Time{}); err != nil || len(hist) != 2 {
		t.Fatalf("history of %s = %v, %v; want queued and delivered", neighbour, hist, err)
	}
	// since leaves out what was stored before it.
	if hist, err := q.History(ctx, target, mid); err != nil || len(hist) != 4 || hist[0].Type != EventDeferred {
		t.Fatalf("history of %s since the queued event = %v, %v; want deferred, delivered, throttled and dsn", target, hist, err)
	}
	if _, err := q.History(ctx, "nosuchid", time.Time{}); err == nil {
		t.Fatal("history of an unknown id found events")
	}
}

// TestTenantHistory: a tenant's history of its id finds the id's events in
// the tenant's shard and in the layout before tenant shards; another
// tenant's id, even one whose tenant shares the shard, is not found.
func TestTenantHistory(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mate := ""
	for i := range 10000 {
		if c := "c" + strconv.Itoa(i); eventTenantShard(c) == eventTenantShard("a") {
			mate = c
			break
		}
	}
	if mate == "" {
		t.Fatal("no tenant shares a's shard")
	}
	q.Event(EventQueued, &Event{ID: "ida", Tenant: "a"})
	q.Event(EventDelivered, &Event{ID: "ida", Tenant: "a"})
	q.Event(EventQueued, &Event{ID: "idm", Tenant: mate})
	q.Event(EventQueued, &Event{ID: "idb", Tenant: "b"})
	legacy := &nats.Msg{Subject: subjEvents + EventThrottled + "." + legacyEventShard("ida"), Header: nats.Header{HdrEventID: []string{"ida"}},
		Data: []byte(`{"type":"throttled","id":"ida","tenant":"a","time":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)}
	if _, err := q.js.PublishMsg(ctx, legacy, jetstream.WithExpectStream(StreamEvents)); err != nil {
		t.Fatal(err)
	}
	if err := q.asyncStored(ctx); err != nil {
		t.Fatal(err)
	}
	hist, err := q.TenantHistory(ctx, "a", "ida", time.Time{})
	if err != nil || len(hist) != 3 {
		t.Fatalf("a's history of its id: %v, %v; want queued, delivered and throttled", hist, err)
	}
	for _, c := range []struct{ tenant, id string }{{"a", "idm"}, {"a", "idb"}, {mate, "ida"}, {"b", "ida"}, {"", "ida"}} {
		if hist, err := q.TenantHistory(ctx, c.tenant, c.id, time.Time{}); !errors.Is(err, ErrNotFound) {
			t.Errorf("tenant %q's history of %s: %v, %v; want not found", c.tenant, c.id, hist, err)
		}
	}
}

// BenchmarkHistory: `queue history` of one id among the events of 500,000
// envelopes (about 120 in its shard).
func BenchmarkHistory(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	ids := make([]string, 500000)
	for i := range ids {
		ids[i] = fmt.Sprintf("id%07d", i)
	}
	publishEvents(ctx, b, q, EventQueued, ids)
	for b.Loop() {
		if hist, err := q.History(ctx, ids[12345], time.Time{}); err != nil || len(hist) != 1 {
			b.Fatal(hist, err)
		}
	}
}

// BenchmarkHistoryManyTenants: the history of one id among the events of
// 500,000 envelopes of 100 tenants, read as History does (the id's shard in
// every tenant shard) and as TenantHistory does (in its tenant's shard).
func BenchmarkHistoryManyTenants(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	const n, tenants = 500000, 100
	tenantOf := func(i int) string { return "tenant" + strconv.Itoa(i%tenants) }
	for i := range n {
		q.Event(EventQueued, &Event{ID: fmt.Sprintf("id%07d", i), Tenant: tenantOf(i), Dest: "d.example"})
		if (i+1)%2048 == 0 {
			if err := q.asyncStored(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := q.asyncStored(ctx); err != nil {
		b.Fatal(err)
	}
	id, tenant := fmt.Sprintf("id%07d", 12345), tenantOf(12345)
	b.Run("History", func(b *testing.B) {
		for b.Loop() {
			if h, err := q.History(ctx, id, time.Time{}); err != nil || len(h) != 1 {
				b.Fatal(h, err)
			}
		}
	})
	b.Run("TenantHistory", func(b *testing.B) {
		for b.Loop() {
			if h, err := q.TenantHistory(ctx, tenant, id, time.Time{}); err != nil || len(h) != 1 {
				b.Fatal(h, err)
			}
		}
	})
}

// TestHistoryOrdersByEventTime: a worker can deliver an envelope before
// Enqueue's fsync returns, so the delivered event may be stored before the
// queued one. The queued event is stamped no later than the envelope was
// stored (the earliest a worker could have taken it), and History orders by
// event time, so the history (and the API's state, its last event) reads
// queued, delivered.
func TestHistoryOrdersByEventTime(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@x.example", Rcpts: []string{"b@d.example"},
		Body: []byte("Subject: s\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	work, err := q.js.Stream(ctx, StreamWork)
	if err != nil {
		t.Fatal(err)
	}
	env, err := work.GetLastMsgForSubject(ctx, workSubject("t", "d.example", ids[0]))
	if err != nil {
		t.Fatal(err)
	}
	q.Event(EventDelivered, &Event{ID: ids[0], Dest: "d.example", Time: env.Time})
	// Published out of time order: History puts the earlier first.
	q.Event(EventDeferred, &Event{ID: ids[0], Dest: "d.example", Time: env.Time.Add(2 * time.Second)})
	q.Event(EventBounced, &Event{ID: ids[0], Dest: "d.example", Time: env.Time.Add(time.Second)})
	hist, err := q.History(ctx, ids[0], time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range hist {
		types = append(types, ev.Type)
	}
	if want := []string{EventQueued, EventDelivered, EventBounced, EventDeferred}; !slices.Equal(types, want) {
		t.Fatalf("history = %v, want %v (queued at %v, envelope stored at %v)", types, want, hist[0].Time, env.Time)
	}
}

// BenchmarkEventSubject: the subject of each event published, two hashes
// and one string.
func BenchmarkEventSubject(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = eventSubject(EventDelivered, "trusted", "28kyZUjPp0excjVOwZna1y")
	}
}
