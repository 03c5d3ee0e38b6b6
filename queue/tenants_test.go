package queue

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestTenantBacklogDoesNotDelayOthers: tenant A has 200 messages waiting
// when tenant B submits one; B's message must be among the first handed
// out, not behind A's backlog.
//
// The test starts reading once the server has handed B's message to this
// worker's pull: reading at once would measure only how soon B's pull got
// its first answer while A's flowed, and on a machine loaded with other
// test binaries that is long enough for dozens of A's messages to reach a
// reader that does nothing with them.
func TestTenantBacklogDoesNotDelayOthers(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for range 200 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "bulk", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "urgent", From: "b@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("y\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, LaneWork, 2)
	if err != nil {
		t.Fatal(err)
	}
	urgent, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("urgent"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		ci, err := urgent.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumAckPending == 1 {
			break // handed to the pull, not yet to the reader
		}
		select {
		case <-ctx.Done():
			t.Fatal("tenant urgent's message was never handed to the worker's pull")
		case <-time.After(time.Millisecond):
		}
	}
	for i := 1; i <= 10; i++ {
		d := next(t, work)
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
		if d.Env.ID == ids[0] {
			t.Logf("tenant urgent's message handed out at position %d of 201", i)
			return
		}
	}
	t.Fatal("tenant urgent's message was not among the first 10 handed out: it waited behind tenant bulk's backlog")
}

// TestNewTenantIsPulledAtOnce: a worker already pulling learns of a new
// tenant's consumer from the announcement, not from its periodic look
// (made an hour long here, so only the announcement can deliver).
func TestNewTenantIsPulledAtOnce(t *testing.T) {
	q, _ := startQueue(t)
	old := tenantRefresh
	tenantRefresh = time.Hour
	t.Cleanup(func() { tenantRefresh = old })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A tenant that exists before the worker starts: receiving its mail
	// proves the worker's first look is over.
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "early", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	_ = next(t, work).Skip(ctx)
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "newcomer", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	if d.Env.ID != ids[0] {
		t.Fatalf("got %s, want %s", d.Env.ID, ids[0])
	}
	_ = d.Skip(ctx)
}

// TestWorkOrphans: mail published straight to the work stream for a tenant
// without a consumer is noticed (and adopted, after which it is handed
// out); mail covered by consumers, pending or pulled and not yet
// acknowledged, is not mistaken for orphaned.
func TestWorkOrphans(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orphans := func() bool {
		t.Helper()
		o, err := q.workOrphans(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return o
	}
	// nats-server updates a consumer's pending count after the store
	// returns, so right after a publish the check may answer "maybe";
	// covered mail must stop looking orphaned within a moment.
	covered := func(what string) {
		t.Helper()
		for end := time.Now().Add(5 * time.Second); orphans(); {
			if time.Now().After(end) {
				t.Fatal(what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if orphans() {
		t.Fatal("an empty work stream has orphans")
	}
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "known", From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	covered("mail of a tenant with a consumer counted as orphaned")
	// Published by a client straight to NATS, for a tenant nobody has
	// created a consumer for.
	env := &Envelope{ID: "direct1", MsgID: "direct1", Tenant: "stranger", From: "a@a.example", Rcpts: []string{"r@d.example"},
		Dest: "d.example", BodyRef: "direct1", Size: 3, Parts: 1}
	m, err := env.Encode(workSubject("stranger", "d.example", "direct1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	if !orphans() {
		t.Fatal("mail of a tenant without a consumer was not noticed")
	}
	if err := q.adoptTenants(ctx); err != nil {
		t.Fatal(err)
	}
	covered("orphans remain after adoption")
	// Both envelopes are handed out; while they are held unacknowledged
	// they are still covered (ack pending), not orphaned.
	work, err := q.Messages(ctx, LaneWork, 2)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*Delivery{}
	for len(got) < 2 {
		d := next(t, work)
		got[d.Env.Tenant] = d
	}
	if got["stranger"] == nil || got["known"] == nil {
		t.Fatalf("handed out %v", got)
	}
	covered("envelopes awaiting their ack counted as orphaned")
	for _, d := range got {
		_ = d.Skip(ctx)
	}
}

// BenchmarkAdoptTenantsBacklog: the periodic look for tenants without a
// consumer, with 100,000 fresh envelopes waiting, all covered.
func BenchmarkAdoptTenantsBacklog(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	const n = 100000
	for i := range n {
		if _, err := q.js.PublishAsync("outflow.work.app.d_test.x"+strconv.Itoa(i), []byte("x")); err != nil {
			b.Fatal(err)
		}
	}
	<-q.js.PublishAsyncComplete()
	if err := q.adoptTenants(ctx); err != nil { // creates the consumer
		b.Fatal(err)
	}
	for b.Loop() {
		if err := q.adoptTenants(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// TestClientTenantConsumerFollowsDaemon: a client that sets nothing up
// (outflow submit, with default options) creates a new tenant's consumer
// with the daemon's ack wait and max ack pending, not its own defaults,
// and leaves a consumer the daemon made as it was.
func TestClientTenantConsumerFollowsDaemon(t *testing.T) {
	daemon, emb := startQueueWith(t, Options{AckWait: 5 * time.Minute, MaxAckPending: 77})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := connectTo(emb, Options{NoSetup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	submit := func(q *Queue, tenant string) {
		t.Helper()
		if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	check := func(tenant string) {
		t.Helper()
		c, err := daemon.js.Consumer(ctx, StreamWork, tenantConsumer(tenant))
		if err != nil {
			t.Fatal(err)
		}
		if cfg := c.CachedInfo().Config; cfg.AckWait != 5*time.Minute || cfg.MaxAckPending != 77 {
			t.Errorf("tenant %s: ack wait %v, max ack pending %d; want the daemon's 5m and 77", tenant, cfg.AckWait, cfg.MaxAckPending)
		}
	}
	submit(client, "fresh") // no consumer yet: the client creates it
	check("fresh")
	submit(daemon, "known") // the daemon's
	submit(client, "known")
	check("known")
}
