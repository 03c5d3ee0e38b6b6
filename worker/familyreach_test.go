package worker

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// familySender stands for a destination whose MX hosts have addresses of
// the families in fams, as the sender reports them (Result.MXFamilies):
// an attempt from a source of a family they lack fails before any
// connection (WrongFamily); one from a source in dead fails to connect
// (Unreached, held until heldUntil when that is set); one from a source
// in blocked is refused at RCPT as blocklisted; the others go to the fake
// MX.
type familySender struct {
	next      Sender
	fams      sender.Families
	dead      map[string]bool
	heldUntil time.Time
	blocked   map[string]bool
	mu        sync.Mutex
	from      []string
}

func (s *familySender) Send(ctx context.Context, m *sender.Message) sender.Result {
	src := m.Source.String()
	s.mu.Lock()
	s.from = append(s.from, src)
	s.mu.Unlock()
	fail := func(res sender.Result, in classify.Input) sender.Result {
		for _, r := range m.Rcpts {
			res.Rcpts = append(res.Rcpts, sender.RcptResult{Rcpt: r, Outcome: in})
		}
		return res
	}
	switch {
	case s.fams.Lacks(m.Source.Addr):
		return fail(sender.Result{WrongFamily: true}, classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
			Text: "MX host mx: no address of the family of source " + src})
	case s.dead[src]:
		return fail(sender.Result{Unreached: true, MXFamilies: s.fams, HeldUntil: s.heldUntil},
			classify.Input{Stage: classify.StageConnect, Event: classify.EventConnRefused, Text: "mx ([2001:db8::25]:25): connect: connection refused"})
	case s.blocked[src]:
		return fail(sender.Result{MXFamilies: s.fams}, classify.Input{Stage: classify.StageRcpt, Code: 554, Enhanced: "5.7.1",
			Text: "Service unavailable; Client host [" + src + "] blocked using zen.spamhaus.org"})
	}
	relayed := *m
	relayed.Source = nil // the fake MX is reached through the relay
	return s.next.Send(ctx, &relayed)
}

func (s *familySender) sources() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.from...)
}

// mixedEgress is an egress pool of the given addresses, in that order
// (the round-robin's first attempt takes the first).
func mixedEgress(t *testing.T, addrs ...string) *sender.Egress {
	t.Helper()
	var entries []sender.EgressEntry
	for _, a := range addrs {
		entries = append(entries, sender.EgressEntry{Source: sender.Source{Addr: netip.MustParseAddr(a)}})
	}
	eg, err := sender.NewEgress(entries, nil)
	if err != nil {
		t.Fatal(err)
	}
	return eg
}

// TestBlockOnTheOnlyReachableSourceBounces: a tenant with an IPv4 and an
// IPv6 address sends to a destination whose MX hosts have addresses of
// one family only, from the address of that family first, and that
// address is blocklisted there. The other address cannot reach the
// destination, so the block bounces the message at once, as with one
// address (docs/runbook.md, section 11: "an IPv6 address for an
// IPv4-only domain"). It was deferred for source-block-hold: the other
// family counted as another source until an attempt from it had missed.
// The same for the mirror case, the IPv6 address blocked at an
// IPv6-only destination.
func TestBlockOnTheOnlyReachableSourceBounces(t *testing.T) {
	for _, c := range []struct {
		name           string
		fams           sender.Families
		blocked, other string
	}{
		{"IPv4-only destination", sender.Families{V4: true, Complete: true}, "127.0.0.2", "2001:db8::1"},
		{"IPv6-only destination", sender.Families{V6: true, Complete: true}, "2001:db8::1", "127.0.0.2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			snd := &familySender{next: e.snd, fams: c.fams, blocked: map[string]bool{c.blocked: true}}
			gate := &blockGate{doneGate: doneGate{done: map[string][][]classify.Result{}}}
			e.startPool(func(c2 *Config) {
				c2.Workers, c2.Egress, c2.Sender, c2.Gate = 1, mixedEgress(t, c.blocked, c.other), snd, gate
				c2.Retry.Base, c2.Retry.Min, c2.Retry.Cap = time.Hour, time.Hour, time.Hour // a deferral stays deferred
			})
			id := e.submit("bob@one.test")
			evs := e.waitEvent(id, queue.EventBounced)
			for _, ev := range evs {
				if ev.Type == queue.EventBounced && (ev.Attempt != 1 || !strings.Contains(ev.Reason, "blocked using")) {
					t.Errorf("bounced at attempt %d with %q, want attempt 1 with the block", ev.Attempt, ev.Reason)
				}
			}
			if n := countPrefix(e.events(id), queue.EventDeferred); n != 0 {
				t.Errorf("events %v: deferred, though %s cannot reach the destination", e.events(id), c.other)
			}
			if got := snd.sources(); len(got) != 1 || got[0] != c.blocked {
				t.Errorf("sources tried %v, want %s once", got, c.blocked)
			}
		})
	}
}

