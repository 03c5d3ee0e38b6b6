package fakedns

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func exchange(t *testing.T, s *Server, network, name string, qtype uint16) *dns.Msg {
	t.Helper()
	c := &dns.Client{Net: network, Timeout: 5 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	r, _, err := c.Exchange(m, s.Addr)
	if err != nil {
		t.Fatalf("%s %s %s: %v", network, name, dns.TypeToString[qtype], err)
	}
	return r
}

func testZone(t *testing.T) (*Server, *Zone) {
	s := Start(t)
	z := s.MustAddZone(t, "example.test",
		"@ MX 10 mx1.example.test.",
		"@ MX 20 mx2",
		"mx1 60 A 127.0.0.2",
		"mx2 AAAA ::1",
		"@ TXT \"v=spf1 -all\"",
		"_25._tcp.mx1 TLSA 3 1 1 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"alias CNAME mx1",
		"a.b.deep A 127.0.0.9",
	)
	s.MustAddZone(t, "null.test", "@ MX 0 .")
	return s, z
}

func TestAnswers(t *testing.T) {
	s, _ := testZone(t)
	for _, network := range []string{"udp", "tcp"} {
		r := exchange(t, s, network, "EXAMPLE.test", dns.TypeMX)
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("%s MX: rcode %d answer %v", network, r.Rcode, r.Answer)
		}
		if mx := r.Answer[1].(*dns.MX); mx.Mx != "mx2.example.test." || mx.Preference != 20 {
			t.Errorf("relative MX target: %v", mx)
		}
		if !r.Authoritative || r.AuthenticatedData {
			t.Errorf("flags: aa=%v ad=%v", r.Authoritative, r.AuthenticatedData)
		}
	}
	if r := exchange(t, s, "udp", "mx1.example.test", dns.TypeA); len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 60 ||
		!r.Answer[0].(*dns.A).A.Equal(net.ParseIP("127.0.0.2")) {
		t.Errorf("A: %v", r.Answer)
	}
	if r := exchange(t, s, "udp", "mx2.example.test", dns.TypeAAAA); len(r.Answer) != 1 || r.Answer[0].Header().Ttl != 300 {
		t.Errorf("AAAA with default TTL: %v", r.Answer)
	}
	if r := exchange(t, s, "udp", "example.test", dns.TypeTXT); len(r.Answer) != 1 || r.Answer[0].(*dns.TXT).Txt[0] != "v=spf1 -all" {
		t.Errorf("TXT: %v", r.Answer)
	}
	if r := exchange(t, s, "udp", "_25._tcp.mx1.example.test", dns.TypeTLSA); len(r.Answer) != 1 || r.Answer[0].(*dns.TLSA).Usage != 3 {
		t.Errorf("TLSA: %v", r.Answer)
	}
	r := exchange(t, s, "udp", "alias.example.test", dns.TypeA)
	if len(r.Answer) != 2 || r.Answer[0].Header().Rrtype != dns.TypeCNAME || r.Answer[1].Header().Rrtype != dns.TypeA {
		t.Errorf("CNAME chase: %v", r.Answer)
	}
	r = exchange(t, s, "udp", "null.test", dns.TypeMX)
	if len(r.Answer) != 1 || r.Answer[0].(*dns.MX).Mx != "." || r.Answer[0].(*dns.MX).Preference != 0 {
		t.Errorf("null MX: %v", r.Answer)
	}
}

func TestNegativeAnswers(t *testing.T) {
	s, z := testZone(t)
	r := exchange(t, s, "udp", "nope.example.test", dns.TypeMX)
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 1 || r.Ns[0].(*dns.SOA).Minttl != DefaultNegTTL {
		t.Errorf("NXDOMAIN in zone: rcode %d ns %v", r.Rcode, r.Ns)
	}
	r = exchange(t, s, "udp", "mx1.example.test", dns.TypeAAAA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 || len(r.Ns) != 1 {
		t.Errorf("NODATA: rcode %d answer %v ns %v", r.Rcode, r.Answer, r.Ns)
	}
	r = exchange(t, s, "udp", "b.deep.example.test", dns.TypeA)
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("empty non-terminal must be NODATA, got rcode %d", r.Rcode)
	}
	r = exchange(t, s, "udp", "elsewhere.invalid", dns.TypeA)
	if r.Rcode != dns.RcodeNameError || len(r.Ns) != 0 {
		t.Errorf("outside every zone: rcode %d ns %v", r.Rcode, r.Ns)
	}
	z.SetNegTTL(7)
	r = exchange(t, s, "udp", "nope.example.test", dns.TypeMX)
	if soa := r.Ns[0].(*dns.SOA); soa.Hdr.Ttl != 7 || soa.Minttl != 7 {
		t.Errorf("SetNegTTL: %v", soa)
	}
}

