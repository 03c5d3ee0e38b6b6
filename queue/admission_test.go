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

// workEach stores one message of each tenant named, in that order, on the
// work lane.
func workEach(t *testing.T, q *Queue, tenants ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tenant := range tenants {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
}

// heldReaches waits until held counts n envelopes fetched and not handed
// out.
func heldReaches(t *testing.T, held *Holding, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		held.mu.Lock()
		got := held.held
		held.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d envelopes held, want %d", got, n)
		}
	}
}

// On the work lane, a tenant the Admission refuses (at its share of the
// delivery slots) does not hold back another tenant's fresh mail, and its
// own is handed out as soon as the Admission changes its answer.
func TestAdmissionOnTheWorkLane(t *testing.T) {
	q, _ := startQueue(t)
	workEach(t, q, "big", "big", "small")
	g := &gate{refused: map[string]bool{"big": true}}
	held := &Holding{}
	work, err := q.Messages(WithAdmission(WithHolding(t.Context(), held), g), LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-work:
		if d.Env.Tenant != "small" {
			t.Fatalf("handed out tenant %q's envelope, refused", d.Env.Tenant)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("small's envelope waited behind big's refused ones")
	}
	heldReaches(t, held, 2) // big's two, fetched and held back
	select {
	case d := <-work:
		t.Fatalf("tenant %q handed out while refused", d.Env.Tenant)
	default:
	}
	g.admit("big")
	for range 2 {
		select {
		case d := <-work:
			if d.Env.Tenant != "big" {
				t.Fatalf("tenant %q", d.Env.Tenant)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("not handed out once admitted")
		}
	}
}

// The retry and rate-limit lanes, which every tenant shares, do not ask:
// their envelopes go to the workers as they come (the worker sends one of
// a tenant at its share back to its lane). Left waiting in the pull, a
// refused tenant's envelopes held back every other tenant's behind them.
func TestAdmissionNotAskedOnSharedLanes(t *testing.T) {
	q, _ := startQueue(t)
	e := deferOne(t, q, LaneRetry, time.Now())
	g := &gate{refused: map[string]bool{e.Tenant: true}}
	retry, err := q.Messages(WithAdmission(t.Context(), g), LaneRetry, 2)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-retry:
		if d.Env.ID != e.ID {
			t.Fatalf("got %s", d.Env.ID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a refused tenant's retry was held in the pull")
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
