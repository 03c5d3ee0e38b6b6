package sender

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

// testClock is the dead-address memory's clock in tests.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: time.Date(2026, 12, 7, 20, 0, 0, 0, time.UTC)} }

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// record is the memory's record of addr (a pointer into it), or a
// fatal error.
func record(t *testing.T, s *Sender, addr string) *deadAddr {
	t.Helper()
	s.dead.mu.Lock()
	defer s.dead.mu.Unlock()
	el := s.dead.m[addr]
	if el == nil {
		t.Fatalf("no record of %s", addr)
	}
	return el.Value.(*deadAddr)
}

// blackholes makes some addresses of w silent: a dial to one waits for
// its context's end, as a connect to a host that drops SYNs does, and
// returns the dialer's timeout. It counts the dials of each.
type blackholes struct {
	w     *world
	mu    sync.Mutex
	addrs map[string]bool
	n     map[string]int
}

func newBlackholes(w *world, addrs ...string) *blackholes {
	b := &blackholes{w: w, addrs: map[string]bool{}, n: map[string]int{}}
	for _, a := range addrs {
		b.addrs[a] = true
	}
	return b
}

func (b *blackholes) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	b.mu.Lock()
	silent := b.addrs[addr]
	if silent {
		b.n[addr]++
	}
	b.mu.Unlock()
	if !silent {
		return b.w.dial(ctx, network, addr)
	}
	<-ctx.Done()
	return nil, &net.OpError{Op: "dial", Net: network, Err: os.ErrDeadlineExceeded}
}

func (b *blackholes) dials(addr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n[addr]
}

func (b *blackholes) revive(addr string) {
	b.mu.Lock()
	delete(b.addrs, addr)
	b.mu.Unlock()
}

// deadWorld is a world whose mx.two.test has two addresses, 127.0.0.11
// silent and 127.0.0.6 a fake MX, for domain two.test; connect timeout
// 300 ms and the memory on a test clock.
func deadWorld(t *testing.T) (*world, *blackholes, *Sender, *testClock, *fakemx.Server) {
	w := newWorld(t)
	good := fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.6", good)
	w.zones["two.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.two.test.", Pref: 10}}}
	w.host("mx.two.test", "127.0.0.11", "127.0.0.6")
	bh := newBlackholes(w, "127.0.0.11:25")
	cfg := w.config()
	cfg.Dial = bh.dial
	cfg.ConnectTimeout = 300 * time.Millisecond
	cfg.MaxMsgsPerConn = 1 // a fresh connection for each delivery
	s := w.sender(cfg)
	clk := newTestClock()
	s.dead.now = clk.now
	return w, bh, s, clk, good
}

// TestDeadAddrCostsOneConnectPerHold: an MX host whose first address
// drops SYNs is dialled there once per hold, whatever the number of
// deliveries: the others go to its second address at once. When the hold
// ends one delivery dials it again (the others, concurrent, do not), and
// a second failure holds it twice as long. Without the memory every
// delivery paid the connect timeout on the first address.
func TestDeadAddrCostsOneConnectPerHold(t *testing.T) {
	w, bh, s, clk, good := deadWorld(t)
	const dead = "127.0.0.11:25"

	r := s.Send(ctxT(t), msg("two.test", "a@two.test"))
	checkDelivered(t, r)
	if bh.dials(dead) != 1 || r.Addr != "127.0.0.6:25" {
		t.Fatalf("first delivery: %d dials of the dead address, delivered via %s", bh.dials(dead), r.Addr)
	}
	if n := strings.Count(w.logBuf.String(), "MX address failed to connect"); n != 1 {
		t.Errorf("%d lines marking the address, want 1:\n%s", n, w.logBuf.String())
	}

	// A minute of deliveries, a fresh connection each: none dials the dead address, none waits.
	for i := range 20 {
		start := time.Now()
		r := s.Send(ctxT(t), msg("two.test", fmt.Sprintf("r%d@two.test", i)))
		checkDelivered(t, r)
		if took := time.Since(start); took > 200*time.Millisecond {
			t.Errorf("delivery %d took %v: waited for the dead address", i, took)
		}
		clk.add(2 * time.Second)
	}
	if n := bh.dials(dead); n != 1 {
		t.Fatalf("%d dials of the dead address within its hold, want 1", n)
	}
	if n := strings.Count(w.logBuf.String(), "MX address failed to connect"); n != 1 {
		t.Errorf("%d lines marking the address, want 1 (skips are not logged above debug)", n)
	}

	// The hold (60 s) is over: of 8 concurrent deliveries one dials it
	// again (a probe), the others go on to the second address.
	clk.add(25 * time.Second)
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() { checkDelivered(t, s.Send(ctxT(t), msg("two.test", fmt.Sprintf("p%d@two.test", i)))) })
	}
	wg.Wait()
	if n := bh.dials(dead); n != 2 {
		t.Fatalf("%d dials of the dead address after its hold ended, want 2 (one probe)", n)
	}
	// Failed again: held twice as long.
	e := record(t, s, dead)
	if e.fails != 2 || e.until.Sub(e.failedAt) != 2*time.Minute {
		t.Errorf("after the probe failed: fails=%d hold=%v, want 2 and 2m", e.fails, e.until.Sub(e.failedAt))
	}
	clk.add(61 * time.Second)
	checkDelivered(t, s.Send(ctxT(t), msg("two.test", "q@two.test")))
	if n := bh.dials(dead); n != 2 {
		t.Errorf("%d dials 61 s into a 2 min hold, want 2", n)
	}
	if len(good.Messages()) != 30 {
		t.Errorf("%d messages at the live address, want 30", len(good.Messages()))
	}
}

