package resolver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/internal/defaults"
)

// Defaults for Config's zero values.
const (
	DefaultTimeout    = 2 * time.Second // one try at one server; resolv.conf's "timeout" when read from there (glibc default 5s)
	DefaultAttempts   = 2               // rounds over all servers; resolv.conf's "attempts" when read from there
	DefaultCacheSize  = 10000           // cached answers (name and type)
	DefaultMaxTTL     = time.Hour       // longest a positive or negative answer is kept
	DefaultResolvConf = "/etc/resolv.conf"
	udpSize           = 1232 // EDNS0 buffer size, the DNS Flag Day 2020 value that avoids fragmentation
)

// Config configures a Resolver. Zero values take the defaults noted.
type Config struct {
	// Servers are the DNS servers to ask, as host or host:port (port 53
	// when absent), tried in order. Empty means the nameservers of
	// ResolvConf, and net.DefaultResolver when that has none.
	Servers []string
	// ResolvConf is the file read when Servers is empty. Default
	// /etc/resolv.conf.
	ResolvConf string
	// Timeout bounds one try at one server. Default DefaultTimeout (or
	// resolv.conf's timeout option).
	Timeout time.Duration
	// Attempts is how many rounds over the servers one query makes before
	// it fails. Default DefaultAttempts (or resolv.conf's attempts
	// option).
	Attempts int
	// CacheSize bounds the cache in entries (one per name and type).
	// Default DefaultCacheSize; negative disables caching.
	CacheSize int
	// MaxTTL caps how long an answer is cached, whatever its TTL.
	// Default DefaultMaxTTL.
	MaxTTL time.Duration
	// Registerer, when set, receives the cache metrics
	// (outflow_dns_cache_hits_total, outflow_dns_cache_misses_total,
	// outflow_dns_cache_entries).
	Registerer prometheus.Registerer
	// Now is the clock, for tests. Default time.Now.
	Now func() time.Time
}

// Resolver answers DNS lookups through the configured servers with a
// cache. It is safe for concurrent use. It satisfies sender.Resolver.
type Resolver struct {
	cfg      Config
	servers  []string // host:port; nil means system (net.DefaultResolver)
	cache    *cache   // nil when disabled
	flights  flights
	metrics  *metrics
	fallback *net.Resolver
}

// New makes a Resolver, reading ResolvConf when no servers are given.
func New(cfg Config) (*Resolver, error) {
	defaults.Set(&cfg.Timeout, DefaultTimeout)
	defaults.Set(&cfg.Attempts, DefaultAttempts)
	if cfg.CacheSize == 0 {
		cfg.CacheSize = DefaultCacheSize
	}
	defaults.Set(&cfg.MaxTTL, DefaultMaxTTL)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.ResolvConf == "" {
		cfg.ResolvConf = DefaultResolvConf
	}
	r := &Resolver{cfg: cfg}
	for _, s := range cfg.Servers {
		addr, err := ServerAddr(s)
		if err != nil {
			return nil, err
		}
		r.servers = append(r.servers, addr)
	}
	if len(r.servers) == 0 {
		// A missing or empty resolv.conf is not an error: the standard
		// library has its own defaults for that case.
		if cc, err := dns.ClientConfigFromFile(cfg.ResolvConf); err == nil && len(cc.Servers) > 0 {
			for _, s := range cc.Servers {
				r.servers = append(r.servers, net.JoinHostPort(s, cc.Port))
			}
			if cfg.Timeout == DefaultTimeout && cc.Timeout > 0 {
				r.cfg.Timeout = time.Duration(cc.Timeout) * time.Second
			}
			if cfg.Attempts == DefaultAttempts && cc.Attempts > 0 {
				r.cfg.Attempts = cc.Attempts
			}
		}
	}
	if len(r.servers) == 0 {
		r.fallback = net.DefaultResolver
	}
	if cfg.CacheSize > 0 {
		r.cache = newCache(cfg.CacheSize)
	}
	m, err := newMetrics(cfg.Registerer, r.cacheLen)
	if err != nil {
		return nil, err
	}
	r.metrics = m
	return r, nil
}

