package fakedns

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// DefaultNegTTL is the TTL, in seconds, of a zone's generated SOA and its
// minimum field, so negative answers are cached for this long (RFC 2308 5).
const DefaultNegTTL = 30

// Server is a running fake authoritative server.
type Server struct {
	// Addr is the host:port that both the UDP and TCP listeners use.
	Addr string

	udp, tcp *dns.Server

	mu       sync.Mutex
	zones    map[string]*Zone // by lower-case FQDN origin
	timeouts map[string]bool
	servfail map[string]bool
	truncate map[string]bool
	delays   map[string]time.Duration
	queries  map[queryKey]int
}

type queryKey struct {
	name  string
	qtype uint16
	net   string
}

// Zone is the data of one zone. Its methods are safe while the server runs.
type Zone struct {
	srv    *Server
	origin string
	rrs    []dns.RR
	soa    *dns.SOA
	ad     bool
}

// Start starts a server on 127.0.0.1 and stops it when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := New()
	if err != nil {
		t.Fatalf("fakedns: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a server on 127.0.0.1 (UDP and TCP on one random port); the
// caller must Close it.
func New() (*Server, error) {
	s := &Server{
		zones:    map[string]*Zone{},
		timeouts: map[string]bool{},
		servfail: map[string]bool{},
		truncate: map[string]bool{},
		delays:   map[string]time.Duration{},
		queries:  map[queryKey]int{},
	}
	// The UDP port is random; TCP must get the same number, which another
	// process may hold, so try a few ports.
	var lastErr error
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		l, err := net.Listen("tcp", pc.LocalAddr().String())
		if err != nil {
			pc.Close()
			lastErr = err
			continue
		}
		s.Addr = pc.LocalAddr().String()
		s.udp = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serve)}
		s.tcp = &dns.Server{Listener: l, Handler: dns.HandlerFunc(s.serve)}
		if err := start(s.udp); err != nil {
			l.Close()
			return nil, err
		}
		if err := start(s.tcp); err != nil {
			s.udp.Shutdown()
			return nil, err
		}
		return s, nil
	}
	return nil, fmt.Errorf("no free port for UDP and TCP: %w", lastErr)
}

// start runs srv in the background and returns once it serves.
func start(srv *dns.Server) error {
	started := make(chan struct{})
	failed := make(chan error, 1)
	srv.NotifyStartedFunc = func() { close(started) }
	go func() {
		if err := srv.ActivateAndServe(); err != nil {
			failed <- err
		}
	}()
	select {
	case <-started:
		return nil
	case err := <-failed:
		return err
	case <-time.After(10 * time.Second):
		return errors.New("fakedns: server did not start within 10s")
	}
}

// Close stops both listeners.
func (s *Server) Close() {
	s.udp.Shutdown()
	s.tcp.Shutdown()
}

// AddZone adds (or replaces) the zone origin with records in presentation
// format. Owner names may be absolute or relative to origin ("@" is the
// origin); a record without a TTL gets 300 s. Unless the records hold an
// SOA, the zone gets one whose TTL and minimum are DefaultNegTTL.
func (s *Server) AddZone(origin string, records ...string) (*Zone, error) {
	origin = fqdn(origin)
	z := &Zone{srv: s, origin: origin}
	for _, line := range records {
		zp := dns.NewZoneParser(strings.NewReader(line), origin, "")
		zp.SetDefaultTTL(300)
		rr, ok := zp.Next()
		if err := zp.Err(); err != nil {
			return nil, fmt.Errorf("fakedns: zone %s: record %q: %w", origin, line, err)
		}
		if !ok {
			return nil, fmt.Errorf("fakedns: zone %s: record %q: empty", origin, line)
		}
		rr.Header().Name = strings.ToLower(rr.Header().Name)
		if !dns.IsSubDomain(origin, rr.Header().Name) {
			return nil, fmt.Errorf("fakedns: zone %s: record %q is outside the zone", origin, line)
		}
		if soa, isSOA := rr.(*dns.SOA); isSOA {
			z.soa = soa
			continue
		}
		z.rrs = append(z.rrs, rr)
	}
	if z.soa == nil {
		z.soa = &dns.SOA{
			Hdr: dns.RR_Header{Name: origin, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: DefaultNegTTL},
			Ns:  "ns." + origin, Mbox: "hostmaster." + origin,
			Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: DefaultNegTTL,
		}
	}
	s.mu.Lock()
	s.zones[origin] = z
	s.mu.Unlock()
	return z, nil
}