// TestDeadAddrAllHeldFailsAtOnce: when every address of every MX host is
// held, a delivery fails at once without dialling, with a transient
// connect failure of the same event, class, scope and rule as the
// failure that marked them (the breaker counts it the same), naming the
// addresses and when they failed. A live backup MX is used at once.
func TestDeadAddrAllHeldFailsAtOnce(t *testing.T) {
	for _, ev := range []classify.Event{classify.EventTimeout, classify.EventConnRefused} {
		t.Run(ev.String(), func(t *testing.T) {
			w := newWorld(t)
			w.zones["dead.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx1.dead.test.", Pref: 10}, {Host: "mx2.dead.test.", Pref: 20}}}
			w.host("mx1.dead.test", "127.0.0.11", "127.0.0.12")
			w.host("mx2.dead.test", "127.0.0.13")
			var bh *blackholes
			cfg := w.config()
			cfg.ConnectTimeout = 300 * time.Millisecond
			if ev == classify.EventTimeout {
				bh = newBlackholes(w, "127.0.0.11:25", "127.0.0.12:25", "127.0.0.13:25")
				cfg.Dial = bh.dial
			} // else w.dial refuses them
			s := w.sender(cfg)
			s.dead.now = newTestClock().now
			dials := func() int {
				if bh != nil {
					return bh.dials("127.0.0.11:25") + bh.dials("127.0.0.12:25") + bh.dials("127.0.0.13:25")
				}
				return len(w.dials())
			}

			r := s.Send(ctxT(t), msg("dead.test", "a@dead.test"))
			checkAll(t, r, classify.StageConnect, 0, ev)
			first := classify.Default().Classify(r.Rcpts[0].Outcome)
			if dials() != 3 {
				t.Fatalf("%d dials, want 3", dials())
			}
			if !r.HeldUntil.IsZero() {
				t.Errorf("HeldUntil %v after an attempt that dialled", r.HeldUntil)
			}

			start := time.Now()
			r = s.Send(ctxT(t), msg("dead.test", "b@dead.test", "c@dead.test"))
			took := time.Since(start)
			checkAll(t, r, classify.StageConnect, 0, ev)
			if dials() != 3 || took > 100*time.Millisecond {
				t.Fatalf("second delivery dialled %d times in all and took %v; want no dial, at once", dials(), took)
			}
			if want := time.Date(2026, 12, 7, 20, 1, 0, 0, time.UTC); !r.HeldUntil.Equal(want) {
				t.Errorf("HeldUntil %v, want the first hold's end %v", r.HeldUntil, want)
			}
			o := r.Rcpts[0].Outcome
			if !strings.HasPrefix(o.Text, syntheticText("")) || !strings.Contains(o.Text, "127.0.0.13:25") ||
				!strings.Contains(o.Text, "failed to connect at 2026-12-07T20:00:00Z") || !strings.Contains(o.Text, "not dialled again before 2026-12-07T20:01:00Z") {
				t.Errorf("text %q", o.Text)
			}
			c := classify.Default().Classify(o)
			if c.Class != classify.Transient || c.Scope != classify.ScopeConnection || c.Class != first.Class || c.Scope != first.Scope || c.Rule != first.Rule || strings.HasPrefix(c.Rule, "local") {
				t.Errorf("held failure classified %s/%s/%s; the connect failure was %s/%s/%s", c.Class, c.Scope, c.Rule, first.Class, first.Scope, first.Rule)
			}

			// The backup comes to life: used at once, the primary's
			// held addresses not dialled.
			good := fakemx.Start(t, fakemx.Options{})
			w.route("127.0.0.13", good)
			if bh != nil {
				bh.revive("127.0.0.13:25")
			}
			record(t, s, "127.0.0.13:25").until = time.Time{} // its hold is over
			r = s.Send(ctxT(t), msg("dead.test", "d@dead.test"))
			checkDelivered(t, r)
			if bh != nil && bh.dials("127.0.0.11:25")+bh.dials("127.0.0.12:25") != 2 {
				t.Errorf("the held primary was dialled again")
			}
			if s.dead.len() != 2 {
				t.Errorf("%d addresses held after the backup connected, want 2 (its record cleared)", s.dead.len())
			}
		})
	}
}

