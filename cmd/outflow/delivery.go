package main

import (
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/resolver"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// deliveryConfig is the DNS and trust-root part of serveConfig; each field
// is a flag and a config-file key of the same name.
type deliveryConfig struct {
	DNS       []string `toml:"dns"`
	TLSCAFile string   `toml:"tls-ca-file"`
	// MX delivery's safety: loopback destinations (refused unless a test
	// allows them) and the tries per attempt (sender.Config's fields of
	// the same names; 0 = no limit here).
	MXAllowLoopback bool `toml:"mx-allow-loopback"`
	MXAddressLimit  int  `toml:"mx-address-limit"`
	MXSessionLimit  int  `toml:"mx-session-limit"`

	// Config-file-only: [[egress]], the source addresses. A tenant's pool
	// is its [tenants.NAME] egress-pool (tenantConfig, cmd/outflow/dsn.go).
	Egress []egressConfig `toml:"egress"`
}

// egressConfig is one [[egress]] entry: a source address to send from and
// the EHLO name that goes with it (its reverse DNS name).
type egressConfig struct {
	Address string `toml:"address"`
	EHLO    string `toml:"ehlo"` // default: hostname
	Pool    string `toml:"pool"` // optional pool name, for [tenants.NAME] egress-pool
}

// bindDeliveryFlags registers the resolver and trust-root flags on fs.
func bindDeliveryFlags(fs *pflag.FlagSet, c *deliveryConfig) {
	fs.StringSliceVar(&c.DNS, "dns", nil, "DNS servers for MX, A/AAAA, TXT and TLSA lookups (ADDR[:PORT][,ADDR…]; default: the nameservers of /etc/resolv.conf)")
	fs.StringVar(&c.TLSCAFile, "tls-ca-file", "", "PEM file of extra root certificates for verifying the relay, MX hosts and MTA-STS policy hosts (added to the system roots)")
	fs.BoolVar(&c.MXAllowLoopback, "mx-allow-loopback", false, "tests and labs only: let MX delivery connect to loopback addresses (127.0.0.0/8, ::1), which it refuses by default like unspecified, link-local and multicast ones (the relay is never checked)")
	fs.IntVar(&c.MXAddressLimit, "mx-address-limit", sender.DefaultMXAddressLimit, "MX host addresses one delivery attempt connects to, over all of the destination's MX hosts, best first (0 = no limit)")
	fs.IntVar(&c.MXSessionLimit, "mx-session-limit", sender.DefaultMXSessionLimit, "MX sessions that may fail after connecting (greeting, TLS, a 4xx to MAIL) in one delivery attempt before it gives up (0 = no limit)")
}

// mxLimit is an mx-*-limit setting as sender.Config takes it: 0 (or
// less) is no limit there, as in Postfix, and negative in sender.Config,
// whose 0 is the default.
func mxLimit(n int) int {
	if n <= 0 {
		return -1
	}
	return n
}

// newResolver builds the delivery resolver from --dns, or from
// /etc/resolv.conf without it, with its cache metrics on reg.
func newResolver(c *deliveryConfig, reg prometheus.Registerer) (*resolver.Resolver, error) {
	var servers []string
	for _, s := range c.DNS {
		if s != "" {
			servers = append(servers, s)
		}
	}
	r, err := resolver.New(resolver.Config{Servers: servers, Registerer: reg})
	if err != nil {
		return nil, usageError{fmt.Errorf("--dns: %w", err)}
	}
	return r, nil
}

// rootCAs is the system's roots plus --tls-ca-file's, or nil (the system
// pool) without the flag. A file that holds no certificate is an error:
// silently trusting only the system would fail every delivery later.
func rootCAs(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, usageError{fmt.Errorf("--tls-ca-file: %w", err)}
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, usageError{fmt.Errorf("--tls-ca-file %s: no PEM certificate in it", file)}
	}
	return pool, nil
}

