package quota

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	now := time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC) // no hour ends during the test
	a.now, b.now = func() time.Time { return now }, func() time.Time { return now }
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

// Leases start at one recipient and double, up to a hundredth of the
// limit: what a process leased counts for the others at once; what it did
// not use goes back to its hour's count when the hour ends.
func TestLeasesGrowAndGoBack(t *testing.T) {
	a, b := openTwo(t, Config{Default: 1000})
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC)
	a.now, b.now = func() time.Time { return now }, func() time.Time { return now }
	count := func(h time.Time) uint64 {
		t.Helper()
		v, _, err := b.read(ctx, slotKey("shop", h.Unix()/3600))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for range 7 { // leases of 1, 2, 4: 7 recipients
		if err := a.Take(ctx, "shop", 1); err != nil {
			t.Fatal(err)
		}
	}
	if got := count(now); got != 7 {
		t.Fatalf("the hour's count after 7 recipients in growing leases: %d", got)
	}
	if err := a.Take(ctx, "shop", 1); err != nil { // a lease of 8
		t.Fatal(err)
	}
	if got := count(now); got != 15 {
		t.Fatalf("after the fourth lease: %d, want 15 (7 of them unused)", got)
	}
	if err := b.Take(ctx, "shop", 986); !errors.Is(err, ErrExceeded) {
		t.Fatalf("986 more with 15 counted: %v", err)
	}
	if err := b.Take(ctx, "shop", 985); err != nil {
		t.Fatalf("985 more: %v", err)
	}
	// The next hour: a's 7 unused recipients go back to the last hour, and
	// the fleet may send them.
	start := now
	now = now.Add(time.Hour)
	if err := a.Take(ctx, "shop", 7); err != nil {
		t.Fatalf("the unused lease given back: %v", err)
	}
	if got := count(start); got != 1000-7 {
		t.Fatalf("the last hour's count after the give-back: %d, want 993", got)
	}
	if err := a.Take(ctx, "shop", 1); !errors.Is(err, ErrExceeded) {
		t.Fatalf("past the limit: %v", err)
	}
	if err := a.Take(ctx, "shop", 1001); !errors.Is(err, ErrOverLimit) {
		t.Fatalf("more than the limit at once: %v", err)
	}
}

// A process whose clock is a little behind leases from the hour before:
// the others count it all the same.
func TestClocksApartShareTheLimit(t *testing.T) {
	a, b := openTwo(t, Config{Default: 100})
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 11, 0, 1, 0, time.UTC)
	a.now = func() time.Time { return now }
	b.now = func() time.Time { return now.Add(-2 * time.Second) } // still 10:59:59
	granted := 0
	for _, l := range []*Limiter{a, b, a, b} {
		for l.Take(ctx, "shop", 1) == nil {
			granted++
		}
	}
	if granted != 100 {
		t.Fatalf("granted %d for a limit of 100 across an hour's boundary", granted)
	}
}

// Recipients taken and not sent come back to this process's next Takes.
func TestReturn(t *testing.T) {
	a, _ := openTwo(t, Config{Default: 3})
	ctx := context.Background()
	if err := a.Take(ctx, "shop", 3); err != nil {
		t.Fatal(err)
	}
	a.Return("shop", 2)
	if err := a.Take(ctx, "shop", 2); err != nil {
		t.Fatalf("after giving back two: %v", err)
	}
	if err := a.Take(ctx, "shop", 1); !errors.Is(err, ErrExceeded) {
		t.Fatalf("past the limit: %v", err)
	}
}

// The window rolls by the hour: a limit spent now comes free 24 hours
// after the end of the hour it was spent in, and the refusal says when.
func TestWindowRolls(t *testing.T) {
	a, _ := openTwo(t, Config{Default: 5})
	ctx := context.Background()
	start := time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC)
	now := start
	a.now = func() time.Time { return now }
	if err := a.Take(ctx, "shop", 5); err != nil {
		t.Fatal(err)
	}
	free := time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)
	now = start.Add(3 * time.Hour)
	err := a.Take(ctx, "shop", 1)
	var ex *Exceeded
	if !errors.As(err, &ex) || ex.Limit != 5 || !ex.Until.Equal(free) {
		t.Fatalf("3 h later: %v, want refused until the 10:00 hour leaves the window, at 11:00 the next day", err)
	}
	now = free.Add(-time.Second) // 10:59:59 the next day
	if err := a.Take(ctx, "shop", 1); !errors.As(err, &ex) || !ex.Until.Equal(free) {
		t.Fatalf("24 h 29 min later: %v", err)
	}
	now = free
	if err := a.Take(ctx, "shop", 5); err != nil {
		t.Fatalf("24 h after the hour ended: %v", err)
	}
}

