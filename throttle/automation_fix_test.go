package throttle

import (
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// TestRuleThatChangedNothingIsNotHeld: a rule whose firing changes nothing
// (an operator's cap with no end is lower than its rate) does not start
// its hold: once the operator clears the cap, its next match acts. Before,
// the firing held the rule silent for its whole for on that worker.
func TestRuleThatChangedNothingIsNotHeld(t *testing.T) {
	env := startKV(t)
	rule := AutoRule{Name: "slow", Class: "throttled", Threshold: 1, Action: ActionRate, Value: 10, For: time.Hour}
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Automation = []AutoRule{rule}
		c.Defaults.Rate = 100
		c.DecreaseFor = time.Hour
		c.NoLearn = true
	})
	if err := SetRate(ctxT(t), env.state, "nop.test", 5, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the operator's cap seen", func() bool { return a.Snapshot("nop.test").RateSource == "pinned" })
	attempt(t, a, "nop.test", resThrottled) // fires; the cap of 5 stays, nothing changed
	if st, _ := GetState(ctxT(t), env.state, "nop.test"); st.RateOverride != 5 || len(st.Rules) != 0 {
		t.Fatalf("the rule changed an operator's cap with no end: %+v", st)
	}
	if err := SetRate(ctxT(t), env.state, "nop.test", 0, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the cap cleared", func() bool { return a.Snapshot("nop.test").RateSource != "pinned" })
	attempt(t, a, "nop.test", resThrottled)
	eventually(t, 5*time.Second, "the rule acting after the cap was cleared", func() bool {
		st, err := GetState(ctxT(t), env.state, "nop.test")
		return err == nil && st.RateOverride == 10 && st.RateBy == "automation: slow"
	})
}

// TestEditedRuleNotHeldByItsOldVersion: the end a rule's action stored is
// keyed by the rule's definition too, so that a rule edited under the same
// name (and restarted) acts at once rather than wait out its old
// version's for; the plain name older daemons read is written beside it,
// and one they wrote is still read.
func TestEditedRuleNotHeldByItsOldVersion(t *testing.T) {
	env := startKV(t)
	old := AutoRule{Name: "zz", Rule: "zz-", Threshold: 1, Action: ActionSuspend, For: time.Hour}
	edited := AutoRule{Name: "zz", Rule: "zz-", Threshold: 1, Action: ActionRate, Value: 5, For: time.Hour}
	mod := func(r AutoRule) func(c *Config) {
		return func(c *Config) { c.Automation = []AutoRule{r}; c.Defaults.Rate = 100; c.NoLearn = true }
	}
	a := newThrottle(t, env, "a", mod(old))
	zz := classify.Result{Class: classify.Transient, Rule: "zz-stop", Code: 421, Text: "stop"}
	attempt(t, a, "ed.test", zz)
	var st DestState
	eventually(t, 5*time.Second, "suspended by the old version", func() bool {
		st, _ = GetState(ctxT(t), env.state, "ed.test")
		return st.Suspended(time.Now())
	})
	if _, ok := st.Rules["zz"]; !ok || len(st.Rules) != 2 {
		t.Fatalf("rules %v: want the keyed entry and the plain name older daemons read", st.Rules)
	}
	if _, err := Resume(ctxT(t), env.state, "ed.test", "ops"); err != nil {
		t.Fatal(err)
	}
	b := newThrottle(t, env, "b", mod(edited)) // the edited rule, restarted
	eventually(t, 5*time.Second, "B sees the resume", func() bool { return !b.Snapshot("ed.test").Suspended })
	attempt(t, b, "ed.test", zz)
	eventually(t, 5*time.Second, "the edited rule acting", func() bool {
		st, err := GetState(ctxT(t), env.state, "ed.test")
		return err == nil && st.RateOverride == 5
	})

	// An entry an older daemon wrote (the plain name) still holds the rule.
	if _, _, _, _, err := updateStateIn(ctxT(t), env.state, "legacy.test", "old", b.frame(), func(s *DestState, now time.Time) bool {
		s.Rules = map[string]time.Time{"zz": now.Add(time.Hour)}
		return true
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "B sees the legacy entry", func() bool { return len(b.Snapshot("legacy.test").State.Rules) == 1 })
	attempt(t, b, "legacy.test", zz)
	time.Sleep(100 * time.Millisecond)
	if st, _ := GetState(ctxT(t), env.state, "legacy.test"); st.RateOverride != 0 {
		t.Fatalf("a rule in force by an older daemon's entry fired again: %+v", st)
	}
}

// TestTenantScopedReplySuspendsTheTenantOnly: a suspend rule fired by
// replies about one tenant's own mail (classify scope tenant, Gmail's
// 4.7.26) suspends that tenant's part of the destination; other tenants'
// mail goes on. whole-destination = true suspends the destination. A rate
// rule is not counted for such a reply.
func TestTenantScopedReplySuspendsTheTenantOnly(t *testing.T) {
	env := startKV(t)
	auth := AutoRule{Name: "auth", Rule: "gmail-auth", Threshold: 2, Action: ActionSuspend, For: time.Hour}
	whole := AutoRule{Name: "whole", Rule: "acme-", Threshold: 1, Action: ActionSuspend, For: time.Hour, WholeDestination: true}
	slow := AutoRule{Name: "slow", Rule: "gmail-auth", Threshold: 1, Action: ActionRate, Value: 1, For: time.Hour}
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Automation = []AutoRule{auth, whole, slow}
		c.Defaults.Rate = 1000
		c.NoLearn = true
	})
	res := classify.Result{Class: classify.Throttled, Scope: classify.ScopeTenant, Rule: "gmail-auth-rate-limited", Code: 421, Enhanced: "4.7.26", Text: "rate limited"}
	send := func(dest, tenant string, r classify.Result) {
		t.Helper()
		p, ref := a.Admit(ctxT(t), dest, tenant, "")
		if p == nil {
			t.Fatalf("%s for %s refused: %+v", dest, tenant, ref)
		}
		p.Done([]classify.Result{r})
	}
	send("g.test", "t1", res)
	send("g.test", "t2", res) // another tenant's match is not t1's count
	send("g.test", "t1", res)
	if p, r := a.Admit(ctxT(t), "g.test", "t1", ""); p != nil || r.Reason != "suspended" || !strings.Contains(r.Detail, "tenant t1") {
		t.Fatalf("t1 after its 2 matches: %v %+v, want refused as suspended for the tenant", p, r)
	}
	if p, r := a.Admit(ctxT(t), "g.test", "t2", ""); p == nil {
		t.Fatalf("t2 refused for t1's replies: %+v", r)
	} else {
		p.Done(nil)
	}
	var st DestState
	var err error
	eventually(t, 5*time.Second, "t1's hold written", func() bool {
		st, err = GetState(ctxT(t), env.state, "g.test")
		return err != nil || len(st.Tenants) > 0
	})
	if err != nil || st.Suspended(time.Now()) || st.RateOverride != 0 {
		t.Fatalf("the destination suspended or slowed for one tenant's replies: %+v %v", st, err)
	}
	if h, ok := st.TenantSuspended("t1", time.Now()); !ok || h.Reason != "automation: auth" {
		t.Fatalf("tenants %+v: want t1 suspended by the rule", st.Tenants)
	}
	if held, err := Resume(ctxT(t), env.state, "g.test", "ops"); err != nil || !held {
		t.Fatalf("resume: %v %v", held, err)
	}
	eventually(t, 5*time.Second, "t1 resumed", func() bool {
		p, _ := a.Admit(ctxT(t), "g.test", "t1", "")
		if p != nil {
			p.Done(nil)
		}
		return p != nil
	})

	send("w.test", "t1", classify.Result{Class: classify.Throttled, Scope: classify.ScopeTenant, Rule: "acme-quota", Code: 452})
	if p, r := a.Admit(ctxT(t), "w.test", "t2", ""); p != nil || r.Reason != "suspended" {
		t.Fatalf("whole-destination: t2 %v %+v, want the destination suspended", p, r)
	}
}

