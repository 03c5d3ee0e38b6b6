package tlsrpt

import (
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/defaults"
)

// Resolver looks up the "_smtp._tls" TXT records.
type Resolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// Defaults.
const (
	DefaultMaxDomains  = 10000            // policy domains counted per day; more are dropped (and logged)
	DefaultMaxFailures = 100              // failure-details rows per policy
	DefaultPostTimeout = 30 * time.Second // one report POST
	MediaType          = "application/tlsrpt+gzip"
)

// Config configures an Aggregator.
type Config struct {
	// Dir, when set, receives each report as
	// <Dir>/<YYYY-MM-DD>/<policy-domain>.json.
	Dir string
	// Post sends each report to the https "rua" addresses of the policy
	// domain's "_smtp._tls" TXT record (RFC 8460 3), gzipped.
	Post bool
	// Resolver looks up the TXT records; required with Post.
	Resolver Resolver
	// RootCAs verifies the report endpoints; nil means the system pool.
	RootCAs *x509.CertPool
	// Dial opens the POSTs' connections; default a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// OrgName and Contact fill organization-name and contact-info.
	OrgName string
	Contact string
	// Instance names this process in report-ids, so that the reports of
	// several workers for one domain and day stay distinct (each process
	// reports the sessions it made).
	Instance string
	// StateFile keeps the counts across restarts; "" keeps them in
	// memory only.
	StateFile string
	// MaxDomains bounds the domains counted per day (default
	// DefaultMaxDomains) and MaxFailures the failure rows per policy
	// (default DefaultMaxFailures; further failures are counted in the
	// summary only).
	MaxDomains  int
	MaxFailures int
	// Now is the clock; default time.Now.
	Now    func() time.Time
	Logger zerolog.Logger
}

// Aggregator counts TLS outcomes per UTC day, policy domain and policy,
// and sends the reports of finished days. It is safe for concurrent use.
type Aggregator struct {
	cfg  Config
	http *http.Client

	mu   sync.Mutex
	days map[string]map[string]*domainStats // day → policy domain → stats
}

type domainStats struct {
	Policies []*policyStats `json:"policies"`
}

type policyStats struct {
	Desc     PolicyDesc       `json:"desc"`
	Success  int64            `json:"success"`
	Failed   int64            `json:"failed"`
	Failures []*FailureDetail `json:"failures,omitempty"`
}

// New returns an Aggregator, with the counts of StateFile when it exists.
func New(cfg Config) (*Aggregator, error) {
	if cfg.Post && cfg.Resolver == nil {
		return nil, errors.New("tlsrpt: Post needs a Resolver")
	}
	defaults.Set(&cfg.MaxDomains, DefaultMaxDomains)
	defaults.Set(&cfg.MaxFailures, DefaultMaxFailures)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Aggregator{cfg: cfg, days: map[string]map[string]*domainStats{},
		http: &http.Client{
			Timeout:   DefaultPostTimeout,
			Transport: &http.Transport{DialContext: cfg.Dial, TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12}},
			// RFC 8460 5.3 does not ask for redirects; a report goes
			// where the domain's record says, nowhere else.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}}
	if cfg.StateFile != "" {
		b, err := os.ReadFile(cfg.StateFile)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("tlsrpt: state: %w", err)
		default:
			if err := json.Unmarshal(b, &a.days); err != nil {
				return nil, fmt.Errorf("tlsrpt: state %s: %w", cfg.StateFile, err)
			}
		}
	}
	return a, nil
}

func dayOf(t time.Time) string { return t.UTC().Format(time.DateOnly) }

