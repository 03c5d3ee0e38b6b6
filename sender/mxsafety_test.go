package sender

import (
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/emersion/go-smtp"
	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/resolver"
)

// TestMXAddressLiteralSkipped: an MX record whose target is an IP address
// is not used (RFC 5321 5.1: MX data is a domain name); the domain's other
// MX hosts are, and a domain with only such records is a temporary DNS
// failure, never its implicit MX.
func TestMXAddressLiteralSkipped(t *testing.T) {
	w := newWorld(t)
	literal, named := fakemx.Start(t, fakemx.Options{}), fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.9", literal)
	w.route("127.0.0.3", named)
	w.zones["mixed.test."] = mockdns.Zone{MX: []net.MX{{Host: "127.0.0.9.", Pref: 10}, {Host: "mx.mixed.test.", Pref: 20}}}
	w.host("mx.mixed.test", "127.0.0.3")
	w.zones["lit.test."] = mockdns.Zone{MX: []net.MX{{Host: "127.0.0.9.", Pref: 10}, {Host: "[127.0.0.9]", Pref: 20}, {Host: "2001:db8::9.", Pref: 30}},
		A: []string{"127.0.0.9"}}
	s := w.sender(w.config())

	r := s.Send(ctxT(t), msg("mixed.test", "a@mixed.test"))
	checkDelivered(t, r)
	if d := w.dials(); !slices.Equal(d, []string{"127.0.0.3:25"}) || len(literal.Messages()) != 0 {
		t.Fatalf("dialled %v (literal MX got %d messages); want only mx.mixed.test", d, len(literal.Messages()))
	}

	r = s.Send(ctxT(t), msg("lit.test", "a@lit.test"))
	checkAll(t, r, classify.StageDNS, 0, classify.EventDNSServFail)
	o := r.Rcpts[0].Outcome
	if !strings.HasPrefix(o.Text, syntheticText("")) || !strings.Contains(o.Text, "127.0.0.9") || !strings.Contains(o.Text, "IP addresses") {
		t.Errorf("text %q", o.Text)
	}
	if c := classify.Default().Classify(o); c.Class != classify.Transient {
		t.Errorf("class %s, want transient", c.Class)
	}
	if d := w.dials(); len(d) != 1 || len(literal.Messages()) != 0 {
		t.Errorf("dialled %v for a domain whose MX records are all addresses", d)
	}
}

// TestMXRefusesLocalAddresses: MX delivery does not connect to loopback,
// unspecified, link-local or multicast addresses, whatever the domain's
// DNS says; private ones are fine. The outcome is permanent (Postfix's
// "loops back to myself", 5.4.6) and says so as a synthetic outcome.
func TestMXRefusesLocalAddresses(t *testing.T) {
	cases := []struct {
		a, aaaa  []string
		dialled  bool
		enhanced string
	}{
		{a: []string{"127.0.0.1"}, enhanced: "5.4.6"},
		{a: []string{"127.3.2.1"}, enhanced: "5.4.6"},
		{aaaa: []string{"::1"}, enhanced: "5.4.6"},
		{aaaa: []string{"::ffff:127.0.0.1"}, enhanced: "5.4.6"},
		{a: []string{"0.0.0.0"}, enhanced: "5.4.6"},
		{a: []string{"0.1.2.3"}, enhanced: "5.4.6"},
		{aaaa: []string{"::"}, enhanced: "5.4.6"},
		{a: []string{"169.254.169.254"}, enhanced: "5.4.4"},
		{aaaa: []string{"fe80::1"}, enhanced: "5.4.4"},
		{a: []string{"224.0.0.1"}, enhanced: "5.4.4"},
		{aaaa: []string{"ff02::1"}, enhanced: "5.4.4"},
		{a: []string{"169.254.1.1", "127.0.0.1"}, enhanced: "5.4.6"},
		{a: []string{"10.1.2.3"}, dialled: true},
		{a: []string{"192.168.1.25"}, dialled: true},
		{a: []string{"172.16.0.25"}, dialled: true},
		{aaaa: []string{"fd00::25"}, dialled: true},
	}
	for _, c := range cases {
		t.Run(strings.Join(append(c.a, c.aaaa...), ","), func(t *testing.T) {
			w := newWorld(t)
			w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
			w.zones["mx.example.test."] = mockdns.Zone{A: c.a, AAAA: c.aaaa}
			cfg := w.config()
			cfg.MXAllowLoopback = false
			r := w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test"))
			if c.dialled {
				if len(w.dials()) != 1 {
					t.Errorf("a private address was not dialled: %v", w.dials())
				}
				return
			}
			if d := w.dials(); len(d) != 0 {
				t.Fatalf("dialled %v", d)
			}
			checkAll(t, r, classify.StageConnect, 554, classify.EventNone)
			o := r.Rcpts[0].Outcome
			if o.Enhanced != c.enhanced || !strings.HasPrefix(o.Text, syntheticText("")) || !strings.Contains(o.Text, "mx.example.test") {
				t.Errorf("outcome %+v, want %s and a synthetic text naming the host", o, c.enhanced)
			}
			if res := classify.Default().Classify(o); res.Class != classify.Permanent {
				t.Errorf("class %s, want permanent", res.Class)
			}
		})
	}
}