// TestDeadAddrExpiryAndClear: the hold ends on time; the probe that
// connects clears the record, and a later failure starts from the first
// hold again; failures in a row double it up to the cap.
func TestDeadAddrExpiryAndClear(t *testing.T) {
	w := newWorld(t)
	w.zones["one.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.one.test.", Pref: 10}}}
	w.host("mx.one.test", "127.0.0.11")
	// 127.0.0.11 refuses: w.dial has no route to it. No connection
	// is pooled.
	cfg := w.config()
	cfg.MaxMsgsPerConn = 1
	s := w.sender(cfg)
	clk := newTestClock()
	s.dead.now = clk.now
	send := func() Result { return s.Send(ctxT(t), msg("one.test", "a@one.test")) }

	var holds []time.Duration
	for range 5 {
		before := len(w.dials())
		checkAll(t, send(), classify.StageConnect, 0, classify.EventConnRefused)
		if len(w.dials()) != before+1 {
			t.Fatalf("not dialled after the hold ended")
		}
		e := record(t, s, "127.0.0.11:25")
		holds = append(holds, e.until.Sub(e.failedAt))
		clk.add(e.until.Sub(clk.now()) - time.Second)
		send()
		if len(w.dials()) != before+1 {
			t.Fatalf("dialled a second before the hold ends")
		}
		clk.add(time.Second)
	}
	if want := []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 5 * time.Minute, 5 * time.Minute}; !slices.Equal(holds, want) {
		t.Errorf("holds %v, want %v", holds, want)
	}

	good := fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.11", good)
	checkDelivered(t, send())
	if s.dead.len() != 0 {
		t.Fatalf("record kept after a connection")
	}
	if !strings.Contains(w.logBuf.String(), "connects again") {
		t.Errorf("no line says the address connects again")
	}
	w.mu.Lock()
	delete(w.routes, "127.0.0.11:25")
	w.mu.Unlock()
	send()
	if e := record(t, s, "127.0.0.11:25"); e.fails != 1 || e.until.Sub(e.failedAt) != time.Minute {
		t.Errorf("after a clear: fails %d, hold %v; want 1, 1m", e.fails, e.until.Sub(e.failedAt))
	}

	// Long after its hold, a record is forgotten: the next failure is a
	// first one.
	clk.add(time.Minute + DefaultDeadAddrHoldMax + time.Second)
	send()
	if e := record(t, s, "127.0.0.11:25"); e.fails != 1 {
		t.Errorf("fails %d after the record was forgotten, want 1", e.fails)
	}
}

// TestDeadAddrOnlyConnectFailures: a server's reply (a 421 greeting),
// the attempt's own time running out and a local dial error mark
// nothing; DeadAddrHold < 0 turns the memory off.
func TestDeadAddrOnlyConnectFailures(t *testing.T) {
	w := newWorld(t)
	busy := fakemx.Start(t, fakemx.Options{Greeting: "421 4.3.2 Too busy"})
	w.route("127.0.0.2", busy)
	w.zones["busy.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.busy.test.", Pref: 10}}}
	w.host("mx.busy.test", "127.0.0.2")
	w.zones["slow.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.slow.test.", Pref: 10}}}
	w.host("mx.slow.test", "127.0.0.11")
	w.zones["local.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.local.test.", Pref: 10}}}
	w.host("mx.local.test", "127.0.0.12")
	bh := newBlackholes(w, "127.0.0.11:25")
	cfg := w.config()
	cfg.Dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == "127.0.0.12:25" {
			return nil, &net.OpError{Op: "dial", Net: network, Err: os.NewSyscallError("connect", syscall.EADDRNOTAVAIL)}
		}
		return bh.dial(ctx, network, addr)
	}
	s := w.sender(cfg)
	for range 2 {
		checkAll(t, s.Send(ctxT(t), msg("busy.test", "a@busy.test")), classify.StageGreeting, 421, classify.EventNone)
		checkAll(t, s.Send(ctxT(t), msg("local.test", "a@local.test")), classify.StageConnect, 0, classify.EventConnRefused)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		s.Send(ctx, msg("slow.test", "a@slow.test"))
		cancel()
	}
	if busy.Connections() != 2 || bh.dials("127.0.0.11:25") != 2 || s.dead.len() != 0 {
		t.Errorf("greeting 421: %d connections; attempt out of time: %d dials; %d held; want 2, 2, 0",
			busy.Connections(), bh.dials("127.0.0.11:25"), s.dead.len())
	}

	cfg = w.config()
	cfg.DeadAddrHold = -1
	off := w.sender(cfg)
	w.zones["one.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.one.test.", Pref: 10}}}
	w.host("mx.one.test", "127.0.0.20")
	before := len(w.dials())
	off.Send(ctxT(t), msg("one.test", "a@one.test"))
	off.Send(ctxT(t), msg("one.test", "a@one.test"))
	if off.dead != nil || len(w.dials()) != before+2 {
		t.Errorf("DeadAddrHold < 0: dials %v, want two", w.dials()[before:])
	}
}

