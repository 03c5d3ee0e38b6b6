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

// The report POSTs' idle connections: closed after postIdle, at most
// postMaxIdle of all endpoints kept.
const (
	postIdle    = 30 * time.Second
	postMaxIdle = 16
)

// DefaultSaveInterval is how often Run saves counts that changed: what a
// process killed without a graceful stop loses at most.
const DefaultSaveInterval = 5 * time.Minute

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
	// memory only. It is saved by each Flush that sends a day (before
	// posting), by Run every SaveInterval while the counts change, and
	// when Run ends.
	StateFile string
	// SaveInterval is how often Run saves changed counts (default
	// DefaultSaveInterval): what a crash loses at most.
	SaveInterval time.Duration
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

	mu      sync.Mutex
	days    map[string]map[string]*domainStats // day → policy domain → stats
	changes uint64                             // bumped by each change to days: Save skips a file that holds them already

	saveMu sync.Mutex // one Save at a time: an older copy never renamed over a newer one
	saved  uint64     // changes when the state file was last written

	// after is Run's timer (time.After); tests replace it to step Run
	// without waiting.
	after func(time.Duration) <-chan time.Time
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
	defaults.Set(&cfg.SaveInterval, DefaultSaveInterval)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Aggregator{cfg: cfg, days: map[string]map[string]*domainStats{}, after: time.After,
		http: &http.Client{
			Timeout: DefaultPostTimeout,
			// Reports go out once a day, to endpoints of many domains: a
			// connection idle after the day's posts is closed rather than
			// kept until the far side drops it (http.Transport's zero
			// values keep every one, without a limit).
			Transport: &http.Transport{DialContext: cfg.Dial, TLSClientConfig: &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
				IdleConnTimeout: postIdle, MaxIdleConns: postMaxIdle, MaxIdleConnsPerHost: 2},
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
	desc := PolicyDesc{Type: ev.PolicyType, String: ev.Policy, Domain: strings.ToLower(ev.Domain), MXHost: ev.MXHosts}
	a.mu.Lock()
	defer a.mu.Unlock()
	// The day is read under the lock that Flush takes: a session counted
	// a moment before midnight lands before the flush of its day, not in
	// a copy of that day that would be reported again, under the same
	// report-id, at the next flush.
	day := dayOf(a.cfg.Now())
	a.changes++
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
//
// The state file is rewritten without those days before the first POST:
// a process killed after posting a day must not find it in the file again
// and post it a second time under the same report-id. Reports are written
// to Dir before that save, since writing one again after a crash only
// replaces the file with the same report; a crash while posting loses the
// posts not yet made, as a failed POST does.
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
	if len(days) > 0 {
		a.changes++
	}
	a.mu.Unlock()
	if len(days) == 0 {
		return
	}
	slices.Sort(days)
	type encoded struct {
		dom  string
		body []byte
	}
	var out []encoded
	for _, d := range days {
		for _, r := range reports[d] {
			dom := r.Policies[0].Policy.Domain
			body, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				a.cfg.Logger.Error().Err(err).Str("policy_domain", dom).Msg("TLS report: encoding failed")
				continue
			}
			out = append(out, encoded{dom, body})
			if a.cfg.Dir == "" {
				continue
			}
			if err := writeFile(filepath.Join(a.cfg.Dir, d), safeName(dom)+".json", body); err != nil {
				a.cfg.Logger.Error().Err(err).Str("policy_domain", dom).Msg("TLS report: writing failed")
			} else {
				a.cfg.Logger.Info().Str("policy_domain", dom).Str("day", d).Msg("TLS report written")
			}
		}
	}
	if err := a.Save(); err != nil {
		// Posted all the same: the days are gone from memory, so the next
		// save (Run's, or the one at a stop) drops them from the file;
		// only a crash before it posts them again.
		a.cfg.Logger.Error().Err(err).Msg("TLS report: saving state failed")
	}
	if a.cfg.Post {
		for _, e := range out {
			a.post(ctx, e.dom, e.body)
		}
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

// Run flushes finished days shortly after each UTC midnight and saves the
// counts every SaveInterval (when they changed) until ctx ends, then saves
// them once more. It is the Aggregator's one goroutine. Saving only at the
// end lost a crashed process's counts since its last stop and kept the
// days it had posted in the file, to be posted again at the next start.
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
		flushAt := now.Truncate(24 * time.Hour).Add(24*time.Hour + time.Minute)
		for wait := flushAt.Sub(now); wait > 0; wait = flushAt.Sub(a.cfg.Now()) {
			if err := a.Save(); err != nil {
				a.cfg.Logger.Error().Err(err).Msg("TLS report: saving state failed")
			}
			select {
			case <-ctx.Done():
				return
			case <-a.after(min(wait, a.cfg.SaveInterval)):
			}
		}
	}
}

// Save writes the counts to StateFile, unless it holds them already. The
// file is replaced atomically and durably (a temporary file, fsync,
// rename, fsync of the directory): a crash leaves the last complete save.
func (a *Aggregator) Save() error {
	if a.cfg.StateFile == "" {
		return nil
	}
	a.saveMu.Lock()
	defer a.saveMu.Unlock()
	a.mu.Lock()
	if a.changes == a.saved {
		a.mu.Unlock()
		return nil
	}
	gen := a.changes
	b, err := json.Marshal(a.days)
	a.mu.Unlock()
	if err != nil {
		return err
	}
	if err := writeFile(filepath.Dir(a.cfg.StateFile), filepath.Base(a.cfg.StateFile), b); err != nil {
		return err
	}
	a.saved = gen
	return nil
}

// writeFile replaces dir/name with b: written to a temporary file in dir,
// fsynced, renamed over name and the directory fsynced, so that a reader
// (or a crash) sees the old contents or the new, never a part, and the new
// ones survive a power loss once writeFile returns.
func writeFile(dir, name string, b []byte) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+name+".*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	return syncDir(dir)
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
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
