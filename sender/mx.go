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
//
// An MX record whose target is an IP address ("MX 10 192.0.2.1.") is
// skipped: MX data is a domain name (RFC 5321 5.1, RFC 1035 3.3.9), and
// a number where a name belongs is a broken record, or a way to point
// outflow at an address of the domain's choosing without even an address
// record. Postfix skips such records too. When no other record is left,
// the outcome is a temporary DNS failure, as for an MX host without an
// address (hostAddrs): the domain exists and a broken record is often
// fixed within the retry window.
func (s *Sender) mxHosts(ctx context.Context, log *msgLog, domain string) ([]string, *classify.Input) {
	domain = strings.ToLower(strings.TrimSuffix(domain, "."))
	mxs, err := s.cfg.Resolver.LookupMX(ctx, domain)
	if err != nil && !isNotFound(err) {
		// A failed lookup is not "no MX": falling back to the A record
		// here could deliver to the wrong host.
		in := dnsInput(domain, "MX", err)
		return nil, &in
	}
	var hosts []*net.MX
	var literals []string // MX targets that are IP addresses, skipped
	nullMX := false
	for _, mx := range mxs {
		h := strings.ToLower(strings.TrimSuffix(mx.Host, "."))
		if h == "" {
			// RFC 7505 3: an MX of "." says the domain takes no mail.
			nullMX = true
			continue
		}
		if isAddrLiteral(h) {
			literals = append(literals, h)
			continue
		}
		hosts = append(hosts, &net.MX{Host: h, Pref: mx.Pref})
	}
	if len(literals) > 0 {
		log.Warn().Strs("mx_literals", literals).Msg("MX records name IP addresses, not host names (RFC 5321 5.1); skipped")
	}
	if len(hosts) == 0 && nullMX {
		in := classify.Input{Stage: classify.StageDNS, Event: classify.EventNullMX,
			Text: domain + " publishes a null MX (RFC 7505): it accepts no mail"}
		return nil, &in
	}
	if len(hosts) == 0 && len(literals) > 0 {
		// Not the implicit MX either: the domain has MX records, broken
		// ones.
		in := classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
			Text: syntheticText(fmt.Sprintf("the MX records of %s name IP addresses (%s), not host names (RFC 5321 5.1); none is used",
				domain, strings.Join(literals, ", ")))}
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
// 5.1). Addresses MX delivery must not reach (refusal) are left out,
// and a host that has no other is refused with a synthetic outcome. With
// a source, only addresses of its family can be reached; when the host
// has none, the failure wraps errWrongFamily.
func (s *Sender) hostAddrs(ctx context.Context, log *msgLog, host string, src *Source) ([]string, error) {
	port := strconv.Itoa(s.cfg.Port)
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		// Only the implicit MX of a destination that is an address.
		addrs = []netip.Addr{a.Unmap()}
	} else {
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
		addrs = make([]netip.Addr, 0, len(ips))
		for _, ip := range ips {
			if a, ok := netip.AddrFromSlice(ip.IP); ok {
				addrs = append(addrs, a.Unmap())
			}
		}
	}
	var refused []netip.Addr
	var whys []string
	addrs = slices.DeleteFunc(addrs, func(a netip.Addr) bool {
		why := s.cfg.refusal(a)
		if why != "" {
			refused = append(refused, a)
			whys = append(whys, why)
		}
		return why != ""
	})
	if len(refused) > 0 {
		log.Warn().Str("mx", host).Str("refused_addrs", joinAddrs(refused)).Strs("reasons", whys).
			Bool("loopback_allowed", s.cfg.MXAllowLoopback).Msg("MX host addresses not used: MX delivery does not connect to them")
	}
	if len(addrs) == 0 && len(refused) > 0 {
		return nil, &stepErr{in: refusedInput(host, refused, whys)}
	}
	var from netip.Addr
	if src != nil {
		from = src.Addr
		if tr := traceFrom(ctx); tr != nil {
			tr.sawHost(host, addrs, from)
		}
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

// Families is what a Send from a source found of the address families of
// its destination's MX hosts (Result.MXFamilies): V4 and V6 say that some
// MX host has an address of the family that MX delivery connects to
// (refusal's addresses do not count), and Complete that the addresses of
// every MX host were looked up, so that a family not set is one the
// destination has none of. The zero value knows nothing.
type Families struct {
	V4, V6   bool
	Complete bool
}

// Has says whether some MX host is known to have an address of a's
// family.
func (f Families) Has(a netip.Addr) bool {
	if a.Unmap().Is4() {
		return f.V4
	}
	return f.V6
}

// Lacks says whether the destination is known to have no MX address of
// a's family: a source of that family cannot reach it.
func (f Families) Lacks(a netip.Addr) bool {
	return f.Complete && !f.Has(a)
}

// with is f with a's family set.
func (f Families) with(a netip.Addr) Families {
	if a.Unmap().Is4() {
		f.V4 = true
	} else {
		f.V6 = true
	}
	return f
}

// mxFamilies is the Result's MXFamilies of a Send from a source to hosts
// (its MX hosts, best first) whose recipients' outcomes are out: the
// families of the hosts' addresses, from the trace for the hosts the Send
// looked up and by looking up the others. Only an attempt that did not
// deliver every recipient needs them (the worker asks whether another
// source can reach the destination), so a delivery costs no lookup; nor
// does a Send without a source or through the relay, which know nothing
// (the zero value). A host whose lookup fails leaves it incomplete.
func (s *Sender) mxFamilies(ctx context.Context, hosts []string, out []classify.Input) Families {
	tr := traceFrom(ctx)
	if tr == nil || s.cfg.Relay != "" || len(hosts) == 0 {
		return Families{}
	}
	delivered := true
	for _, in := range out {
		delivered = delivered && in.Stage == classify.StageDataEnd && in.Code/100 == 2
	}
	if delivered {
		return Families{}
	}
	f := Families{Complete: true}
	for _, h := range hosts {
		hf, ok := tr.hosts[h]
		if !ok {
			hf = s.hostFamilies(ctx, h)
		}
		f.V4, f.V6, f.Complete = f.V4 || hf.V4, f.V6 || hf.V6, f.Complete && hf.Complete
	}
	return f
}

// hostFamilies looks up the addresses of MX host host, as hostAddrs does
// but without logging or ordering them, and returns their families;
// incomplete when the lookup fails.
func (s *Sender) hostFamilies(ctx context.Context, host string) Families {
	var f Families
	if a, err := netip.ParseAddr(host); err == nil {
		if s.cfg.refusal(a) == "" {
			f = f.with(a)
		}
		f.Complete = true
		return f
	}
	ips, err := s.cfg.Resolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		return f
	}
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip.IP); ok && s.cfg.refusal(a.Unmap()) == "" {
			f = f.with(a)
		}
	}
	f.Complete = true
	return f
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

