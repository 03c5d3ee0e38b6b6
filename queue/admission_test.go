package queue

import (
	"context"
	"sync"
	"testing"
	"time"
)

// gate is an Admission that refuses the tenants it is told to.
type gate struct {
	mu      sync.Mutex
	refused map[string]bool
	changed chan struct{}
}

func (g *gate) Admits(tenant string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.refused[tenant]
}

func (g *gate) Started(string) {}

func (g *gate) Changed() <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.changed == nil {
		g.changed = make(chan struct{})
	}
	return g.changed
}

func (g *gate) admit(tenant string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.refused, tenant)
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// retryEach puts one envelope of each tenant named on the retry lane, due
// now, in that order.
func retryEach(t *testing.T, q *Queue, tenants ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tenant := range tenants {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		work, err := q.Messages(wctx, LaneWork, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := next(t, work)
		n := d.Env.Clone()
		n.Attempt = 1
		if err := d.Reschedule(ctx, n, LaneRetry, time.Now(), true); err != nil {
			t.Fatal(err)
		}
		wcancel()
	}
}

// On the retry lane, which every tenant shares, a tenant the Admission
// refuses (at its share of the delivery slots) does not hold back another
// tenant's envelope behind its own: neither those of the same pull, nor
// those the next pull gets, which is made with the refused ones carried.
// At the stop what is carried goes back at once, not after the ack wait.
func TestAdmissionRefusedTenantHoldsBackNoOther(t *testing.T) {
	q, _ := startQueue(t)
	retryEach(t, q, "big", "big", "small")
	g := &gate{refused: map[string]bool{"big": true}}
	ctx, cancel := context.WithCancel(context.Background())
	held := &Holding{}
	// Two at a time: the first pull gets big's two, and small's comes
	// only with the next one.
	retry, err := q.Messages(WithAdmission(WithHolding(ctx, held), g), LaneRetry, 2)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-retry:
		if d.Env.Tenant != "small" {
			t.Fatalf("handed out tenant %q's envelope, refused", d.Env.Tenant)
		}
		if err := d.Delivered(context.Background(), d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("small's envelope waited behind big's refused ones")
	}
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer wcancel()
	if n, err := held.Wait(wctx); err != nil || n != 2 {
		t.Fatalf("given back %d at the stop (%v), want big's 2", n, err)
	}
	again, err := q.Messages(t.Context(), LaneRetry, 2)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		select {
		case d := <-again:
			if d.Env.Tenant != "big" {
				t.Fatalf("tenant %q", d.Env.Tenant)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("big's carried envelopes were not given back at the stop")
		}
	}
}

// A refused tenant's envelope is handed out as soon as the Admission
// changes its answer, not at the next give-back.
func TestAdmissionChangeHandsOut(t *testing.T) {
	q, _ := startQueue(t)
	retryEach(t, q, "big")
	g := &gate{refused: map[string]bool{"big": true}}
	held := &Holding{}
	retry, err := q.Messages(WithAdmission(WithHolding(t.Context(), held), g), LaneRetry, 2)
	if err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		held.mu.Lock()
		n := held.held
		held.mu.Unlock()
		if n == 1 {
			break // fetched, and held back
		}
		if time.Now().After(end) {
			t.Fatal("the envelope was never fetched")
		}
	}
	select {
	case d := <-retry:
		t.Fatalf("tenant %q handed out while refused", d.Env.Tenant)
	default:
	}
	g.admit("big")
	select {
	case d := <-retry:
		if d.Env.Tenant != "big" {
			t.Fatalf("tenant %q", d.Env.Tenant)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("not handed out once admitted")
	}
}

func TestNextAdmitted(t *testing.T) {
	env := func(tenant string) *Delivery { return &Delivery{Env: &Envelope{Tenant: tenant}} }
	w := []*Delivery{env("a"), env("a"), env("b"), env("a")}
	if got := nextAdmitted(nil, w); got != 0 {
		t.Errorf("no admission: %d", got)
	}
	if got := nextAdmitted(nil, nil); got != -1 {
		t.Errorf("nothing waiting: %d", got)
	}
	if got := nextAdmitted(&gate{refused: map[string]bool{"a": true}}, w); got != 2 {
		t.Errorf("a refused: %d, want b's at 2", got)
	}
	if got := nextAdmitted(&gate{refused: map[string]bool{"a": true, "b": true}}, w); got != -1 {
		t.Errorf("all refused: %d", got)
	}
}
