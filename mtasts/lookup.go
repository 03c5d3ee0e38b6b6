package mtasts

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/outflow/outflow/internal/defaults"
)

// Resolver is the DNS the policy discovery needs.
type Resolver interface {
	LookupTXT(ctx context.Context, name string) ([]string, error)
}

// DialFunc opens a TCP connection; it has the shape of
// (*net.Dialer).DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Defaults. The fetch limits are RFC 8461 3.3's suggestions.
const (
	DefaultFetchTimeout = time.Minute     // the whole HTTPS GET, connect to last byte
	DefaultFailureHold  = 5 * time.Minute // a failed fetch is not repeated for the same id sooner
	DefaultMaxEntries   = 10000           // domains in the cache
	MaxPolicySize       = 64 << 10        // bytes of policy body
	wellKnownPath       = "/.well-known/mta-sts.txt"
)

// Failure types for TLS reporting (RFC 8460 4.3.2.1).
const (
	FailureFetch   = "sts-policy-fetch-error"
	FailureInvalid = "sts-policy-invalid"
	FailureWebPKI  = "sts-webpki-invalid"
)

// Config configures a Client. Zero fields take the defaults noted.
type Config struct {
	// Resolver looks up the "_mta-sts" TXT records. Required.
	Resolver Resolver
	// RootCAs verifies the policy host's certificate; nil means the
	// system pool. The daemon passes the pool of --tls-ca-file here.
	RootCAs *x509.CertPool
	// PolicyAddr, when set (host:port), is where every policy fetch
	// connects, whatever the domain; the URL, the TLS server name and the
	// certificate check stay those of "mta-sts.<domain>". It is for tests
	// and labs, where the policy hosts are one local HTTPS server.
	PolicyAddr string
	// Dial opens the fetch's connections. Default a net.Dialer (which
	// resolves "mta-sts.<domain>" with the system resolver).
	Dial DialFunc
	// FetchTimeout bounds one policy fetch. Default DefaultFetchTimeout.
	FetchTimeout time.Duration
	// FailureHold is how long a failed fetch is remembered for the TXT
	// id it was made for. Default DefaultFailureHold.
	FailureHold time.Duration
	// MaxEntries bounds the cache (domains). Default DefaultMaxEntries.
	MaxEntries int
	// Now is the clock; default time.Now. Tests move it.
	Now func() time.Time
}

// Result is what Lookup found for a domain.
type Result struct {
	// Policy is the policy that applies, nil when none does. A policy of
	// mode none is returned as such: the domain has withdrawn it.
	Policy *Policy
	// Failure, when the domain announces a policy (a valid TXT record)
	// but none could be had and none is cached, is the RFC 8460 result
	// type: FailureFetch, FailureInvalid or FailureWebPKI. Err says why.
	Failure string
	Err     error
	// Cached is true when Policy came from the cache without a fetch.
	Cached bool
}

type entry struct {
	policy    *Policy   // last good policy (may be expired)
	failID    string    // TXT id whose fetch failed
	failUntil time.Time // no new fetch for failID before then
	failType  string
	failErr   error
	fetching  chan struct{} // closed when the running fetch ends; nil when none runs
	refreshAt time.Time     // no refresh of a valid policy before then (refreshDue)
}

