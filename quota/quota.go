package quota

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketQuota holds every limited tenant's counts, one key per tenant and
// hour: <tenant, base64url>.<hours since 1970>, the value the recipients
// taken in that hour by the whole fleet (decimal). Keys live 25 hours.
const BucketQuota = "outflow_quota"

// window is how far back a limit counts, in hour slots.
const window = 24

// Buckets opens key-value buckets (queue.Queue.KeyValue).
type Buckets interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

// Config is the limits: recipients per rolling 24 hours per tenant.
type Config struct {
	// Default applies to every tenant not in Tenants; 0 is no limit.
	Default int
	// Tenants overrides Default for the tenants it names; 0 is no limit.
	Tenants map[string]int
}

// Limit is tenant's limit, 0 for none.
func (c Config) Limit(tenant string) int {
	if n, ok := c.Tenants[tenant]; ok {
		return max(n, 0)
	}
	return max(c.Default, 0)
}

// Any reports whether some tenant has a limit.
func (c Config) Any() bool {
	if c.Default > 0 {
		return true
	}
	for _, n := range c.Tenants {
		if n > 0 {
			return true
		}
	}
	return false
}

// ErrExceeded is returned by Take when the tenant's limit is reached; its
// Exceeded says until when.
var ErrExceeded = errors.New("sending limit reached")

// Exceeded is Take's refusal: the limit and the earliest time at which
// some of it comes free.
type Exceeded struct {
	Limit int
	Until time.Time
}

func (e *Exceeded) Error() string {
	return fmt.Sprintf("sending limit of %d recipients per 24 hours reached, until %s", e.Limit, e.Until.UTC().Format(time.RFC3339))
}

func (e *Exceeded) Unwrap() error { return ErrExceeded }

// Limiter counts each limited tenant's recipients across the fleet and
// refuses those over its limit. A process does not write the shared count
// for every recipient: it takes a lease of a hundredth of the limit at a
// time (one compare-and-set on the hour's key) and counts it down in
// memory, so a limited tenant costs a round trip per lease, and a tenant
// without a limit nothing. What a process leased and did not use counts as
// sent: the fleet may refuse up to a lease per process early, never send
// more than the limit.
type Limiter struct {
	kv  jetstream.KeyValue
	cfg Config
	now func() time.Time

	mu      sync.Mutex
	tenants map[string]*tenantState
}

// tenantState is one tenant's count in this process.
type tenantState struct {
	mu     sync.Mutex
	hour   int64              // the hour slot leased from
	slots  [window - 1]uint64 // the fleet's counts in the window's other 23 hours, oldest first, read when hour began here
	past   uint64             // their sum
	leased uint64             // recipients leased in hour and not yet taken
}

// until is when some of the limit comes free: the end of the window for
// the oldest hour with a count.
func (st *tenantState) until() time.Time {
	first := st.hour - window + 1
	for i, v := range st.slots {
		if v > 0 {
			return time.Unix((first+int64(i)+window)*3600, 0)
		}
	}
	return time.Unix((st.hour+window)*3600, 0)
}

// Open returns the limiter for cfg; nil when no tenant has a limit (Take
// on nil always allows).
func Open(ctx context.Context, b Buckets, cfg Config) (*Limiter, error) {
	if !cfg.Any() {
		return nil, nil
	}
	kv, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketQuota,
		Description: "outflow sending limits: recipients per tenant and hour", History: 1, TTL: (window + 1) * time.Hour})
	if err != nil {
		return nil, err
	}
	return &Limiter{kv: kv, cfg: cfg, now: time.Now, tenants: map[string]*tenantState{}}, nil
}

// Limit is tenant's limit, 0 for none (or a nil limiter).
func (l *Limiter) Limit(tenant string) int {
	if l == nil {
		return 0
	}
	return l.cfg.Limit(tenant)
}

func slotKey(tenant string, hour int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tenant)) + "." + strconv.FormatInt(hour, 10)
}

// Take counts n recipients of tenant against its limit: nil when they may
// be sent, an *Exceeded (errors.Is ErrExceeded) when the limit leaves
// fewer than n, and any other error when the counts cannot be read or
// written (the caller refuses for now: a limit that cannot be checked is
// not skipped).
func (l *Limiter) Take(ctx context.Context, tenant string, n int) error {
	limit := l.Limit(tenant)
	if limit == 0 || n <= 0 {
		return nil
	}
	l.mu.Lock()
	st := l.tenants[tenant]
	if st == nil {
		st = &tenantState{}
		l.tenants[tenant] = st
	}
	l.mu.Unlock()

	st.mu.Lock()
	defer st.mu.Unlock()
	now := l.now()
	hour := now.Unix() / 3600
	if st.hour != hour {
		if err := l.readPast(ctx, tenant, hour, st); err != nil {
			st.hour = 0
			return err
		}
	}
	need := uint64(n)
	if st.leased >= need {
		st.leased -= need
		return nil
	}
	need -= st.leased
	block := max(uint64(limit)/100, 1)
	key := slotKey(tenant, hour)
	for range 20 {
		cur, rev, err := l.read(ctx, key)
		if err != nil {
			return err
		}
		used := st.past + cur
		if used+need > uint64(limit) {
			return &Exceeded{Limit: limit, Until: st.until()}
		}
		grant := min(max(need, block), uint64(limit)-used)
		v := []byte(strconv.FormatUint(cur+grant, 10))
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, v)
		} else {
			_, err = l.kv.Update(ctx, key, v, rev)
		}
		if err == nil {
			st.leased = st.leased + grant - uint64(n)
			return nil
		}
		// A lost compare-and-set: ErrKeyExists from Create, a revision
		// mismatch from Update (10071, or 10164 on a replicated bucket).
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("quota %s: %w", tenant, err)
		}
		// Another process leased first: read again.
	}
	return fmt.Errorf("quota %s: the hour's count kept changing", tenant)
}

// read returns the count at key and its revision, 0 and 0 when none.
func (l *Limiter) read(ctx context.Context, key string) (uint64, uint64, error) {
	e, err := l.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("quota %s: %w", key, err)
	}
	v, err := strconv.ParseUint(string(e.Value()), 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("quota %s: %q is not a count", key, e.Value())
	}
	return v, e.Revision(), nil
}

// readPast starts st on hour: the fleet's counts of tenant in the window's
// hours before it, and no lease. Those hours no longer grow (every process
// leases from its current hour), so they are read once an hour.
func (l *Limiter) readPast(ctx context.Context, tenant string, hour int64, st *tenantState) error {
	st.past = 0
	for i := range st.slots {
		v, _, err := l.read(ctx, slotKey(tenant, hour-window+1+int64(i)))
		if err != nil {
			return err
		}
		st.slots[i] = v
		st.past += v
	}
	st.hour, st.leased = hour, 0
	return nil
}