// isAddrLiteral says whether an MX target is an IP address rather than a
// host name ("192.0.2.1", "2001:db8::1", or either in brackets).
func isAddrLiteral(h string) bool {
	_, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"))
	return err == nil
}

// refusal says why MX delivery must not connect to a, or "" when it may.
// These addresses lead back to this host (loopback; the unspecified
// address and the rest of 0.0.0.0/8, which the kernel takes as "this
// host") or to whatever happens to sit on the local link (link-local), or
// are no destination for TCP at all (multicast): a recipient domain that
// publishes one would steer outflow's SMTP at local services. Private
// ranges (10/8, 172.16/12, 192.168/16, fc00::/7) stay allowed, since
// internal MX hosts are normal. MXAllowLoopback (tests, labs) allows
// loopback only. The relay is never checked: the operator chose it.
func (c *Config) refusal(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a.IsLoopback():
		if c.MXAllowLoopback {
			return ""
		}
		return "loopback"
	case a.IsUnspecified() || (a.Is4() && a.As4()[0] == 0):
		return "unspecified"
	case a.IsLinkLocalUnicast():
		return "link-local"
	case a.IsMulticast():
		return "multicast"
	}
	return ""
}

// refusedInput is the outcome for an MX host all of whose addresses
// MX delivery refuses (refusal). It is permanent, 554 5.4.6 (routing
// loop) when one of them leads back to this host, 554 5.4.4 (unable to
// route) otherwise, as Postfix bounces mail whose MX is itself ("mail for
// example.com loops back to myself", 5.4.6) and RFC 5321 5.1 has a client
// drop MX records that lead to itself: the address is what the domain
// publishes, a retry would read the same records, and a domain that points
// its MX at 127.0.0.1 usually does so to say that it takes no mail (the
// way of saying it before RFC 7505's null MX). Only when no host was
// reachable is this the message's outcome: when another MX host fails
// temporarily, that failure is reported instead (acquire), and the
// message waits.
func refusedInput(host string, refused []netip.Addr, whys []string) classify.Input {
	enhanced, what := "5.4.4", "no address MX delivery connects to"
	if slices.Contains(whys, "loopback") || slices.Contains(whys, "unspecified") {
		enhanced, what = "5.4.6", "mail to it would loop back to this host"
	}
	return synthetic(classify.StageConnect, 554, enhanced, fmt.Sprintf("MX host %s resolves only to %s (%s): %s; not delivering to it (RFC 5321 5.1)",
		host, joinAddrs(refused), strings.Join(slices.Compact(slices.Sorted(slices.Values(whys))), ", "), what))
}

func joinAddrs(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
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