// TestUnreachedFamilyGoesOutFromTheOther: a tenant with an IPv6 and an
// IPv4 address sends to a destination whose MX host has both, its IPv6
// address dead. An attempt that drew the IPv6 address, whose every MX
// address of that family failed to connect (or is held after failing),
// goes out from the IPv4 address in the same attempt and is delivered at
// once, with no deferral; the throttle hears the connection failure for
// the IPv6 pair (its breaker counts it) and the delivery for the IPv4
// one. Deferred, one message waited four backoffs in a row for the IPv6
// address, which the same MX host never needed. Without an address of
// the other family on the MX hosts, nothing changes: the failure is the
// attempt's outcome.
func TestUnreachedFamilyGoesOutFromTheOther(t *testing.T) {
	for _, c := range []struct {
		name string
		pool []string
		held bool
		v6   int // messages of the four whose turn of the round-robin gives an IPv6 address
	}{
		{"connect refused", []string{"2001:db8::1", "127.0.0.2"}, false, 2},
		{"every address held", []string{"2001:db8::1", "127.0.0.2"}, true, 2},
		// The round-robin's next address is of the same family: the
		// retry takes one of the other all the same.
		{"two IPv6 addresses", []string{"2001:db8::1", "2001:db8::2", "127.0.0.2"}, false, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, nil)
			snd := &familySender{next: e.snd, fams: sender.Families{V4: true, V6: true, Complete: true},
				dead: map[string]bool{"2001:db8::1": true, "2001:db8::2": true}}
			if c.held {
				snd.heldUntil = time.Now().Add(time.Minute)
			}
			gate := &doneGate{done: map[string][][]classify.Result{}}
			e.startPool(func(cfg *Config) {
				cfg.Workers, cfg.Egress, cfg.Sender, cfg.Gate = 1, mixedEgress(t, c.pool...), snd, gate
				cfg.Retry.Base, cfg.Retry.Min, cfg.Retry.Cap = time.Hour, time.Hour, time.Hour
			})
			var ids []string
			for range 4 {
				ids = append(ids, e.submit("bob@both.test"))
			}
			for _, id := range ids {
				e.waitEvent(id, queue.EventDelivered)
				for _, ev := range e.events(id) {
					if ev != queue.EventQueued && ev != queue.EventDelivered {
						t.Errorf("%s: events %v, want it delivered at its first attempt", id, e.events(id))
						break
					}
				}
			}
			gate.mu.Lock()
			defer gate.mu.Unlock()
			v6 := append(gate.done["2001:db8::1"], gate.done["2001:db8::2"]...)
			if len(v6) == 0 {
				t.Fatalf("sources tried %v: no IPv6 address drawn", snd.sources())
			}
			for _, rs := range v6 {
				if len(rs) != 1 || rs[0].Class != classify.Transient || rs[0].Rule != "connection-refused" {
					t.Errorf("the IPv6 pair's permit finished with %+v, want its connection failure", rs)
				}
			}
			if n := len(gate.done["127.0.0.2"]); n != 4 {
				t.Errorf("%d permits of the IPv4 address finished, want 4 (each message from it)", n)
			}
			// The retry takes no turn of the round-robin: the next
			// message goes on from the address after the failed one, not
			// from it again.
			if len(v6) != c.v6 {
				t.Errorf("sources tried %v: %d attempts drew an IPv6 address, want %d", snd.sources(), len(v6), c.v6)
			}
		})
	}

	t.Run("no address of the other family", func(t *testing.T) {
		e := newEnv(t, nil)
		snd := &familySender{next: e.snd, fams: sender.Families{V6: true, Complete: true}, dead: map[string]bool{"2001:db8::1": true}}
		e.startPool(func(c *Config) {
			c.Workers, c.Egress, c.Sender = 1, mixedEgress(t, "2001:db8::1", "127.0.0.2"), snd
			c.Retry.Base, c.Retry.Min, c.Retry.Cap = time.Hour, time.Hour, time.Hour
		})
		id := e.submit("bob@v6only.test")
		e.waitEvent(id, queue.EventDeferred)
		if got := snd.sources(); len(got) != 1 || got[0] != "2001:db8::1" {
			t.Errorf("sources tried %v, want the IPv6 address only", got)
		}
	})
}

// rateOnlyGate refuses every admission from one source for a turn at the
// rate, and admits the others as doneGate does.
type rateOnlyGate struct {
	doneGate
	refuse string
}

func (g *rateOnlyGate) Admit(ctx context.Context, d, t, source string) (throttle.Permit, throttle.Refusal) {
	if source == g.refuse {
		return nil, throttle.Refusal{Until: time.Now().Add(time.Hour), Reason: "rate"}
	}
	return g.doneGate.Admit(ctx, d, t, source)
}

// TestUnreachedFamilyOtherRefused: when the throttle refuses the other
// family's address, the failure to connect stays the attempt's outcome
// (deferred, as without the retry), reported once for the failed pair.
func TestUnreachedFamilyOtherRefused(t *testing.T) {
	e := newEnv(t, nil)
	snd := &familySender{next: e.snd, fams: sender.Families{V4: true, V6: true, Complete: true}, dead: map[string]bool{"2001:db8::1": true}}
	gate := &rateOnlyGate{doneGate: doneGate{done: map[string][][]classify.Result{}}, refuse: "127.0.0.2"}
	e.startPool(func(c *Config) {
		c.Workers, c.Egress, c.Sender, c.Gate = 1, mixedEgress(t, "2001:db8::1", "127.0.0.2"), snd, gate
		c.Retry.Base, c.Retry.Min, c.Retry.Cap = time.Hour, time.Hour, time.Hour
	})
	id := e.submit("bob@both.test")
	evs := e.waitEvent(id, queue.EventDeferred)
	for _, ev := range evs {
		if ev.Type == queue.EventDeferred && !strings.Contains(ev.Reason, "connection refused") {
			t.Errorf("deferred with %q, want the connection failure", ev.Reason)
		}
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if rs := gate.done["2001:db8::1"]; len(rs) != 1 || len(rs[0]) != 1 || rs[0][0].Rule != "connection-refused" {
		t.Errorf("the IPv6 pair heard %+v, want its connection failure once", rs)
	}
}