// TestDeadAddrNotCountedByAddressLimit: held addresses are not dialled,
// so MXAddressLimit does not count them: a host whose first five
// addresses are held is reached on its sixth.
func TestDeadAddrNotCountedByAddressLimit(t *testing.T) {
	w := newWorld(t)
	good := fakemx.Start(t, fakemx.Options{})
	w.route("127.0.0.16", good)
	w.zones["six.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.six.test.", Pref: 10}}}
	w.host("mx.six.test", "127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14", "127.0.0.15", "127.0.0.16")
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("six.test", "a@six.test"))
	checkAll(t, r, classify.StageConnect, 0, classify.EventConnRefused)
	if !strings.Contains(r.Rcpts[0].Outcome.Text, "address limit") {
		t.Fatalf("text %q", r.Rcpts[0].Outcome.Text)
	}
	r = s.Send(ctxT(t), msg("six.test", "b@six.test"))
	checkDelivered(t, r)
	if d := w.dials(); len(d) != 6 || d[5] != "127.0.0.16:25" {
		t.Errorf("dialled %v", d)
	}
}

// TestDeadAddrPerSource: an address held for one egress source is still
// dialled from another.
func TestDeadAddrPerSource(t *testing.T) {
	d := newDeadAddrs(&Config{ConnectTimeout: time.Second, DeadAddrHold: time.Minute, DeadAddrHoldMax: 5 * time.Minute})
	a := &Source{Addr: netip.MustParseAddr("192.0.2.1")}
	b := &Source{Addr: netip.MustParseAddr("192.0.2.2")}
	tk, held := d.claim(deadKey(a, "198.51.100.1:25"))
	if held != nil {
		t.Fatal("held before any failure")
	}
	if m, _ := tk.done(dialDead, classify.EventTimeout, "mx", "198.51.100.1:25", "i/o timeout"); m == nil {
		t.Fatal("not marked")
	}
	if _, held := d.claim(deadKey(a, "198.51.100.1:25")); held == nil {
		t.Error("not held for the source that failed")
	}
	if _, held := d.claim(deadKey(b, "198.51.100.1:25")); held != nil {
		t.Error("held for another source")
	}
	if _, held := d.claim(deadKey(nil, "198.51.100.1:25")); held != nil {
		t.Error("held for the default source")
	}
}

// TestDeadAddrBounded: the memory keeps at most deadAddrMax addresses,
// and forgets those whose hold ended long ago.
func TestDeadAddrBounded(t *testing.T) {
	clk := newTestClock()
	d := newDeadAddrs(&Config{ConnectTimeout: time.Second, DeadAddrHold: time.Minute, DeadAddrHoldMax: 5 * time.Minute})
	d.now = clk.now
	mark := func(addr string) {
		tk, _ := d.claim(addr)
		tk.done(dialDead, classify.EventTimeout, "mx", addr, "i/o timeout")
	}
	for i := range deadAddrMax + 100 {
		mark(fmt.Sprintf("10.%d.%d.%d:25", i>>16, i>>8&255, i&255))
	}
	if n := d.len(); n != deadAddrMax {
		t.Fatalf("%d addresses remembered, want %d", n, deadAddrMax)
	}
	if _, held := d.claim("10.0.0.0:25"); held != nil {
		t.Error("the oldest was kept past the cap")
	}
	clk.add(time.Minute + 5*time.Minute + time.Second)
	mark("192.0.2.1:25")
	if n := d.len(); n != 1 {
		t.Errorf("%d addresses remembered long after their holds, want 1", n)
	}
}
