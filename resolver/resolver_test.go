package resolver

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/internal/fakedns"
)

// clock is a settable test clock.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *clock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *clock) add(d time.Duration) { c.ns.Add(int64(d)) }

func setup(t *testing.T, cfg Config) (*Resolver, *fakedns.Server, *fakedns.Zone, *clock) {
	t.Helper()
	srv := fakedns.Start(t)
	z := srv.MustAddZone(t, "example.test",
		"@ 300 MX 20 mx2",
		"@ 300 MX 10 mx1",
		"mx1 60 A 127.0.0.2",
		"mx1 60 AAAA ::1",
		"mx2 A 127.0.0.3",
		"@ TXT \"v=STSv1; \" \"id=1\"",
		"_25._tcp.mx1 TLSA 3 1 1 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
	)
	srv.MustAddZone(t, "null.test", "@ MX 0 .")
	clk := newClock()
	if cfg.Servers == nil {
		cfg.Servers = []string{srv.Addr}
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 300 * time.Millisecond
	}
	cfg.Now = clk.now
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r, srv, z, clk
}

func TestLookups(t *testing.T) {
	r, _, _, _ := setup(t, Config{})
	ctx := context.Background()
	mxs, err := r.LookupMX(ctx, "Example.Test")
	if err != nil || len(mxs) != 2 || mxs[0].Host != "mx2.example.test." || mxs[0].Pref != 20 || mxs[1].Pref != 10 {
		t.Fatalf("MX: %v %v", mxs, err)
	}
	ips, err := r.LookupIPAddr(ctx, "mx1.example.test")
	if err != nil || len(ips) != 2 || ips[0].IP.To4() != nil || !ips[1].IP.Equal(net.ParseIP("127.0.0.2")) {
		t.Fatalf("IPAddr (IPv6 first): %v %v", ips, err)
	}
	hosts, err := r.LookupHost(ctx, "mx2.example.test")
	if err != nil || len(hosts) != 1 || hosts[0] != "127.0.0.3" {
		t.Fatalf("Host (no AAAA): %v %v", hosts, err)
	}
	txt, err := r.LookupTXT(ctx, "example.test")
	if err != nil || len(txt) != 1 || txt[0] != "v=STSv1; id=1" {
		t.Fatalf("TXT strings joined: %q %v", txt, err)
	}
	mxs, err = r.LookupMX(ctx, "null.test")
	if err != nil || len(mxs) != 1 || mxs[0].Host != "." {
		t.Fatalf("null MX: %v %v", mxs, err)
	}
}

func TestTLSAAndAD(t *testing.T) {
	r, _, z, clk := setup(t, Config{})
	ctx := context.Background()
	recs, ad, err := r.LookupTLSA(ctx, 25, "tcp", "mx1.example.test")
	if err != nil || len(recs) != 1 || recs[0].Usage != 3 || recs[0].Selector != 1 || recs[0].MatchingType != 1 || ad {
		t.Fatalf("TLSA without AD: %v ad=%v %v", recs, ad, err)
	}
	z.SetAD(true)
	clk.add(time.Hour) // past the cached answer
	recs, ad, err = r.LookupTLSA(ctx, 25, "tcp", "mx1.example.test.")
	if err != nil || len(recs) != 1 || !ad {
		t.Fatalf("TLSA with AD: %v ad=%v %v", recs, ad, err)
	}
	recs, ad, err = r.LookupTLSA(ctx, 25, "tcp", "mx2.example.test")
	if err != nil || recs != nil || !ad {
		t.Fatalf("no TLSA is not an error, and carries the AD of the denial: %v ad=%v %v", recs, ad, err)
	}
}

// TestAddrAuthenticated: whether a host's address records came with the
// AD bit, for DANE's look at a failed TLSA lookup; a name without
// addresses is an error.
func TestAddrAuthenticated(t *testing.T) {
	r, _, z, clk := setup(t, Config{})
	ctx := context.Background()
	if ok, err := r.AddrAuthenticated(ctx, "mx1.example.test"); err != nil || ok {
		t.Fatalf("unsigned zone: %v, %v", ok, err)
	}
	z.SetAD(true)
	clk.add(time.Hour) // past the cached answers
	if ok, err := r.AddrAuthenticated(ctx, "mx2.example.test"); err != nil || !ok {
		t.Fatalf("signed zone (A only): %v, %v", ok, err)
	}
	if _, err := r.AddrAuthenticated(ctx, "none.example.test"); err == nil {
		t.Fatal("a name without addresses: no error")
	}
}

