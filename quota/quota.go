package quota

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketQuota holds every limited tenant's counts, one key per tenant and
// hour: <tenant, base64url>.<hours since 1970>, the value the recipients
// taken in that hour by the whole fleet (decimal). Keys live 26 hours, an
// hour longer than the window; a bucket made by an earlier release with
// keys of 25 hours is raised to 26 when a process opens it (a key last
// written at the start of its hour still lives until its hour leaves the
// window of 25: only clocks apart lose from the lower TTL).
const BucketQuota = "outflow_quota"

// window is how many hour slots a limit counts: the current hour and the 24
// before it. A slot holds a whole hour, so the oldest one counted must be
// the hour of "now less 24 hours", all of it: with the 23 before the
// current one only (an earlier release), a limit spent at 10:59:59 came
// free at 10:00:00 the next day, and a leaked password sent twice the limit
// in 23 hours. With 25, what is taken in an hour comes free 24 hours after
// that hour ends: no 24 hours ever hold more than the limit, and a
// recipient counts for 24 to 25 hours. The keys are the same as before, so
// the counts an earlier release wrote count in full.
const window = 25

// Buckets opens key-value buckets (queue.Queue.KeyValue).
type Buckets interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

// Config is the limits: recipients per rolling 24 hours per tenant (no 24
// hours hold more; see window).
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

// ErrOverLimit is returned by Take for more recipients at once than the
// tenant's whole limit: no wait makes room for them.
var ErrOverLimit = errors.New("more recipients than the sending limit")

// Limiter counts each limited tenant's recipients across the fleet and
// refuses those over its limit. A process does not write the shared count
// for every recipient: it leases recipients from the current hour's key
// (one compare-and-set) and counts them down in memory. A lease starts at
// one recipient and doubles with each lease in the hour, up to a
// hundredth of the limit, so a busy tenant costs a round trip per
// hundredth of its limit, a quiet one a round trip per recipient, and a
// tenant without a limit nothing. What a process leased and did not use is
// given back when its hour ends (or counts as sent, if the give-back is
// lost): the fleet never sends more than the limit, and refuses early by
// at most the leases held at that moment.
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
	slots  [window - 1]uint64 // the fleet's counts in the window's other hours, oldest first, read when hour began here
	past   uint64             // the sum of slots but the last (the hour before, read live at each lease)
	leased uint64             // recipients leased in hour and not yet taken
	block  uint64             // the next lease's size
}

// until is when some of the limit comes free: the end of the window for
// the oldest hour with a count, 24 hours after that hour ends (slot+25
// hours), which is when a Take first leaves it out.
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
	kv, err := openBucket(ctx, b)
	if err != nil {
		return nil, err
	}
	return &Limiter{kv: kv, cfg: cfg, now: time.Now, tenants: map[string]*tenantState{}}, nil
}

// openBucket opens BucketQuota, making it on first use: its keys live one
// hour longer than the window.
func openBucket(ctx context.Context, b Buckets) (jetstream.KeyValue, error) {
	return b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketQuota,
		Description: "outflow sending limits: recipients per tenant and hour", History: 1, TTL: (window + 1) * time.Hour})
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

func (l *Limiter) state(tenant string) *tenantState {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.tenants[tenant]
	if st == nil {
		st = &tenantState{}
		l.tenants[tenant] = st
	}
	return st
}

