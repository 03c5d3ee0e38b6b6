package quota

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

func openTwo(t *testing.T, cfg Config) (*Limiter, *Limiter) {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var ls [2]*Limiter
	for i := range ls {
		q := testqueue.Connect(t, emb, queue.Options{})
		if ls[i], err = Open(ctx, q, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return ls[0], ls[1]
}

// Two processes taking one recipient at a time, concurrently, are given
// the limit between them and not one more.
func TestLimitIsTheFleets(t *testing.T) {
	a, b := openTwo(t, Config{Tenants: map[string]int{"shop": 60}})
	ctx := context.Background()
	var mu sync.Mutex
	granted := 0
	var wg sync.WaitGroup
	for _, l := range []*Limiter{a, b, a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				err := l.Take(ctx, "shop", 1)
				if errors.Is(err, ErrExceeded) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				granted++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if granted != 60 {
		t.Fatalf("granted %d recipients for a limit of 60", granted)
	}
	// Another tenant, unlimited, is not counted at all.
	if err := a.Take(ctx, "other", 1000); err != nil {
		t.Fatal(err)
	}
}

// A process leases a hundredth of the limit at a time: what it leased
// counts for the others at once, and what it did not use is not given to
// them.
func TestLeasesCountForTheOthers(t *testing.T) {
	a, b := openTwo(t, Config{Default: 1000})
	ctx := context.Background()
	if err := a.Take(ctx, "shop", 1); err != nil {
		t.Fatal(err)
	}
	cur, _, err := b.read(ctx, slotKey("shop", time.Now().Unix()/3600))
	if err != nil || cur != 10 {
		t.Fatalf("the hour's count after one recipient: %d, %v; want a lease of 10", cur, err)
	}
	if err := b.Take(ctx, "shop", 991); !errors.Is(err, ErrExceeded) {
		t.Fatalf("991 more with 10 leased elsewhere: %v", err)
	}
	if err := b.Take(ctx, "shop", 990); err != nil {
		t.Fatalf("990 more: %v", err)
	}
	// a's lease holds 9 more.
	for range 9 {
		if err := a.Take(ctx, "shop", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Take(ctx, "shop", 1); !errors.Is(err, ErrExceeded) {
		t.Fatalf("past the limit: %v", err)
	}
}

// The window rolls by the hour: a limit spent now comes free 24 hours
// after the hour it was spent in, and the refusal says when.
func TestWindowRolls(t *testing.T) {
	a, _ := openTwo(t, Config{Default: 5})
	ctx := context.Background()
	start := time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC)
	now := start
	a.now = func() time.Time { return now }
	if err := a.Take(ctx, "shop", 5); err != nil {
		t.Fatal(err)
	}
	now = start.Add(3 * time.Hour)
	err := a.Take(ctx, "shop", 1)
	var ex *Exceeded
	if !errors.As(err, &ex) || ex.Limit != 5 || !ex.Until.Equal(time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)) {
		t.Fatalf("3 h later: %v, want refused until the 10:00 hour leaves the window, at 10:00 the next day", err)
	}
	now = start.Add(23*time.Hour + 29*time.Minute) // 09:59 the next day
	if err := a.Take(ctx, "shop", 1); !errors.Is(err, ErrExceeded) {
		t.Fatalf("23 h later: %v", err)
	}
	now = start.Add(23*time.Hour + 30*time.Minute) // 10:00
	if err := a.Take(ctx, "shop", 5); err != nil {
		t.Fatalf("a day later: %v", err)
	}
}

// No limit, no bucket, and a nil limiter allows everything; a tenant can
// be let off a default limit with 0.
func TestNoLimit(t *testing.T) {
	l, err := Open(context.Background(), nil, Config{Tenants: map[string]int{"shop": 0}})
	if l != nil || err != nil {
		t.Fatalf("Open without limits: %v, %v", l, err)
	}
	if err := l.Take(context.Background(), "shop", 1<<20); err != nil {
		t.Fatal(err)
	}
	c := Config{Default: 10, Tenants: map[string]int{"free": 0}}
	if c.Limit("free") != 0 || c.Limit("shop") != 10 {
		t.Fatalf("limits %d, %d", c.Limit("free"), c.Limit("shop"))
	}
}

// BenchmarkTake is a limited tenant's cost per recipient: a count in
// memory, and a lease from the bucket every hundredth of the limit (a
// limit of a million, so run it at most a million times: -benchtime
// 200000x).
func BenchmarkTake(b *testing.B) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(emb.Shutdown)
	q := testqueue.Connect(b, emb, queue.Options{})
	l, err := Open(context.Background(), q, Config{Default: 1_000_000})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Take(ctx, "shop", 1); err != nil {
			b.Fatal(err)
		}
	}
}
