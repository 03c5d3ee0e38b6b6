package throttle

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/outflow/outflow/classify"
)

// TestSourceBlockSuspendsThePair: a reply about the source address
// ("blocked using zen.spamhaus.org") suspends that (destination, source)
// pair for source-block-hold, in the shared state and at once here, with
// the reply as the reason; the destination's other addresses, and the
// destination without a source, go on. A second block does not shorten
// the hold, and one with no source (no egress addresses) suspends nothing.
func TestSourceBlockSuspendsThePair(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", func(c *Config) { c.SourceBlockHold = 2 * time.Hour })
	block := classify.Default().Classify(classify.Input{Stage: classify.StageRcpt,
		Raw: "554 5.7.1 Service unavailable; Client host [127.0.0.2] blocked using zen.spamhaus.org"})
	if block.Scope != classify.ScopeSource {
		t.Fatalf("the block is scoped %s", block.Scope)
	}
	// The worker defers such a reply when the tenant has another
	// address; the throttle reads the scope, whatever the class.
	deferred := block
	deferred.Class, deferred.Rule = classify.Transient, block.Rule+"/other-source"

	start := time.Now()
	inFlight := hold(t, th, "example.com", "127.0.0.2") // answered later, below
	if ok, r := admitted(t, th, "example.com", "127.0.0.2", deferred, resDelivered); !ok {
		t.Fatalf("first attempt refused: %+v", r)
	}
	ok, r := admitted(t, th, "example.com", "127.0.0.2")
	if ok || r.Reason != "suspended" {
		t.Fatalf("the blocked pair was not suspended at once: admitted %v, %+v", ok, r)
	}
	if !strings.HasPrefix(r.Detail, "example.com@127.0.0.2: source blocked (source-blocked): 554 5.7.1") {
		t.Errorf("the refusal's detail %q does not say what is suspended and why", r.Detail)
	}
	if p := r.Public(); p != "example.com@127.0.0.2: source blocked (source-blocked)" {
		t.Errorf("the refusal as its tenants read it: %q, want the suspension without the reply that set it", p)
	}
	if ok, r := admitted(t, th, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("the other address was refused: %+v", r)
	}
	st := th.Snapshot("example.com@127.0.0.2")
	if !st.Suspended || !strings.Contains(st.State.Reason, "source-blocked") || !strings.Contains(st.State.Reason, "554 5.7.1 Service unavailable") {
		t.Errorf("snapshot of the pair: suspended %v, reason %q", st.Suspended, st.State.Reason)
	}
	if until := st.State.SuspendedUntil; until.Before(start.Add(2*time.Hour-time.Minute)) || until.After(time.Now().Add(2*time.Hour)) {
		t.Errorf("suspended until %v, want two hours from now", until)
	}
	eventually(t, 5*time.Second, "the suspension in the shared state", func() bool {
		e, err := env.state.Get(ctxT(t), StateKey("example.com@127.0.0.2"))
		return err == nil && strings.Contains(string(e.Value()), "source-blocked")
	})

	// Blocked again, with a shorter hold, on an attempt that was in
	// flight: the hold is not shortened.
	p := hold(t, th, "example.com", "127.0.0.3")
	th.cfg.SourceBlockHold = time.Minute
	inFlight.Done([]classify.Result{block})
	if st := th.Snapshot("example.com@127.0.0.2"); !st.State.SuspendedUntil.After(time.Now().Add(time.Hour)) {
		t.Errorf("the pair's hold was shortened by a second block: until %v", st.State.SuspendedUntil)
	}
	p.Done([]classify.Result{block})
	if st := th.Snapshot("example.com@127.0.0.3"); !st.Suspended {
		t.Error("a block of the second address did not suspend it")
	}
	if !th.SourceBlocked("example.com", "127.0.0.3") {
		t.Error("SourceBlocked(example.com, 127.0.0.3) = false after its block")
	}

	// Without egress addresses the name carries no source: the reply
	// bounces its mail, and the destination is not suspended.
	if ok, r := admitted(t, th, "plain.test", "", block); !ok {
		t.Fatalf("refused: %+v", r)
	}
	if ok, r := admitted(t, th, "plain.test", "", resDelivered); !ok {
		t.Fatalf("a block without a source suspended the destination: %+v", r)
	}
}

// TestSourceBlockIsNoFailure: replies about the source neither open the
// pair's breaker nor count as its answers; the suspension deals with them.
func TestSourceBlockIsNoFailure(t *testing.T) {
	block := classify.Result{Class: classify.Permanent, Scope: classify.ScopeSource, Rule: "source-blocked", Code: 554}
	o := outcomeOf([]classify.Result{block, block})
	if !o.sourceBlocked || o.failed || o.reached || o.answered || o.blockWhy.Rule != "source-blocked" {
		t.Errorf("outcome %+v", o)
	}
	for _, text := range []string{strings.Repeat("é", 200), "x" + strings.Repeat("é", 200)} {
		got := replyLine(classify.Result{Code: 550, Enhanced: "5.7.1", Text: text})
		if len(got) > maxReasonReply+len("…") || !strings.HasPrefix(got, "550 5.7.1 ") || !strings.HasSuffix(got, "é…") || !utf8.ValidString(got) {
			t.Errorf("replyLine cut to %q", got)
		}
	}
}

