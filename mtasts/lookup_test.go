package mtasts

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testpki"
)

type fakeTXT struct {
	mu   sync.Mutex
	recs map[string][]string
	err  error
}

func (f *fakeTXT) set(name string, recs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recs[name] = recs
}

func (f *fakeTXT) LookupTXT(_ context.Context, name string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	r, ok := f.recs[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return r, nil
}

// policyServer is a local HTTPS server playing every mta-sts.<domain>
// host: it answers by the Host header from bodies.
type policyServer struct {
	addr    string
	fetches atomic.Int64
	mu      sync.Mutex
	handler map[string]http.HandlerFunc // by domain
	bodies  map[string]string
	gate    chan struct{} // when set, each request waits for it to close
}

// hold makes every request wait until the returned channel is closed.
func (ps *policyServer) hold() chan struct{} {
	gate := make(chan struct{})
	ps.mu.Lock()
	ps.gate = gate
	ps.mu.Unlock()
	return gate
}

func (ps *policyServer) set(domain, body string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	ps.bodies[domain] = body
}

func startPolicyServer(t *testing.T, ca *testpki.CA, hosts ...string) *policyServer {
	t.Helper()
	leaf, err := ca.Issue(hosts, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ps := &policyServer{handler: map[string]http.HandlerFunc{}, bodies: map[string]string{}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	ps.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ps.fetches.Add(1)
		domain := strings.TrimPrefix(r.Host, "mta-sts.")
		ps.mu.Lock()
		h, body, ok := ps.handler[domain], ps.bodies[domain], true
		gate := ps.gate
		ps.mu.Unlock()
		if gate != nil {
			<-gate
		}
		if r.URL.Path != wellKnownPath {
			http.NotFound(w, r)
			return
		}
		if h != nil {
			h(w, r)
			return
		}
		if body == "" {
			ok = false
		}
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ps
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

type rig struct {
	dns   *fakeTXT
	srv   *policyServer
	clock *clock
	c     *Client
}

func newRig(t *testing.T) *rig {
	t.Helper()
	ca, err := testpki.NewRoot("policy test CA")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{dns: &fakeTXT{recs: map[string][]string{}}, clock: &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}}
	r.srv = startPolicyServer(t, ca, "mta-sts.example.com", "mta-sts.other.test")
	r.c, err = New(Config{Resolver: r.dns, RootCAs: ca.Pool(), PolicyAddr: r.srv.addr, Now: r.clock.now, FetchTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

const enforce = "version: STSv1\nmode: enforce\nmx: mx.example.com\nmax_age: 3600\n"

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLookupFetchesCachesAndRefreshes(t *testing.T) {
	r := newRig(t)
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", enforce)
	res := r.c.Lookup(ctxT(t), "Example.COM.")
	if res.Policy == nil || res.Policy.Mode != ModeEnforce || res.Policy.ID != "one" || res.Cached {
		t.Fatalf("first lookup: %+v", res)
	}
	if !res.Policy.Match("mx.example.com") {
		t.Error("policy does not match its own mx")
	}
	// Same id: from the cache, no fetch.
	res = r.c.Lookup(ctxT(t), "example.com")
	if !res.Cached || r.srv.fetches.Load() != 1 {
		t.Fatalf("second lookup: cached=%v fetches=%d", res.Cached, r.srv.fetches.Load())
	}
	// A new id: fetched again.
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=two;")
	r.srv.set("example.com", strings.Replace(enforce, "mx.example.com", "mx2.example.com", 1))
	res = r.c.Lookup(ctxT(t), "example.com")
	if res.Policy == nil || res.Policy.ID != "two" || !res.Policy.Match("mx2.example.com") || r.srv.fetches.Load() != 2 {
		t.Fatalf("after the id changed: %+v fetches=%d", res, r.srv.fetches.Load())
	}
}

func TestLookupKeepsCachedPolicyWhenRefreshFails(t *testing.T) {
	r := newRig(t)
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", enforce)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil {
		t.Fatalf("first lookup: %+v", res)
	}
	// The id changes but the policy host now serves an error: the
	// cached policy stays (RFC 8461 5.1).
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=two;")
	r.srv.set("example.com", "")
	res := r.c.Lookup(ctxT(t), "example.com")
	if res.Policy == nil || res.Policy.ID != "one" || !res.Cached {
		t.Fatalf("refresh failure: %+v", res)
	}
	// The TXT record disappears: still the cached policy.
	r.dns.set("_mta-sts.example.com")
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil || res.Policy.ID != "one" {
		t.Fatalf("TXT gone: %+v", res)
	}
	// Past max_age, with the fetch still failing: no policy, and the
	// failure is reported.
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=three;")
	r.clock.add(2 * time.Hour)
	res = r.c.Lookup(ctxT(t), "example.com")
	if res.Policy != nil || res.Failure != FailureFetch || res.Err == nil {
		t.Fatalf("expired and unfetchable: %+v", res)
	}
	// Within FailureHold the failed fetch is not repeated.
	n := r.srv.fetches.Load()
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Failure != FailureFetch || r.srv.fetches.Load() != n {
		t.Fatalf("held failure: %+v fetches %d → %d", res, n, r.srv.fetches.Load())
	}
	r.clock.add(DefaultFailureHold)
	r.srv.set("example.com", enforce)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil || res.Policy.ID != "three" {
		t.Fatalf("after the hold: %+v", res)
	}
}

func TestLookupNoPolicy(t *testing.T) {
	r := newRig(t)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy != nil || res.Failure != "" {
		t.Fatalf("no TXT: %+v", res)
	}
	// Two STS records: none is used (RFC 8461 3.1).
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=a;", "v=STSv1; id=b;")
	r.srv.set("example.com", enforce)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy != nil || r.srv.fetches.Load() != 0 {
		t.Fatalf("two records: %+v", res)
	}
	// Unrelated TXT records are ignored.
	r.dns.set("_mta-sts.example.com", "v=spf1 -all", "v=STSv1; id=a;")
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil {
		t.Fatalf("with an unrelated record: %+v", res)
	}
}

func TestFetchLimits(t *testing.T) {
	cases := map[string]struct {
		h    http.HandlerFunc
		want string
	}{
		"redirect not followed": {func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, "https://mta-sts.example.com/elsewhere", http.StatusFound)
		}, FailureFetch},
		"content type": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			_, _ = w.Write([]byte(enforce))
		}, FailureInvalid},
		"too large": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte(enforce + strings.Repeat("x_pad: y\n", MaxPolicySize/9+1)))
		}, FailureFetch},
		"syntax": {func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			_, _ = w.Write([]byte("version: STSv1\nmode: sometimes\nmax_age: 1\n"))
		}, FailureInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := newRig(t)
			r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
			r.srv.mu.Lock()
			r.srv.handler["example.com"] = tc.h
			r.srv.mu.Unlock()
			res := r.c.Lookup(ctxT(t), "example.com")
			if res.Policy != nil || res.Failure != tc.want {
				t.Fatalf("got %+v, want failure %s", res, tc.want)
			}
		})
	}
}