// No 24 hours hold more than the limit, at the worst moments too: the
// whole limit spent in the last second of an hour still counts at the
// start of the same hour the next day (23 h 0 min 1 s later), and the
// refusal quotes the first moment a day has passed since then. Two
// processes take from the limit in turn, every half hour and in the last
// second of each hour for three days, as much as each is given.
func TestNoDayHoldsMoreThanTheLimit(t *testing.T) {
	const limit = 200 // leases grow to 2
	a, b := openTwo(t, Config{Default: limit})
	ctx := context.Background()
	first := time.Date(2026, 12, 6, 10, 59, 59, 0, time.UTC)
	now := first
	a.now, b.now = func() time.Time { return now }, func() time.Time { return now }
	if err := a.Take(ctx, "shop", limit); err != nil {
		t.Fatal(err)
	}
	now = time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	var ex *Exceeded
	if err := b.Take(ctx, "shop", 1); !errors.As(err, &ex) || !ex.Until.Equal(time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC)) {
		t.Fatalf("the whole limit again 23 h 0 min 1 s later: %v, want refused until 11:00", err)
	}

	granted := slices.Repeat([]time.Time{first}, limit)
	start := now
	for step := range 3 * 24 * 3 {
		// :00:00, :30:00 and :59:59 of each hour.
		now = start.Add(time.Duration(step/3)*time.Hour + []time.Duration{0, 30 * time.Minute, 59*time.Minute + 59*time.Second}[step%3])
		for open := 2; open > 0; {
			open = 0
			for _, l := range []*Limiter{a, b} {
				err := l.Take(ctx, "shop", 1)
				if err == nil {
					granted = append(granted, now)
					open++
					continue
				}
				if !errors.As(err, &ex) {
					t.Fatal(err)
				}
				if !ex.Until.After(now) || ex.Until.Sub(now) > 25*time.Hour {
					t.Fatalf("at %s: refused until %s", now, ex.Until)
				}
			}
		}
	}
	if len(granted) < 3*limit {
		t.Fatalf("%d recipients in three days under a limit of %d a day", len(granted), limit)
	}
	// granted is in time order: for each grant, the grants in the 24 hours
	// from it, both ends included.
	for i, from := range granted {
		n := 0
		for _, at := range granted[i:] {
			if at.Sub(from) <= 24*time.Hour {
				n++
			}
		}
		if n > limit {
			t.Fatalf("%d recipients in the 24 hours from %s, for a limit of %d", n, from, limit)
		}
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

// Read sums each tenant's hours in the window: what the fleet counted,
// leases included, and nothing older than 24 hours.
func TestRead(t *testing.T) {
	a, _ := openTwo(t, Config{Default: 1000})
	ctx := context.Background()
	now := time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC)
	a.now = func() time.Time { return now.Add(-25 * time.Hour) } // out of the window by then
	if err := a.Take(ctx, "shop", 5); err != nil {
		t.Fatal(err)
	}
	a.now = func() time.Time { return now.Add(-2 * time.Hour) }
	if err := a.Take(ctx, "shop", 3); err != nil {
		t.Fatal(err)
	}
	a.now = func() time.Time { return now }
	if err := a.Take(ctx, "shop", 2); err != nil {
		t.Fatal(err)
	}
	if err := a.Take(ctx, "news", 1); err != nil {
		t.Fatal(err)
	}
	got, err := Read(ctx, kvBuckets{a.kv}, "", now)
	if err != nil {
		t.Fatal(err)
	}
	want := []Usage{{Tenant: "news", Last24h: 1, ThisHour: 1}, {Tenant: "shop", Last24h: 5, ThisHour: 2}}
	if !slices.Equal(got, want) {
		t.Fatalf("Read = %+v, want %+v", got, want)
	}
	if one, err := Read(ctx, kvBuckets{a.kv}, "news", now); err != nil || len(one) != 1 || one[0].Tenant != "news" {
		t.Fatalf("Read of one tenant = %+v, %v", one, err)
	}
}

// kvBuckets hands out one bucket already open.
type kvBuckets struct{ kv jetstream.KeyValue }

func (b kvBuckets) KeyValue(context.Context, jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	return b.kv, nil
}

// barrierKV holds the first Create or Update of each of two limiters until
// both have read: two processes on either side of an hour lease at the
// same moment, each from its own hour's key.
type barrierKV struct {
	jetstream.KeyValue
	wg   *sync.WaitGroup
	once sync.Once
}

func (b *barrierKV) hold() { b.once.Do(func() { b.wg.Done(); b.wg.Wait() }) }

func (b *barrierKV) Create(ctx context.Context, k string, v []byte, o ...jetstream.KVCreateOpt) (uint64, error) {
	b.hold()
	return b.KeyValue.Create(ctx, k, v, o...)
}

func (b *barrierKV) Update(ctx context.Context, k string, v []byte, r uint64) (uint64, error) {
	b.hold()
	return b.KeyValue.Update(ctx, k, v, r)
}

// TestHourBoundaryLeases: two processes, one a millisecond before 11:00
// and one at it, lease 600 of a limit of 1000 at the same moment, each
// from its own hour's key. Not both are granted: each write's
// compare-and-set covers its own hour only, and both were once.
func TestHourBoundaryLeases(t *testing.T) {
	for range 3 {
		a, b := openTwo(t, Config{Default: 1000})
		var wg sync.WaitGroup
		wg.Add(2)
		a.kv = &barrierKV{KeyValue: a.kv, wg: &wg}
		b.kv = &barrierKV{KeyValue: b.kv, wg: &wg}
		at := time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC)
		a.now = func() time.Time { return at.Add(-time.Millisecond) }
		b.now = func() time.Time { return at }
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		errs := make(chan error, 2)
		go func() { errs <- a.Take(ctx, "shop", 600) }()
		go func() { errs <- b.Take(ctx, "shop", 600) }()
		e1, e2 := <-errs, <-errs
		cancel()
		if e1 == nil && e2 == nil {
			t.Fatal("both granted: 1200 recipients under a limit of 1000")
		}
	}
}
