package worker

import (
	"math"
	"sync"
	"time"
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
//
// The work lane's hand-off asks before it hands an envelope over (Admits,
// Started: queue.Admission). The retry and rate-limit lanes, which every
// tenant shares, do not (a refused envelope left there held the others
// back): the slot that takes one asks (TryStart). One past its tenant's
// reserve or share waits in the slot (slotWait) until one of its tenant's
// deliveries ends, serving the other tenants' fresh mail meanwhile; at
// most maxWait slots wait at once, and the envelopes past those go back
// to their lane for later, without an attempt (slotBack).
//
// The hand-off counts a delivery started after the slot has taken it, so
// the slot may count it ended first: a count may go below zero for a
// moment, and a tenant is in flight while its count is above zero.
type tenantSlots struct {
	mu       sync.Mutex
	workers  int
	limit    int                // workers less the reserve
	weights  map[string]float64 // tenant weights (default 1)
	inflight map[string]int     // deliveries in flight, by tenant (zero: absent)
	sum      float64            // weights of the tenants whose count is above zero
	waiting  int                // slots holding an envelope that waits (slotWait)
	maxWait  int                // at most this many
	// held is, by tenant, how long its deliveries hold a slot: a
	// moving average of the last ones' (end), for the time an
	// envelope sent back waits (BackFor).
	held    map[string]time.Duration
	changed chan struct{} // closed at the next end, then replaced; nil unwatched
}

func newTenantSlots(workers int, weights map[string]float64) *tenantSlots {
	return &tenantSlots{workers: workers, limit: workers - workers/8, maxWait: max(1, workers/8),
		weights: weights, inflight: map[string]int{}, held: map[string]time.Duration{}}
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
	return n < s.capLocked(tenant, n, s.limit)
}

// capLocked is how many slots tenant, holding n, may hold now, limit at
// most.
func (s *tenantSlots) capLocked(tenant string, n, limit int) int {
	w, sum := s.weight(tenant), s.sum
	if n <= 0 {
		sum += w
	}
	if sum < w {
		sum = w // a float sum's drift: never a share above the whole
	}
	share := int(math.Ceil(float64(s.workers) * w / sum))
	return max(1, min(limit, share))
}

// slotVerdict is what a slot does with an envelope it took from a shared
// lane (TryStart).
type slotVerdict int

const (
	// slotStart: counted started; deliver it.
	slotStart slotVerdict = iota
	// slotWait: its tenant holds all it may; the slot holds the envelope
	// (counted among the waiting) until StartWaiting starts it or
	// StopWaiting gives it up.
	slotWait
	// slotBack: its tenant holds all it may and maxWait slots wait
	// already; the envelope goes back to its lane for later.
	slotBack
)

// TryStart is Admits and Started at once, for a slot that took an
// envelope of tenant's from a shared lane: slotStart when it counted the
// delivery started, else slotWait or slotBack.
//
// The reserve holds here as on the work lane: a tenant alone holding all
// but the reserve with retries to a host that never answers left the next
// tenant's password reset waiting for one of those sessions to time out.
// Its envelope past the reserve waits in the slot rather than going back
// for tenantShareRetry: when a destination recovers from an outage and
// releases its deferred mail onto the retry lane, the slots wait for the
// rate's tokens, and a 6 s drain whose envelopes past the reserve went
// back for half a minute took 34.
func (s *tenantSlots) TryStart(tenant string) slotVerdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.startLocked(tenant) {
		return slotStart
	}
	if s.waiting >= s.maxWait {
		return slotBack
	}
	s.waiting++
	return slotWait
}

// StartWaiting counts a waiting envelope of tenant's started, and no
// longer waiting, when its tenant may start one now.
func (s *tenantSlots) StartWaiting(tenant string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.startLocked(tenant) {
		return false
	}
	s.waiting--
	return true
}

// StopWaiting counts a waiting envelope given up (sent back or given
// back at a stop).
func (s *tenantSlots) StopWaiting() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting--
}

func (s *tenantSlots) startLocked(tenant string) bool {
	n := s.inflight[tenant]
	if n >= s.capLocked(tenant, n, s.limit) {
		return false
	}
	s.addLocked(tenant, 1)
	return true
}

// addLocked moves tenant's count by d, keeping sum to the weights of the
// tenants above zero.
func (s *tenantSlots) addLocked(tenant string, d int) {
	was := s.inflight[tenant]
	now := was + d
	switch {
	case was <= 0 && now > 0:
		s.sum += s.weight(tenant)
	case was > 0 && now <= 0:
		s.sum -= s.weight(tenant)
	}
	if now == 0 {
		delete(s.inflight, tenant)
	} else {
		s.inflight[tenant] = now
	}
	if len(s.inflight) == 0 || s.sum < 0 {
		s.sum = 0 // no drift from the float sums while idle
	}
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
	s.addLocked(tenant, 1)
}

// end counts a delivery of tenant's ended, and wakes the hand-offs that
// wait for one. took is how long it held its slot, 0 for one that did not
// start (counted by the hand-off, given back at a stop).
func (s *tenantSlots) end(tenant string, took time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if took > 0 {
		// A moving average over about the last eight.
		if h, ok := s.held[tenant]; ok {
			s.held[tenant] = h + (took-h)/8
		} else {
			s.held[tenant] = took
		}
	}
	s.addLocked(tenant, -1)
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// BackFor is how long an envelope of tenant's that no slot could take
// (slotBack) waits on its lane before it comes again: twice as long as
// its tenant's deliveries hold a slot, by which time one of those it
// holds has most likely ended, between backMin and tenantShareRetry.
// A fixed half minute left every slot idle: two tenants with backlogs
// returning from the rate-limit lane, pushed over their shares as a
// third tenant came, sent the whole of them back for 30 s while their
// own deliveries (waits for the rate's turns) ended within two seconds,
// and the destination got 2 to 7 of its 20 messages a second for 25 s.
// A tenant whose hosts hold each session for minutes still waits the
// half minute, which bounds how often its backlog is written back.
func (s *tenantSlots) BackFor(tenant string) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.held[tenant]
	if !ok {
		return tenantShareRetry
	}
	return min(max(2*h, backMin), tenantShareRetry)
}

// backMin is the least time an envelope sent back for its tenant's share
// waits.
const backMin = time.Second