func TestFetchNeedsAVerifiedCertificate(t *testing.T) {
	r := newRig(t)
	// other.test is on the certificate but untrusted.com is not.
	r.dns.set("_mta-sts.untrusted.com", "v=STSv1; id=one;")
	r.srv.set("untrusted.com", enforce)
	res := r.c.Lookup(ctxT(t), "untrusted.com")
	if res.Policy != nil || res.Failure != FailureWebPKI {
		t.Fatalf("name not on the certificate: %+v", res)
	}
	// A pool that does not know the CA.
	other, err := testpki.NewRoot("another CA")
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Resolver: r.dns, RootCAs: other.Pool(), PolicyAddr: r.srv.addr})
	if err != nil {
		t.Fatal(err)
	}
	r.dns.set("_mta-sts.other.test", "v=STSv1; id=one;")
	r.srv.set("other.test", enforce)
	if res := c.Lookup(ctxT(t), "other.test"); res.Policy != nil || res.Failure != FailureWebPKI {
		t.Fatalf("unknown CA: %+v", res)
	}
}

func TestConcurrentLookupsShareOneFetch(t *testing.T) {
	r := newRig(t)
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", enforce)
	gate := r.srv.hold()
	var wg sync.WaitGroup
	results := make([]Result, 8)
	for i := range results {
		wg.Go(func() { results[i] = r.c.Lookup(ctxT(t), "example.com") })
	}
	// Let the lookups pile up on the one fetch, then release it.
	deadline := time.Now().Add(10 * time.Second)
	for r.srv.fetches.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	close(gate)
	wg.Wait()
	for i, res := range results {
		if res.Policy == nil {
			t.Errorf("lookup %d: %+v", i, res)
		}
	}
	if n := r.srv.fetches.Load(); n != 1 {
		t.Errorf("%d fetches, want 1", n)
	}
}