func dnsErr(t *testing.T, err error) *net.DNSError {
	t.Helper()
	var de *net.DNSError
	if !errors.As(err, &de) {
		t.Fatalf("want *net.DNSError, got %T %v", err, err)
	}
	return de
}

func TestErrorsAreClassified(t *testing.T) {
	r, srv, _, _ := setup(t, Config{Attempts: 1})
	ctx := context.Background()
	_, err := r.LookupMX(ctx, "nope.example.test")
	if de := dnsErr(t, err); !de.IsNotFound || de.IsTemporary {
		t.Errorf("NXDOMAIN: %+v", de)
	}
	_, err = r.LookupMX(ctx, "mx1.example.test")
	if de := dnsErr(t, err); !de.IsNotFound {
		t.Errorf("NODATA: %+v", de)
	}
	_, err = r.LookupIPAddr(ctx, "nope.example.test")
	if de := dnsErr(t, err); !de.IsNotFound {
		t.Errorf("no address: %+v", de)
	}
	srv.ServFail("sf.test")
	_, err = r.LookupMX(ctx, "sf.test")
	if de := dnsErr(t, err); de.IsNotFound || !de.IsTemporary || !strings.Contains(de.Err, "SERVFAIL") {
		t.Errorf("SERVFAIL: %+v", de)
	}
	srv.Timeout("slow.test")
	_, err = r.LookupMX(ctx, "slow.test")
	if de := dnsErr(t, err); de.IsNotFound || !de.IsTemporary || !de.IsTimeout {
		t.Errorf("timeout: %+v", de)
	}
	// One address family timing out and the other absent is a temporary
	// failure, not "no address".
	srv.MustAddZone(t, "half.test", "@ MX 10 host", "host A 127.0.0.4")
	srv.Timeout("v6.half.test")
	srv.MustAddZone(t, "v6.half.test")
	_, err = r.LookupIPAddr(ctx, "v6.half.test")
	if de := dnsErr(t, err); de.IsNotFound || !de.IsTemporary {
		t.Errorf("both families failed: %+v", de)
	}
	_, _, err = r.LookupTLSA(ctx, 25, "tcp", "slow.test")
	if de := dnsErr(t, err); !de.IsTemporary {
		t.Errorf("TLSA timeout: %+v", de)
	}
}

