package throttle

import (
	"sync/atomic"
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

// manualClock is a worker's wall clock that moves only when the test
// moves it, so that whether two admissions fall within a pin's period
// does not depend on how fast the machine runs the test.
type manualClock struct{ ns atomic.Int64 }

func newManualClock() *manualClock {
	c := &manualClock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *manualClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// wholeLevelThrottle is one worker alone (no registry: its share is the
// fleet's), on clk, that never waits for a token (a second admission
// within a pin's period is refused at once, so no timer runs on the real
// clock) and learns nothing (a pair without a rate is not paced, nor
// held to a first-contact window).
func wholeLevelThrottle(t *testing.T, env *kvEnv, clk *manualClock, mod func(*Config)) *Throttle {
	return newThrottle(t, env, "a", func(c *Config) {
		c.Registry = nil
		c.Now = clk.now
		c.MaxWait = -1
		c.NoLearn = true
		if mod != nil {
			mod(c)
		}
	})
}

// stored applies the state stored for name to th at once, as its
// watcher does a moment later (the watcher's copy then changes nothing:
// same revision).
func stored(t *testing.T, env *kvEnv, th *Throttle, name string) {
	t.Helper()
	e, err := env.state.Get(ctxT(t), StateKey(name))
	if err != nil {
		t.Fatalf("state of %s: %v", name, err)
	}
	th.applyState(e, false)
}

// hold admits an attempt from source now or fails the test; the caller
// is done with it.
func hold(t *testing.T, th *Throttle, domain, source string) Permit {
	t.Helper()
	p, r := th.Admit(ctxT(t), domain, "", source)
	if p == nil {
		t.Fatalf("%s from %s refused: %+v", domain, source, r)
	}
	return p
}

// TestWholeDestinationPinCapsEverySource: `dest rate example.com --max 1`
// with two egress addresses holds example.com to 1/s in total, whatever
// address the mail leaves from, and its refusal gives the envelope a
// place at the pin's spacing. Before, admission read each pair's state
// alone: the pin was stored and printed as in force, and each address
// sent at its own pace.
func TestWholeDestinationPinCapsEverySource(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	th := wholeLevelThrottle(t, env, clk, nil)
	if err := SetRate(ctxT(t), env.state, "example.com", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")

	if ok, r := admitted(t, th, "example.com", "127.0.0.2", resDelivered); !ok {
		t.Fatalf("the first send under the pin refused: %+v", r)
	}
	ok, r := admitted(t, th, "example.com", "127.0.0.3", resDelivered)
	if ok || r.Reason != "rate" {
		t.Fatalf("a second send within the pin's second, from the other address: admitted %v, %+v; want refused \"rate\"", ok, r)
	}
	if ahead := r.Until.Sub(clk.now()); ahead != time.Second {
		t.Errorf("its place %v ahead, want the pin's period, 1s", ahead)
	}
	clk.advance(time.Second)
	if ok, r := admitted(t, th, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("a second later, the other address refused: %+v", r)
	}
	if n := ownFlight(th, "example.com"); n != 0 {
		t.Errorf("%d in flight under example.com's pin after every attempt was done or refused", n)
	}

	// Cleared, each address sends at its own pace again.
	if err := SetRate(ctxT(t), env.state, "example.com", 0, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	for _, src := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.2"} {
		if ok, r := admitted(t, th, "example.com", src, resDelivered); !ok {
			t.Fatalf("pin cleared: %s refused: %+v", src, r)
		}
	}
}

// TestWholeDestinationConnsCapEverySource: a connection limit set on the
// destination holds its attempts in flight from every address together;
// each address's own limit still holds for that address.
func TestWholeDestinationConnsCapEverySource(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	th := wholeLevelThrottle(t, env, clk, nil)
	ctx := ctxT(t)
	if err := SetConns(ctx, env.state, "example.com", 2, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := SetConns(ctx, env.state, PairName("example.com", "127.0.0.2"), 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	stored(t, env, th, PairName("example.com", "127.0.0.2"))

	first := hold(t, th, "example.com", "127.0.0.2")
	// The pair's own limit of one: refused by it, and the place taken
	// under the destination's is given back.
	if ok, r := admitted(t, th, "example.com", "127.0.0.2", resDelivered); ok || r.Reason != "conns" {
		t.Fatalf("a second connection from 127.0.0.2 under its own limit of one: admitted %v, %+v; want refused \"conns\"", ok, r)
	}
	second := hold(t, th, "example.com", "127.0.0.3")
	for _, src := range []string{"127.0.0.3", "127.0.0.4"} {
		if ok, r := admitted(t, th, "example.com", src, resDelivered); ok || r.Reason != "conns" {
			t.Errorf("a third connection to example.com, from %s, under its limit of two: admitted %v, %+v; want refused \"conns\"", src, ok, r)
		}
	}
	if n := ownFlight(th, "example.com"); n != 2 {
		t.Errorf("%d in flight under example.com's limit, want the two admitted", n)
	}
	first.Done([]classify.Result{resDelivered})
	third := hold(t, th, "example.com", "127.0.0.4")
	second.Done([]classify.Result{resDelivered})
	third.Done([]classify.Result{resDelivered})
	if n := ownFlight(th, "example.com"); n != 0 {
		t.Errorf("%d in flight under example.com's limit after every attempt was done", n)
	}
}

// TestPairPinUnderTheWholeDestinationsPin: a pin on one address and a pin
// on the whole destination both hold, and the whole destination's token
// taken by an attempt its address's pin then refuses goes to the next
// attempt from another address at once.
func TestPairPinUnderTheWholeDestinationsPin(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	th := wholeLevelThrottle(t, env, clk, nil)
	ctx := ctxT(t)
	if err := SetRate(ctx, env.state, "example.com", 2, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := SetRate(ctx, env.state, PairName("example.com", "127.0.0.2"), 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	stored(t, env, th, PairName("example.com", "127.0.0.2"))

	if ok, r := admitted(t, th, "example.com", "127.0.0.2", resDelivered); !ok {
		t.Fatalf("the first send refused: %+v", r)
	}
	clk.advance(500 * time.Millisecond) // the whole's next token (2/s), not the pair's (1/s)
	ok, r := admitted(t, th, "example.com", "127.0.0.2", resDelivered)
	if ok || r.Reason != "rate" {
		t.Fatalf("127.0.0.2 half a second after its first, pinned at 1/s: admitted %v, %+v; want refused \"rate\"", ok, r)
	}
	if ahead := r.Until.Sub(clk.now()); ahead != 500*time.Millisecond {
		t.Errorf("its place %v ahead, want its pair's next token, 500ms", ahead)
	}
	if ok, r := admitted(t, th, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("127.0.0.3 refused the whole destination's token 127.0.0.2 did not use: %+v", r)
	}
	if ok, r := admitted(t, th, "example.com", "127.0.0.4", resDelivered); ok || r.Reason != "rate" {
		t.Errorf("a third send within half a second, under the whole destination's 2/s: admitted %v, %+v; want refused \"rate\"", ok, r)
	}
}

// TestWholeDestinationSuspensionWithSources: a suspension of the whole
// destination still refuses every address "suspended", before its pin; a
// suspension of one address refuses that one, and gives back the whole
// destination's token it took, so another address sends at once. Resumed,
// the pin holds the total again.
func TestWholeDestinationSuspensionWithSources(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	th := wholeLevelThrottle(t, env, clk, nil)
	ctx := ctxT(t)
	if err := SetRate(ctx, env.state, "example.com", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := Suspend(ctx, env.state, "example.com", time.Now().Add(time.Hour), "all", "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		if ok, r := admitted(t, th, "example.com", src, resDelivered); ok || r.Reason != "suspended" {
			t.Errorf("example.com suspended, from %s: admitted %v, %+v; want refused \"suspended\"", src, ok, r)
		}
	}
	if _, err := Resume(ctx, env.state, "example.com", "ops"); err != nil {
		t.Fatal(err)
	}
	if err := Suspend(ctx, env.state, PairName("example.com", "127.0.0.2"), time.Now().Add(time.Hour), "blocked", "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	stored(t, env, th, PairName("example.com", "127.0.0.2"))

	if ok, r := admitted(t, th, "example.com", "127.0.0.2", resDelivered); ok || r.Reason != "suspended" {
		t.Fatalf("from the suspended address: admitted %v, %+v; want refused \"suspended\"", ok, r)
	}
	if ok, r := admitted(t, th, "example.com", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("the other address refused the pin's token the suspended one did not use: %+v", r)
	}
	if ok, r := admitted(t, th, "example.com", "127.0.0.4", resDelivered); ok || r.Reason != "rate" {
		t.Errorf("a second send within the pin's second: admitted %v, %+v; want refused \"rate\"", ok, r)
	}
}

// TestLevelsOfADomainOfAGroupWithSources: a.test, in google's group,
// sent from egress addresses, meets a.test's own limits first, then
// google's as a whole (on the total of every domain and every address),
// then google@SOURCE's. A later level's refusal gives back what the
// earlier ones took: a.test's token goes to its next attempt.
func TestLevelsOfADomainOfAGroupWithSources(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := wholeLevelThrottle(t, env, clk, func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
	})
	ctx := ctxT(t)
	if err := SetRate(ctx, env.state, "a.test", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	if err := SetConns(ctx, env.state, "google", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "a.test")
	stored(t, env, th, "google")

	b := hold(t, th, "b.test", "127.0.0.2")
	// google's one connection is b.test's: a.test from another address
	// takes a.test's token, is refused by google's limit, and gives the
	// token back.
	if ok, r := admitted(t, th, "a.test", "127.0.0.3", resDelivered); ok || r.Reason != "conns" {
		t.Fatalf("a.test while google's one connection is out: admitted %v, %+v; want refused \"conns\"", ok, r)
	}
	if n := ownFlight(th, "a.test"); n != 0 {
		t.Errorf("a.test: %d in flight after its attempt was refused", n)
	}
	b.Done([]classify.Result{resDelivered})
	if ok, r := admitted(t, th, "a.test", "127.0.0.3", resDelivered); !ok {
		t.Fatalf("a.test refused the token its refused attempt did not use: %+v", r)
	}
	// And a.test's pin holds across addresses and before google's.
	if ok, r := admitted(t, th, "a.test", "127.0.0.2", resDelivered); ok || r.Reason != "rate" {
		t.Errorf("a.test's second send within its pinned second, from the other address: admitted %v, %+v; want refused \"rate\"", ok, r)
	}
	if n := ownFlight(th, "google"); n != 0 {
		t.Errorf("google: %d in flight after every attempt was done or refused", n)
	}
}

// TestPairRecoversAtTheWholeDestinationsPin: a pair that recovers (its
// suspension ends) has the destination's deferred mail released at the
// whole destination's pin when that is under the pair's own rate: the
// mail is admitted under it.
func TestPairRecoversAtTheWholeDestinationsPin(t *testing.T) {
	env := startKV(t)
	clk := newManualClock()
	th := wholeLevelThrottle(t, env, clk, func(c *Config) {
		c.Overrides = map[string]Limits{"example.com": {Rate: 10}}
	})
	pair := th.getDest(PairName("example.com", "127.0.0.2"))
	if got := th.recoverRate(pair, pair.state); got != 10 {
		t.Fatalf("the pair recovers at %v/s without a pin, want its configured 10/s", got)
	}
	if err := SetRate(ctxT(t), env.state, "example.com", 2, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	stored(t, env, th, "example.com")
	if got := th.recoverRate(pair, pair.state); got != 2 {
		t.Errorf("the pair recovers at %v/s under example.com's pin of 2/s, want 2/s", got)
	}
}
