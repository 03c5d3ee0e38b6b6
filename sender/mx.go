package sender

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
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

// hostAddrs returns the ip:port addresses of one MX host, in resolver
// order; each is tried before the next MX host (RFC 5321 5.1).
func (s *Sender) hostAddrs(ctx context.Context, host string) ([]string, *classify.Input) {
	if ip := net.ParseIP(host); ip != nil {
		return []string{net.JoinHostPort(host, strconv.Itoa(s.cfg.Port))}, nil
	}
	ips, err := s.cfg.Resolver.LookupIPAddr(ctx, host)
	if err != nil || len(ips) == 0 {
		// An MX host without an address is reported as a temporary
		// DNS failure, not NXDOMAIN: the destination domain exists, and
		// a broken MX record is often fixed within the retry window.
		if err == nil {
			err = errors.New("no addresses")
		}
		in := classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
			Text: fmt.Sprintf("MX host %s: address lookup: %v", host, err)}
		return nil, &in
	}
	out := make([]string, 0, len(ips))
	for _, ip := range ips {
		out = append(out, net.JoinHostPort(ip.IP.String(), strconv.Itoa(s.cfg.Port)))
	}
	return out, nil
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
