package worker

import (
	"math"
	"sync"
)

// tenantSlots keeps each tenant to its share of the pool's delivery slots
// (queue.Admission, asked by the pulls' hand-off).
//
// The hand-off serves tenants in turn, but a slot is held for as long as
// its delivery takes, and that is the receiving host's to decide: a tenant
// whose mail goes to hosts that accept a connection and never answer holds
// each slot for up to the command timeout (5 minutes). Served in turn, such
// a tenant ends up holding every slot, and another tenant's password reset
// waits those minutes for one to come free. So:
//   - no tenant may hold more than workers − workers/8 slots (28 of 32):
//     the rest is free for the next tenant that comes, at once;
//   - while other tenants have deliveries in flight, a tenant may start one
//     only below its weighted share of the slots, ceil(workers × weight /
//     Σ weights of the tenants in flight, itself included), at least one.
//     A tenant over it (it took the slots while alone) starts nothing until
//     its own deliveries bring it under.
//
// A tenant alone uses all but the reserve; with fewer than 8 workers there
// is no reserve, and shares still apply.
type tenantSlots struct {
	mu       sync.Mutex
	workers  int
	limit    int                // workers less the reserve
	weights  map[string]float64 // tenant weights (default 1)
	inflight map[string]int     // deliveries in flight, by tenant (none: absent)
	sum      float64            // weights of the tenants in inflight
	changed  chan struct{}      // closed at the next end, then replaced; nil unwatched
}

func newTenantSlots(workers int, weights map[string]float64) *tenantSlots {
	return &tenantSlots{workers: workers, limit: workers - workers/8, weights: weights, inflight: map[string]int{}}
}

func (s *tenantSlots) weight(tenant string) float64 {
	if w, ok := s.weights[tenant]; ok && w > 0 {
		return w
	}
	return 1
}

// Admits reports whether a delivery of tenant's may start now.
func (s *tenantSlots) Admits(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.inflight[tenant]
	return n < s.capLocked(tenant, n)
}

// capLocked is how many slots tenant, holding n, may hold now.
func (s *tenantSlots) capLocked(tenant string, n int) int {
	w, sum := s.weight(tenant), s.sum
	if n == 0 {
		sum += w
	}
	share := int(math.Ceil(float64(s.workers) * w / sum))
	return max(1, min(s.limit, share))
}

// Changed returns a channel closed when the next delivery ends.
func (s *tenantSlots) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

// Started counts a delivery of tenant's handed to a slot (by the pulls'
// hand-off, as the slot takes it).
func (s *tenantSlots) Started(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[tenant]++; s.inflight[tenant] == 1 {
		s.sum += s.weight(tenant)
	}
}

// end counts a delivery of tenant's ended, and wakes the hand-offs that
// wait for one.
func (s *tenantSlots) end(tenant string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight[tenant]--; s.inflight[tenant] <= 0 {
		delete(s.inflight, tenant)
		if s.sum -= s.weight(tenant); len(s.inflight) == 0 {
			s.sum = 0 // no drift from the float sums while idle
		}
	}
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}