// TestMXLocalAddressAmongOthers: a host's refused addresses are left out
// and its others tried; a host with only refused addresses is passed over
// for the next MX, and when that one fails temporarily the message waits
// rather than bounces.
func TestMXLocalAddressAmongOthers(t *testing.T) {
	w := newWorld(t)
	fake := fakemx.Start(t, fakemx.Options{})
	w.route("10.0.0.25", fake)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
	w.zones["mx.example.test."] = mockdns.Zone{A: []string{"127.0.0.1", "10.0.0.25"}}
	w.zones["backup.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx1.backup.test.", Pref: 10}, {Host: "mx2.backup.test.", Pref: 20}}}
	w.zones["mx1.backup.test."] = mockdns.Zone{A: []string{"127.0.0.1"}}
	w.zones["mx2.backup.test."] = mockdns.Zone{A: []string{"192.0.2.25"}} // refuses
	cfg := w.config()
	cfg.MXAllowLoopback = false
	s := w.sender(cfg)

	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
	if d := w.dials(); !slices.Equal(d, []string{"10.0.0.25:25"}) {
		t.Errorf("dialled %v", d)
	}
	r := s.Send(ctxT(t), msg("backup.test", "a@backup.test"))
	checkAll(t, r, classify.StageConnect, 0, classify.EventConnRefused)
	if d := w.dials(); !slices.Equal(d, []string{"10.0.0.25:25", "192.0.2.25:25"}) {
		t.Errorf("dialled %v", d)
	}
	if !strings.Contains(w.logBuf.String(), "MX host addresses not used") {
		t.Error("refused addresses not logged")
	}
}

