package sender

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"
	"github.com/miekg/dns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/resolver"
)

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

func TestOrderAddrs(t *testing.T) {
	all := func(netip.Addr, netip.Addr) bool { return true }
	noV6 := func(dst, _ netip.Addr) bool { return dst.Is4() }
	in := addrs("192.0.2.1", "2001:db8::1", "192.0.2.2", "::1", "2002:c000:201::1", "fd00::1")
	cases := []struct {
		name   string
		usable func(dst, src netip.Addr) bool
		src    string
		want   []string
	}{
		{"IPv6 first, by precedence", all, "", []string{"::1", "2001:db8::1", "192.0.2.1", "192.0.2.2", "2002:c000:201::1", "fd00::1"}},
		{"without IPv6 connectivity, IPv4 first", noV6, "", []string{"192.0.2.1", "192.0.2.2", "::1", "2001:db8::1", "2002:c000:201::1", "fd00::1"}},
		{"an IPv4 source keeps IPv4 only", all, "127.0.0.2", []string{"192.0.2.1", "192.0.2.2"}},
		{"an IPv6 source keeps IPv6 only", all, "::1", []string{"::1", "2001:db8::1", "2002:c000:201::1", "fd00::1"}},
	}
	for _, c := range cases {
		var src netip.Addr
		if c.src != "" {
			src = netip.MustParseAddr(c.src)
		}
		got := orderAddrs(in, src, c.usable)
		var gs []string
		for _, a := range got {
			gs = append(gs, a.String())
		}
		if !slices.Equal(gs, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, gs, c.want)
		}
	}
}

func TestEgressCandidates(t *testing.T) {
	e, err := NewEgress([]EgressEntry{
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.2"), EHLO: "o2.test"}, Pool: "bulk"},
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.3"), EHLO: "o3.test"}, Pool: "bulk"},
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.4")}, Pool: "vip"},
	}, map[string]string{"alice": "vip", "bob": "bulk"})
	if err != nil {
		t.Fatal(err)
	}
	first := func(tenant string) string { return e.Candidates(tenant, "d.test")[0].Addr.String() }
	if got := e.Candidates("alice", "d.test"); len(got) != 1 || got[0].Addr.String() != "127.0.0.4" {
		t.Errorf("alice's pool: %v", got)
	}
	a, b := first("bob"), first("bob")
	if a == b || !strings.HasPrefix(a, "127.0.0.") || (a != "127.0.0.2" && a != "127.0.0.3") {
		t.Errorf("bob's pool is not round-robin: %s then %s", a, b)
	}
	if got := e.Candidates("bob", "d.test"); len(got) != 2 || got[0] == got[1] {
		t.Errorf("the rest of the pool follows the first: %v", got)
	}
	if got := e.Candidates("carol", "d.test"); len(got) != 3 {
		t.Errorf("a tenant without a pool gets every address: %v", got)
	}
	// The turn is per destination: a tenant's mail alternating between
	// two domains still alternates its addresses for each of them. With
	// one counter for all, every message to one domain left from one
	// address.
	seen := map[string]map[netip.Addr]bool{"x.test": {}, "y.test": {}}
	for range 4 {
		for _, dest := range []string{"x.test", "y.test"} {
			seen[dest][e.Candidates("bob", dest)[0].Addr] = true
		}
	}
	for dest, addrs := range seen {
		if len(addrs) != 2 {
			t.Errorf("%s, its mail alternating with another domain's, went from %v only", dest, addrs)
		}
	}
	if _, err := NewEgress([]EgressEntry{{Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}}}, map[string]string{"x": "nope"}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("unknown pool: %v", err)
	}
	if _, err := NewEgress([]EgressEntry{{Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}}, {Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}}}, nil); err == nil {
		t.Error("a duplicate address was accepted")
	}
	if _, err := NewEgress([]EgressEntry{{Source: Source{Addr: netip.MustParseAddr("0.0.0.0")}}}, nil); err == nil {
		t.Error("the unspecified address was accepted")
	}
	if _, err := NewEgress([]EgressEntry{{Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}}, {Source: Source{Addr: netip.MustParseAddr("::ffff:127.0.0.2")}}}, nil); err == nil {
		t.Error("an address and its IPv4-mapped form were accepted as two")
	}
	if e, err := NewEgress([]EgressEntry{{Source: Source{Addr: netip.MustParseAddr("::ffff:127.0.0.2")}}}, nil); err != nil || !e.All()[0].Addr.Is4() {
		t.Errorf("an IPv4-mapped address is not taken as IPv4: %v %v", err, e.All())
	}
}