// ServerAddr checks one --dns entry and returns it as host:port, adding
// port 53 when it has none ("127.0.0.1", "::1", "[::1]", "[::1]:5353").
// A bare IPv6 address cannot carry a port: "::1:5353" is the address
// ::1:5353 on port 53, since nothing tells it from ::1 on port 5353 (the
// port goes after brackets, "[::1]:5353"); serve logs the servers it uses
// at start, so that such a reading shows.
func ServerAddr(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("resolver: empty DNS server address")
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if p, perr := strconv.Atoi(port); perr != nil || p < 1 || p > 65535 {
			return "", fmt.Errorf("resolver: DNS server %q: bad port", s)
		}
		if host == "" {
			return "", fmt.Errorf("resolver: DNS server %q: no host", s)
		}
		return s, nil
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		// An IPv6 address written as in host:port, without the port.
		if ip, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && ip.Is6() {
			return net.JoinHostPort(s[1:len(s)-1], "53"), nil
		}
	}
	if strings.ContainsAny(s, "[]") {
		return "", fmt.Errorf("resolver: DNS server %q: want host, ip, [ipv6] or host:port", s)
	}
	return net.JoinHostPort(s, "53"), nil
}

// Servers returns the servers asked, as host:port; nil when lookups go to
// the system's resolver through the standard library.
func (r *Resolver) Servers() []string { return append([]string(nil), r.servers...) }

func (r *Resolver) cacheLen() int {
	if r.cache == nil {
		return 0
	}
	return r.cache.len()
}

// LookupMX returns the MX records of name in the order the server gave
// them; a null MX (RFC 7505) is one record with Host ".". NXDOMAIN and a
// name without MX records are IsNotFound errors, as from net.Resolver.
func (r *Resolver) LookupMX(ctx context.Context, name string) ([]*net.MX, error) {
	if r.fallback != nil {
		return r.fallback.LookupMX(ctx, name)
	}
	a, err := r.lookup(ctx, name, dns.TypeMX)
	if err != nil {
		return nil, err
	}
	var out []*net.MX
	for _, rr := range a.rrs {
		if mx, ok := rr.(*dns.MX); ok {
			out = append(out, &net.MX{Host: mx.Mx, Pref: mx.Preference})
		}
	}
	return out, nil
}

// LookupTXT returns the TXT records of name, each record's strings joined
// (RFC 7208 3.3, RFC 8461 3.1 read them that way).
func (r *Resolver) LookupTXT(ctx context.Context, name string) ([]string, error) {
	if r.fallback != nil {
		return r.fallback.LookupTXT(ctx, name)
	}
	a, err := r.lookup(ctx, name, dns.TypeTXT)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, rr := range a.rrs {
		if t, ok := rr.(*dns.TXT); ok {
			out = append(out, strings.Join(t.Txt, ""))
		}
	}
	return out, nil
}

// LookupTLSA returns the TLSA records for a service (RFC 6698 3: the name
// _port._proto.host, e.g. port 25, proto "tcp"), and whether the answer
// came with the AD bit, i.e. a validating resolver vouches for it. No
// records (NXDOMAIN or NODATA) is not an error: recs is nil and
// authenticated says whether the denial itself was validated. Errors are
// temporary failures. Through the standard library fallback there is no
// TLSA support: nil records, not authenticated.
func (r *Resolver) LookupTLSA(ctx context.Context, port int, proto, host string) (recs []*dns.TLSA, authenticated bool, err error) {
	if r.fallback != nil {
		return nil, false, nil
	}
	name, err := dns.TLSAName(dns.Fqdn(host), strconv.Itoa(port), proto)
	if err != nil {
		return nil, false, &net.DNSError{Err: err.Error(), Name: host}
	}
	a, err := r.lookup(ctx, name, dns.TypeTLSA)
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound && a != nil {
			return nil, a.ad, nil
		}
		return nil, false, err
	}
	for _, rr := range a.rrs {
		if t, ok := rr.(*dns.TLSA); ok {
			recs = append(recs, t)
		}
	}
	return recs, a.ad, nil
}

// AddrAuthenticated reports whether host's address records came with the
// AD bit (dane.AddrAuthenticator): any of its A and AAAA answers that has
// records. The answers are the ones the dial reads, from the cache. An
// error when neither lookup found an address; false, without an error,
// through the standard library fallback, which cannot tell.
func (r *Resolver) AddrAuthenticated(ctx context.Context, host string) (bool, error) {
	if r.fallback != nil {
		return false, nil
	}
	var firstErr error
	found := false
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeA} {
		a, err := r.lookup(ctx, host, qt)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if len(a.rrs) > 0 {
			found = true
			if a.ad {
				return true, nil
			}
		}
	}
	if !found && firstErr != nil {
		return false, firstErr
	}
	return false, nil
}