// TestMXLoopbackRealDial is the review's case with the production dialer:
// an MX host whose address is 127.0.0.1 must not reach the local listener
// (here a fake MX on the port MX delivery uses), unless MXAllowLoopback
// says so; 0.0.0.0 is refused even then.
func TestMXLoopbackRealDial(t *testing.T) {
	fake := fakemx.Start(t, fakemx.Options{})
	_, port, _ := net.SplitHostPort(fake.Addr())
	dnsSrv := fakedns.Start(t)
	dnsSrv.MustAddZone(t, "evil.test", "@ MX 10 mx", "mx A 127.0.0.1")
	dnsSrv.MustAddZone(t, "zero.test", "@ MX 10 mx", "mx A 0.0.0.0")
	dnsSrv.MustAddZone(t, "lit.test", "@ MX 10 127.0.0.1.")
	r, err := resolver.New(resolver.Config{Servers: []string{dnsSrv.Addr}, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	w := newWorld(t)
	cfg := w.config()
	cfg.Resolver, cfg.Dial, cfg.MXAllowLoopback = r, nil, false
	cfg.Port, _ = strconv.Atoi(port)
	s := w.sender(cfg)
	for _, d := range []string{"evil.test", "zero.test", "lit.test"} {
		res := s.Send(ctxT(t), msg(d, "a@"+d))
		if o := res.Rcpts[0].Outcome; o.Code == 250 || res.Addr != "" {
			t.Errorf("%s: delivered to the local listener: %+v", d, res)
		}
	}
	if n := fake.Connections(); n != 0 {
		t.Fatalf("the local listener got %d connections", n)
	}

	cfg.MXAllowLoopback = true
	s = w.sender(cfg)
	checkDelivered(t, s.Send(ctxT(t), msg("evil.test", "a@evil.test")))
	for _, d := range []string{"zero.test", "lit.test"} {
		if o := s.Send(ctxT(t), msg(d, "a@"+d)).Rcpts[0].Outcome; o.Code == 250 {
			t.Errorf("%s delivered with MXAllowLoopback: %+v", d, o)
		}
	}
	if len(fake.Messages()) != 1 {
		t.Errorf("%d messages, want the one to evil.test", len(fake.Messages()))
	}
}

// TestRelayOnLoopbackAllowed: the refusal is for MX delivery; a relay on
// 127.0.0.1 is the operator's choice.
func TestRelayOnLoopbackAllowed(t *testing.T) {
	fake := fakemx.Start(t, fakemx.Options{})
	w := newWorld(t)
	cfg := w.config()
	cfg.Relay, cfg.RelayTLS, cfg.Dial, cfg.MXAllowLoopback = fake.Addr(), RelayNoTLS, nil, false
	checkDelivered(t, w.sender(cfg).Send(ctxT(t), msg("anywhere.test", "a@anywhere.test")))
}

// manyMX gives example.test n MX hosts of two refusing addresses each.
func manyMX(w *world, n int) {
	var mxs []net.MX
	for i := range n {
		h := fmt.Sprintf("mx%d.example.test", i)
		mxs = append(mxs, net.MX{Host: h + ".", Pref: uint16(10 + i)})
		w.host(h, fmt.Sprintf("127.0.1.%d", i+1), fmt.Sprintf("127.0.2.%d", i+1))
	}
	w.zones["example.test."] = mockdns.Zone{MX: mxs}
}

// TestMXAddressLimit: 30 MX hosts of two unreachable addresses each cost
// MXAddressLimit connection attempts (5 by default, Postfix's
// smtp_mx_address_limit), not 60, and the outcome says the limit ended
// the tries.
func TestMXAddressLimit(t *testing.T) {
	for _, c := range []struct{ limit, want int }{{0, DefaultMXAddressLimit}, {3, 3}, {-1, 60}} {
		t.Run(strconv.Itoa(c.limit), func(t *testing.T) {
			w := newWorld(t)
			manyMX(w, 30)
			cfg := w.config()
			cfg.MXAddressLimit = c.limit
			r := w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test"))
			if d := w.dials(); len(d) != c.want {
				t.Errorf("%d connection attempts, want %d", len(d), c.want)
			}
			checkAll(t, r, classify.StageConnect, 0, classify.EventConnRefused)
			limited := strings.Contains(r.Rcpts[0].Outcome.Text, "address limit")
			if limited != (c.limit >= 0) {
				t.Errorf("text %q: says the address limit stopped it: %v", r.Rcpts[0].Outcome.Text, limited)
			}
		})
	}
	// A host whose addresses all fit is not marked as stopped.
	w := newWorld(t)
	manyMX(w, 2)
	r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test"))
	if len(w.dials()) != 4 || strings.Contains(r.Rcpts[0].Outcome.Text, "limit") {
		t.Errorf("dials %v, text %q", w.dials(), r.Rcpts[0].Outcome.Text)
	}
}

// TestMXSessionLimit: sessions that connect and fail (a 421 greeting)
// count towards MXSessionLimit (2 by default, Postfix's
// smtp_mx_session_limit); refused connections do not.
func TestMXSessionLimit(t *testing.T) {
	setup := func(t *testing.T) (*world, *fakemx.Server) {
		w := newWorld(t)
		good := fakemx.Start(t, fakemx.Options{})
		w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx0.example.test.", Pref: 5},
			{Host: "mx1.example.test.", Pref: 10}, {Host: "mx2.example.test.", Pref: 20}, {Host: "mx3.example.test.", Pref: 30}}}
		w.host("mx0.example.test", "127.0.0.10") // refuses: no session
		for i, ip := range []string{"127.0.0.2", "127.0.0.3"} {
			w.host(fmt.Sprintf("mx%d.example.test", i+1), ip)
			w.route(ip, fakemx.Start(t, fakemx.Options{Greeting: "421 4.3.2 busy, try later"}))
		}
		w.host("mx3.example.test", "127.0.0.4")
		w.route("127.0.0.4", good)
		return w, good
	}
	w, good := setup(t)
	r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test"))
	checkAll(t, r, classify.StageGreeting, 421, classify.EventNone)
	if d := w.dials(); !slices.Equal(d, []string{"127.0.0.10:25", "127.0.0.2:25", "127.0.0.3:25"}) || len(good.Messages()) != 0 {
		t.Errorf("dialled %v; want the refusing host and two sessions, not mx3", d)
	}
	if txt := r.Rcpts[0].Outcome.Text; !strings.HasPrefix(txt, "busy, try later") || !strings.Contains(txt, "session limit") {
		t.Errorf("text %q", txt)
	}
	if c := classify.Default().Classify(r.Rcpts[0].Outcome); c.Class != classify.Transient {
		t.Errorf("class %s (%s)", c.Class, c.Rule)
	}

	w, good = setup(t)
	cfg := w.config()
	cfg.MXSessionLimit = 3
	checkDelivered(t, w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test")))
	if len(good.Messages()) != 1 {
		t.Error("MXSessionLimit 3: mx3 not reached")
	}
}

// TestMXLimitsSparedBySuccess: connections that deliver do not count
// towards the limits: 250 recipients over connections of one transaction
// of 100 each take three sessions to one address.
func TestMXLimitsSparedBySuccess(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{})
	cfg := w.config()
	cfg.MaxMsgsPerConn = 1
	cfg.MXSessionLimit, cfg.MXAddressLimit = 1, 1
	var rcpts []string
	for i := range 250 {
		rcpts = append(rcpts, fmt.Sprintf("r%d@example.test", i))
	}
	r := w.sender(cfg).Send(ctxT(t), msg("example.test", rcpts...))
	checkDelivered(t, r)
	if fake.Connections() != 3 || r.Transactions != 3 {
		t.Errorf("connections %d, transactions %d", fake.Connections(), r.Transactions)
	}
}

