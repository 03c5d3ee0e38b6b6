package sender

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/outflow/outflow/classify"
)

// mxHosts returns the host names to try for domain, best first (RFC 5321
// 5.1), or the DNS outcome that stops delivery.
func (s *Sender) mxHosts(ctx context.Context, domain string) ([]string, *classify.Input) {
	domain = strings.ToLower(strings.TrimSuffix(domain, "."))
	mxs, err := s.cfg.Resolver.LookupMX(ctx, domain)
	if err != nil && !isNotFound(err) {
		// A failed lookup is not "no MX": falling back to the A record
		// here could deliver to the wrong host.
		in := dnsInput(domain, "MX", err)
		return nil, &in
	}
	var hosts []*net.MX
	nullMX := false
	for _, mx := range mxs {
		h := strings.ToLower(strings.TrimSuffix(mx.Host, "."))
		if h == "" {
			// RFC 7505 3: an MX of "." says the domain takes no mail.
			nullMX = true
			continue
		}
		hosts = append(hosts, &net.MX{Host: h, Pref: mx.Pref})
	}
	if len(hosts) == 0 && nullMX {
		in := classify.Input{Stage: classify.StageDNS, Event: classify.EventNullMX,
			Text: domain + " publishes a null MX (RFC 7505): it accepts no mail"}
		return nil, &in
	}
	if len(hosts) == 0 {
		// RFC 5321 5.1: no MX records at all means the domain itself is
		// the implicit MX, if it has an address.
		addrs, err := s.cfg.Resolver.LookupIPAddr(ctx, domain)
		if err != nil || len(addrs) == 0 {
			if err == nil || isNotFound(err) {
				in := classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSNXDomain,
					Text: fmt.Sprintf("%s has no MX and no A/AAAA record", domain)}
				return nil, &in
			}
			in := dnsInput(domain, "A/AAAA", err)
			return nil, &in
		}
		return []string{domain}, nil
	}
	// RFC 5321 5.1: lowest preference first, and hosts of equal
	// preference in random order so that load spreads across them.
	rand.Shuffle(len(hosts), func(i, j int) { hosts[i], hosts[j] = hosts[j], hosts[i] })
	slices.SortStableFunc(hosts, func(a, b *net.MX) int { return int(a.Pref) - int(b.Pref) })
	names := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if !slices.Contains(names, h.Host) {
			names = append(names, h.Host)
		}
	}
	return names, nil
}

// errWrongFamily marks the failure of an MX host that has addresses, none
// of them of the source address's family (an IPv6 source and a host with
// only A records): another source may reach it (Result.WrongFamily).
var errWrongFamily = errors.New("no address of the source's family")

// hostAddrs returns the ip:port addresses of one MX host in the order to
// try them (orderAddrs); each is tried before the next MX host (RFC 5321
// 5.1). With a source, only addresses of its family can be reached; when
// the host has none, the failure wraps errWrongFamily.
func (s *Sender) hostAddrs(ctx context.Context, host string, src *Source) ([]string, error) {
	port := strconv.Itoa(s.cfg.Port)
	if ip := net.ParseIP(host); ip != nil {
		return []string{net.JoinHostPort(host, port)}, nil
	}
	ips, err := s.cfg.Resolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		// An MX host without an address is reported as a temporary
		// DNS failure, not NXDOMAIN: the destination domain exists, and
		// a broken MX record is often fixed within the retry window.
		if err == nil {
			err = errors.New("no addresses")
		}
		return nil, &stepErr{in: classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
			Text: fmt.Sprintf("MX host %s: address lookup: %v", host, err)}}
	}
	addrs := make([]netip.Addr, 0, len(ips))
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip.IP); ok {
			addrs = append(addrs, a.Unmap())
		}
	}
	var from netip.Addr
	if src != nil {
		from = src.Addr
	}
	addrs = orderAddrs(addrs, from, reachable)
	if len(addrs) == 0 {
		return nil, &stepErr{in: classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
			Text: fmt.Sprintf("MX host %s: no address of the family of source %s", host, from)}, err: errWrongFamily}
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, net.JoinHostPort(a.String(), port))
	}
	return out, nil
}

// orderAddrs sorts a host's addresses the way RFC 6724 6 does in its
// basics: usable destinations first (rule 1: this host has a route to it,
// so an IPv6 address comes first only when the host has IPv6
// connectivity), then by the precedence of the default policy table (rule
// 6: IPv6 before IPv4), keeping the resolver's order otherwise. Unusable
// addresses go last rather than away (a route may appear), except that
// with a source address only its own family is kept, since a socket bound
// to an IPv4 address cannot reach an IPv6 one.
func orderAddrs(addrs []netip.Addr, src netip.Addr, usable func(dst, src netip.Addr) bool) []netip.Addr {
	type cand struct {
		a      netip.Addr
		usable bool
		prec   int
	}
	cands := make([]cand, 0, len(addrs))
	for _, a := range addrs {
		if src.IsValid() && a.Is4() != src.Is4() {
			continue
		}
		cands = append(cands, cand{a, usable(a, src), precedence(a)})
	}
	slices.SortStableFunc(cands, func(x, y cand) int {
		if x.usable != y.usable {
			if x.usable {
				return -1
			}
			return 1
		}
		return y.prec - x.prec
	})
	out := make([]netip.Addr, len(cands))
	for i, c := range cands {
		out[i] = c.a
	}
	return out
}

// precedence is the RFC 6724 2.1 default policy table's precedence of a.
func precedence(a netip.Addr) int {
	switch {
	case a.Is4() || a.Is4In6():
		return 35 // ::ffff:0:0/96
	case a == netip.IPv6Loopback():
		return 50 // ::1/128
	case netip.MustParsePrefix("2002::/16").Contains(a):
		return 30 // 6to4
	case netip.MustParsePrefix("2001::/32").Contains(a):
		return 5 // Teredo
	case netip.MustParsePrefix("fc00::/7").Contains(a):
		return 3 // unique local
	case netip.MustParsePrefix("fec0::/10").Contains(a), netip.MustParsePrefix("3ffe::/16").Contains(a),
		netip.MustParsePrefix("::/96").Contains(a):
		return 1 // site-local, 6bone, IPv4-compatible
	}
	return 40 // ::/0
}

// reachable says whether the kernel has a route to dst (from src, when
// set): connecting a UDP socket picks a route and a source address without
// sending a packet, as RFC 6724's source selection needs (Go's own
// resolver does the same).
func reachable(dst, src netip.Addr) bool {
	var laddr *net.UDPAddr
	if src.IsValid() {
		laddr = net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0))
	}
	c, err := net.DialUDP("udp", laddr, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

func isNotFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// dnsInput maps a lookup error: "not found" is NXDOMAIN, anything else
// (SERVFAIL, timeout, refused) is a temporary failure.
func dnsInput(name, rr string, err error) classify.Input {
	ev := classify.EventDNSServFail
	if isNotFound(err) {
		ev = classify.EventDNSNXDomain
	}
	return classify.Input{Stage: classify.StageDNS, Event: ev, Text: fmt.Sprintf("%s %s lookup: %v", name, rr, err)}
}