// TestSourceBlockInAGroupHoldsTheDomainOnly: one domain of a provider
// group refuses an address as blocked (a Microsoft 365 customer's own
// block list): that domain is suspended from that address, and neither
// the group from it (its other domains' mail) nor the domain from other
// addresses. Suspending the group's pair held a tenant's mail to every
// domain the provider hosts for an hour. SourceBlocked says which.
func TestSourceBlockInAGroupHoldsTheDomainOnly(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
	})
	if g := th.Group("a.test"); g != "google" {
		t.Fatalf("Group(a.test) = %q", g)
	}
	block := classify.Result{Class: classify.Transient, Scope: classify.ScopeSource, Rule: "source-blocked/other-source", Code: 550,
		Enhanced: "5.7.1", Text: "Service unavailable, Client host [127.0.0.2] blocked using Customer Block list (AS16012607)"}
	if ok, r := admitted(t, th, "a.test", "127.0.0.2", block); !ok {
		t.Fatalf("refused: %+v", r)
	}
	if ok, r := admitted(t, th, "a.test", "127.0.0.2"); ok || r.Reason != "suspended" {
		t.Fatalf("a.test from the blocked address: admitted %v, %+v; want suspended", ok, r)
	}
	if !th.SourceBlocked("a.test", "127.0.0.2") {
		t.Error("SourceBlocked(a.test, 127.0.0.2) = false")
	}
	for _, c := range []struct{ domain, source string }{{"b.test", "127.0.0.2"}, {"a.test", "127.0.0.3"}} {
		if ok, r := admitted(t, th, c.domain, c.source, resDelivered); !ok {
			t.Errorf("%s from %s refused: %+v", c.domain, c.source, r)
		}
		if th.SourceBlocked(c.domain, c.source) {
			t.Errorf("SourceBlocked(%s, %s) = true", c.domain, c.source)
		}
	}
	if st := th.Snapshot("google@127.0.0.2"); st.Suspended {
		t.Errorf("the group's pair was suspended: %+v", st.State)
	}
	if st := th.Snapshot("a.test@127.0.0.2"); !st.Suspended || !strings.Contains(st.State.Reason, "Customer Block list") {
		t.Errorf("a.test@127.0.0.2: suspended %v, reason %q", st.Suspended, st.State.Reason)
	}
}

// TestOtherSuspensionsAreNoBlock: SourceBlocked is true only for a
// suspension a reply about the source wrote. An automation rule's 15
// minutes after throttles, or an operator's suspension, end and the
// address is taken again: a block of another address then defers the
// message to it rather than bounce it.
func TestOtherSuspensionsAreNoBlock(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	until := time.Now().Add(15 * time.Minute)
	for name, reason := range map[string]string{
		"gmail.com@127.0.0.2": "automation: gmail-unusual-rate",
		"gmail.com@127.0.0.3": "provider blocks 127.0.0.3; delisting requested",
		"gmail.com":           "source blocked (source-blocked): but of the whole destination",
	} {
		if err := Suspend(ctxT(t), env.state, name, until, reason, "ops"); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "the suspensions seen", func() bool {
		return th.Snapshot("gmail.com@127.0.0.2").Suspended && th.Snapshot("gmail.com@127.0.0.3").Suspended && th.Snapshot("gmail.com").Suspended
	})
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		if th.SourceBlocked("gmail.com", src) {
			t.Errorf("SourceBlocked(gmail.com, %s) = true for a suspension that is not a source block", src)
		}
	}
}

// TestRefusalPublic: what a held message's tenant reads of a refusal
// leaves out the reply quoted by a source block's suspension (another
// message's), and only that: other suspensions' details stay whole.
func TestRefusalPublic(t *testing.T) {
	for detail, want := range map[string]string{
		"a.test@192.0.2.1: source blocked (source-listed): 550 5.7.1 from=<x@b.example>": "a.test@192.0.2.1: source blocked (source-listed)",
		"a.test@192.0.2.1: source blocked (source-listed): 550 a): b":                    "a.test@192.0.2.1: source blocked (source-listed)",
		"a.test: suspended by an operator":                                               "a.test: suspended by an operator",
		"a.test for tenant t: automation: slow-down":                                     "a.test for tenant t: automation: slow-down",
		"": "",
	} {
		if got := (Refusal{Reason: "suspended", Detail: detail}).Public(); got != want {
			t.Errorf("Public of %q = %q, want %q", detail, got, want)
		}
	}
}
