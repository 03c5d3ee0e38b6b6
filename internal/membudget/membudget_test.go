package membudget

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The semaphore itself: waiters wake on release, a canceled wait takes
// nothing, the share and the budget are each enforced, a charge over the
// share is refused without a wait, tenants that hold nothing are
// forgotten, and OnChange sees every change in order.
func TestBudget(t *testing.T) {
	b := New(100, 60)
	var seen []int64
	b.OnChange = func(used int64) { seen = append(seen, used) } // called under b's lock
	ctx := context.Background()
	if err := b.Acquire(ctx, "a", 60, 0); err != nil {
		t.Fatal(err)
	}
	var full *Full
	if err := b.Acquire(ctx, "a", 1, 0); !errors.As(err, &full) || !full.TenantFull || full.Limit != 60 {
		t.Fatalf("over the share: %v", err)
	}
	start := time.Now()
	if err := b.Acquire(ctx, "b", 61, time.Minute); !errors.As(err, &full) || !full.TenantFull {
		t.Fatalf("larger than a share: %v", err)
	}
	if time.Since(start) > 10*time.Second {
		t.Fatal("a charge larger than a share waited")
	}
	if err := b.Acquire(ctx, "b", 40, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(ctx, "c", 1, 10*time.Millisecond); !errors.As(err, &full) || full.TenantFull || full.Limit != 100 {
		t.Fatalf("over the budget: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := b.Acquire(cctx, "c", 1, time.Minute); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled wait: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Acquire(ctx, "c", 30, time.Minute) }()
	// The waiter is waiting once it has looked and found no room: the
	// release below wakes it either way, before or after it starts to
	// wait (it looks again when the channel it waits on is closed).
	b.Release("a", 60)
	if err := <-got; err != nil {
		t.Fatalf("a waiter after a release: %v", err)
	}
	if n := b.TenantInUse("c"); n != 30 {
		t.Fatalf("tenant c holds %d, want 30", n)
	}
	b.Release("b", 40)
	b.Release("c", 30)
	if used, peak := b.InUse(); used != 0 || peak != 100 || len(b.tenants) != 0 {
		t.Fatalf("used %d, peak %d, tenants %v", used, peak, b.tenants)
	}
	if full, share := b.Refused(); full != 1 || share != 2 {
		t.Fatalf("refused %d for the budget, %d for a share; want 1 and 2", full, share)
	}
	want := []int64{60, 100, 40, 70, 30, 0}
	if len(seen) != len(want) {
		t.Fatalf("OnChange saw %v, want %v", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Fatalf("OnChange saw %v, want %v", seen, want)
		}
	}
	if New(-1, 0) != nil || New(0, 10) != nil {
		t.Fatal("a budget of zero or less bounds something")
	}
	var none *Budget
	if err := none.Acquire(ctx, "a", 1<<40, 0); err != nil {
		t.Fatal(err)
	}
	none.Release("a", 1<<40)
	if used, _ := none.InUse(); used != 0 || none.Total() != 0 {
		t.Fatal("a nil budget holds something")
	}
}

// Wait charges nothing: it says whether a charge would fit, waiting for
// room as Acquire does, and is refused as Acquire would be.
func TestWait(t *testing.T) {
	b := New(100, 60)
	ctx := context.Background()
	if err := b.Wait(ctx, "a", 60, 0); err != nil {
		t.Fatal(err)
	}
	if used, _ := b.InUse(); used != 0 {
		t.Fatalf("Wait charged %d", used)
	}
	if err := b.Acquire(ctx, "b", 50, 0); err != nil {
		t.Fatal(err)
	}
	var full *Full
	if err := b.Wait(ctx, "a", 51, 10*time.Millisecond); !errors.As(err, &full) || full.TenantFull {
		t.Fatalf("over the budget: %v", err)
	}
	if err := b.Wait(ctx, "a", 61, time.Minute); !errors.As(err, &full) || !full.TenantFull {
		t.Fatalf("larger than a share: %v", err)
	}
	got := make(chan error, 1)
	go func() { got <- b.Wait(ctx, "a", 51, time.Minute) }()
	b.Release("b", 50)
	if err := <-got; err != nil {
		t.Fatalf("a waiter after a release: %v", err)
	}
	if used, _ := b.InUse(); used != 0 || b.TenantInUse("a") != 0 {
		t.Fatalf("Wait left %d charged", used)
	}
	var none *Budget
	if err := none.Wait(ctx, "a", 1<<40, 0); err != nil {
		t.Fatal(err)
	}
}