// twoMX routes mx1 (127.0.0.2) and mx2 (127.0.0.3) of example.test to
// the given fakes (nil: refuses).
func twoMX(t *testing.T, prim, backup *fakemx.Server) *world {
	w := newWorld(t)
	w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx1.example.test.", Pref: 10}, {Host: "mx2.example.test.", Pref: 20}}}
	w.host("mx1.example.test", "127.0.0.2")
	w.host("mx2.example.test", "127.0.0.3")
	if prim != nil {
		w.route("127.0.0.2", prim)
	}
	if backup != nil {
		w.route("127.0.0.3", backup)
	}
	return w
}

func mailHook(code int, enhanced smtp.EnhancedCode, text string) fakemx.Hook {
	return func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageMail {
			return &smtp.SMTPError{Code: code, EnhancedCode: enhanced, Message: text}
		}
		return nil
	}
}

// TestNextMXAfterSoftMAIL: a 4xx to MAIL (421, 451), or a connection lost
// at MAIL, sends the recipients to the next MX host, as Postfix does;
// with and without PIPELINING and CHUNKING.
func TestNextMXAfterSoftMAIL(t *testing.T) {
	for _, code := range []int{421, 451} {
		for _, hide := range [][]string{nil, {"CHUNKING"}, {"PIPELINING", "CHUNKING"}, {"PIPELINING"}} {
			t.Run(fmt.Sprintf("%d-without-%s", code, strings.Join(hide, "+")), func(t *testing.T) {
				prim := fakemx.Start(t, fakemx.Options{HideExtensions: hide, Hook: mailHook(code, smtp.EnhancedCode{4, 3, 0}, "try later")})
				backup := fakemx.Start(t, fakemx.Options{HideExtensions: hide})
				w := twoMX(t, prim, backup)
				r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test"))
				checkDelivered(t, r)
				if len(backup.Messages()) != 1 || r.Host != "mx2.example.test" {
					t.Errorf("backup got %d messages, result host %s", len(backup.Messages()), r.Host)
				}
			})
		}
	}
	t.Run("dropped-at-MAIL", func(t *testing.T) {
		// Without CHUNKING: with it, the message has left with MAIL and
		// a lost connection may have delivered it (below).
		prim := fakemx.Start(t, fakemx.Options{HideExtensions: []string{"CHUNKING"}, Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
			if st == fakemx.StageMail {
				return fakemx.Drop
			}
			return nil
		}})
		backup := fakemx.Start(t, fakemx.Options{})
		w := twoMX(t, prim, backup)
		checkDelivered(t, w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test")))
		if len(backup.Messages()) != 1 {
			t.Error("backup not used after the primary hung up at MAIL")
		}
	})
}

