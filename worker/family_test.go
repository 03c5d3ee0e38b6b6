package worker

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// v4OnlySender stands for a destination whose MX hosts have only IPv4
// addresses: an attempt from an IPv6 source fails before any connection
// (sender.Result.WrongFamily); one from an IPv4 source goes to the fake MX.
type v4OnlySender struct {
	next Sender
	mu   sync.Mutex
	from []string // the source of every Send, in order
}

func (s *v4OnlySender) Send(ctx context.Context, m *sender.Message) sender.Result {
	s.mu.Lock()
	s.from = append(s.from, m.Source.String())
	s.mu.Unlock()
	if m.Source.Addr.Is6() {
		res := sender.Result{WrongFamily: true}
		for _, r := range m.Rcpts {
			res.Rcpts = append(res.Rcpts, sender.RcptResult{Rcpt: r, Outcome: classify.Input{Stage: classify.StageDNS,
				Event: classify.EventDNSServFail, Text: "MX host mx: no address of the family of source " + m.Source.String()}})
		}
		return res
	}
	relayed := *m
	relayed.Source = nil // the fake MX is reached through the relay
	return s.next.Send(ctx, &relayed)
}

func (s *v4OnlySender) sources() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.from...)
}

// doneGate is the open gate, recording what each source's permits were
// finished with.
type doneGate struct {
	throttle.OpenGate
	mu   sync.Mutex
	done map[string][][]classify.Result
}

type donePermit struct {
	g   *doneGate
	src string
}

func (p donePermit) Done(rs []classify.Result) {
	p.g.mu.Lock()
	defer p.g.mu.Unlock()
	p.g.done[p.src] = append(p.g.done[p.src], rs)
}

func (donePermit) Limits() throttle.Limits { return throttle.Limits{} }

func (g *doneGate) Admit(_ context.Context, _, _, source string) (throttle.Permit, throttle.Refusal) {
	return donePermit{g, source}, throttle.Refusal{}
}

// TestMixedFamilyEgress gives a tenant an IPv6 and an IPv4 egress address
// and sends to an IPv4-only destination: every message is delivered at its
// first attempt from the IPv4 address, with no deferral; the IPv6 address
// is tried once and then left out for that destination; and its failure is
// not reported to the throttle (no breaker or learned rate hears of it).
func TestMixedFamilyEgress(t *testing.T) {
	e := newEnv(t, nil)
	eg, err := sender.NewEgress([]sender.EgressEntry{
		{Source: sender.Source{Addr: netip.MustParseAddr("2001:db8::1")}},
		{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.2")}},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snd := &v4OnlySender{next: e.snd}
	gate := &doneGate{done: map[string][][]classify.Result{}}
	e.startPool(func(c *Config) { c.Workers, c.Egress, c.Sender, c.Gate = 1, eg, snd, gate })
	var ids []string
	for range 4 {
		ids = append(ids, e.submit("bob@v4only.test"))
	}
	for _, id := range ids {
		e.waitEvent(id, queue.EventDelivered)
		evs, _ := e.q.History(context.Background(), id, time.Time{})
		for _, ev := range evs {
			if ev.Type == queue.EventDelivered && ev.Attempt != 1 {
				t.Errorf("%s delivered at attempt %d, want 1", id, ev.Attempt)
			}
			if ev.Type != queue.EventQueued && ev.Type != queue.EventDelivered {
				t.Errorf("%s: event %s: the wrong family cost the message more than a retry of the send", id, ev.Type)
			}
		}
	}
	if got := snd.sources(); len(got) != 5 || got[0] != "2001:db8::1" || got[1] != "127.0.0.2" {
		t.Errorf("sources tried %v: want the IPv6 address once, then the IPv4 one for all four", got)
	} else {
		for _, s := range got[1:] {
			if s != "127.0.0.2" {
				t.Errorf("sources tried %v: the IPv6 address again after it proved useless", got)
			}
		}
	}
	gate.mu.Lock()
	defer gate.mu.Unlock()
	for _, rs := range gate.done["2001:db8::1"] {
		if rs != nil {
			t.Errorf("the IPv6 address's permit finished with results %v: want none", rs)
		}
	}
	if n := len(gate.done["127.0.0.2"]); n != 4 {
		t.Errorf("%d permits of the IPv4 address finished, want 4", n)
	}
}

// groupGate is the open gate grouping every domain into one provider group.
type groupGate struct{ throttle.OpenGate }

func (groupGate) Group(string) string { return "bigco" }

// TestDeferredEnvelopeCarriesItsGroup: an envelope deferred by a worker
// that groups destinations carries the group it was found in, so that
// `queue list --dest bigco` (and dest status bigco's counts, and the
// runbook's loops) find the group's deferred mail.
func TestDeferredEnvelopeCarriesItsGroup(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	e.startPool(func(c *Config) {
		c.Gate = groupGate{}
		c.Retry.Base, c.Retry.Min, c.Retry.Cap = time.Hour, time.Hour, time.Hour // stays deferred
	})
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDeferred)
	items, err := e.q.List(context.Background(), queue.Filter{State: queue.StateDeferred, Dest: "bigco"})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 || items[0].Env.ID != id || items[0].Env.Group != "bigco" || items[0].Env.Dest != "dest.test" {
		t.Fatalf("deferred mail of group bigco: %+v, want %s", items, id)
	}
}

// TestOneFamilyPoolGetsTheFailure: a tenant whose addresses are all IPv6,
// sending to an IPv4-only destination, gets the DNS failure as a transient
// outcome (deferred), with one admission per attempt, not a second one
// looking for an address it does not have.
func TestOneFamilyPoolGetsTheFailure(t *testing.T) {
	e := newEnv(t, nil)
	eg, err := sender.NewEgress([]sender.EgressEntry{{Source: sender.Source{Addr: netip.MustParseAddr("2001:db8::1")}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	snd := &v4OnlySender{next: e.snd}
	gate := &doneGate{done: map[string][][]classify.Result{}}
	e.startPool(func(c *Config) {
		c.Workers, c.Egress, c.Sender, c.Gate = 1, eg, snd, gate
		c.Retry.Base, c.Retry.Min, c.Retry.Cap = time.Hour, time.Hour, time.Hour
	})
	id := e.submit("bob@v4only.test")
	e.waitEvent(id, queue.EventDeferred)
	gate.mu.Lock()
	defer gate.mu.Unlock()
	if n := len(gate.done["2001:db8::1"]); n != 1 {
		t.Errorf("%d admissions for one attempt, want 1", n)
	}
	if got := snd.sources(); len(got) != 1 {
		t.Errorf("sent %v, want one attempt", got)
	}
}