// TestSourceBindsAddressAndEHLO dials for real (no dial hook): the fake MX
// sees each message come from its source address with that source's EHLO
// name, and connections from two sources are not shared.
func TestSourceBindsAddressAndEHLO(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	_, port, _ := net.SplitHostPort(mx.Addr())
	w := newWorld(t)
	w.host("mx.example.test", "127.0.0.1")
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	cfg := w.config()
	cfg.Dial = nil
	cfg.Port, _ = strconv.Atoi(port)
	s := w.sender(cfg)
	ctx := ctxT(t)
	for _, src := range []Source{{Addr: netip.MustParseAddr("127.0.0.2"), EHLO: "o2.outflow.test"}, {Addr: netip.MustParseAddr("127.0.0.3")}} {
		m := msg("example.test", "bob@example.test")
		m.Source = &src
		checkDelivered(t, s.Send(ctx, m))
	}
	got := mx.Messages()
	if len(got) != 2 {
		t.Fatalf("%d messages", len(got))
	}
	if got[0].Source != "127.0.0.2" || got[0].Hostname != "o2.outflow.test" {
		t.Errorf("first: source %s ehlo %s", got[0].Source, got[0].Hostname)
	}
	if got[1].Source != "127.0.0.3" || got[1].Hostname != testHostname {
		t.Errorf("second (no ehlo of its own): source %s ehlo %s", got[1].Source, got[1].Hostname)
	}
	if mx.Connections() != 2 {
		t.Errorf("connections = %d: a pooled connection from one source was used for another", mx.Connections())
	}
}

// TestIPv6First gives an MX host an AAAA (::1) and an A: the IPv6 address
// is dialled first when the machine has ::1, and IPv4 takes over when the
// IPv6 one refuses.
func TestIPv6First(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback on this machine (%v): RFC 6724 ordering over [::1] not tested", err)
	} else {
		ln.Close()
	}
	v6 := fakemx.Start(t, fakemx.Options{Addr: "[::1]:0"})
	v4 := fakemx.Start(t, fakemx.Options{})
	w := newWorld(t)
	w.zones["mx.example.test."] = mockdns.Zone{A: []string{"127.0.0.2"}, AAAA: []string{"::1"}}
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.mu.Lock()
	w.routes["[::1]:25"] = v6.Addr()
	w.mu.Unlock()
	w.route("127.0.0.2", v4)
	s := w.sender(w.config())
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
	if d := w.dials(); len(d) == 0 || d[0] != "[::1]:25" || len(v6.Messages()) != 1 {
		t.Fatalf("dialled %v, IPv6 server got %d: want [::1] first", d, len(v6.Messages()))
	}
	v6.Close()
	s.Close()
	s = w.sender(w.config())
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
	if len(v4.Messages()) != 1 {
		t.Errorf("IPv4 fallback: %d messages on the IPv4 server", len(v4.Messages()))
	}
}