// Take counts n recipients of tenant against its limit: nil when they may
// be sent, an *Exceeded (errors.Is ErrExceeded) when the limit leaves
// fewer than n, ErrOverLimit when n is more than the whole limit, and any
// other error when the counts cannot be read or written (the caller
// refuses for now: a limit that cannot be checked is not skipped).
func (l *Limiter) Take(ctx context.Context, tenant string, n int) error {
	limit := l.Limit(tenant)
	if limit == 0 || n <= 0 {
		return nil
	}
	if n > limit {
		return fmt.Errorf("%w: %d recipients, a limit of %d per 24 hours", ErrOverLimit, n, limit)
	}
	st := l.state(tenant)
	st.mu.Lock()
	defer st.mu.Unlock()
	hour := l.now().Unix() / 3600
	if st.hour != hour {
		if err := l.startHour(ctx, tenant, hour, st); err != nil {
			return err
		}
	}
	need := uint64(n)
	if st.leased >= need {
		st.leased -= need
		return nil
	}
	need -= st.leased
	maxBlock := max(uint64(limit)/100, 1)
	key := slotKey(tenant, hour)
	for range 20 {
		// The hours beside this one are read at each lease: a process
		// whose clock is a little behind or ahead still leases from them.
		before, _, err := l.read(ctx, slotKey(tenant, hour-1))
		if err != nil {
			return err
		}
		after, _, err := l.read(ctx, slotKey(tenant, hour+1))
		if err != nil {
			return err
		}
		cur, rev, err := l.read(ctx, key)
		if err != nil {
			return err
		}
		st.slots[window-2] = before
		used := st.past + before + cur + after
		if used+need > uint64(limit) {
			return &Exceeded{Limit: limit, Until: st.until()}
		}
		grant := min(max(need, min(st.block, maxBlock)), uint64(limit)-used)
		v := []byte(strconv.FormatUint(cur+grant, 10))
		if rev == 0 {
			_, err = l.kv.Create(ctx, key, v)
		} else {
			_, err = l.kv.Update(ctx, key, v, rev)
		}
		if err == nil && l.overBeside(ctx, tenant, hour, st.past+cur+grant, uint64(limit)) {
			// A process on the other side of the hour leased from its
			// own key meanwhile, which this write's compare-and-set does
			// not cover: take the grant back and read again.
			l.giveBack(ctx, key, grant)
			continue
		}
		if err == nil {
			st.leased = st.leased + grant - uint64(n)
			st.block = min(2*st.block, maxBlock)
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

// overBeside reads the hours beside hour again, after a lease was written
// to hour's key, and reports whether with them the window holds more than
// limit: counted is everything else (the older hours and hour's key as
// written). A read that fails counts as nothing more: the lease stands.
func (l *Limiter) overBeside(ctx context.Context, tenant string, hour int64, counted, limit uint64) bool {
	before, _, err := l.read(ctx, slotKey(tenant, hour-1))
	if err != nil {
		return false
	}
	after, _, err := l.read(ctx, slotKey(tenant, hour+1))
	if err != nil {
		return false
	}
	return counted+before+after > limit
}

// Return gives back n recipients of tenant taken and not sent (a
// transaction that did not end in a stored message): this process's next
// Takes use them first.
func (l *Limiter) Return(tenant string, n int) {
	if l == nil || n <= 0 || l.Limit(tenant) == 0 {
		return
	}
	st := l.state(tenant)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.hour == l.now().Unix()/3600 {
		st.leased += uint64(n)
	}
}

// startHour moves st to hour: what it leased in its last hour and did not
// use goes back to that hour's count (best effort: lost, it only counts
// as sent), and the fleet's counts of the window's earlier hours are read
// once, since no process leases from them any more (the hour before is
// read again at each lease, for clocks a little behind).
func (l *Limiter) startHour(ctx context.Context, tenant string, hour int64, st *tenantState) error {
	if st.leased > 0 && st.hour != 0 {
		l.giveBack(ctx, slotKey(tenant, st.hour), st.leased)
	}
	st.hour, st.leased, st.block, st.past = 0, 0, 1, 0
	for i := range st.slots {
		v, _, err := l.read(ctx, slotKey(tenant, hour-window+1+int64(i)))
		if err != nil {
			return err
		}
		st.slots[i] = v
		if i < window-2 {
			st.past += v
		}
	}
	st.hour = hour
	return nil
}

// giveBack takes n off the count at key, by compare-and-set.
func (l *Limiter) giveBack(ctx context.Context, key string, n uint64) {
	for range 5 {
		cur, rev, err := l.read(ctx, key)
		if err != nil || rev == 0 {
			return
		}
		if _, err = l.kv.Update(ctx, key, []byte(strconv.FormatUint(cur-min(cur, n), 10)), rev); err == nil ||
			!errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return
		}
	}
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

// Usage is a tenant's count in the window, as the fleet wrote it (leased
// recipients included, given-back ones not). Last24h is what the limit
// counts now: this hour and the 24 whole hours before it (see window),
// so up to 25 hours of sending.
type Usage struct {
	Tenant   string `json:"tenant"`
	Last24h  uint64 `json:"last_24h"`
	ThisHour uint64 `json:"this_hour"`
}

// Read returns the counts of every tenant with a count in the window up to
// now (tenant "" for all, or the one named), by tenant: what `outflow
// quota list` prints.
func Read(ctx context.Context, b Buckets, tenant string, now time.Time) ([]Usage, error) {
	kv, err := openBucket(ctx, b)
	if err != nil {
		return nil, err
	}
	filter := ">"
	if tenant != "" {
		filter = base64.RawURLEncoding.EncodeToString([]byte(tenant)) + ".*"
	}
	keys, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", BucketQuota, err)
	}
	defer func() { _ = keys.Stop() }()
	hour := now.Unix() / 3600
	l := &Limiter{kv: kv}
	byTenant := map[string]*Usage{}
	seen := map[string]bool{} // a listing may name a key twice
	for k := range keys.Keys() {
		if seen[k] {
			continue
		}
		seen[k] = true
		enc, h, ok := strings.Cut(k, ".")
		slot, err := strconv.ParseInt(h, 10, 64)
		name, derr := base64.RawURLEncoding.DecodeString(enc)
		if !ok || err != nil || derr != nil || slot <= hour-window || slot > hour+1 {
			continue
		}
		v, _, err := l.read(ctx, k)
		if err != nil {
			return nil, err
		}
		u := byTenant[string(name)]
		if u == nil {
			u = &Usage{Tenant: string(name)}
			byTenant[string(name)] = u
		}
		u.Last24h += v
		if slot == hour {
			u.ThisHour += v
		}
	}
	out := make([]Usage, 0, len(byTenant))
	for _, u := range byTenant {
		out = append(out, *u)
	}
	slices.SortFunc(out, func(a, b Usage) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out, nil
}
