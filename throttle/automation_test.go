package throttle

import (
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

func TestAutoRuleMatch(t *testing.T) {
	rules, err := compileAutoRules([]AutoRule{
		{Name: "pat", Pattern: `^421 4\.7\.28 `, Action: ActionSuspend, For: time.Minute},
		{Name: "rule", Rule: "gmail-", Action: ActionSuspend, For: time.Minute},
		{Name: "both", Rule: "rate-signal", Class: "throttled", Action: ActionConns, Value: 1, For: time.Minute},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	gmail := classify.Result{Class: classify.Throttled, Rule: "gmail-rate-4.7.28", Code: 421, Enhanced: "4.7.28", Text: "Our system has detected an unusual rate"}
	cases := []struct {
		rule int
		res  classify.Result
		want bool
	}{
		{0, gmail, true},
		{0, classify.Result{Code: 451, Enhanced: "4.7.28", Text: "other code"}, false},
		{1, gmail, true},
		{1, classify.Result{Rule: "yahoo-x"}, false},
		{2, classify.Result{Class: classify.Throttled, Rule: "rate-signal"}, true},
		{2, classify.Result{Class: classify.Transient, Rule: "rate-signal"}, false},
		{0, classify.Result{Rule: "local", Code: 421, Enhanced: "4.7.28", Text: "x"}, false},
		{1, classify.Result{Rule: "local-breaker-open"}, false},
	}
	for i, c := range cases {
		if got := rules[c.rule].match(c.res); got != c.want {
			t.Errorf("case %d: rule %s match(%+v) = %v", i, rules[c.rule].Name, c.res, got)
		}
	}
}

func TestAutoRuleValidation(t *testing.T) {
	for _, c := range []struct {
		r    AutoRule
		want string
	}{
		{AutoRule{Name: "x", Pattern: "(", Action: "suspend", For: time.Minute}, `"x": pattern`},
		{AutoRule{Name: "y", Pattern: "a", Action: "explode", For: time.Minute}, `"y": unknown action "explode"`},
		{AutoRule{Name: "z", Pattern: "a", Action: "suspend"}, `"z": for`},
		{AutoRule{Name: "r", Pattern: "a", Action: "rate", For: time.Minute}, `"r": action rate needs value`},
		{AutoRule{Name: "c", Pattern: "a", Action: "conns", Value: 1.5, For: time.Minute}, `"c": action conns`},
		{AutoRule{Name: "e", Action: "suspend", For: time.Minute}, `"e": needs a pattern`},
		{AutoRule{Name: "k", Class: "bogus", Action: "suspend", For: time.Minute}, `"k": class`},
		{AutoRule{Pattern: "a", Action: "suspend", For: time.Minute}, `#1: no name`},
	} {
		_, err := compileAutoRules([]AutoRule{c.r}, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one containing %q", c.r, err, c.want)
		}
	}
}

func TestWindowThreshold(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var w window
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	if w.add(at(0), 3, 10*time.Second) || w.add(at(5), 3, 10*time.Second) {
		t.Fatal("fired before the threshold")
	}
	if w.add(at(20), 3, 10*time.Second) {
		t.Fatal("fired with the first match outside the window")
	}
	if w.add(at(21), 3, 10*time.Second) {
		t.Fatal("fired: 5s is outside the window of 21s")
	}
	if !w.add(at(22), 3, 10*time.Second) {
		t.Fatal("did not fire at 20, 21, 22")
	}
	w.activeUntil = at(100)
	for s := 23.0; s < 30; s++ {
		if w.add(at(s), 3, 10*time.Second) {
			t.Fatal("fired again while the action is active")
		}
	}
}
