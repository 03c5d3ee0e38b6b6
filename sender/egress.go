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
	"syscall"
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

// FamilyCandidates returns the tenant's sources of one family (v4: IPv4,
// else IPv6) for dest, in the round-robin order from the destination's
// next turn, without taking it: for an attempt that goes out from the
// other family than the address its own turn gave (the worker's retry
// when the destination has no MX address of that one's family, or none
// that connects). Taking a turn there moved the destination's next
// attempt back onto the family that had just failed, every time.
func (e *Egress) FamilyCandidates(tenant, dest string, v4 bool) []Source {
	list := e.Pool(tenant)
	if len(list) == 0 {
		return nil
	}
	pool := e.byTenant[tenant]
	e.mu.Lock()
	turn := e.next[turnKey{pool, dest}]
	e.mu.Unlock()
	start := int(turn % uint64(len(list)))
	var out []Source
	for i := range list {
		if s := list[(start+i)%len(list)]; s.Addr.Is4() == v4 {
			out = append(out, s)
		}
	}
	return out
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

// ForRelay returns the sources that can reach relay (host:port, as
// Config.Relay): with the relay at an IP address, those of its family
// only, since a connection bound to an address of one family cannot reach
// an address of the other ("no suitable address found", a local failure
// at every attempt that took such a source, spending the message's
// attempt). Every pool keeps its name and tenants; it is an error, naming
// the relay and the pool, when the addresses a tenant sends from (a
// pool, or every address for tenants without one) have none of that
// family: its mail could never leave. A relay given by host name is
// returned as is: the dialler takes whichever of the name's addresses the
// source's family can reach.
func (e *Egress) ForRelay(relay string) (*Egress, error) {
	if e == nil || relay == "" {
		return e, nil
	}
	host, _, err := net.SplitHostPort(relay)
	if err != nil {
		host = relay
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return e, nil
	}
	v4 := a.Unmap().Is4()
	family := "IPv6"
	if v4 {
		family = "IPv4"
	}
	keep := func(list []Source) ([]Source, []string) {
		var out []Source
		var others []string
		for _, s := range list {
			if s.Addr.Is4() == v4 {
				out = append(out, s)
			} else {
				others = append(others, s.Addr.String())
			}
		}
		return out, others
	}
	r := &Egress{pools: map[string][]Source{}, byTenant: e.byTenant, next: map[turnKey]uint64{}}
	var others []string
	if r.all, others = keep(e.all); len(r.all) == 0 {
		return nil, fmt.Errorf("egress: relay %s is an %s address, and no [[egress]] address is one (%s; tenants without an egress-pool send from all of them): a connection bound to one cannot reach the relay",
			relay, family, strings.Join(others, ", "))
	}
	var bad []string
	for name, list := range e.pools {
		if r.pools[name], others = keep(list); len(r.pools[name]) == 0 {
			bad = append(bad, fmt.Sprintf("pool %q (%s)", name, strings.Join(others, ", ")))
		}
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return nil, fmt.Errorf("egress: relay %s is an %s address, and %s has no %s [[egress]] address: a connection bound to one of its addresses cannot reach the relay",
			relay, family, strings.Join(bad, ", "), family)
	}
	return r, nil
}

// ehlo is the name to give in EHLO on c: its source's, or the host's.
func (c *client) ehlo() string {
	if c.src != nil && c.src.EHLO != "" {
		return c.src.EHLO
	}
	return c.cfg.Hostname
}

// dialFrom opens a connection to addr, from src when it is set. A dial
// from a source is noted in the Send's trace (sendTrace.dialed).
func (c *Config) dialFrom(ctx context.Context, src *Source, addr string) (net.Conn, error) {
	if src == nil {
		return c.Dial(ctx, "tcp", addr)
	}
	conn, err := c.DialSource(ctx, src.Addr, "tcp", addr)
	if tr := traceFrom(ctx); tr != nil {
		tr.dialed(err)
	}
	return conn, err
}

// dialSource is the default Config.DialSource: a net.Dialer bound to the
// source address (any port).
func dialSource(ctx context.Context, src netip.Addr, network, addr string) (net.Conn, error) {
	d := net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	return d.DialContext(ctx, network, addr)
}

type sourceKey struct{}

// sourced is what a Send with a source carries on its context: the
// source, and the trace of what its steps found out.
type sourced struct {
	src   *Source
	trace sendTrace
}

// withSource carries a Send's source, and a fresh trace, to the steps
// that dial.
func withSource(ctx context.Context, src *Source) context.Context {
	if src == nil {
		return ctx
	}
	return context.WithValue(ctx, sourceKey{}, &sourced{src: src})
}

// sourceFrom is the Send's source, nil for none.
func sourceFrom(ctx context.Context) *Source {
	if s, _ := ctx.Value(sourceKey{}).(*sourced); s != nil {
		return s.src
	}
	return nil
}

// traceFrom is the trace of the Send with a source, nil without one.
func traceFrom(ctx context.Context) *sendTrace {
	if s, _ := ctx.Value(sourceKey{}).(*sourced); s != nil {
		return &s.trace
	}
	return nil
}

// sendTrace is what the steps of one Send from a source found out about
// its destination's MX hosts: the address families of each host looked
// up (hostAddrs), and how the dials from the source went (dialFrom). It
// gives the Result its MXFamilies and Unreached, which tell the worker
// whether an address of the other family can do what this one could not.
// One Send's steps run one after the other, so it needs no lock.
type sendTrace struct {
	hosts map[string]Families // MX host → the families of its addresses MX delivery connects to
	// srcAddrs counts the addresses of the source's family found over
	// the hosts looked up: with none, the failure is WrongFamily's.
	srcAddrs int
	// connected: a dial made a TCP connection (whatever the server said
	// then, a server was reached). local: a dial failed for a reason of
	// this host's (a source address it lacks, no file descriptors, the
	// attempt cancelled), which says nothing about the MX address.
	connected, local bool
}

// sawHost records the addresses of MX host host (those MX delivery may
// connect to, of either family) for a Send from src.
func (tr *sendTrace) sawHost(host string, addrs []netip.Addr, src netip.Addr) {
	if tr.hosts == nil {
		tr.hosts = map[string]Families{}
	}
	var f Families
	for _, a := range addrs {
		f = f.with(a)
		if a.Is4() == src.Is4() {
			tr.srcAddrs++
		}
	}
	f.Complete = true
	tr.hosts[host] = f
}

// dialed records how a dial from the source went: err is the dialler's.
// A timeout, a refusal or an unreachable host or network is the
// address's failure to connect (as the dead-address memory reads it,
// dialResult); anything else is local.
func (tr *sendTrace) dialed(err error) {
	var ne net.Error
	switch {
	case err == nil:
		tr.connected = true
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout(),
		errors.Is(err, syscall.ETIMEDOUT), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTDOWN):
	default:
		tr.local = true
	}
}

// unreached reports, for a Send from a source that got no connection to
// any MX host (its first acquire failed), whether every address of the
// source's family it found failed to connect: dialled and timed out,
// refused or unreachable, or held after such a failure and not dialled
// (deadaddr.go), with at least one such address and no server reached.
// A host that answered, even with a refusal, was reached; a local
// failure says nothing about the addresses. The attempt's own deadline
// is not a failure to connect either.
func unreached(ctx context.Context) bool {
	tr := traceFrom(ctx)
	return tr != nil && tr.srcAddrs > 0 && !tr.connected && !tr.local && !ctxOver(ctx)
}

// poolKey is the connection pool's key for host reached from src:
// connections from different sources are never shared.
func poolKey(base string, src *Source) string {
	if src == nil {
		return base
	}
	return base + "|" + src.Addr.String()
}