func TestCacheIsBounded(t *testing.T) {
	r := newRig(t)
	c, err := New(Config{Resolver: r.dns, RootCAs: nil, PolicyAddr: r.srv.addr, MaxEntries: 3, FetchTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"a.test", "b.test", "c.test", "d.test", "e.test"} {
		r.dns.set("_mta-sts."+d, "v=STSv1; id=x;")
		c.Lookup(ctxT(t), d) // fails (no certificate for it): an entry all the same
	}
	c.mu.Lock()
	n := len(c.entries)
	c.mu.Unlock()
	if n > 3 {
		t.Errorf("%d entries, want at most 3", n)
	}
}

// waitFetches waits for the policy server to have answered n fetches.
func waitFetches(t *testing.T, r *rig, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for r.srv.fetches.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d fetches, want %d", r.srv.fetches.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitPolicy waits for the cached policy of domain to satisfy ok.
func waitPolicy(t *testing.T, c *Client, domain string, ok func(*Policy) bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		e := c.entries[domain]
		done := e != nil && e.fetching == nil && e.policy != nil && ok(e.policy)
		c.mu.Unlock()
		if done {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cached policy of %s never changed as expected", domain)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPoliciesRefreshedBeforeTheyExpire: a policy in use is fetched again
// in the background once half its max_age (at most a day) has passed,
// the lookup that finds it due still answering with the cached one; a
// refresh that fails keeps it in force; Refresh does the same for a
// domain nobody looked up since. Before, a policy was fetched again only
// at a new TXT id or after it expired, when an attacker who blocks the
// policy host strips it.
func TestPoliciesRefreshedBeforeTheyExpire(t *testing.T) {
	r := newRig(t)
	twoDays := "version: STSv1\nmode: enforce\nmx: mx.example.com\nmax_age: 172800\n"
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", twoDays)
	first := r.c.Lookup(ctxT(t), "example.com")
	if first.Policy == nil {
		t.Fatalf("first lookup: %+v", first)
	}
	r.clock.add(23 * time.Hour)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy != first.Policy || r.srv.fetches.Load() != 1 {
		t.Fatalf("before the refresh is due: %+v, %d fetches", res, r.srv.fetches.Load())
	}
	// Due: answered from the cache, fetched again meanwhile.
	r.srv.set("example.com", strings.Replace(twoDays, "172800", "259200", 1))
	r.clock.add(2 * time.Hour)
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy != first.Policy || !res.Cached {
		t.Fatalf("the lookup that finds it due: %+v", res)
	}
	waitPolicy(t, r.c, "example.com", func(p *Policy) bool { return p.MaxAge == 72*time.Hour })
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil || !res.Policy.Expires().Equal(r.clock.now().Add(72*time.Hour)) {
		t.Fatalf("after the refresh: %+v", res)
	}

	// A refresh that fails keeps the policy in force to its end.
	r.srv.set("example.com", "")
	r.clock.add(25 * time.Hour)
	fetches := r.srv.fetches.Load()
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil {
		t.Fatalf("lookup at the failing refresh: %+v", res)
	}
	waitFetches(t, r, fetches+1)
	waitPolicy(t, r.c, "example.com", func(*Policy) bool { return true })
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil || res.Policy.MaxAge != 72*time.Hour {
		t.Fatalf("after the failed refresh: %+v, want the cached policy", res)
	}

	// A domain nobody looks up is refreshed by Refresh.
	r.dns.set("_mta-sts.other.test", "v=STSv1; id=o;")
	r.srv.set("other.test", "version: STSv1\nmode: enforce\nmx: mx.other.test\nmax_age: 172800\n")
	if res := r.c.Lookup(ctxT(t), "other.test"); res.Policy == nil {
		t.Fatalf("other.test: %+v", res)
	}
	r.srv.set("other.test", "version: STSv1\nmode: testing\nmx: mx.other.test\nmax_age: 172800\n")
	if n := r.c.Refresh(ctxT(t)); n != 0 {
		t.Fatalf("Refresh started %d fetches with none due", n)
	}
	r.clock.add(25 * time.Hour)
	if n := r.c.Refresh(ctxT(t)); n < 1 {
		t.Fatalf("Refresh started %d fetches, want other.test's", n)
	}
	waitPolicy(t, r.c, "other.test", func(p *Policy) bool { return p.Mode == ModeTesting })
}

// TestCancelledLookupLeavesTheFetch: a caller whose context ends while the
// policy is fetched stops waiting, but the fetch goes on and its policy
// is there for the next lookup. Before, the fetch ran on that caller's
// context, and its cancellation was held as the domain's failure for
// every sender for FailureHold.
func TestCancelledLookupLeavesTheFetch(t *testing.T) {
	r := newRig(t)
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", enforce)
	gate := r.srv.hold()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { waitFetches(t, r, 1); cancel() }()
	if res := r.c.Lookup(ctx, "example.com"); res.Policy != nil || res.Err == nil {
		t.Fatalf("cancelled lookup: %+v", res)
	}
	close(gate)
	waitPolicy(t, r.c, "example.com", func(*Policy) bool { return true })
	if res := r.c.Lookup(ctxT(t), "example.com"); res.Policy == nil || res.Failure != "" {
		t.Fatalf("the next lookup: %+v, want the policy the fetch got", res)
	}
}

// TestFullCacheKeepsPoliciesInForce: a full cache makes room from the
// domains without a policy in force; domains whose policy cannot be had
// (an attacker's, by the thousand) do not push out the policies that
// protect mail.
func TestFullCacheKeepsPoliciesInForce(t *testing.T) {
	r := newRig(t)
	c, err := New(Config{Resolver: r.dns, RootCAs: r.c.cfg.RootCAs, PolicyAddr: r.srv.addr, MaxEntries: 3, FetchTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r.dns.set("_mta-sts.example.com", "v=STSv1; id=one;")
	r.srv.set("example.com", enforce)
	r.dns.set("_mta-sts.other.test", "v=STSv1; id=o;")
	r.srv.set("other.test", "version: STSv1\nmode: enforce\nmx: mx.other.test\nmax_age: 3600\n")
	for _, d := range []string{"example.com", "other.test"} {
		if res := c.Lookup(ctxT(t), d); res.Policy == nil {
			t.Fatalf("%s: %+v", d, res)
		}
	}
	for _, d := range []string{"a.test", "b.test", "c.test", "d.test", "e.test"} {
		r.dns.set("_mta-sts."+d, "v=STSv1; id=x;")
		c.Lookup(ctxT(t), d) // fails (no certificate for it): an entry all the same
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.entries) > 3 {
		t.Errorf("%d entries, want at most 3", len(c.entries))
	}
	for _, d := range []string{"example.com", "other.test"} {
		if e := c.entries[d]; e == nil || e.policy == nil {
			t.Errorf("%s's policy pushed out of the cache", d)
		}
	}
}

// TestRefreshBoundsItsFetches: Refresh fetches the due policies
// refreshParallel at a time, not a connection per cached policy at once.
func TestRefreshBoundsItsFetches(t *testing.T) {
	ca, err := testpki.NewRoot("policy test CA")
	if err != nil {
		t.Fatal(err)
	}
	var domains, hosts []string
	for i := range refreshParallel + 4 {
		d := "d" + strconv.Itoa(i) + ".test"
		domains, hosts = append(domains, d), append(hosts, "mta-sts."+d)
	}
	r := &rig{dns: &fakeTXT{recs: map[string][]string{}}, clock: &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}}
	r.srv = startPolicyServer(t, ca, hosts...)
	r.c, err = New(Config{Resolver: r.dns, RootCAs: ca.Pool(), PolicyAddr: r.srv.addr, Now: r.clock.now, FetchTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range domains {
		r.dns.set("_mta-sts."+d, "v=STSv1; id=one;")
		r.srv.set(d, "version: STSv1\nmode: enforce\nmx: mx."+d+"\nmax_age: 172800\n")
		if res := r.c.Lookup(ctxT(t), d); res.Policy == nil {
			t.Fatalf("%s: %+v", d, res)
		}
	}
	base := r.srv.fetches.Load()
	gate := r.srv.hold()
	r.clock.add(25 * time.Hour)
	started := make(chan int, 1)
	go func() { started <- r.c.Refresh(ctxT(t)) }()
	waitFetches(t, r, base+refreshParallel)
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) {
		if n := r.srv.fetches.Load() - base; n > refreshParallel {
			t.Fatalf("%d fetches at once, want at most %d", n, refreshParallel)
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(gate)
	if n := <-started; n != len(domains) {
		t.Fatalf("Refresh started %d, want %d", n, len(domains))
	}
}