// Record counts one outcome in today's (UTC) counts.
func (a *Aggregator) Record(ev Event) {
	if ev.Domain == "" {
		return
	}
	day := dayOf(a.cfg.Now())
	desc := PolicyDesc{Type: ev.PolicyType, String: ev.Policy, Domain: strings.ToLower(ev.Domain), MXHost: ev.MXHosts}
	a.mu.Lock()
	defer a.mu.Unlock()
	doms := a.days[day]
	if doms == nil {
		doms = map[string]*domainStats{}
		a.days[day] = doms
	}
	ds := doms[desc.Domain]
	if ds == nil {
		if len(doms) >= a.cfg.MaxDomains {
			return
		}
		ds = &domainStats{}
		doms[desc.Domain] = ds
	}
	var ps *policyStats
	for _, p := range ds.Policies {
		if p.Desc.Type == desc.Type && slices.Equal(p.Desc.String, desc.String) {
			ps = p
			break
		}
	}
	if ps == nil {
		ps = &policyStats{Desc: desc}
		ds.Policies = append(ds.Policies, ps)
	}
	if ev.Success {
		ps.Success++
		return
	}
	ps.Failed++
	for _, f := range ps.Failures {
		if f.ResultType == ev.Result && f.ReceivingMXHostname == ev.ReceivingMX && f.ReceivingIP == ev.ReceivingIP && f.SendingMTAIP == ev.SendingIP {
			f.FailedSessionCount++
			return
		}
	}
	if len(ps.Failures) < a.cfg.MaxFailures {
		ps.Failures = append(ps.Failures, &FailureDetail{ResultType: ev.Result, SendingMTAIP: ev.SendingIP,
			ReceivingMXHostname: ev.ReceivingMX, ReceivingIP: ev.ReceivingIP, FailedSessionCount: 1, AdditionalInfo: trim(ev.Detail, 400)})
	}
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// Reports builds the reports of day ("2006-01-02") without sending them,
// one per policy domain, sorted by domain.
func (a *Aggregator) Reports(day string) []Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.reportsLocked(day)
}

func (a *Aggregator) reportsLocked(day string) []Report {
	start, err := time.Parse(time.DateOnly, day)
	if err != nil {
		return nil
	}
	var out []Report
	for dom, ds := range a.days[day] {
		r := Report{OrganizationName: a.cfg.OrgName, ContactInfo: a.cfg.Contact,
			DateRange: DateRange{Start: start, End: start.Add(24*time.Hour - time.Second)},
			ReportID:  fmt.Sprintf("%s_%s_%s@%s", day, dom, cmp.Or(a.cfg.Instance, "0"), cmp.Or(a.cfg.OrgName, "outflow"))}
		for _, p := range ds.Policies {
			pr := PolicyResult{Policy: p.Desc, Summary: Summary{Successful: p.Success, Failed: p.Failed}}
			if pr.Policy.String == nil {
				pr.Policy.String = []string{}
			}
			for _, f := range p.Failures {
				pr.FailureDetails = append(pr.FailureDetails, *f)
			}
			r.Policies = append(r.Policies, pr)
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(x, y Report) int {
		return strings.Compare(x.Policies[0].Policy.Domain, y.Policies[0].Policy.Domain)
	})
	return out
}

// Flush sends the reports of every day before today (UTC) and forgets
// those days. A report that cannot be written or posted is logged and
// dropped: RFC 8460 reports are best effort, and a day's counts must not
// pile up behind an endpoint that is down.
func (a *Aggregator) Flush(ctx context.Context) {
	today := dayOf(a.cfg.Now())
	a.mu.Lock()
	var days []string
	reports := map[string][]Report{}
	for d := range a.days {
		if d < today {
			days = append(days, d)
			reports[d] = a.reportsLocked(d)
			delete(a.days, d)
		}
	}
	a.mu.Unlock()
	slices.Sort(days)
	for _, d := range days {
		for _, r := range reports[d] {
			a.deliver(ctx, d, r)
		}
	}
}

func (a *Aggregator) deliver(ctx context.Context, day string, r Report) {
	dom := r.Policies[0].Policy.Domain
	body, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		a.cfg.Logger.Error().Err(err).Str("policy_domain", dom).Msg("TLS report: encoding failed")
		return
	}
	if a.cfg.Dir != "" {
		if err := writeFile(filepath.Join(a.cfg.Dir, day), safeName(dom)+".json", body); err != nil {
			a.cfg.Logger.Error().Err(err).Str("policy_domain", dom).Msg("TLS report: writing failed")
		} else {
			a.cfg.Logger.Info().Str("policy_domain", dom).Str("day", day).Msg("TLS report written")
		}
	}
	if a.cfg.Post {
		a.post(ctx, dom, body)
	}
}