// newEgress builds the source addresses from [[egress]] and the tenants'
// pools; nil without entries. Each address must be one this host can bind
// (it is on a local interface), checked now rather than at the first
// delivery. With a relay (--relay) at an IP address, only the addresses
// of its family are used, and a pool without one is refused now
// (sender.Egress.ForRelay): from it, every attempt failed before leaving
// this host, and its mail was deferred until max-age.
func newEgress(c *deliveryConfig, tenants map[string]tenantConfig, relay string) (*sender.Egress, error) {
	if len(c.Egress) == 0 {
		for name, tc := range tenants {
			if tc.EgressPool != "" {
				return nil, usageError{fmt.Errorf("[tenants.%s] egress-pool %q: there are no [[egress]] entries", name, tc.EgressPool)}
			}
		}
		return nil, nil
	}
	entries := make([]sender.EgressEntry, 0, len(c.Egress))
	for i, e := range c.Egress {
		a, err := netip.ParseAddr(e.Address)
		if err != nil {
			return nil, usageError{fmt.Errorf("[[egress]] entry %d: address %q: %w", i+1, e.Address, err)}
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(a.String(), "0"))
		if err != nil {
			return nil, usageError{fmt.Errorf("[[egress]] %s: cannot bind it (is it on a local interface?): %w", a, err)}
		}
		_ = ln.Close()
		entries = append(entries, sender.EgressEntry{Source: sender.Source{Addr: a, EHLO: e.EHLO}, Pool: e.Pool})
	}
	pools := map[string]string{}
	for name, tc := range tenants {
		pools[name] = tc.EgressPool
	}
	eg, err := sender.NewEgress(entries, pools)
	if err != nil {
		return nil, usageError{err}
	}
	if eg, err = eg.ForRelay(relay); err != nil {
		return nil, usageError{err}
	}
	return eg, nil
}

// sourceStatus is dest's state per egress address, for `dest status` of a
// destination asked without a source; nil without egress addresses.
func sourceStatus(t *throttle.Throttle, egress *sender.Egress, domain, dest, source string) []throttle.DestStatus {
	if egress.Len() == 0 || source != "" {
		return nil
	}
	domain = throttle.NormalizeDest(domain)
	var out []throttle.DestStatus
	for _, src := range egress.All() {
		st := t.Snapshot(throttle.PairName(dest, src.String()))
		if domain != dest {
			// One domain of a provider group: a suspension of the domain
			// from this address (a block it answered, `dest suspend
			// a.test@SOURCE`) holds its mail, though the group's pair is
			// not suspended. Shown as the group's row showed nothing.
			if own := t.Snapshot(throttle.PairName(domain, src.String())); own.Suspended && !st.Suspended {
				st.Dest, st.Suspended, st.SuspendedTill, st.State.Reason = own.Dest, true, own.SuspendedTill, own.State.Reason
			}
		}
		out = append(out, st)
	}
	return out
}

// printSources is `dest status`'s table of the destination per egress
// address, as each worker applies it; nothing without [[egress]].
func printSources(out io.Writer, views []throttle.WorkerStatus) error {
	any := false
	for _, v := range views {
		any = any || len(v.Sources) > 0
	}
	if !any {
		return nil
	}
	fmt.Fprintln(out, "per source address (dest status DEST@SOURCE for one):")
	tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tSOURCE\tSUSPENDED\tFLEET RATE\tFROM\tFACTOR\tLEARNED\tIN FLIGHT\tBREAKER")
	for _, v := range views {
		for _, s := range v.Sources {
			_, src := throttle.SplitPair(s.Dest)
			susp := "no"
			if s.Suspended {
				susp = "until " + s.SuspendedTill.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.2f\t%s\t%d\t%s\n", v.Worker, src, susp, rate(s.FleetRate), dash(s.RateSource),
				s.Factor, learnedShort(s.State), s.InFlight, s.Breaker)
		}
	}
	return tw.Flush()
}
