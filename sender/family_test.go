package sender

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/emersion/go-smtp"
	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

// TestMXFamilies: a Send from a source that does not deliver every
// recipient says which address families the destination's MX hosts have,
// every host's, the ones it never looked up (a backup MX) and a host of a
// pooled connection included: the worker then knows whether a source of
// the other family could reach the destination (a blocklisted IPv4
// address is the only one of the pool that can reach an IPv4-only
// domain: the block bounces). A host whose addresses cannot be looked up
// leaves it incomplete; a delivery, a Send without a source and the
// relay know nothing.
func TestMXFamilies(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.Contains(arg, "block") {
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Client host blocked using zen.spamhaus.org"}
		}
		return nil
	}})
	w := newWorld(t)
	w.host("mx4.v4only.test", "127.0.0.2")
	w.zones["v4only.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx4.v4only.test.", Pref: 10}}}
	w.zones["mx6.both.test."] = mockdns.Zone{AAAA: []string{"2001:db8::25"}}
	w.zones["both.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx4.v4only.test.", Pref: 10}, {Host: "mx6.both.test.", Pref: 20}}}
	w.zones["broken.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx4.v4only.test.", Pref: 10}, {Host: "gone.broken.test.", Pref: 20}}}
	w.route("127.0.0.2", mx)
	cfg := w.config()
	cfg.DialSource = func(ctx context.Context, _ netip.Addr, network, addr string) (net.Conn, error) {
		return w.dial(ctx, network, addr)
	}
	s := w.sender(cfg)
	ctx := ctxT(t)
	v4 := &Source{Addr: netip.MustParseAddr("127.0.0.9")}

	for _, c := range []struct {
		domain string
		want   Families
	}{
		{"v4only.test", Families{V4: true, Complete: true}},
		{"v4only.test", Families{V4: true, Complete: true}}, // on the pooled connection
		{"both.test", Families{V4: true, V6: true, Complete: true}},
		{"broken.test", Families{V4: true}},
	} {
		m := msg(c.domain, "block@"+c.domain)
		m.Source = v4
		r := s.Send(ctx, m)
		checkAll(t, r, classify.StageRcpt, 554, 0)
		if r.MXFamilies != c.want {
			t.Errorf("%s (reused %v): MXFamilies %+v, want %+v", c.domain, r.Reused, r.MXFamilies, c.want)
		}
		if r.Unreached {
			t.Errorf("%s: Unreached set, though the server answered", c.domain)
		}
	}
	if n := mx.Connections(); n == 0 || n >= 4 {
		t.Errorf("%d connections for 4 sends: the pooled connection was not reused", n)
	}
	if f := (Families{V4: true, Complete: true}); !f.Lacks(netip.MustParseAddr("2001:db8::1")) || f.Lacks(netip.MustParseAddr("::ffff:192.0.2.1")) ||
		(Families{V4: true}).Lacks(netip.MustParseAddr("2001:db8::1")) {
		t.Error("Families.Lacks: wrong")
	}

	m := msg("v4only.test", "bob@v4only.test")
	m.Source = v4
	if r := s.Send(ctx, m); r.MXFamilies != (Families{}) {
		t.Errorf("a delivery: MXFamilies %+v, want none (no lookup spent on it)", r.MXFamilies)
	}
	if r := s.Send(ctx, msg("v4only.test", "block@v4only.test")); r.MXFamilies != (Families{}) {
		t.Errorf("no source: MXFamilies %+v, want none", r.MXFamilies)
	}
}

