package worker

import (
	"net/netip"
	"sync"
	"time"

	"github.com/outflow/outflow/sender"
)

// familyMemory is how long a destination is remembered to have no MX
// address of a family: about the TTL of the address records it was read
// from, so that a destination that adds AAAA records is tried over IPv6
// again within the hour.
const familyMemory = time.Hour

// familyMemoryMax bounds the destinations remembered; past it, expired
// entries are swept and, if that is not enough, arbitrary ones forgotten
// (forgetting costs one attempt that never leaves this host).
const familyMemoryMax = 10000

// families remembers, per destination domain, the address families its MX
// hosts were found to lack (sender.Result.WrongFamily). An egress pool
// that mixes IPv4 and IPv6 addresses then sends to an IPv4-only
// destination from its IPv4 addresses only: without it every other
// attempt would go to an IPv6 source, fail before any connection, spend
// an attempt of the message's budget and count against that address at
// the destination. It is per process; another worker learns the same at
// its own first try.
type families struct {
	mu sync.Mutex
	m  map[string]familyGap
}

// familyGap is until when each family is known to be missing.
type familyGap struct{ v4, v6 time.Time }

func (g familyGap) lacks(a netip.Addr, now time.Time) bool {
	if a.Is4() {
		return now.Before(g.v4)
	}
	return now.Before(g.v6)
}

// lack records that dest has no MX address of a's family. a is an egress
// source, which NewEgress has unmapped (::ffff:a.b.c.d is IPv4).
func (f *families) lack(dest string, a netip.Addr, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]familyGap{}
	}
	if _, ok := f.m[dest]; !ok && len(f.m) >= familyMemoryMax {
		for k, g := range f.m {
			if !now.Before(g.v4) && !now.Before(g.v6) {
				delete(f.m, k)
			}
		}
		for k := range f.m {
			if len(f.m) < familyMemoryMax {
				break
			}
			delete(f.m, k)
		}
	}
	g := f.m[dest]
	if a.Is4() {
		g.v4 = now.Add(familyMemory)
	} else {
		g.v6 = now.Add(familyMemory)
	}
	f.m[dest] = g
}

// lacks reports whether dest is known to have no MX address of a's family.
func (f *families) lacks(dest string, a netip.Addr, now time.Time) bool {
	f.mu.Lock()
	g, ok := f.m[dest]
	f.mu.Unlock()
	return ok && g.lacks(a, now)
}

// usable is cands without the sources of a family dest is known to lack,
// in the same order; all of cands when that would leave none (the attempt
// then fails as it would have, and says why).
func (f *families) usable(dest string, cands []sender.Source, now time.Time) []sender.Source {
	f.mu.Lock()
	g, ok := f.m[dest]
	f.mu.Unlock()
	if !ok {
		return cands
	}
	out := cands[:0:0]
	for _, c := range cands {
		if !g.lacks(c.Addr, now) {
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}

// otherFamilyHas says whether the MX families an attempt found (fams)
// include the family other than src's: whether a source of that family
// may reach an MX host that src's could not.
func otherFamilyHas(fams sender.Families, src netip.Addr) bool {
	if src.Is4() {
		return fams.V6
	}
	return fams.V4
}
