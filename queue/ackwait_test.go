package queue

import (
	"context"
	"testing"
	"time"
)

// TestStartUpdatesTenantConsumers: a daemon started again with another
// ack wait, replicas and max ack pending gives them to the tenants' work
// consumers that exist, before any mail is stored for them, and keeps the
// rest of their configuration. Before, a tenant's consumer kept the ack
// wait of the daemon that made it until the tenant's next mail, while the
// workers' keep-alives followed the new one: a send longer than the old
// ack wait was handed out again and went out twice.
func TestStartUpdatesTenantConsumers(t *testing.T) {
	q, emb := startQueueWith(t, Options{AckWait: 10 * time.Second, MaxAckPending: 100})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "T", From: "a@src.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	before, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("T"))
	if err != nil {
		t.Fatal(err)
	}
	if aw := before.CachedInfo().Config.AckWait; aw != 10*time.Second {
		t.Fatalf("ack wait %v before the restart, want 10s", aw)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}

	again, err := connectTo(emb, Options{AckWait: 2 * time.Minute, MaxAckPending: 200})
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	c, err := again.lanes[LaneWork].Consumer(ctx, tenantConsumer("T"))
	if err != nil {
		t.Fatal(err)
	}
	got, was := c.CachedInfo().Config, before.CachedInfo().Config
	if got.AckWait != 2*time.Minute || got.MaxAckPending != 200 {
		t.Errorf("after the restart: ack wait %v, max ack pending %d; want 2m and 200", got.AckWait, got.MaxAckPending)
	}
	if got.FilterSubject != was.FilterSubject || got.InactiveThreshold != was.InactiveThreshold || got.Description != was.Description {
		t.Errorf("the rest of the configuration changed: %+v, was %+v", got, was)
	}
	if n := c.CachedInfo().NumPending; n != 1 {
		t.Errorf("%d envelopes pending, want the one stored", n)
	}
}

// TestDeliveryAckWaitIsTheConsumers: a delivery says the ack wait of the
// consumer that handed it out, which another daemon started later set,
// not its own process's; what a process learned is asked again once it
// is older than the refresh.
func TestDeliveryAckWaitIsTheConsumers(t *testing.T) {
	q, emb := startQueueWith(t, Options{AckWait: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "T", From: "a@src.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	if aw := q.consumerAckWait(StreamRetry, consumerRetry); aw != time.Minute {
		t.Fatalf("retry lane: %v learned at setup, want 1m", aw)
	}
	other, err := connectTo(emb, Options{AckWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	ch, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, ch)
	if aw := d.AckWait(); aw != 10*time.Second {
		t.Errorf("delivery's ack wait %v, want its consumer's 10s (the process's is 1m)", aw)
	}
	if err := d.Skip(ctx); err != nil {
		t.Fatal(err)
	}

	// The retry lane's was learned at setup, before the other daemon
	// changed it: it is the old one until the refresh, then the new one.
	if aw := q.consumerAckWait(StreamRetry, consumerRetry); aw != time.Minute {
		t.Fatalf("retry lane: %v before the refresh, want the 1m learned", aw)
	}
	q.ackWaits.mu.Lock()
	q.ackWaits.refresh = time.Millisecond
	q.ackWaits.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		aw := q.consumerAckWait(StreamRetry, consumerRetry)
		if aw == 10*time.Second {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("retry lane: still %v after the refresh, want 10s", aw)
		}
	}
}