// Client discovers, fetches and caches MTA-STS policies. It is safe for
// concurrent use; concurrent lookups of one domain share one fetch.
type Client struct {
	cfg  Config
	http *http.Client

	mu      sync.Mutex
	entries map[string]*entry
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.Resolver == nil {
		return nil, errors.New("mtasts: no Resolver")
	}
	defaults.Set(&cfg.FetchTimeout, DefaultFetchTimeout)
	defaults.Set(&cfg.FailureHold, DefaultFailureHold)
	defaults.Set(&cfg.MaxEntries, DefaultMaxEntries)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PolicyAddr != "" {
		if _, _, err := net.SplitHostPort(cfg.PolicyAddr); err != nil {
			return nil, fmt.Errorf("mtasts: PolicyAddr %q: %w", cfg.PolicyAddr, err)
		}
	}
	dial := cfg.Dial
	if dial == nil {
		d := &net.Dialer{}
		dial = d.DialContext
	}
	if cfg.PolicyAddr != "" {
		inner := dial
		dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			return inner(ctx, network, cfg.PolicyAddr)
		}
	}
	tr := &http.Transport{
		Proxy:               nil, // the policy host is asked directly
		DialContext:         dial,
		TLSClientConfig:     &tls.Config{RootCAs: cfg.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: cfg.FetchTimeout,
		MaxIdleConns:        10,
		IdleConnTimeout:     30 * time.Second,
	}
	c := &Client{
		cfg: cfg,
		http: &http.Client{
			Transport: tr,
			Timeout:   cfg.FetchTimeout,
			// RFC 8461 3.3: "Senders MUST NOT follow HTTP redirects."
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		entries: map[string]*entry{},
	}
	return c, nil
}

// Lookup returns the policy that applies to domain now (RFC 8461 5.1).
//
// A fetch runs on its own, bounded by FetchTimeout: a caller whose
// context ends stops waiting for it, and its end does not become the
// failure every sender to the domain is given for FailureHold.
func (c *Client) Lookup(ctx context.Context, domain string) Result {
	domain = strings.ToLower(strings.TrimSuffix(domain, "."))
	// A failed TXT lookup counts as no record: the cached policy, if
	// any, still applies.
	id, _ := c.txtID(ctx, domain)
	started := false // this lookup started the fetch it waits for
	for {
		now := c.cfg.Now()
		c.mu.Lock()
		e := c.entries[domain]
		var valid *Policy
		if e != nil && e.policy != nil && now.Before(e.policy.Expires()) {
			valid = e.policy
		}
		switch {
		case id == "":
			// No (valid) TXT record, or DNS failed: a cached policy
			// stays in force until it expires.
			c.mu.Unlock()
			if valid != nil {
				return Result{Policy: valid, Cached: true}
			}
			return Result{}
		case valid != nil && valid.ID == id:
			c.refreshDue(e, domain, id, now)
			c.mu.Unlock()
			return Result{Policy: valid, Cached: !started}
		case e != nil && e.failID == id && now.Before(e.failUntil):
			c.mu.Unlock()
			if valid != nil {
				return Result{Policy: valid, Cached: true}
			}
			return Result{Failure: e.failType, Err: e.failErr}
		case e != nil && e.fetching != nil:
			ch := e.fetching
			c.mu.Unlock()
			select {
			case <-ch:
				if r, ok := c.fetched(domain, id, started); ok {
					return r
				}
				continue // look again at what the fetch left
			case <-ctx.Done():
				if valid != nil {
					return Result{Policy: valid, Cached: true}
				}
				return Result{Failure: FailureFetch, Err: ctx.Err()}
			}
		}
		if e == nil {
			e = c.newEntry(domain, now)
		}
		c.startFetch(e, domain, id)
		started = true
		c.mu.Unlock()
	}
}

// fetched is what a lookup that waited for a fetch of id answers: the
// policy it got, even one whose max_age is 0 (used once, not cached), or
// its failure with the cached policy that stays in force. ok is false
// when the entry says neither (it left the cache meanwhile).
func (c *Client) fetched(domain, id string, started bool) (Result, bool) {
	now := c.cfg.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	e := c.entries[domain]
	switch {
	case e == nil:
		return Result{}, false
	case e.failID == id && now.Before(e.failUntil):
		if e.policy != nil && now.Before(e.policy.Expires()) {
			// 5.1: a policy that cannot be refreshed stays in force
			// until it expires.
			return Result{Policy: e.policy, Cached: true}, true
		}
		return Result{Failure: e.failType, Err: e.failErr}, true
	case e.policy != nil && e.policy.ID == id:
		return Result{Policy: e.policy, Cached: !started}, true
	}
	return Result{}, false
}

// startFetch fetches domain's policy for TXT id in the background and
// records the outcome in e. c.mu is held.
func (c *Client) startFetch(e *entry, domain, id string) {
	done := make(chan struct{})
	e.fetching = done
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.FetchTimeout)
		defer cancel()
		p, ftype, err := c.fetch(ctx, domain)
		c.mu.Lock()
		defer c.mu.Unlock()
		e.fetching = nil
		close(done)
		if err == nil {
			p.ID, p.Fetched = id, c.cfg.Now()
			e.policy, e.failID, e.failErr, e.failType = p, "", nil, ""
			return
		}
		e.failID, e.failUntil, e.failType, e.failErr = id, c.cfg.Now().Add(c.cfg.FailureHold), ftype, err
	}()
}

// refreshAfter is how long after its fetch a policy is fetched again
// while it is in use: half its max_age, and at least daily (RFC 8461 10.2
// asks senders to refresh cached policies proactively, so that an
// attacker who blocks the policy host around an expiry cannot strip
// them). refreshRetry spaces the tries when the policy host fails.
const (
	refreshAfter = 24 * time.Hour
	refreshRetry = time.Hour
)

// dueForRefresh reports whether e holds a policy in force that is due to
// be fetched again (refreshAfter), with no fetch running and no refresh
// tried within refreshRetry. c.mu is held.
func (e *entry) dueForRefresh(now time.Time) bool {
	p := e.policy
	return p != nil && e.fetching == nil && now.Before(p.Expires()) && !now.Before(e.refreshAt) &&
		!now.Before(p.Fetched.Add(min(p.MaxAge/2, refreshAfter)))
}

// refreshDue starts a background fetch of the valid policy in e when it
// is due: the lookup that finds it due still answers with the cached
// policy, and a refresh that fails keeps it. c.mu is held.
func (c *Client) refreshDue(e *entry, domain, id string, now time.Time) {
	if !e.dueForRefresh(now) {
		return
	}
	e.refreshAt = now.Add(refreshRetry)
	c.startFetch(e, domain, id)
}