func TestADSwitch(t *testing.T) {
	s, z := testZone(t)
	z.SetAD(true)
	if r := exchange(t, s, "udp", "_25._tcp.mx1.example.test", dns.TypeTLSA); !r.AuthenticatedData {
		t.Error("AD not set after SetAD(true)")
	}
	if r := exchange(t, s, "udp", "null.test", dns.TypeMX); r.AuthenticatedData {
		t.Error("AD leaked to another zone")
	}
	z.SetAD(false)
	if r := exchange(t, s, "tcp", "_25._tcp.mx1.example.test", dns.TypeTLSA); r.AuthenticatedData {
		t.Error("AD still set after SetAD(false)")
	}
}

func TestFailures(t *testing.T) {
	s, _ := testZone(t)
	s.ServFail("example.test")
	if r := exchange(t, s, "udp", "mx1.example.test", dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("ServFail beneath the name: rcode %d", r.Rcode)
	}
	s.Heal("example.test")
	if r := exchange(t, s, "udp", "mx1.example.test", dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("after Heal: rcode %d", r.Rcode)
	}

	s.Timeout("null.test")
	for _, network := range []string{"udp", "tcp"} {
		c := &dns.Client{Net: network, Timeout: 300 * time.Millisecond}
		m := new(dns.Msg)
		m.SetQuestion("null.test.", dns.TypeMX)
		_, _, err := c.Exchange(m, s.Addr)
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Errorf("%s: Timeout name answered: %v", network, err)
		}
	}
	if got := s.Queries("null.test", dns.TypeMX); got != 2 {
		t.Errorf("Queries = %d, want 2", got)
	}

	s.Truncate("example.test")
	r := exchange(t, s, "udp", "example.test", dns.TypeMX)
	if !r.Truncated || len(r.Answer) != 0 {
		t.Errorf("Truncate over UDP: tc=%v answer %v", r.Truncated, r.Answer)
	}
	if r := exchange(t, s, "tcp", "example.test", dns.TypeMX); r.Truncated || len(r.Answer) != 2 {
		t.Errorf("Truncate over TCP: tc=%v answer %v", r.Truncated, r.Answer)
	}
	if s.QueriesOver("example.test", dns.TypeMX, "udp") != 1 || s.QueriesOver("example.test", dns.TypeMX, "tcp") != 1 {
		t.Error("QueriesOver does not count per network")
	}
}

func TestLargeAnswerTruncatedOverUDP(t *testing.T) {
	s := Start(t)
	var recs []string
	for range 40 {
		recs = append(recs, "@ TXT \""+strings.Repeat("x", 100)+"\"")
	}
	s.MustAddZone(t, "big.test", recs...)
	if r := exchange(t, s, "udp", "big.test", dns.TypeTXT); !r.Truncated {
		t.Errorf("4 KB answer over UDP without EDNS0: not truncated (%d records)", len(r.Answer))
	}
	if r := exchange(t, s, "tcp", "big.test", dns.TypeTXT); r.Truncated || len(r.Answer) != 40 {
		t.Errorf("over TCP: tc=%v, %d records", r.Truncated, len(r.Answer))
	}
}

func TestDelay(t *testing.T) {
	s, _ := testZone(t)
	s.Delay("example.test", 200*time.Millisecond)
	start := time.Now()
	exchange(t, s, "udp", "example.test", dns.TypeMX)
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("answered after %v, want at least 200ms", el)
	}
}

func TestBadRecords(t *testing.T) {
	s := Start(t)
	if _, err := s.AddZone("x.test", "@ MX ten mx"); err == nil {
		t.Error("bad MX accepted")
	}
	if _, err := s.AddZone("x.test", "other.test. A 127.0.0.1"); err == nil {
		t.Error("record outside the zone accepted")
	}
}