func TestFailoverAcrossServers(t *testing.T) {
	good := fakedns.Start(t)
	good.MustAddZone(t, "example.test", "@ MX 10 mx")
	bad := fakedns.Start(t)
	bad.ServFail("example.test")
	dead := fakedns.Start(t)
	dead.Timeout("example.test")
	r, err := New(Config{Servers: []string{dead.Addr, bad.Addr, good.Addr}, Timeout: 200 * time.Millisecond, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	mxs, err := r.LookupMX(context.Background(), "example.test")
	if err != nil || len(mxs) != 1 {
		t.Fatalf("MX after a dead and a failing server: %v %v", mxs, err)
	}
	if dead.Queries("example.test", dns.TypeMX) != 1 || bad.Queries("example.test", dns.TypeMX) != 1 {
		t.Error("the first two servers were not tried")
	}
}

func TestRetriesRounds(t *testing.T) {
	r, srv, _, _ := setup(t, Config{Attempts: 3, Timeout: 100 * time.Millisecond})
	srv.Timeout("slow.test")
	if _, err := r.LookupMX(context.Background(), "slow.test"); err == nil {
		t.Fatal("timeout answered")
	}
	if got := srv.Queries("slow.test", dns.TypeMX); got != 3 {
		t.Errorf("queries = %d, want 3 rounds", got)
	}
}

func TestTCPFallbackOnTruncation(t *testing.T) {
	r, srv, _, _ := setup(t, Config{})
	srv.Truncate("example.test")
	mxs, err := r.LookupMX(context.Background(), "example.test")
	if err != nil || len(mxs) != 2 {
		t.Fatalf("MX over TCP: %v %v", mxs, err)
	}
	if srv.QueriesOver("example.test", dns.TypeMX, "udp") != 1 || srv.QueriesOver("example.test", dns.TypeMX, "tcp") != 1 {
		t.Error("want one UDP try then one TCP query")
	}
}

func TestCacheByTTL(t *testing.T) {
	reg := prometheus.NewRegistry()
	r, srv, _, clk := setup(t, Config{Registerer: reg})
	ctx := context.Background()
	for range 3 {
		if _, err := r.LookupIPAddr(ctx, "mx1.example.test"); err != nil {
			t.Fatal(err)
		}
	}
	if got := srv.Queries("mx1.example.test", dns.TypeA); got != 1 {
		t.Fatalf("A queried %d times within its TTL, want 1", got)
	}
	clk.add(59 * time.Second)
	r.LookupIPAddr(ctx, "mx1.example.test")
	if got := srv.Queries("mx1.example.test", dns.TypeA); got != 1 {
		t.Fatalf("queried again before the 60s TTL ran out")
	}
	clk.add(2 * time.Second)
	r.LookupIPAddr(ctx, "mx1.example.test")
	if got := srv.Queries("mx1.example.test", dns.TypeA); got != 2 {
		t.Fatalf("not queried again after the TTL: %d", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	want := map[string]float64{"outflow_dns_cache_hits_total": 6, "outflow_dns_cache_misses_total": 4, "outflow_dns_cache_entries": 2}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v (all: %v)", name, got[name], v, got)
		}
	}
}

func TestNegativeCaching(t *testing.T) {
	r, srv, z, clk := setup(t, Config{})
	ctx := context.Background()
	z.SetNegTTL(10)
	for range 2 {
		if _, err := r.LookupMX(ctx, "nope.example.test"); !dnsErr(t, err).IsNotFound {
			t.Fatal(err)
		}
	}
	if got := srv.Queries("nope.example.test", dns.TypeMX); got != 1 {
		t.Fatalf("NXDOMAIN queried %d times within the SOA minimum", got)
	}
	clk.add(11 * time.Second)
	r.LookupMX(ctx, "nope.example.test")
	if got := srv.Queries("nope.example.test", dns.TypeMX); got != 2 {
		t.Fatalf("NXDOMAIN still cached after the SOA minimum: %d", got)
	}
	// Outside every zone the fake server sends no SOA: not cached.
	r.LookupMX(ctx, "elsewhere.invalid")
	r.LookupMX(ctx, "elsewhere.invalid")
	if got := srv.Queries("elsewhere.invalid", dns.TypeMX); got != 2 {
		t.Errorf("negative answer without SOA cached: %d queries", got)
	}
	// Failures are not cached.
	srv.ServFail("sf.test")
	r.LookupMX(ctx, "sf.test")
	r.LookupMX(ctx, "sf.test")
	if got := srv.Queries("sf.test", dns.TypeMX); got != 2*DefaultAttempts {
		t.Errorf("SERVFAIL cached: %d queries", got)
	}
}

func TestCacheBounded(t *testing.T) {
	r, srv, _, _ := setup(t, Config{CacheSize: 2})
	ctx := context.Background()
	for _, n := range []string{"a.example.test", "b.example.test", "c.example.test"} {
		r.LookupMX(ctx, n)
	}
	if got := r.cacheLen(); got != 2 {
		t.Fatalf("cache holds %d, want 2", got)
	}
	r.LookupMX(ctx, "c.example.test") // still cached
	r.LookupMX(ctx, "a.example.test") // evicted first
	if srv.Queries("c.example.test", dns.TypeMX) != 1 || srv.Queries("a.example.test", dns.TypeMX) != 2 {
		t.Error("least recently used entry was not the one evicted")
	}
}

func TestConcurrentLookupsShareOneQuery(t *testing.T) {
	r, srv, _, _ := setup(t, Config{Timeout: 5 * time.Second})
	srv.Delay("example.test", 300*time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := r.LookupMX(context.Background(), "example.test"); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := srv.Queries("example.test", dns.TypeMX); got != 1 {
		t.Errorf("20 concurrent lookups made %d queries, want 1", got)
	}
}

func TestCallerCancelDoesNotFailOthers(t *testing.T) {
	r, srv, _, _ := setup(t, Config{Timeout: 5 * time.Second})
	srv.Delay("example.test", 300*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { _, err := r.LookupMX(ctx, "example.test"); first <- err }()
	deadline := time.Now().Add(5 * time.Second)
	for srv.Queries("example.test", dns.TypeMX) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) && !dnsErr(t, err).IsTemporary {
		t.Errorf("cancelled caller: %v", err)
	}
	if _, err := r.LookupMX(context.Background(), "example.test"); err != nil {
		t.Errorf("second caller failed with the first: %v", err)
	}
}

func TestResolvConf(t *testing.T) {
	srv := fakedns.Start(t)
	srv.MustAddZone(t, "example.test", "@ MX 10 mx")
	host, port, _ := net.SplitHostPort(srv.Addr)
	f := filepath.Join(t.TempDir(), "resolv.conf")
	os.WriteFile(f, []byte("nameserver "+host+"\noptions timeout:1 attempts:1\n"), 0o644)
	// resolv.conf has no port syntax; the fake listens on a random one.
	cc, _ := dns.ClientConfigFromFile(f)
	if cc.Port != "53" {
		t.Fatalf("port %s", cc.Port)
	}
	r, err := New(Config{ResolvConf: f})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Servers(); len(got) != 1 || got[0] != net.JoinHostPort(host, "53") || r.cfg.Timeout != time.Second || r.cfg.Attempts != 1 {
		t.Fatalf("servers %v timeout %v attempts %d", got, r.cfg.Timeout, r.cfg.Attempts)
	}
	_ = port
	r, err = New(Config{ResolvConf: filepath.Join(t.TempDir(), "missing")})
	if err != nil || r.fallback == nil || r.Servers() != nil {
		t.Fatalf("missing resolv.conf: fallback %v err %v", r.fallback, err)
	}
	recs, ad, err := r.LookupTLSA(context.Background(), 25, "tcp", "mx.example.test")
	if recs != nil || ad || err != nil {
		t.Errorf("TLSA through the fallback: %v %v %v", recs, ad, err)
	}
}

func TestServerAddr(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1": "127.0.0.1:53", "127.0.0.1:5353": "127.0.0.1:5353", "::1": "[::1]:53",
		"[::1]:5353": "[::1]:5353", " ns.example.test ": "ns.example.test:53",
		// An IPv6 address in brackets without a port, as --relay and
		// --nats-addr write one, takes port 53; it was refused.
		"[::1]": "[::1]:53", "[2001:db8::53]": "[2001:db8::53]:53", "[fe80::1%lo]": "[fe80::1%lo]:53",
		// Ambiguous, and read as an address: serve logs the servers it uses.
		"::1:5353": "[::1:5353]:53",
	} {
		if got, err := ServerAddr(in); err != nil || got != want {
			t.Errorf("ServerAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:0", "127.0.0.1:x", ":53", "[::1", "[]", "[ns.example.test]", "[127.0.0.1]"} {
		if _, err := ServerAddr(bad); err == nil {
			t.Errorf("ServerAddr(%q) accepted", bad)
		}
	}
	if _, err := New(Config{Servers: []string{"1.2.3.4:99999"}}); err == nil {
		t.Error("New accepted a bad server")
	}
}

// TestCanonicalName: the name at the end of a host's CNAME chain, across
// zones, with the AD bit of the answer that carried it (for DANE's TLSA
// lookup at the expanded name, RFC 7672 2.2.2), from the cache the second
// time; the host itself when it is no alias.
func TestCanonicalName(t *testing.T) {
	r, srv, z, _ := setup(t, Config{})
	z2 := srv.MustAddZone(t, "provider.test", "mx CNAME mx2.provider.test.", "mx2 A 127.0.0.9")
	srv.MustAddZone(t, "alias.test", "mx CNAME mx.provider.test.", "loop CNAME loop2", "loop2 CNAME loop")
	ctx := context.Background()
	if name, ad, err := r.CanonicalName(ctx, "mx.alias.test."); err != nil || name != "mx2.provider.test" || ad {
		t.Fatalf("unsigned chain: %q %v %v", name, ad, err)
	}
	z2.SetAD(true)
	z.SetAD(true)
	if name, ad, err := r.CanonicalName(ctx, "MX.provider.test"); err != nil || name != "mx2.provider.test" || !ad {
		t.Fatalf("signed chain: %q %v %v", name, ad, err)
	}
	before := srv.Queries("mx.provider.test.", dns.TypeA)
	if name, _, err := r.CanonicalName(ctx, "mx.provider.test"); err != nil || name != "mx2.provider.test" || srv.Queries("mx.provider.test.", dns.TypeA) != before {
		t.Fatalf("from the cache: %q %v, queries %d -> %d", name, err, before, srv.Queries("mx.provider.test.", dns.TypeA))
	}
	if name, ad, err := r.CanonicalName(ctx, "mx1.example.test"); err != nil || name != "mx1.example.test" || !ad {
		t.Fatalf("no alias: %q %v %v", name, ad, err)
	}
	if _, _, err := r.CanonicalName(ctx, "none.example.test"); err == nil {
		t.Fatal("a name without addresses: no error")
	}
	if _, _, err := r.CanonicalName(ctx, "loop.alias.test"); err == nil {
		t.Fatal("a CNAME loop: no error")
	}
}
