package sender

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync"
)

// Source is an egress address: the local address a connection to an MX
// host (or the relay) is made from, and the name given in EHLO on it,
// which should be that address's reverse DNS name (Postfix's
// smtp_bind_address with smtp_helo_name).
type Source struct {
	Addr netip.Addr
	// EHLO is the name in every EHLO on connections from Addr. Default
	// Config.Hostname.
	EHLO string
}

// String is the address, the name a source has in logs, throttle state
// (throttle.PairName) and `outflow dest status`.
func (s *Source) String() string {
	if s == nil {
		return ""
	}
	return s.Addr.String()
}

// EgressEntry is one [[egress]] entry of the configuration.
type EgressEntry struct {
	Source
	// Pool names the pool the address belongs to; "" is in no named pool
	// (it is still among the default "all addresses").
	Pool string
}

// Egress picks source addresses for a tenant's mail: its pool's addresses
// (all of them when the tenant has none), in round-robin order per
// destination. It is safe for concurrent use.
//
// The turn is kept per (pool, destination): with one counter for all,
// a tenant whose mail alternated between two domains sent every message
// for one of them from the same address (each provider's limit per
// address then halved the domain's rate, and a block the classifier did
// not read as one bounced every message instead of half).
type Egress struct {
	all      []Source
	pools    map[string][]Source
	byTenant map[string]string
	mu       sync.Mutex
	next     map[turnKey]uint64 // the next turn of each pool for each destination
}

// turnKey is a pool and a recipient domain (a key of Egress.next; a
// struct, where a joined string cost an allocation on every attempt).
type turnKey struct{ pool, dest string }

// maxTurns bounds Egress.next: past it the turns start again from none
// (one message per destination may then go from the first address twice
// in a row).
const maxTurns = 50000

// NewEgress checks the entries and the tenant → pool assignments: every
// entry has a unicast address, listed once, and every pool a tenant names
// has addresses. (Whether an address is on a local interface shows when
// binding it; `outflow serve` tries that at start.)
func NewEgress(entries []EgressEntry, tenantPools map[string]string) (*Egress, error) {
	e := &Egress{pools: map[string][]Source{}, byTenant: map[string]string{}, next: map[turnKey]uint64{}}
	seen := map[netip.Addr]bool{}
	for _, en := range entries {
		// ::ffff:192.0.2.10 is 192.0.2.10: one address, of family IPv4.
		en.Addr = en.Addr.Unmap()
		if !en.Addr.IsValid() {
			return nil, errors.New("egress: an entry has no address")
		}
		if en.Addr.IsUnspecified() || en.Addr.IsMulticast() {
			return nil, fmt.Errorf("egress: %s is not a source address", en.Addr)
		}
		if seen[en.Addr] {
			return nil, fmt.Errorf("egress: %s is listed twice", en.Addr)
		}
		seen[en.Addr] = true
		if strings.ContainsAny(en.EHLO, " \r\n\t") {
			return nil, fmt.Errorf("egress %s: ehlo %q must be a single domain name", en.Addr, en.EHLO)
		}
		e.all = append(e.all, en.Source)
		if en.Pool != "" {
			e.pools[en.Pool] = append(e.pools[en.Pool], en.Source)
		}
	}
	for tenant, pool := range tenantPools {
		if pool == "" {
			continue
		}
		if _, ok := e.pools[pool]; !ok {
			names := make([]string, 0, len(e.pools))
			for n := range e.pools {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("egress: tenant %q: pool %q has no [[egress]] address (pools: %s)", tenant, pool, strings.Join(names, ", "))
		}
		e.byTenant[tenant] = pool
	}
	return e, nil
}

// Len is the number of configured addresses.
func (e *Egress) Len() int {
	if e == nil {
		return 0
	}
	return len(e.all)
}

// All returns every configured source, in configuration order.
func (e *Egress) All() []Source { return append([]Source(nil), e.all...) }

// Candidates returns the sources for a tenant's next attempt to dest,
// starting at the next one in the round-robin order of the tenant's pool
// for dest and then the rest of its pool, so the caller can move on when
// the first is blocked or throttled.
func (e *Egress) Candidates(tenant, dest string) []Source {
	list := e.all
	pool, ok := e.byTenant[tenant]
	if ok {
		list = e.pools[pool]
	}
	if len(list) == 0 {
		return nil
	}
	key := turnKey{pool, dest}
	e.mu.Lock()
	if _, seen := e.next[key]; !seen && len(e.next) >= maxTurns {
		clear(e.next)
	}
	turn := e.next[key]
	e.next[key] = turn + 1
	e.mu.Unlock()
	start := int(turn % uint64(len(list)))
	out := make([]Source, 0, len(list))
	out = append(out, list[start:]...)
	return append(out, list[:start]...)
}

// Pool is the addresses a tenant sends from, in configuration order,
// without taking a turn of the round-robin. The caller must not change it.
func (e *Egress) Pool(tenant string) []Source {
	if e == nil {
		return nil
	}
	if p, ok := e.byTenant[tenant]; ok {
		return e.pools[p]
	}
	return e.all
}

// HasFamily says whether the tenant's addresses include one of IPv4 (v4)
// or IPv6, without taking a turn of the round-robin.
func (e *Egress) HasFamily(tenant string, v4 bool) bool {
	list := e.all
	if p, ok := e.byTenant[tenant]; ok {
		list = e.pools[p]
	}
	for _, s := range list {
		if s.Addr.Is4() == v4 {
			return true
		}
	}
	return false
}

// ehlo is the name to give in EHLO on c: its source's, or the host's.
func (c *client) ehlo() string {
	if c.src != nil && c.src.EHLO != "" {
		return c.src.EHLO
	}
	return c.cfg.Hostname
}

// dialFrom opens a connection to addr, from src when it is set.
func (c *Config) dialFrom(ctx context.Context, src *Source, addr string) (net.Conn, error) {
	if src == nil {
		return c.Dial(ctx, "tcp", addr)
	}
	return c.DialSource(ctx, src.Addr, "tcp", addr)
}

// dialSource is the default Config.DialSource: a net.Dialer bound to the
// source address (any port).
func dialSource(ctx context.Context, src netip.Addr, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	return d.DialContext(ctx, network, addr)
}

type sourceKey struct{}

// withSource carries a Send's source to the steps that dial.
func withSource(ctx context.Context, src *Source) context.Context {
	if src == nil {
		return ctx
	}
	return context.WithValue(ctx, sourceKey{}, src)
}

// sourceFrom is the Send's source, nil for none.
func sourceFrom(ctx context.Context) *Source {
	src, _ := ctx.Value(sourceKey{}).(*Source)
	return src
}

// poolKey is the connection pool's key for host reached from src:
// connections from different sources are never shared.
func poolKey(base string, src *Source) string {
	if src == nil {
		return base
	}
	return base + "|" + src.Addr.String()
}