// TestUnreached: a Send from an IPv6 source to an MX host whose IPv6
// address refuses connections and whose IPv4 address works says so
// (Unreached, MXFamilies with both), and so does the next one, which
// finds the address held and dials nothing: the worker sends the attempt
// from an IPv4 source instead. A server that answered, even with a
// refusal, was reached; a dial that failed for a local reason (a source
// the machine lacks) says nothing of the MX address.
func TestUnreached(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	// A server that greets with 421 and hangs up: reached, though it
	// took nothing.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { busy.Close() })
	go func() {
		for {
			c, err := busy.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("421 4.3.2 busy, try later\r\n"))
			c.Close()
		}
	}()
	w := newWorld(t)
	w.zones["mx.mixed.test."] = mockdns.Zone{A: []string{"127.0.0.2"}, AAAA: []string{"2001:db8::25"}}
	w.zones["mixed.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.mixed.test.", Pref: 10}}}
	w.zones["mx.answers.test."] = mockdns.Zone{A: []string{"127.0.0.2"}, AAAA: []string{"2001:db8::26"}}
	w.zones["answers.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.answers.test.", Pref: 10}}}
	w.zones["mx.local.test."] = mockdns.Zone{A: []string{"127.0.0.2"}, AAAA: []string{"2001:db8::27"}}
	w.zones["local.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.local.test.", Pref: 10}}}
	w.route("127.0.0.2", mx)
	w.mu.Lock()
	w.routes["[2001:db8::26]:25"] = busy.Addr().String()
	w.mu.Unlock()
	cfg := w.config()
	cfg.DialSource = func(ctx context.Context, _ netip.Addr, network, addr string) (net.Conn, error) {
		if addr == "[2001:db8::27]:25" {
			return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.EADDRNOTAVAIL}
		}
		return w.dial(ctx, network, addr)
	}
	s := w.sender(cfg)
	ctx := ctxT(t)
	v6 := &Source{Addr: netip.MustParseAddr("2001:db8::1")}
	both := Families{V4: true, V6: true, Complete: true}

	for i, wantHeld := range []bool{false, true} {
		m := msg("mixed.test", "bob@mixed.test")
		m.Source = v6
		r := s.Send(ctx, m)
		checkAll(t, r, classify.StageConnect, 0, classify.EventConnRefused)
		if !r.Unreached || r.MXFamilies != both || r.WrongFamily {
			t.Errorf("send %d: Unreached %v, MXFamilies %+v, WrongFamily %v; want unreached, both families", i+1, r.Unreached, r.MXFamilies, r.WrongFamily)
		}
		if held := !r.HeldUntil.IsZero(); held != wantHeld {
			t.Errorf("send %d: held %v, want %v", i+1, held, wantHeld)
		}
	}
	if d := w.dials(); len(d) != 1 || d[0] != "[2001:db8::25]:25" {
		t.Errorf("dialled %v, want the IPv6 address once (then held)", d)
	}

	for _, domain := range []string{"answers.test", "local.test"} {
		m := msg(domain, "bob@"+domain)
		m.Source = v6
		if r := s.Send(ctx, m); r.Unreached {
			t.Errorf("%s: Unreached set: %+v", domain, r.Rcpts[0].Outcome)
		}
	}

	m := msg("mixed.test", "bob@mixed.test")
	m.Source = &Source{Addr: netip.MustParseAddr("127.0.0.9")}
	if r := s.Send(ctx, m); r.Unreached {
		t.Error("a delivery over IPv4 is Unreached")
	} else {
		checkDelivered(t, r)
	}
}

// TestFamilyCandidates: the sources of one family, in the order the
// destination's next turn of the round-robin gives, without taking it.
func TestFamilyCandidates(t *testing.T) {
	e, err := NewEgress([]EgressEntry{
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.2")}, Pool: "p"},
		{Source: Source{Addr: netip.MustParseAddr("2001:db8::1")}, Pool: "p"},
		{Source: Source{Addr: netip.MustParseAddr("127.0.0.3")}, Pool: "p"},
	}, map[string]string{"t": "p"})
	if err != nil {
		t.Fatal(err)
	}
	str := func(ss []Source) string {
		var out []string
		for _, s := range ss {
			out = append(out, s.Addr.String())
		}
		return strings.Join(out, " ")
	}
	if got := str(e.FamilyCandidates("t", "d.test", true)); got != "127.0.0.2 127.0.0.3" {
		t.Errorf("IPv4 before any turn: %s", got)
	}
	e.Candidates("t", "d.test") // 127.0.0.2's turn
	e.Candidates("t", "d.test") // 2001:db8::1's
	for range 2 {
		if got := str(e.FamilyCandidates("t", "d.test", true)); got != "127.0.0.3 127.0.0.2" {
			t.Errorf("IPv4 after two turns: %s, want from the third address on", got)
		}
	}
	if got := str(e.Candidates("t", "d.test")); got != "127.0.0.3 127.0.0.2 2001:db8::1" {
		t.Errorf("the next turn after FamilyCandidates: %s, want the third address's", got)
	}
	if got := str(e.FamilyCandidates("other", "d.test", false)); got != "2001:db8::1" {
		t.Errorf("IPv6 of a tenant without a pool: %s", got)
	}
	if got := (*Egress)(nil).FamilyCandidates("t", "d.test", true); got != nil {
		t.Errorf("no egress: %v", got)
	}
}