// refreshParallel bounds the fetches Refresh has running at once: a cache
// of thousands of policies fetched again in one burst would open as many
// HTTPS connections.
const refreshParallel = 8

// Refresh fetches again every cached policy that is due (refreshAfter)
// and whose domain still announces one, refreshParallel at a time; it
// returns how many it started, once all but the last refreshParallel have
// ended. The daemon calls it periodically, so that policies of domains
// not mailed in a while are refreshed before they expire too.
func (c *Client) Refresh(ctx context.Context) int {
	now := c.cfg.Now()
	c.mu.Lock()
	var due []string
	for d, e := range c.entries {
		if e.dueForRefresh(now) {
			due = append(due, d)
		}
	}
	c.mu.Unlock()
	n := 0
	var running []chan struct{}
	for _, d := range due {
		if len(running) == refreshParallel {
			select {
			case <-running[0]:
			case <-ctx.Done():
			}
			running = running[1:]
		}
		if ctx.Err() != nil {
			break
		}
		id, err := c.txtID(ctx, d)
		if err != nil || id == "" {
			continue // the cached policy stays in force until it expires
		}
		now := c.cfg.Now()
		c.mu.Lock()
		if e := c.entries[d]; e != nil && e.dueForRefresh(now) {
			e.refreshAt = now.Add(refreshRetry)
			c.startFetch(e, d, id)
			running = append(running, e.fetching)
			n++
		}
		c.mu.Unlock()
	}
	return n
}

// newEntry adds an entry for domain, first making room when the cache is
// full: expired entries go, then those without a policy in force (failed
// fetches), and only then, when every entry holds one, the policy that
// expires soonest. A valid policy is what protects the domain's mail, so
// domains whose policies cannot be had (an attacker's, by the thousand)
// must not push it out. c.mu is held.
func (c *Client) newEntry(domain string, now time.Time) *entry {
	if len(c.entries) >= c.cfg.MaxEntries {
		inForce := func(e *entry) bool { return e.policy != nil && now.Before(e.policy.Expires()) }
		for d, e := range c.entries {
			if e.fetching == nil && !inForce(e) && !now.Before(e.failUntil) {
				delete(c.entries, d)
			}
		}
		for d, e := range c.entries {
			if len(c.entries) < c.cfg.MaxEntries {
				break
			}
			if e.fetching == nil && !inForce(e) {
				delete(c.entries, d)
			}
		}
		for len(c.entries) >= c.cfg.MaxEntries {
			soonest := ""
			for d, e := range c.entries {
				if e.fetching == nil && (soonest == "" || e.policy.Expires().Before(c.entries[soonest].policy.Expires())) {
					soonest = d
				}
			}
			if soonest == "" {
				break // every entry is fetching: allow one more
			}
			delete(c.entries, soonest)
		}
	}
	e := &entry{}
	c.entries[domain] = e
	return e
}

// txtID returns the id of the domain's one valid "_mta-sts" record, or ""
// (RFC 8461 3.1: records not starting with "v=STSv1;" are discarded, and
// anything but exactly one left means no policy is announced).
func (c *Client) txtID(ctx context.Context, domain string) (string, error) {
	recs, err := c.cfg.Resolver.LookupTXT(ctx, "_mta-sts."+domain)
	if err != nil {
		return "", err
	}
	var sts []string
	for _, r := range recs {
		if strings.HasPrefix(r, "v=STSv1;") || r == "v=STSv1" {
			sts = append(sts, r)
		}
	}
	if len(sts) != 1 {
		return "", nil
	}
	return ParseTXT(sts[0])
}

// fetch GETs and parses the domain's policy, returning the RFC 8460
// failure type with any error.
func (c *Client) fetch(ctx context.Context, domain string) (*Policy, string, error) {
	host := "mta-sts." + domain
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+wellKnownPath, nil)
	if err != nil {
		return nil, FailureFetch, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var cv *tls.CertificateVerificationError
		if errors.As(err, &cv) {
			return nil, FailureWebPKI, fmt.Errorf("policy host %s: %w", host, err)
		}
		return nil, FailureFetch, fmt.Errorf("policy host %s: %w", host, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		// Redirects land here too (3.3: never followed).
		return nil, FailureFetch, fmt.Errorf("policy host %s: HTTP %s", host, resp.Status)
	}
	mt, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || mt != "text/plain" {
		return nil, FailureInvalid, fmt.Errorf("policy host %s: content type %q, want text/plain", host, resp.Header.Get("Content-Type"))
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, MaxPolicySize+1))
	if err != nil {
		return nil, FailureFetch, fmt.Errorf("policy host %s: reading policy: %w", host, err)
	}
	if len(body) > MaxPolicySize {
		return nil, FailureFetch, fmt.Errorf("policy host %s: policy larger than %d bytes", host, MaxPolicySize)
	}
	p, err := Parse(body)
	if err != nil {
		return nil, FailureInvalid, fmt.Errorf("policy host %s: %w", host, err)
	}
	return p, "", nil
}