// post sends the report to the domain's https rua addresses (RFC 8460 3,
// 5.3). mailto: addresses are skipped: reports by mail are not sent yet.
func (a *Aggregator) post(ctx context.Context, dom string, body []byte) {
	uris, err := a.ruas(ctx, dom)
	if err != nil || len(uris) == 0 {
		a.cfg.Logger.Debug().Str("policy_domain", dom).Err(err).Msg("TLS report: no https rua; not posted")
		return
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(body)
	_ = zw.Close()
	for _, u := range uris {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(gz.Bytes()))
		if err != nil {
			continue
		}
		req.Header.Set("Content-Type", MediaType)
		resp, err := a.http.Do(req)
		if err != nil {
			a.cfg.Logger.Warn().Str("policy_domain", dom).Str("rua", u).Err(err).Msg("TLS report: POST failed")
			continue
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			a.cfg.Logger.Warn().Str("policy_domain", dom).Str("rua", u).Int("status", resp.StatusCode).Msg("TLS report: POST refused")
			continue
		}
		a.cfg.Logger.Info().Str("policy_domain", dom).Str("rua", u).Msg("TLS report posted")
	}
}

// ruas returns the https addresses of the domain's one "v=TLSRPTv1" TXT
// record (RFC 8460 3: "rua=" a comma-separated list).
func (a *Aggregator) ruas(ctx context.Context, dom string) ([]string, error) {
	recs, err := a.cfg.Resolver.LookupTXT(ctx, "_smtp._tls."+dom)
	if err != nil {
		return nil, err
	}
	var rpt []string
	for _, r := range recs {
		if strings.HasPrefix(r, "v=TLSRPTv1;") || r == "v=TLSRPTv1" {
			rpt = append(rpt, r)
		}
	}
	if len(rpt) != 1 {
		return nil, fmt.Errorf("%d v=TLSRPTv1 records", len(rpt))
	}
	var out []string
	for _, f := range strings.Split(rpt[0], ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(f), "=")
		if !ok || strings.TrimSpace(k) != "rua" {
			continue
		}
		for _, u := range strings.Split(v, ",") {
			if u = strings.TrimSpace(u); strings.HasPrefix(strings.ToLower(u), "https://") {
				out = append(out, u)
			}
		}
	}
	return out, nil
}

// Run flushes finished days shortly after each UTC midnight until ctx
// ends, then saves the counts. It is the Aggregator's one goroutine.
func (a *Aggregator) Run(ctx context.Context) {
	defer func() {
		if r := recover(); r != nil {
			a.cfg.Logger.Error().Interface("panic", r).Msg("TLS report loop panicked; reports stop until restart")
		}
		if err := a.Save(); err != nil {
			a.cfg.Logger.Error().Err(err).Msg("TLS report: saving state failed")
		}
	}()
	for {
		a.Flush(ctx)
		now := a.cfg.Now().UTC()
		next := now.Truncate(24 * time.Hour).Add(24*time.Hour + time.Minute)
		t := time.NewTimer(next.Sub(now))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Save writes the counts to StateFile (atomically, through a rename).
func (a *Aggregator) Save() error {
	if a.cfg.StateFile == "" {
		return nil
	}
	a.mu.Lock()
	b, err := json.Marshal(a.days)
	a.mu.Unlock()
	if err != nil {
		return err
	}
	return writeFile(filepath.Dir(a.cfg.StateFile), filepath.Base(a.cfg.StateFile), b)
}

func writeFile(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Close(); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return os.Rename(tmp.Name(), filepath.Join(dir, name))
}

// safeName keeps a domain usable as a file name.
func safeName(dom string) string {
	return strings.Map(func(r rune) rune {
		if r == '/' || r == '\\' || r == 0 {
			return '_'
		}
		return r
	}, strings.TrimPrefix(dom, "."))
}
