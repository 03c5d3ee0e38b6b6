package worker

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// blockedSourceSender stands for a destination whose MX refuses one of
// outflow's addresses as blocklisted at RCPT, and takes the others' mail
// (to the fake MX).
type blockedSourceSender struct {
	next    Sender
	blocked map[string]bool
	mu      sync.Mutex
	from    []string
}

func (s *blockedSourceSender) Send(ctx context.Context, m *sender.Message) sender.Result {
	s.mu.Lock()
	s.from = append(s.from, m.Source.String())
	s.mu.Unlock()
	if src := m.Source.String(); s.blocked[src] {
		var res sender.Result
		for _, r := range m.Rcpts {
			res.Rcpts = append(res.Rcpts, sender.RcptResult{Rcpt: r, Outcome: classify.Input{Stage: classify.StageRcpt, Code: 554, Enhanced: "5.7.1",
				Text: "Service unavailable; Client host [" + src + "] blocked using zen.spamhaus.org"}})
		}
		return res
	}
	relayed := *m
	relayed.Source = nil // the fake MX is reached through the relay
	return s.next.Send(ctx, &relayed)
}

func (s *blockedSourceSender) sources() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.from...)
}

// TestBlockedSourceDefersToAnotherAddress: a tenant with two egress
// addresses, one of them blocklisted at the destination. The message first
// sent from the blocked address is deferred, not bounced, and delivered
// from the other on its retry; the throttle hears the refusal as a reply
// about the source (so it can suspend the pair). A tenant whose pool is
// that one (blocked) address has nothing else to send from: its message bounces.
func TestBlockedSourceDefersToAnotherAddress(t *testing.T) {
	e := newEnv(t, nil)
	eg, err := sender.NewEgress([]sender.EgressEntry{
		{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.2")}, Pool: "both"},
		{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.3")}, Pool: "both"},
		{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.4")}, Pool: "one"},
	}, map[string]string{"t1": "both", "t2": "one"})
	if err != nil {
		t.Fatal(err)
	}
	snd := &blockedSourceSender{next: e.snd, blocked: map[string]bool{"127.0.0.2": true, "127.0.0.4": true}}
	gate := &doneGate{done: map[string][][]classify.Result{}}
	e.startPool(func(c *Config) { c.Workers, c.Egress, c.Sender, c.Gate = 1, eg, snd, gate })

	id := e.submit("bob@blocks.test") // tenant t1; the round-robin starts at 127.0.0.2
	evs := e.waitEvent(id, queue.EventDelivered)
	var deferred, bounced int
	for _, ev := range evs {
		switch ev.Type {
		case queue.EventDeferred:
			deferred++
			if !strings.Contains(ev.Reason, "blocked using") {
				t.Errorf("deferral reason %q", ev.Reason)
			}
		case queue.EventBounced, queue.EventDead:
			bounced++
		}
	}
	if deferred != 1 || bounced != 0 {
		t.Errorf("events %v: want one deferral, then the delivery", e.events(id))
	}
	if got := snd.sources(); len(got) != 2 || got[0] != "127.0.0.2" || got[1] != "127.0.0.3" {
		t.Errorf("sources tried %v: want the blocked address, then the other", got)
	}
	gate.mu.Lock()
	var heard []classify.Result
	for _, rs := range gate.done["127.0.0.2"] {
		heard = append(heard, rs...)
	}
	gate.mu.Unlock()
	if len(heard) != 1 || heard[0].Scope != classify.ScopeSource || heard[0].Class != classify.Transient || heard[0].Rule != "source-blocked/other-source" {
		t.Errorf("the throttle heard %+v, want the block as a deferral about the source", heard)
	}

	// One address: nothing else to send from.
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t2", From: "app@src.test", Rcpts: []string{"carol@blocks.test"},
		Body: []byte("Subject: hi\r\nMessage-ID: <y@src.test>\r\n\r\nhello\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	e.waitEvent(ids[0], queue.EventBounced)
	if n := countPrefix(e.events(ids[0]), queue.EventDeferred); n != 0 {
		t.Errorf("the one-address tenant's message was deferred %d times", n)
	}
}
