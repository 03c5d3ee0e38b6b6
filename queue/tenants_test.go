package queue

import (
	"context"
	"testing"
	"time"
)

// TestTenantBacklogDoesNotDelayOthers: tenant A has 200 messages waiting
// when tenant B submits one; B's message must be among the first handed
// out, not behind A's backlog.
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
