package main

import (
	"context"
	"crypto/x509"
	"net"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/dane"
	"github.com/outflow/outflow/mtasts"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/tlsrpt"
)

// tlsPolicyConfig is the MTA-STS, DANE and TLS-report part of
// serveConfig; each field is a flag and a config-file key of the same
// name. docs/delivery.md describes what they do.
type tlsPolicyConfig struct {
	MTASTS           bool   `toml:"mta-sts"`
	MTASTSPolicyAddr string `toml:"mta-sts-policy-addr"`
	DANE             bool   `toml:"dane"`
	TLSReportDir     string `toml:"tls-report-dir"`
	TLSReportPost    bool   `toml:"tls-report-post"`
	TLSReportOrg     string `toml:"tls-report-org"`
	TLSReportContact string `toml:"tls-report-contact"`
}

func bindTLSPolicyFlags(fs *pflag.FlagSet, c *tlsPolicyConfig) {
	fs.BoolVar(&c.MTASTS, "mta-sts", true, "apply recipient domains' MTA-STS policies (RFC 8461) to MX delivery")
	fs.StringVar(&c.MTASTSPolicyAddr, "mta-sts-policy-addr", "", "for tests and labs: fetch every MTA-STS policy from this HOST:PORT (the certificate is still checked for mta-sts.<domain>)")
	fs.BoolVar(&c.DANE, "dane", true, "apply DNSSEC-authenticated TLSA records (DANE, RFC 7672) to MX delivery; needs a validating resolver (--dns)")
	fs.StringVar(&c.TLSReportDir, "tls-report-dir", "", "write the daily TLS reports (RFC 8460 JSON) under this directory, one file per policy domain")
	fs.BoolVar(&c.TLSReportPost, "tls-report-post", false, "POST the daily TLS reports to the https rua addresses of each domain's _smtp._tls TXT record")
	fs.StringVar(&c.TLSReportOrg, "tls-report-org", "", "organization-name in TLS reports (default: the hostname)")
	fs.StringVar(&c.TLSReportContact, "tls-report-contact", "", "contact-info in TLS reports (default: postmaster@<hostname>)")
}

// tlsResolver is what MTA-STS, DANE and the reports look up.
type tlsResolver interface {
	mtasts.Resolver
	dane.Resolver
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// dialVia connects to host:port at the addresses res finds for host, so
// that MTA-STS policy hosts resolve through --dns like everything else of
// delivery.
func dialVia(res tlsResolver) mtasts.DialFunc {
	var d net.Dialer
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		ips, err := res.LookupIPAddr(ctx, host)
		if err != nil {
			return nil, err
		}
		var last error = &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
		for _, ip := range ips {
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.IP.String(), port))
			if err == nil {
				return c, nil
			}
			last = err
		}
		return nil, last
	}
}

// tlsSessions counts DANE and MTA-STS outcomes in
// outflow_tls_policy_sessions_total and hands them on to the report
// aggregator, if any.
type tlsSessions struct {
	c    *prometheus.CounterVec
	next sender.TLSReporter
}

func (m *tlsSessions) Record(ev tlsrpt.Event) {
	result := ev.Result
	if ev.Success {
		result = "success"
	}
	m.c.WithLabelValues(ev.PolicyType, result).Inc()
	if m.next != nil {
		m.next.Record(ev)
	}
}

// tlsPolicies builds the MTA-STS client, the DANE resolver and the TLS
// outcome reporter (metrics, and the report aggregator when reports are
// kept) for the sender, and returns a function that runs, until ctx ends,
// the aggregator and the MTA-STS policies' refresh (nil when there is
// neither).
func tlsPolicies(c *serveConfig, res tlsResolver, roots *x509.CertPool, hostname, workerID string, reg prometheus.Registerer, log zerolog.Logger) (
	sts sender.MTASTSLookup, tlsa dane.Resolver, rep sender.TLSReporter, run func(context.Context), err error) {
	sts, tlsa, rep, runReports, err := tlsPoliciesAndReports(c, res, roots, hostname, workerID, reg, log)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cl, _ := sts.(*mtasts.Client)
	if cl == nil {
		return sts, tlsa, rep, runReports, nil
	}
	return sts, tlsa, rep, func(ctx context.Context) {
		// Returns once the report loop has saved the day's counts too.
		var wg sync.WaitGroup
		if runReports != nil {
			wg.Go(func() { runReports(ctx) })
		}
		refreshSTS(ctx, cl, stsRefreshEvery)
		wg.Wait()
	}, nil
}

// stsRefreshEvery is how often the cached MTA-STS policies due for a
// refresh are fetched again (mtasts.Client.Refresh).
const stsRefreshEvery = time.Hour

// refreshSTS refreshes the MTA-STS policies that are due every period,
// until ctx ends: a policy is fetched again at half its max_age (at most
// a day) whether or not mail went to its domain meanwhile (RFC 8461 10.2).
func refreshSTS(ctx context.Context, cl *mtasts.Client, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cl.Refresh(ctx)
		}
	}
}

func tlsPoliciesAndReports(c *serveConfig, res tlsResolver, roots *x509.CertPool, hostname, workerID string, reg prometheus.Registerer, log zerolog.Logger) (
	sts sender.MTASTSLookup, tlsa dane.Resolver, rep sender.TLSReporter, run func(context.Context), err error) {
	t := &c.tlsPolicyConfig
	sessions := &tlsSessions{c: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outflow_tls_policy_sessions_total",
		Help: "MX sessions (and MTA-STS policy fetches) under a DANE or MTA-STS policy, by policy type (sts, tlsa) and result (success or the RFC 8460 result type).",
	}, []string{"policy", "result"})}
	if err := reg.Register(sessions.c); err != nil {
		return nil, nil, nil, nil, err
	}
	if t.MTASTS {
		cl, err := mtasts.New(mtasts.Config{Resolver: res, RootCAs: roots, PolicyAddr: t.MTASTSPolicyAddr, Dial: dialVia(res)})
		if err != nil {
			return nil, nil, nil, nil, usageError{err}
		}
		sts = cl
	}
	if t.DANE {
		tlsa = res
	}
	if t.TLSReportDir == "" && !t.TLSReportPost {
		return sts, tlsa, sessions, nil, nil
	}
	org, contact := t.TLSReportOrg, t.TLSReportContact
	if org == "" {
		org = hostname
	}
	if contact == "" {
		contact = "postmaster@" + hostname
	}
	agg, err := tlsrpt.New(tlsrpt.Config{Dir: t.TLSReportDir, Post: t.TLSReportPost, Resolver: res, RootCAs: roots, Dial: dialVia(res),
		OrgName: org, Contact: contact, Instance: workerID, StateFile: filepath.Join(c.Data, "tlsrpt-state.json"),
		Logger: log.With().Str("component", "tlsrpt").Logger()})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	sessions.next = agg
	return sts, tlsa, sessions, agg.Run, nil
}