// MustAddZone is AddZone that fails the test on a bad record.
func (s *Server) MustAddZone(t testing.TB, origin string, records ...string) *Zone {
	t.Helper()
	z, err := s.AddZone(origin, records...)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

// SetAD says whether answers from this zone carry the AD bit, i.e. whether
// a validating resolver would call them authenticated (RFC 4035 3.2.3).
func (z *Zone) SetAD(ad bool) {
	z.srv.mu.Lock()
	z.ad = ad
	z.srv.mu.Unlock()
}

// SetNegTTL sets the zone's SOA TTL and minimum, in seconds: how long a
// negative answer from it may be cached.
func (z *Zone) SetNegTTL(seconds uint32) {
	z.srv.mu.Lock()
	z.soa.Hdr.Ttl = seconds
	z.soa.Minttl = seconds
	z.srv.mu.Unlock()
}

// Timeout makes the server never answer queries for name or any name
// beneath it (a dead or firewalled authoritative server).
func (s *Server) Timeout(name string) { s.set(s.timeouts, name, true) }

// ServFail makes the server answer SERVFAIL for name and names beneath it.
func (s *Server) ServFail(name string) { s.set(s.servfail, name, true) }

// Truncate makes UDP answers for name and names beneath it empty with TC
// set, so that only TCP gets the records (RFC 7766).
func (s *Server) Truncate(name string) { s.set(s.truncate, name, true) }

// Heal undoes Timeout, ServFail, Truncate and Delay for name.
func (s *Server) Heal(name string) {
	name = fqdn(name)
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.timeouts, name)
	delete(s.servfail, name)
	delete(s.truncate, name)
	delete(s.delays, name)
}

// Delay makes the server wait d before answering for name and names
// beneath it (a slow server; concurrent clients then overlap).
func (s *Server) Delay(name string, d time.Duration) {
	s.mu.Lock()
	s.delays[fqdn(name)] = d
	s.mu.Unlock()
}

func (s *Server) set(m map[string]bool, name string, v bool) {
	s.mu.Lock()
	m[fqdn(name)] = v
	s.mu.Unlock()
}

// Queries is how many queries for name and type (dns.TypeMX …) arrived,
// over UDP and TCP together.
func (s *Server) Queries(name string, qtype uint16) int {
	return s.QueriesOver(name, qtype, "udp") + s.QueriesOver(name, qtype, "tcp")
}

// QueriesOver is how many queries for name and type arrived over network
// ("udp" or "tcp").
func (s *Server) QueriesOver(name string, qtype uint16, network string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries[queryKey{fqdn(name), qtype, network}]
}

func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg) {
	if len(req.Question) != 1 {
		m := new(dns.Msg)
		m.SetRcode(req, dns.RcodeFormatError)
		_ = w.WriteMsg(m)
		return
	}
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	network := "udp"
	if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
		network = "tcp"
	}

	s.mu.Lock()
	s.queries[queryKey{name, q.Qtype, network}]++
	timeout := matches(s.timeouts, name)
	servfail := matches(s.servfail, name)
	truncate := network == "udp" && matches(s.truncate, name)
	var delay time.Duration
	for n, d := range s.delays {
		if dns.IsSubDomain(n, name) && d > delay {
			delay = d
		}
	}
	s.mu.Unlock()

	if timeout {
		return // no answer at all; the client's own timeout fires
	}
	if delay > 0 {
		time.Sleep(delay) // the simulated server latency itself, not a wait in a test
	}
	m := new(dns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	if servfail {
		m.SetRcode(req, dns.RcodeServerFailure)
		_ = w.WriteMsg(m)
		return
	}
	if truncate {
		m.Truncated = true
		_ = w.WriteMsg(m)
		return
	}

	s.mu.Lock()
	s.answer(m, name, q.Qtype)
	s.mu.Unlock()

	if network == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil {
			size = max(int(opt.UDPSize()), dns.MinMsgSize)
			m.SetEdns0(opt.UDPSize(), false)
		}
		m.Truncate(size)
	}
	_ = w.WriteMsg(m)
}

// answer fills m for name and qtype from the zones; s.mu is held.
func (s *Server) answer(m *dns.Msg, name string, qtype uint16) {
	for range 8 { // CNAME chain limit
		z := s.zoneFor(name)
		if z == nil {
			m.Rcode = dns.RcodeNameError
			return
		}
		m.AuthenticatedData = z.ad
		if qtype == dns.TypeSOA && name == z.origin {
			m.Answer = append(m.Answer, dns.Copy(z.soa))
			return
		}
		var found, exists bool
		var cname *dns.CNAME
		for _, rr := range z.rrs {
			h := rr.Header()
			if dns.IsSubDomain(name, h.Name) {
				exists = true // RFC 8020: a name with descendants exists
			}
			if h.Name != name {
				continue
			}
			if h.Rrtype == qtype || qtype == dns.TypeANY {
				m.Answer = append(m.Answer, dns.Copy(rr))
				found = true
			} else if c, ok := rr.(*dns.CNAME); ok {
				cname = c
			}
		}
		if found {
			return
		}
		if cname != nil {
			m.Answer = append(m.Answer, dns.Copy(cname))
			name = strings.ToLower(cname.Target)
			continue
		}
		if !exists && name != z.origin {
			m.Rcode = dns.RcodeNameError
		}
		m.Ns = append(m.Ns, dns.Copy(z.soa))
		return
	}
}

// zoneFor is the zone with the longest origin that contains name.
func (s *Server) zoneFor(name string) *Zone {
	for n := name; ; {
		if z, ok := s.zones[n]; ok {
			return z
		}
		i, end := dns.NextLabel(n, 0)
		if end {
			return nil
		}
		n = n[i:]
	}
}

// matches reports whether name or one of its ancestors is in m.
func matches(m map[string]bool, name string) bool {
	for n := range m {
		if m[n] && dns.IsSubDomain(n, name) {
			return true
		}
	}
	return false
}

func fqdn(name string) string { return dns.Fqdn(strings.ToLower(name)) }
