// Package membudget is in charge of bounding the memory that the messages
// being received hold at once, process-wide: a weighted semaphore over
// bytes (a Budget) with a cap per tenant, so that one tenant's large
// messages cannot take all of it. A listener charges each message what it
// holds (or will hold) before it holds it, waits a short time for room
// when there is none, and refuses the message, transiently, when none
// came; it gives the charge back when the message is done with, whatever
// its end. Both listeners (submission/inflight.go, api/inflight.go)
// charge a message for the bytes that have arrived of it, never for the
// size its client declares: a declared size costs nothing to declare, and
// held in the budget it let a few clients that sent nothing lock every
// other tenant out. A declared size is only looked at (Wait), so that a
// message that could not fit now is refused before it is sent.
package membudget

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Budget is a weighted semaphore over bytes with a cap per tenant. A nil
// *Budget bounds nothing: Acquire always succeeds, Release does nothing.
type Budget struct {
	total, share int64

	// OnChange, when set before the Budget is used, is called with the
	// bytes charged after every change, with the Budget's lock held so
	// that the values arrive in order (a gauge set from it never shows a
	// stale value); it must be quick and must not call the Budget.
	OnChange func(used int64)

	mu      sync.Mutex
	used    int64
	tenants map[string]int64 // charged bytes by tenant, only those with some
	// changed is closed, and replaced, whenever bytes are released: the
	// waiters look again.
	changed chan struct{}
	peak    int64 // the most bytes ever charged at once

	refusedFull, refusedShare atomic.Uint64 // charges refused, by reason
}

// New returns a Budget of total bytes, of which one tenant may hold at
// most share (clamped to 1..total). A total of zero or less returns nil:
// no bound.
func New(total, share int64) *Budget {
	if total <= 0 {
		return nil
	}
	share = min(max(share, 1), total)
	return &Budget{total: total, share: share, tenants: map[string]int64{}, changed: make(chan struct{})}
}

// Total is the budget in bytes; 0 for a nil Budget.
func (b *Budget) Total() int64 {
	if b == nil {
		return 0
	}
	return b.total
}

// Share is the most bytes one tenant may hold; 0 for a nil Budget.
func (b *Budget) Share() int64 {
	if b == nil {
		return 0
	}
	return b.share
}

// Full is why a charge was refused: the budget was full, or the tenant
// held its share.
type Full struct {
	Tenant string
	// TenantFull: the tenant held its share (Limit is the share);
	// otherwise the whole budget was charged (Limit is the budget). A
	// tenant whose share is the whole budget is refused for the budget.
	TenantFull bool
	Limit      int64
	// Wait is how long the charge waited for room before it was refused.
	Wait time.Duration
}

func (e *Full) Error() string {
	if e.TenantFull {
		return fmt.Sprintf("tenant %s holds its share (%d bytes) of the memory for messages in flight", e.Tenant, e.Limit)
	}
	return fmt.Sprintf("messages in flight hold the whole memory budget (%d bytes)", e.Limit)
}

// Acquire charges n more bytes to tenant, waiting up to wait for room. It
// returns a *Full when there was none, or the context's error. A charge
// larger than the tenant's share can never fit and is refused at once.
func (b *Budget) Acquire(ctx context.Context, tenant string, n int64, wait time.Duration) error {
	return b.acquire(ctx, tenant, n, wait, true)
}

// Wait is Acquire without the charge: it waits up to wait until n more
// bytes of tenant's would fit, and returns nil then, or what Acquire
// would have. It holds nothing, so nothing can be kept from others by
// calling it: a listener asks it about a message's declared size before
// the message is sent, and charges the message as it arrives.
func (b *Budget) Wait(ctx context.Context, tenant string, n int64, wait time.Duration) error {
	return b.acquire(ctx, tenant, n, wait, false)
}

func (b *Budget) acquire(ctx context.Context, tenant string, n int64, wait time.Duration, take bool) error {
	if b == nil || n <= 0 {
		return nil
	}
	if n > b.share {
		return b.full(tenant, true, 0)
	}
	var timer *time.Timer
	for {
		b.mu.Lock()
		tenantOK := b.tenants[tenant]+n <= b.share
		if tenantOK && b.used+n <= b.total {
			if take {
				b.used += n
				b.tenants[tenant] += n
				b.peak = max(b.peak, b.used)
				if b.OnChange != nil {
					b.OnChange(b.used)
				}
			}
			b.mu.Unlock()
			return nil
		}
		changed := b.changed
		b.mu.Unlock()
		if timer == nil {
			if wait <= 0 {
				return b.full(tenant, !tenantOK && b.share < b.total, wait)
			}
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-changed:
		case <-timer.C:
			b.mu.Lock()
			tenantFull := b.tenants[tenant]+n > b.share && b.share < b.total
			b.mu.Unlock()
			return b.full(tenant, tenantFull, wait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *Budget) full(tenant string, tenantFull bool, wait time.Duration) *Full {
	e := &Full{Tenant: tenant, TenantFull: tenantFull, Limit: b.total, Wait: wait}
	if tenantFull {
		e.Limit = b.share
		b.refusedShare.Add(1)
	} else {
		b.refusedFull.Add(1)
	}
	return e
}

// Release gives back n bytes of tenant's.
func (b *Budget) Release(tenant string, n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	if left := b.tenants[tenant] - n; left > 0 {
		b.tenants[tenant] = left
	} else {
		delete(b.tenants, tenant)
	}
	if b.OnChange != nil {
		b.OnChange(b.used)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	b.mu.Unlock()
}

// InUse returns the bytes charged now and the most ever charged at once.
func (b *Budget) InUse() (used, peak int64) {
	if b == nil {
		return 0, 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used, b.peak
}

// ResetPeak forgets the most bytes ever charged at once, so that InUse's
// peak is that of what comes after: a measurement's start.
func (b *Budget) ResetPeak() {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.peak = b.used
}

// TenantInUse returns the bytes charged to tenant now.
func (b *Budget) TenantInUse(tenant string) int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tenants[tenant]
}

// Refused returns how many charges were refused so far because the budget
// was full, and because the tenant held its share.
func (b *Budget) Refused() (full, share uint64) {
	if b == nil {
		return 0, 0
	}
	return b.refusedFull.Load(), b.refusedShare.Load()
}