// TestNoNextMXOnceAccepted: what is not a session failure before any
// recipient was accepted stays the outcome, and the backup is not tried:
// a 5xx to MAIL, a 5xx or 4xx to RCPT, a connection lost after a
// recipient was accepted, and one lost after a BDAT chunk left with MAIL.
func TestNoNextMXOnceAccepted(t *testing.T) {
	cases := []struct {
		name  string
		opts  fakemx.Options
		stage classify.Stage
	}{
		{"550-MAIL", fakemx.Options{Hook: mailHook(550, smtp.EnhancedCode{5, 7, 1}, "go away")}, classify.StageMail},
		{"550-RCPT", fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
			if st == fakemx.StageRcpt {
				return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
			}
			return nil
		}}, classify.StageRcpt},
		{"451-RCPT", fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
			if st == fakemx.StageRcpt {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 7, 1}, Message: "greylisted"}
			}
			return nil
		}}, classify.StageRcpt},
		{"lost-after-RCPT", fakemx.Options{HideExtensions: []string{"CHUNKING"}, Hook: func(st fakemx.Stage, arg string) *smtp.SMTPError {
			if st == fakemx.StageRcpt && arg == "b@example.test" {
				return fakemx.Drop
			}
			return nil
		}}, classify.StageRcpt},
		{"lost-at-MAIL-after-BDAT", fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
			if st == fakemx.StageMail {
				return fakemx.Drop
			}
			return nil
		}}, classify.StageDataEnd},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			prim := fakemx.Start(t, c.opts)
			backup := fakemx.Start(t, fakemx.Options{})
			w := twoMX(t, prim, backup)
			r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test", "b@example.test"))
			if d := w.dials(); len(d) != 1 || len(backup.Messages()) != 0 {
				t.Errorf("dialled %v, backup got %d messages", d, len(backup.Messages()))
			}
			if o := r.Rcpts[1].Outcome; o.Stage != c.stage {
				t.Errorf("outcome %+v, want stage %s", o, c.stage)
			}
		})
	}
}