// CanonicalName returns the name host's address records are at: host
// itself, or the end of the CNAME chain that leads to them (RFC 7672
// 2.2.2's "fully CNAME-expanded" name, where DANE looks for TLSA records
// first), without the trailing dot, and whether that answer came with
// the AD bit. A validating resolver sets AD only when every RRset of the
// answer, each CNAME of the chain included, validated (RFC 4035 3.2.3),
// so authenticated says that the whole chain is secure. Of the AAAA and A
// answers with records, an authenticated one is preferred. The answers are
// the ones the dial reads, from the cache. An error when neither lookup
// found an address; host and false through the standard library fallback,
// which cannot tell.
func (r *Resolver) CanonicalName(ctx context.Context, host string) (name string, authenticated bool, err error) {
	host = strings.TrimSuffix(host, ".")
	if r.fallback != nil {
		return host, false, nil
	}
	var firstErr error
	for _, qt := range []uint16{dns.TypeAAAA, dns.TypeA} {
		a, err := r.lookup(ctx, host, qt)
		if err != nil {
			firstErr = cmp.Or(firstErr, err)
			continue
		}
		if len(a.rrs) == 0 || (name != "" && !a.ad) {
			continue
		}
		name, authenticated = strings.TrimSuffix(a.target, "."), a.ad
		if a.ad {
			break
		}
	}
	if name == "" {
		if firstErr == nil {
			firstErr = notFound(host, "")
		}
		return "", false, firstErr
	}
	return name, authenticated, nil
}

// LookupIPAddr returns the IPv6 and IPv4 addresses of host, IPv6 first;
// the caller orders them for dialing. It fails only when neither lookup
// found an address: with IsNotFound when both say the name has none.
func (r *Resolver) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	if r.fallback != nil {
		return r.fallback.LookupIPAddr(ctx, host)
	}
	if ip := net.ParseIP(host); ip != nil {
		return []net.IPAddr{{IP: ip}}, nil
	}
	type result struct {
		a   *answer
		err error
	}
	var wg sync.WaitGroup
	var res [2]result
	for i, qt := range []uint16{dns.TypeAAAA, dns.TypeA} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i].a, res[i].err = r.lookup(ctx, host, qt)
		}()
	}
	wg.Wait()
	var out []net.IPAddr
	for _, x := range res {
		if x.err != nil {
			continue
		}
		for _, rr := range x.a.rrs {
			switch v := rr.(type) {
			case *dns.AAAA:
				out = append(out, net.IPAddr{IP: v.AAAA})
			case *dns.A:
				out = append(out, net.IPAddr{IP: v.A})
			}
		}
	}
	if len(out) > 0 {
		return out, nil
	}
	// No address: a temporary failure of either lookup wins over "not
	// found", since the failed one might have had addresses.
	for _, x := range res {
		var de *net.DNSError
		if x.err != nil && !(errors.As(x.err, &de) && de.IsNotFound) {
			return nil, x.err
		}
	}
	for _, x := range res {
		if x.err != nil {
			return nil, x.err
		}
	}
	return nil, notFound(host, "")
}

// LookupHost is LookupIPAddr as strings, for sender.Resolver.
func (r *Resolver) LookupHost(ctx context.Context, host string) ([]string, error) {
	ips, err := r.LookupIPAddr(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.IP.String()
	}
	return out, nil
}

// lookup answers name and qtype from the cache or one shared query. A
// negative answer comes back both as the answer and as an IsNotFound error.
func (r *Resolver) lookup(ctx context.Context, name string, qtype uint16) (*answer, error) {
	key := cacheKey{name: dns.Fqdn(strings.ToLower(name)), qtype: qtype}
	if _, ok := dns.IsDomainName(key.name); !ok {
		return nil, &net.DNSError{Err: "invalid domain name", Name: name}
	}
	if r.cache != nil {
		if a := r.cache.get(key, r.cfg.Now()); a != nil {
			r.metrics.hits.Inc()
			return a, a.err(name)
		}
	}
	r.metrics.misses.Inc()
	a, err := r.flights.do(ctx, key, func(ctx context.Context) (*answer, error) {
		a, err := r.query(ctx, key)
		if err == nil && r.cache != nil && a.expires.After(r.cfg.Now()) {
			r.cache.put(key, a)
		}
		return a, err
	})
	if err != nil {
		var de *net.DNSError
		if !errors.As(err, &de) {
			err = &net.DNSError{Err: err.Error(), Name: name, IsTemporary: true,
				IsTimeout: errors.Is(err, context.DeadlineExceeded)}
		}
		return nil, err
	}
	return a, a.err(name)
}

