package sender

import (
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestCloseIdleClosesOnlyThatDomainsIdleConnections: CloseIdle(domain)
// QUITs the idle pooled connections to the domain's MX host, and leaves
// another domain's idle connection and the domain's own busy one alone,
// which are then used again. (The throttle refused the worker "conns": a
// fleet's connection limit counts deliveries in flight, and an idle socket
// to the provider held one of its slots for the idle timeout, 30 s.)
func TestCloseIdleClosesOnlyThatDomainsIdleConnections(t *testing.T) {
	var (
		holding     atomic.Bool           // a.test's conn 1 waits at its next dot
		held        = make(chan struct{}) // closed when it does
		release     = make(chan struct{}) // ends the wait
		heldOnce    sync.Once
		releaseOnce sync.Once
	)
	pa := startPeer(t, []string{"PIPELINING"}, func(conn int, cmd string) string {
		if conn == 1 && cmd == "." && holding.Load() {
			heldOnce.Do(func() { close(held) })
			<-release
		}
		return ""
	})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	pb := startPeer(t, []string{"PIPELINING"}, func(int, string) string { return "" })
	w := newWorld(t)
	w.zones["a.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.a.test.", Pref: 10}}}
	w.zones["b.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.b.test.", Pref: 10}}}
	w.host("mx.a.test", "127.0.0.2")
	w.host("mx.b.test", "127.0.0.3")
	w.mu.Lock()
	w.routes["127.0.0.2:25"], w.routes["127.0.0.3:25"] = pa.addr(), pb.addr()
	w.mu.Unlock()
	s := w.sender(w.config())

	// a.test's connection 1 is busy in a Send held at its final dot, its
	// connection 2 idle; b.test's connection 1 idle.
	checkDelivered(t, s.Send(ctxT(t), msg("a.test", "bob@a.test")))
	holding.Store(true)
	busy := make(chan Result, 1)
	go func() { busy <- s.Send(ctxT(t), msg("a.test", "carol@a.test")) }()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the held send never reached its final dot")
	}
	checkDelivered(t, s.Send(ctxT(t), msg("a.test", "dave@a.test")))
	checkDelivered(t, s.Send(ctxT(t), msg("b.test", "erin@b.test")))
	if pa.connections() != 2 || pb.connections() != 1 {
		t.Fatalf("connections a=%d b=%d, want 2 and 1", pa.connections(), pb.connections())
	}

	if n := s.CloseIdle("nowhere.test"); n != 0 {
		t.Errorf("CloseIdle of a domain never sent to closed %d", n)
	}
	if n := s.CloseIdle("A.test."); n != 1 {
		t.Fatalf("CloseIdle(a.test) closed %d connections, want 1 (the idle one)", n)
	}
	eventually(t, "QUIT on a.test's idle connection", func() bool {
		return slices.Contains(pa.commands(), "2: QUIT")
	})
	if n := s.CloseIdle("a.test"); n != 0 {
		t.Errorf("a second CloseIdle(a.test) closed %d, want 0", n)
	}

	holding.Store(false)
	releaseOnce.Do(func() { close(release) })
	checkDelivered(t, <-busy)
	// The busy connection went back to the pool, b.test's stayed there.
	if r := s.Send(ctxT(t), msg("a.test", "frank@a.test")); !r.Reused {
		t.Error("a.test's busy connection was not kept")
	}
	if r := s.Send(ctxT(t), msg("b.test", "gina@b.test")); !r.Reused {
		t.Error("b.test's idle connection did not survive CloseIdle(a.test)")
	}
	for _, c := range append(pa.commands(), pb.commands()...) {
		if c == "1: QUIT" {
			t.Errorf("a connection CloseIdle(a.test) had to leave alone got QUIT: a %q b %q", pa.commands(), pb.commands())
		}
	}
	if pa.connections() != 2 || pb.connections() != 1 {
		t.Errorf("connections a=%d b=%d, want 2 and 1", pa.connections(), pb.connections())
	}
}

// TestCloseIdleThroughRelayDoesNothing: through a relay every destination
// shares the relay's connections, which hold no slot at any destination's
// provider; one destination at its share closes none of them.
func TestCloseIdleThroughRelayDoesNothing(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{})
	cfg.RelayUsername, cfg.RelayTLS = "", RelayNoTLS
	s := w.sender(cfg)
	checkDelivered(t, s.Send(ctxT(t), msg("a.test", "bob@a.test")))
	if n := s.CloseIdle("a.test"); n != 0 {
		t.Fatalf("CloseIdle through the relay closed %d connections", n)
	}
	if r := s.Send(ctxT(t), msg("a.test", "carol@a.test")); !r.Reused || fake.Connections() != 1 {
		t.Errorf("reused %v, %d connections; want the relay connection kept", r.Reused, fake.Connections())
	}
}

// TestPoolDestsBounded: the domains noted for CloseIdle are forgotten once
// every connection they put back has expired (reap), and never grow past
// maxDests however many domains are sent to within the idle timeout.
func TestPoolDestsBounded(t *testing.T) {
	p := newPool(0, -1, time.Minute)
	now := time.Now()
	for i := range maxDests + 100 {
		p.noteDest(fmt.Sprintf("d%d.test", i), "mx:h", now)
		if len(p.dests) > maxDests {
			t.Fatalf("%d domains noted, over maxDests", len(p.dests))
		}
	}
	if len(p.dests) > maxDests*3/4+100 {
		t.Errorf("%d domains noted; at maxDests they were not pruned to three quarters", len(p.dests))
	}
	p.noteDest("fresh.test", "mx:h", now.Add(2*time.Minute))
	p.reap(now.Add(2 * time.Minute))
	if len(p.dests) != 1 || p.dests["fresh.test"] == nil {
		t.Errorf("%d domains left after the reap, want fresh.test alone", len(p.dests))
	}
	for i := range maxDestKeys + 3 {
		p.noteDest("fresh.test", fmt.Sprintf("mx:h%d", i), now)
	}
	if keys := p.dests["fresh.test"].keys; len(keys) != maxDestKeys || keys[len(keys)-1] != fmt.Sprintf("mx:h%d", maxDestKeys+2) {
		t.Errorf("keys %q, want the last %d", keys, maxDestKeys)
	}
}
