package throttle

import (
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

func TestPairName(t *testing.T) {
	if n := PairName("gmail.com", "192.0.2.10"); n != "gmail.com@192.0.2.10" {
		t.Errorf("PairName = %q", n)
	}
	if n := PairName("gmail.com", ""); n != "gmail.com" {
		t.Errorf("PairName without source = %q", n)
	}
	for name, want := range map[string][2]string{
		"gmail.com@192.0.2.10": {"gmail.com", "192.0.2.10"}, "google@2001:db8::1": {"google", "2001:db8::1"}, "gmail.com": {"gmail.com", ""},
	} {
		if d, s := SplitPair(name); d != want[0] || s != want[1] {
			t.Errorf("SplitPair(%q) = %q, %q", name, d, s)
		}
	}
	if k := StateKey(PairName("gmail.com", "2001:db8::1")); DestFromKey(k) != "gmail.com@2001:db8::1" {
		t.Errorf("a pair does not survive its KV key %q", k)
	}
}

// admitted reports whether an attempt from source is admitted now, and
// gives the permit back with res.
func admitted(t *testing.T, th *Throttle, domain, source string, res ...classify.Result) (bool, Refusal) {
	t.Helper()
	p, r := th.Admit(ctxT(t), domain, "", source)
	if p == nil {
		return false, r
	}
	p.Done(res)
	return true, Refusal{}
}

// TestSuspensionPerSource: a suspension of one (destination, source) pair
// stops that address only; one of the destination stops every address.
func TestSuspensionPerSource(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", nil)
	until := time.Now().Add(time.Hour)
	if err := Suspend(ctxT(t), env.state, PairName("example.com", "127.0.0.2"), until, "blocked", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "pair suspension seen", func() bool {
		ok, r := admitted(t, a, "example.com", "127.0.0.2")
		return !ok && r.Reason == "suspended"
	})
	if ok, r := admitted(t, a, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("the other source was refused: %+v", r)
	}
	if ok, _ := admitted(t, a, "example.com", "", resDelivered); !ok {
		t.Fatal("the destination without a source was refused")
	}
	if st := a.Snapshot("example.com@127.0.0.2"); !st.Suspended || st.State.Reason != "blocked" {
		t.Errorf("snapshot of the pair: %+v", st)
	}
	if st := a.Snapshot("example.com@127.0.0.3"); st.Suspended {
		t.Errorf("snapshot of the other pair: %+v", st)
	}

	if err := Suspend(ctxT(t), env.state, "example.com", until, "all", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "destination suspension holds for every source", func() bool {
		ok, r := admitted(t, a, "example.com", "127.0.0.3")
		return !ok && r.Reason == "suspended"
	})
}

// TestThrottlePerSource: throttled replies on one source cut that pair's
// rate and open its breaker, and leave the other source's alone; both
// pairs have the destination's configured limits.
func TestThrottlePerSource(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Overrides = map[string]Limits{"example.com": {Rate: 100}}
		c.BreakerFailures = 3
	})
	for range 5 {
		if ok, _ := admitted(t, a, "example.com", "127.0.0.2", resThrottled); !ok {
			break
		}
	}
	eventually(t, 5*time.Second, "the throttled pair's rate cut", func() bool {
		return a.Snapshot("example.com@127.0.0.2").Factor < 1
	})
	b := a.Snapshot("example.com@127.0.0.3")
	if b.Factor != 1 || b.Limits.Rate != 100 || b.FleetRate != 100 {
		t.Errorf("the other source: factor %v limits %+v fleet %v", b.Factor, b.Limits, b.FleetRate)
	}
	if got := a.Snapshot("example.com@127.0.0.2").Limits.Rate; got != 100 {
		t.Errorf("the pair's configured rate = %v, want the destination's 100", got)
	}
	if ok, r := admitted(t, a, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Errorf("the other source was refused: %+v", r)
	}
	at, _, ok := a.Pace("example.com", "", "127.0.0.2", time.Time{})
	if !ok || at.IsZero() {
		t.Error("PaceSource gave no place for a pair with a rate")
	}
}