// err is the error a negative answer stands for.
func (a *answer) err(name string) error {
	if !a.notFound {
		return nil
	}
	return notFound(name, a.server)
}

func notFound(name, server string) error {
	return &net.DNSError{Err: "no such host", Name: name, Server: server, IsNotFound: true}
}

// query asks the servers in order, Attempts rounds, until one gives a
// definite answer (NOERROR or NXDOMAIN).
func (r *Resolver) query(ctx context.Context, key cacheKey) (*answer, error) {
	var last *net.DNSError
	for range r.cfg.Attempts {
		for _, srv := range r.servers {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			resp, err := r.exchange(ctx, srv, key)
			if err != nil {
				var ne net.Error
				last = &net.DNSError{Err: err.Error(), Name: key.name, Server: srv, IsTemporary: true,
					IsTimeout: errors.As(err, &ne) && ne.Timeout()}
				continue
			}
			switch resp.Rcode {
			case dns.RcodeSuccess, dns.RcodeNameError:
				return r.toAnswer(srv, key, resp), nil
			default:
				last = &net.DNSError{Err: "server answered " + dns.RcodeToString[resp.Rcode], Name: key.name,
					Server: srv, IsTemporary: true}
			}
		}
	}
	return nil, last
}

// exchange asks one server over UDP, and again over TCP when the answer is
// truncated.
func (r *Resolver) exchange(ctx context.Context, srv string, key cacheKey) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(key.name, key.qtype)
	m.RecursionDesired = true
	// RFC 6840 5.7: AD in a query asks a validating resolver to report
	// whether it validated, without the RRSIGs that DO would bring.
	m.AuthenticatedData = true
	m.SetEdns0(udpSize, false)
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	c := &dns.Client{Net: "udp", Timeout: r.cfg.Timeout, UDPSize: udpSize}
	resp, _, err := c.ExchangeContext(ctx, m, srv)
	if err == nil && resp.Truncated {
		c := &dns.Client{Net: "tcp", Timeout: r.cfg.Timeout}
		resp, _, err = c.ExchangeContext(ctx, m, srv)
	}
	return resp, err
}

// toAnswer keeps the records of the asked type and works out how long the
// answer may be cached.
func (r *Resolver) toAnswer(srv string, key cacheKey, resp *dns.Msg) *answer {
	now := r.cfg.Now()
	a := &answer{ad: resp.AuthenticatedData, server: srv, target: key.name}
	ttl := r.cfg.MaxTTL
	cnames := map[string]string{}
	for _, rr := range resp.Answer {
		h := rr.Header()
		if h.Rrtype != key.qtype && h.Rrtype != dns.TypeCNAME {
			continue
		}
		ttl = min(ttl, time.Duration(h.Ttl)*time.Second)
		if h.Rrtype == key.qtype {
			a.rrs = append(a.rrs, rr)
		} else if c, ok := rr.(*dns.CNAME); ok {
			cnames[strings.ToLower(h.Name)] = strings.ToLower(dns.Fqdn(c.Target))
		}
	}
	// Follow the chain from the question (the server lists it in order,
	// but nothing says it must); a loop ends at the length of the map.
	for range len(cnames) {
		next, ok := cnames[a.target]
		if !ok {
			break
		}
		a.target = next
	}
	if len(a.rrs) == 0 {
		a.notFound = true
		a.nxdomain = resp.Rcode == dns.RcodeNameError
		// RFC 2308 5: a negative answer lives for the lower of the SOA's
		// TTL and its minimum field; without an SOA it is not cached.
		ttl = 0
		for _, rr := range resp.Ns {
			if soa, ok := rr.(*dns.SOA); ok {
				ttl = min(r.cfg.MaxTTL, time.Duration(min(soa.Hdr.Ttl, soa.Minttl))*time.Second)
				break
			}
		}
	}
	a.expires = now.Add(ttl)
	return a
}