// TestSoftMAILOutcome: when no host takes the recipients, the outcome is
// the last 4xx a server said (a backup's refused connection is no news
// about the destination), and MXSessionLimit bounds the hosts tried.
func TestSoftMAILOutcome(t *testing.T) {
	prim := fakemx.Start(t, fakemx.Options{Hook: mailHook(421, smtp.EnhancedCode{4, 7, 28}, "rate limited, slow down")})
	w := twoMX(t, prim, nil)
	r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test"))
	checkAll(t, r, classify.StageMail, 421, classify.EventNone)
	if d := w.dials(); len(d) != 2 {
		t.Errorf("dialled %v, want both hosts", d)
	}
	if c := classify.Default().Classify(r.Rcpts[0].Outcome); c.Class != classify.Throttled {
		t.Errorf("class %s (%s), want the primary's throttle", c.Class, c.Rule)
	}

	w = newWorld(t)
	var mxs []net.MX
	for i := range 3 {
		h := fmt.Sprintf("mx%d.example.test", i)
		mxs = append(mxs, net.MX{Host: h + ".", Pref: uint16(10 + i)})
		ip := fmt.Sprintf("127.0.0.%d", i+2)
		w.host(h, ip)
		w.route(ip, fakemx.Start(t, fakemx.Options{Hook: mailHook(450+i, smtp.EnhancedCode{4, 3, 0}, fmt.Sprintf("busy %d", i))}))
	}
	w.zones["example.test."] = mockdns.Zone{MX: mxs}
	r = w.sender(w.config()).Send(ctxT(t), msg("example.test", "a@example.test"))
	checkAll(t, r, classify.StageMail, 451, classify.EventNone)
	if d := w.dials(); len(d) != 2 {
		t.Errorf("dialled %v, want MXSessionLimit's 2 hosts", d)
	}
	if txt := r.Rcpts[0].Outcome.Text; !strings.Contains(txt, "busy 1") || !strings.Contains(txt, "session limit") {
		t.Errorf("text %q", txt)
	}
}

// TestSoftMAILNotPooled: a pooled connection that gets a 451 to MAIL is
// not given back to the pool: the next Send to that host opens a new one.
func TestSoftMAILNotPooled(t *testing.T) {
	var refuse atomic.Bool
	prim := fakemx.Start(t, fakemx.Options{Hook: func(st fakemx.Stage, _ string) *smtp.SMTPError {
		if st == fakemx.StageMail && refuse.Load() {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not now"}
		}
		return nil
	}})
	backup := fakemx.Start(t, fakemx.Options{})
	w := twoMX(t, prim, backup)
	s := w.sender(w.config())
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
	refuse.Store(true)
	r := s.Send(ctxT(t), msg("example.test", "a@example.test"))
	checkDelivered(t, r)
	if !r.Reused || len(backup.Messages()) != 1 {
		t.Fatalf("reused %v, backup got %d: want the pooled connection refused, then the backup", r.Reused, len(backup.Messages()))
	}
	refuse.Store(false)
	checkDelivered(t, s.Send(ctxT(t), msg("example.test", "a@example.test")))
	if prim.Connections() != 2 || len(prim.Messages()) != 2 {
		t.Errorf("primary: %d connections, %d messages; the refused connection was pooled again", prim.Connections(), len(prim.Messages()))
	}
}

// TestRelaySoftMAIL: the relay is one host: a 451 to MAIL is the outcome
// after one connection.
func TestRelaySoftMAIL(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{Hook: mailHook(451, smtp.EnhancedCode{4, 3, 0}, "not now")})
	cfg.RelayTLS, cfg.RelayUsername = RelayNoTLS, ""
	r := w.sender(cfg).Send(ctxT(t), msg("anywhere.test", "a@anywhere.test"))
	checkAll(t, r, classify.StageMail, 451, classify.EventNone)
	if fake.Connections() != 1 || len(w.dials()) != 1 {
		t.Errorf("%d connections, dials %v", fake.Connections(), w.dials())
	}
}