func TestAutoRuleNamesChecked(t *testing.T) {
	known := map[string]classify.Scope{
		"gmail-auth-rate-limited": classify.ScopeTenant,
		"gmail-rate-4.7.28":       0,
		"yahoo-tss04":             classify.ScopeDestination,
		"rfc3463-permanent":       0,
	}
	ok := []AutoRule{
		{Name: "a", Rule: "gmail-", Action: ActionSuspend, For: time.Minute},
		{Name: "b", Rule: "gmail-auth", Action: ActionSuspend, For: time.Minute},
		{Name: "c", Rule: "rfc3463-permanent/soft-bounce", Action: ActionSuspend, For: time.Minute},
		{Name: "d", Rule: "no-rule", Action: ActionSuspend, For: time.Minute},
		{Name: "e", Rule: "gmail-auth", Action: ActionRate, Value: 1, For: time.Minute, WholeDestination: true},
		{Name: "f", Rule: "gmail-", Action: ActionRate, Value: 1, For: time.Minute}, // matches a destination rule too
	}
	if _, err := compileAutoRules(ok, known); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    AutoRule
		want []string
	}{
		{AutoRule{Name: "typo", Rule: "gmial-auth", Action: ActionSuspend, For: time.Minute},
			[]string{`"typo"`, `"gmial-auth"`, `did you mean "gmail-auth-rate-limited"`}},
		{AutoRule{Name: "yah", Rule: "yahoo-tss4", Action: ActionSuspend, For: time.Minute}, []string{`did you mean "yahoo-tss04"`}},
		{AutoRule{Name: "own", Rule: "local-suspended", Action: ActionSuspend, For: time.Minute}, []string{"never feed automation"}},
		{AutoRule{Name: "tr", Rule: "gmail-auth", Action: ActionRate, Value: 1, For: time.Minute}, []string{"scoped to the tenant", "whole-destination = true"}},
		{AutoRule{Name: "wd", Rule: "yahoo-", Action: ActionSuspend, For: time.Minute, WholeDestination: true}, []string{"whole-destination is for replies scoped to one tenant"}},
	} {
		_, err := compileAutoRules([]AutoRule{c.r}, known)
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %v, want one containing %q", c.r, err, w)
			}
		}
	}
	// Not checked without the classify rules (the config file's own check).
	if _, err := compileAutoRules([]AutoRule{{Name: "typo", Rule: "gmial-auth", Action: ActionSuspend, For: time.Minute}}, nil); err != nil {
		t.Errorf("without known rules: %v", err)
	}
}