// TestThroughResolver runs the MX rules over package resolver and a real
// DNS server: preference order with a dead primary, null MX, the implicit
// MX, NXDOMAIN and a DNS timeout, each classified the way classify needs.
func TestThroughResolver(t *testing.T) {
	dnsSrv := fakedns.Start(t)
	dnsSrv.MustAddZone(t, "pref.test", "@ MX 10 mx1", "@ MX 20 mx2", "mx1 A 127.0.0.2", "mx2 A 127.0.0.3")
	dnsSrv.MustAddZone(t, "null.test", "@ MX 0 .")
	dnsSrv.MustAddZone(t, "amx.test", "@ A 127.0.0.4")
	dnsSrv.MustAddZone(t, "slow.test", "@ MX 10 mx")
	dnsSrv.Timeout("slow.test")
	r, err := resolver.New(resolver.Config{Servers: []string{dnsSrv.Addr}, Timeout: 200 * time.Millisecond, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	second, implicit := fakemx.Start(t, fakemx.Options{}), fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.3", second)
	w.route("127.0.0.4", implicit)
	cfg := w.config()
	cfg.Resolver = r
	s := w.sender(cfg)
	ctx := ctxT(t)

	checkDelivered(t, s.Send(ctx, msg("pref.test", "a@pref.test")))
	if d := w.dials(); len(d) < 2 || d[0] != "127.0.0.2:25" || d[1] != "127.0.0.3:25" || len(second.Messages()) != 1 {
		t.Errorf("preference: dialled %v", d)
	}
	checkAll(t, s.Send(ctx, msg("null.test", "a@null.test")), classify.StageDNS, 0, classify.EventNullMX)
	checkDelivered(t, s.Send(ctx, msg("amx.test", "a@amx.test")))
	if len(implicit.Messages()) != 1 {
		t.Error("implicit MX (A record) not used")
	}
	checkAll(t, s.Send(ctx, msg("nope.pref.test", "a@nope.pref.test")), classify.StageDNS, 0, classify.EventDNSNXDomain)
	checkAll(t, s.Send(ctx, msg("slow.test", "a@slow.test")), classify.StageDNS, 0, classify.EventDNSServFail)
	if dnsSrv.Queries("slow.test", dns.TypeMX) != 1 {
		t.Error("timed-out domain not queried")
	}
}

// TestWrongFamily sends from an IPv6 source to domains whose MX hosts have
// only IPv4 addresses: nothing is dialled, and the result says the other
// family may reach them (WrongFamily), unless some host failed otherwise.
// An IPv4 source reaches the same host.
func TestWrongFamily(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	w := newWorld(t)
	w.host("mx4.v4only.test", "127.0.0.2")
	w.zones["v4only.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx4.v4only.test.", Pref: 10}}}
	// mixed.test's primary has an IPv6 address that refuses connections,
	// its backup only an IPv4 one.
	w.zones["mx6.mixed.test."] = mockdns.Zone{AAAA: []string{"2001:db8::25"}}
	w.zones["mixed.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx6.mixed.test.", Pref: 10}, {Host: "mx4.v4only.test.", Pref: 20}}}
	w.route("127.0.0.2", mx)
	cfg := w.config()
	cfg.DialSource = func(ctx context.Context, _ netip.Addr, network, addr string) (net.Conn, error) {
		return w.dial(ctx, network, addr)
	}
	s := w.sender(cfg)
	ctx := ctxT(t)
	v6 := &Source{Addr: netip.MustParseAddr("2001:db8::1")}
	v4 := &Source{Addr: netip.MustParseAddr("127.0.0.9")}

	m := msg("v4only.test", "bob@v4only.test")
	m.Source = v6
	r := s.Send(ctx, m)
	if !r.WrongFamily {
		t.Errorf("IPv6 source to an IPv4-only MX: WrongFamily not set: %+v", r)
	}
	checkAll(t, r, classify.StageDNS, 0, classify.EventDNSServFail)
	if d := w.dials(); len(d) != 0 {
		t.Errorf("dialled %v from an IPv6 source to IPv4-only hosts", d)
	}

	m = msg("mixed.test", "bob@mixed.test")
	m.Source = v6
	if r := s.Send(ctx, m); r.WrongFamily {
		t.Errorf("a host of the source's family refused, yet WrongFamily is set: %+v", r)
	}
	if d := w.dials(); !slices.Equal(d, []string{"[2001:db8::25]:25"}) {
		t.Errorf("dialled %v, want the IPv6 primary only", d)
	}

	m = msg("v4only.test", "bob@v4only.test")
	m.Source = v4
	r = s.Send(ctx, m)
	checkDelivered(t, r)
	if r.WrongFamily {
		t.Error("WrongFamily set on a delivery")
	}
}

// BenchmarkEgressCandidates: the round-robin turn every attempt from an
// egress address takes (a lock and the per-destination counter).
func BenchmarkEgressCandidates(b *testing.B) {
	e, err := NewEgress([]EgressEntry{
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}, Pool: "bulk"},
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.3")}, Pool: "bulk"},
	}, map[string]string{"bob": "bulk"})
	if err != nil {
		b.Fatal(err)
	}
	dests := []string{"gmail.com", "outlook.com", "yahoo.com", "example.org"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if len(e.Candidates("bob", dests[i%len(dests)])) != 2 {
			b.Fatal("two candidates")
		}
	}
}
