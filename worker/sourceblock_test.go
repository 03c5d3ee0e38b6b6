package worker

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// blockedSourceSender stands for a destination whose MX refuses one of
// outflow's addresses as blocklisted at RCPT, and takes the others' mail
// (to the fake MX).
type blockedSourceSender struct {
	next    Sender
	blocked map[string]bool
	// keepSource hands the others' mail on with its source (to a
	// v4OnlySender), not to the fake MX through the relay.
	keepSource bool
	mu         sync.Mutex
	from       []string
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
	if s.keepSource {
		return s.next.Send(ctx, m)
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

// blockGate is doneGate that keeps suspensions as the throttle does for a
// reply about the source: the address is suspended for the destination
// from then on (SourceSuspended; admission is not refused, the test sees
// what the worker decides).
type blockGate struct {
	doneGate
	blocked sync.Map // source -> true
}

type blockPermit struct {
	donePermit
	g *blockGate
}

func (p blockPermit) Done(rs []classify.Result) {
	for _, r := range rs {
		if r.Scope == classify.ScopeSource {
			p.g.blocked.Store(p.src, true)
		}
	}
	p.donePermit.Done(rs)
}

func (g *blockGate) Admit(_ context.Context, _, _, source string) (throttle.Permit, throttle.Refusal) {
	return blockPermit{donePermit{&g.doneGate, source}, g}, throttle.Refusal{}
}

func (g *blockGate) SourceBlocked(_, source string) bool {
	_, ok := g.blocked.Load(source)
	return ok
}

// TestBlockedEverywhereBounces: a block of the sending address is deferred
// only while the tenant has another address the destination may take:
// one not suspended there (here both addresses are listed: the second
// block bounces), and one of a family the destination has MX addresses of
// (an IPv6 address for an IPv4-only destination is none). Deferred with
// no such address, the message went from block to suspension until
// max-age, a day, where a tenant with one address bounces at once.
func TestBlockedEverywhereBounces(t *testing.T) {
	t.Run("both listed", func(t *testing.T) {
		e := newEnv(t, nil)
		eg, err := sender.NewEgress([]sender.EgressEntry{
			{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.2")}},
			{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.3")}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		snd := &blockedSourceSender{next: e.snd, blocked: map[string]bool{"127.0.0.2": true, "127.0.0.3": true}}
		gate := &blockGate{doneGate: doneGate{done: map[string][][]classify.Result{}}}
		e.startPool(func(c *Config) { c.Workers, c.Egress, c.Sender, c.Gate = 1, eg, snd, gate })
		id := e.submit("bob@blocks.test")
		e.waitEvent(id, queue.EventBounced)
		if evs := e.events(id); countPrefix(evs, queue.EventDeferred) != 1 {
			t.Errorf("events %v: want one deferral (to the other address), then the bounce", evs)
		}
		if got := snd.sources(); len(got) != 2 || got[0] == got[1] {
			t.Errorf("sources tried %v: want each address once", got)
		}
	})
	t.Run("the other of a family the destination lacks", func(t *testing.T) {
		e := newEnv(t, nil)
		eg, err := sender.NewEgress([]sender.EgressEntry{
			{Source: sender.Source{Addr: netip.MustParseAddr("2001:db8::1")}},
			{Source: sender.Source{Addr: netip.MustParseAddr("127.0.0.2")}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		snd := &blockedSourceSender{next: &v4OnlySender{next: e.snd}, blocked: map[string]bool{"127.0.0.2": true}, keepSource: true}
		gate := &blockGate{doneGate: doneGate{done: map[string][][]classify.Result{}}}
		e.startPool(func(c *Config) { c.Workers, c.Egress, c.Sender, c.Gate = 1, eg, snd, gate })
		id := e.submit("bob@v4only.test")
		e.waitEvent(id, queue.EventBounced)
		if evs := e.events(id); countPrefix(evs, queue.EventDeferred) != 0 {
			t.Errorf("events %v: want the bounce at once: the IPv6 address cannot reach the destination", evs)
		}
	})
}

// suspendedGate refuses every admission as suspended, with a detail.
type suspendedGate struct{ throttle.OpenGate }

func (suspendedGate) Admit(context.Context, string, string, string) (throttle.Permit, throttle.Refusal) {
	return nil, throttle.Refusal{Until: time.Now().Add(time.Hour), Reason: "suspended",
		Detail: "blocks.test@127.0.0.2: source blocked (source-blocked): " + blockReply}
}

// blockReply is the reply that suspended suspendedGate's pair: an attempt
// of another message, perhaps another tenant's, whose envelope it quotes.
const blockReply = "554 5.7.1 listed; from=<orders@b.example> to=<vip@blocks.test>"

// suspendedAfterGate admits the first attempt, then refuses as
// suspendedGate does.
type suspendedAfterGate struct {
	suspendedGate
	admitted atomic.Bool
}

func (g *suspendedAfterGate) Admit(ctx context.Context, d, t, s string) (throttle.Permit, throttle.Refusal) {
	if g.admitted.CompareAndSwap(false, true) {
		return g.OpenGate.Admit(ctx, d, t, s)
	}
	return g.suspendedGate.Admit(ctx, d, t, s)
}

// suspendedThenRateGate refuses the first attempt for a suspension that
// ends at once, then every later one for a turn at the rate an hour ahead.
type suspendedThenRateGate struct {
	throttle.OpenGate
	refused atomic.Int32
}

func (g *suspendedThenRateGate) Admit(context.Context, string, string, string) (throttle.Permit, throttle.Refusal) {
	if g.refused.Add(1) == 1 {
		return nil, throttle.Refusal{Until: time.Now().Add(100 * time.Millisecond), Reason: "suspended",
			Detail: "blocks.test: suspended by an operator"}
	}
	return nil, throttle.Refusal{Until: time.Now().Add(time.Hour), Reason: "rate"}
}

// waitFound waits until the stored message id meets cond, and returns it.
func (e *env) waitFound(id, what string, cond func(*queue.Item) bool) *queue.Item {
	e.t.Helper()
	var it *queue.Item
	waitUntil(e.t, what, func() bool {
		found, err := e.q.Find(context.Background(), id)
		if err == nil && cond(found) {
			it = found
			return true
		}
		return false
	})
	return it
}

// TestSuspendedMessageSaysWhy: a message held by a suspension before any
// attempt shows the suspension as its last reply (queue list, the
// console), where it showed a deferral with no reply at all, and the
// application hears of it in a deferred event. One that was tried keeps
// the reply of its last attempt; once the suspension has ended, the
// untried message no longer shows it. What the tenant reads names the
// suspension, not the reply that set it: that reply answered another
// message, and quoted its sender and recipient to every tenant whose mail
// the suspension held (the log's detail keeps it for the operator).
func TestSuspendedMessageSaysWhy(t *testing.T) {
	t.Run("suspension ended", func(t *testing.T) {
		e := newEnv(t, nil)
		gate := &suspendedThenRateGate{}
		e.startPool(func(c *Config) { c.Workers, c.Gate = 1, gate })
		id := e.submit("bob@blocks.test")
		e.waitEvent(id, queue.EventDeferred)
		it := e.waitFound(id, "the rate's refusal after the suspension", func(it *queue.Item) bool {
			return gate.refused.Load() >= 2 && it.NextAt.After(time.Now().Add(30*time.Minute))
		})
		if it.Env.LastClass != "" || it.Env.LastReply != "" {
			t.Fatalf("after the suspension: last class %q, reply %q, want none", it.Env.LastClass, it.Env.LastReply)
		}
		if n := countPrefix(e.events(id), queue.EventDeferred); n != 1 {
			t.Fatalf("deferred events %d, want 1 (the suspension's only): %v", n, e.events(id))
		}
	})
	t.Run("tried before", func(t *testing.T) {
		e := newEnv(t, func(stage fakemx.Stage, _ string) *smtp.SMTPError {
			if stage == fakemx.StageRcpt {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
			}
			return nil
		})
		gate := &suspendedAfterGate{}
		e.startPool(func(c *Config) { c.Workers, c.Gate = 1, gate })
		id := e.submit("bob@blocks.test")
		e.waitEvent(id, queue.EventDeferred)
		// The retry (fastRetry: within a second or two) is refused.
		it := e.waitFound(id, "the retry rescheduled by the refusal", func(it *queue.Item) bool {
			return it.Env.Attempt == 1 && it.NextAt.After(time.Now().Add(30*time.Minute))
		})
		if it.Env.LastClass != "transient" || !strings.Contains(it.Env.LastReply, "try again later") {
			t.Fatalf("after the refusal: last class %q, reply %q, want the attempt's", it.Env.LastClass, it.Env.LastReply)
		}
	})

	e := newEnv(t, nil)
	var logs syncBuf
	e.startPool(func(c *Config) { c.Workers, c.Gate, c.Logger = 1, suspendedGate{}, zerolog.New(&logs) })
	id := e.submit("bob@blocks.test")
	it := e.waitFound(id, "a last reply on the held message", func(it *queue.Item) bool { return it.Env.LastReply != "" })
	const public = "suspended: blocks.test@127.0.0.2: source blocked (source-blocked)"
	if it.Env.LastClass != "local" || it.Env.LastReply != public {
		t.Fatalf("last class %q, reply %q, want %q", it.Env.LastClass, it.Env.LastReply, public)
	}
	evs := e.waitEvent(id, queue.EventDeferred)
	if !strings.Contains(logs.String(), `"detail":"blocks.test@127.0.0.2: source blocked (source-blocked): `+blockReply) {
		t.Fatalf("the refusal's log line lacks the reply for the operator:\n%s", logs.String())
	}
	for _, ev := range evs {
		if ev.Type == queue.EventDeferred {
			if ev.Reason != public ||
				ev.Attempt != 0 || len(ev.Recipients) != 1 || ev.Recipients[0] != "bob@blocks.test" {
				t.Fatalf("the suspension's deferred event: %+v", ev)
			}
		}
	}
}
