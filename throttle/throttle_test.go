package throttle

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/testutil"
)

// kvEnv is an embedded JetStream server with the two buckets, as `serve`
// creates them.
type kvEnv struct {
	js       jetstream.JetStream
	state    jetstream.KeyValue
	registry jetstream.KeyValue
}

func startKV(t testing.TB) *kvEnv {
	t.Helper()
	js := testutil.StartJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	state, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "outflow_dest", History: 5, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "outflow_workers", TTL: 15 * time.Second, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	return &kvEnv{js: js, state: state, registry: reg}
}

// newThrottle starts a worker on env; mod adjusts its config.
func newThrottle(t testing.TB, env *kvEnv, id string, mod func(*Config)) *Throttle {
	t.Helper()
	cfg := Config{WorkerID: id, State: env.state, Registry: env.registry}
	if mod != nil {
		mod(&cfg)
	}
	th, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", id, err)
	}
	t.Cleanup(func() {
		if err := th.Close(); err != nil {
			t.Errorf("close %s: %v", id, err)
		}
	})
	return th
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	poll := time.NewTicker(2 * time.Millisecond)
	defer poll.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("not within %s: %s", within, what)
		case <-poll.C:
		}
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

var (
	resDelivered = classify.Result{Class: classify.Delivered, Scope: classify.ScopeRecipient, Rule: "accepted", Code: 250}
	resThrottled = classify.Result{Class: classify.Throttled, Scope: classify.ScopeDestination, Rule: "rate-signal", Code: 421, Enhanced: "4.7.0", Text: "Try again later, too many messages"}
	resConnFail  = classify.Result{Class: classify.Transient, Scope: classify.ScopeConnection, Rule: "no-rule", Text: "conn-refused"}
	resLocal     = classify.Result{Class: classify.Transient, Scope: classify.ScopeDestination, Rule: "local", Text: "destination suspended: 4.7.0 too many messages"}
)

// mustAdmit admits or fails the test.
func mustAdmit(t testing.TB, th *Throttle, domain string) Permit {
	t.Helper()
	p, r := th.Admit(ctxT(t), domain, "", "")
	if p == nil {
		t.Fatalf("%s: Admit(%s) refused: %+v", th.cfg.WorkerID, domain, r)
	}
	return p
}

func attempt(t testing.TB, th *Throttle, domain string, res ...classify.Result) {
	t.Helper()
	mustAdmit(t, th, domain).Done(res)
}

func waitLive(t testing.TB, n int, ths ...*Throttle) {
	t.Helper()
	for _, th := range ths {
		eventually(t, 5*time.Second, "live workers", func() bool { return th.Live() == n })
	}
}

func TestThrottleSeenByOneSlowsEveryWorker(t *testing.T) {
	env := startKV(t)
	reg := prometheus.NewRegistry()
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 100; c.Registerer = reg })
	b := newThrottle(t, env, "b", func(c *Config) { c.Defaults.Rate = 100 })
	waitLive(t, 2, a, b)
	if got := b.Snapshot("example.com"); got.FleetRate != 100 || got.WorkerRate != 50 {
		t.Fatalf("before: fleet %v worker %v, want 100 and 50", got.FleetRate, got.WorkerRate)
	}

	attempt(t, a, "example.com", resThrottled)
	if got := a.Snapshot("example.com").FleetRate; got != 50 {
		t.Fatalf("A's own rate after its throttle = %v, want 50 at once", got)
	}
	start := time.Now()
	eventually(t, time.Second, "B follows A's cut within 1s", func() bool {
		s := b.Snapshot("example.com")
		return s.FleetRate == 50 && s.WorkerRate == 25
	})
	t.Logf("B saw the cut after %s", time.Since(start))

	// A second throttle within DecreaseFor does not cut again.
	attempt(t, a, "example.com", resThrottled)
	attempt(t, b, "example.com", resThrottled) // B saw 0.5 already: its cut is from 0.5
	eventually(t, 5*time.Second, "one more cut fleet-wide", func() bool {
		st, err := GetState(ctxT(t), env.state, "example.com")
		return err == nil && st.Factor == 0.25
	})
	eventually(t, 5*time.Second, "metric", func() bool {
		return metricValue(t, a.m.factor.WithLabelValues("example.com")) == 0.25
	})
}

func TestConcurrentCutsDoNotCompound(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 100 })
	b := newThrottle(t, env, "b", func(c *Config) { c.Defaults.Rate = 100 })
	waitLive(t, 2, a, b)
	// Both see the same overload before either sees the other's cut.
	pa, pb := mustAdmit(t, a, "x.test"), mustAdmit(t, b, "x.test")
	pa.Done([]classify.Result{resThrottled})
	pb.Done([]classify.Result{resThrottled})
	deadline := time.Now().Add(2 * time.Second)
	for a.Snapshot("x.test").Factor != 0.5 || b.Snapshot("x.test").Factor != 0.5 {
		if time.Now().After(deadline) {
			st, err := GetState(ctxT(t), env.state, "x.test")
			t.Fatalf("not within 2s: both settle on one cut; a %v, b %v, stored %+v (%v)",
				a.Snapshot("x.test").Factor, b.Snapshot("x.test").Factor, st, err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// A throttled reply to an attempt that went out before another worker's
// cut reached this one does not cut again: the reply belongs to the
// overload that cut already answered. Deterministic form of the race
// TestConcurrentCutsDoNotCompound catches under load.
func TestCutArrivingInFlightIsNotCutAgain(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 100 })
	b := newThrottle(t, env, "b", func(c *Config) { c.Defaults.Rate = 100 })
	waitLive(t, 2, a, b)
	pa := mustAdmit(t, a, "x.test") // sent at the full rate
	attempt(t, b, "x.test", resThrottled)
	eventually(t, 2*time.Second, "a sees b's cut", func() bool { return a.Snapshot("x.test").Factor == 0.5 })
	pa.Done([]classify.Result{resThrottled})
	if got := a.Snapshot("x.test").Factor; got != 0.5 {
		t.Fatalf("a's factor after its in-flight attempt was throttled: %v, want 0.5 (cut once)", got)
	}
	st, err := GetState(ctxT(t), env.state, "x.test")
	if err != nil || st.Factor != 0.5 {
		t.Fatalf("stored factor %v (%v), want 0.5", st.Factor, err)
	}
}

func TestSuspendAndResumeFromOutside(t *testing.T) {
	env := startKV(t)
	var recovered atomic.Int32
	onRecover := func(dest string, rate float64) {
		if dest == "example.com" && rate == 10 {
			recovered.Add(1)
		}
	}
	mod := func(c *Config) { c.Defaults.Rate = 10; c.OnRecover = onRecover }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if err := Suspend(ctxT(t), env.state, "Example.COM", until, "maintenance", "ops"); err != nil {
		t.Fatal(err)
	}
	for _, th := range []*Throttle{a, b} {
		eventually(t, 5*time.Second, "suspension seen", func() bool {
			p, r := th.Admit(ctxT(t), "example.com", "", "")
			if p != nil {
				p.Done(nil)
				return false
			}
			return r.Reason == "suspended" && r.Until.Equal(until)
		})
	}
	st, err := GetState(ctxT(t), env.state, "example.com")
	if err != nil || st.Reason != "maintenance" || st.UpdatedBy != "ops" || !st.SuspendedUntil.Equal(until) {
		t.Fatalf("state = %+v, %v", st, err)
	}

	if held, err := Resume(ctxT(t), env.state, "example.com", "ops"); err != nil || !held {
		t.Fatalf("resume of a suspended destination: %v, %v", held, err)
	}
	if held, err := Resume(ctxT(t), env.state, "never.example", "ops"); err != nil || held {
		t.Fatalf("resume of a destination never suspended: %v, %v; want false", held, err)
	}
	for _, th := range []*Throttle{a, b} {
		eventually(t, 5*time.Second, "resume seen", func() bool {
			p, _ := th.Admit(ctxT(t), "example.com", "", "")
			if p != nil {
				p.Done([]classify.Result{resDelivered})
			}
			return p != nil
		})
	}
	eventually(t, 2*time.Second, "OnRecover fired", func() bool { return recovered.Load() >= 1 })
	eventually(t, 2*time.Second, "recover flag cleared everywhere", func() bool {
		st, err := GetState(ctxT(t), env.state, "example.com")
		return err == nil && !st.Recover && !a.Snapshot("example.com").State.Recover && !b.Snapshot("example.com").State.Recover
	})
	if n := recovered.Load(); n != 1 {
		t.Fatalf("OnRecover fired %d times, want once", n)
	}
}

func TestSuspensionEndsByTimeAndRecoversOnce(t *testing.T) {
	env := startKV(t)
	var recovered atomic.Int32
	mod := func(c *Config) { c.OnRecover = func(string, float64) { recovered.Add(1) } }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	if err := Suspend(ctxT(t), env.state, "short.test", time.Now().Add(300*time.Millisecond), "test", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "suspended", func() bool { return a.Snapshot("short.test").Suspended })
	eventually(t, 3*time.Second, "suspension cleared in KV", func() bool {
		st, err := GetState(ctxT(t), env.state, "short.test")
		return err == nil && st.SuspendedUntil.IsZero()
	})
	eventually(t, 2*time.Second, "OnRecover", func() bool { return recovered.Load() == 1 })
	attempt(t, a, "short.test", resDelivered)
	attempt(t, b, "short.test", resDelivered)
	eventually(t, 5*time.Second, "both see the end", func() bool {
		return a.Snapshot("short.test").State.SuspendedUntil.IsZero() && b.Snapshot("short.test").State.SuspendedUntil.IsZero()
	})
	if n := recovered.Load(); n != 1 {
		t.Fatalf("OnRecover fired %d times, want once", n)
	}
}

// TestWaitingAdmissionMeetsWhatCameMeanwhile: an admission waiting for its
// turn is refused, when it wakes, by a suspension or an open breaker that
// came while it waited, as a new admission would be, and gives its place
// in flight back. Before, it was granted: each below about a second after
// the suspension or the breaker came.
func TestWaitingAdmissionMeetsWhatCameMeanwhile(t *testing.T) {
	type result struct {
		p Permit
		r Refusal
	}
	// waiting admits once (the bucket's token, returned), then starts an
	// admission that waits for its turn a second later.
	waiting := func(t *testing.T, th *Throttle, domain, name string) <-chan result {
		t.Helper()
		mustAdmit(t, th, domain).Done([]classify.Result{resDelivered})
		got := make(chan result, 1)
		go func() {
			p, r := th.Admit(context.Background(), domain, "", "")
			got <- result{p, r}
		}()
		d := th.getDest(name)
		eventually(t, 5*time.Second, "an admission waiting for its turn", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.inflight == 1
		})
		return got
	}
	refused := func(t *testing.T, th *Throttle, got <-chan result, name, reason string, until time.Time) {
		t.Helper()
		res := <-got
		if res.p != nil {
			res.p.Done(nil)
			t.Fatalf("the waiting admission was granted, want refused %q: it came while it waited", reason)
		}
		if res.r.Reason != reason || res.r.Until.Sub(until).Abs() > time.Second {
			t.Fatalf("refused %+v, want %q until %v", res.r, reason, until)
		}
		if n := th.Snapshot(name).InFlight; n != 0 {
			t.Fatalf("%d in flight after the refusal, want 0", n)
		}
	}
	slow := func(c *Config) { c.Defaults.Rate, c.MaxWait = 1, 3*time.Second }

	t.Run("suspension", func(t *testing.T) {
		env := startKV(t)
		a := newThrottle(t, env, "a", slow)
		got := waiting(t, a, "w.test", "w.test")
		until := time.Now().Add(30 * time.Minute)
		if err := Suspend(ctxT(t), env.state, "w.test", until, "stop now", "ops"); err != nil {
			t.Fatal(err)
		}
		refused(t, a, got, "w.test", "suspended", until)
	})
	t.Run("breaker", func(t *testing.T) {
		env := startKV(t)
		a := newThrottle(t, env, "a", func(c *Config) { slow(c); c.BreakerFailures, c.BreakerCooldown = 1, time.Minute })
		p := mustAdmit(t, a, "w.test")
		got := make(chan result, 1)
		go func() {
			p, r := a.Admit(context.Background(), "w.test", "", "")
			got <- result{p, r}
		}()
		d := a.getDest("w.test")
		eventually(t, 5*time.Second, "an admission waiting for its turn", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.inflight == 2
		})
		p.Done([]classify.Result{resConnFail}) // opens the breaker for a minute
		refused(t, a, got, "w.test", "breaker-open", time.Now().Add(time.Minute))
	})
	t.Run("one domain of a group", func(t *testing.T) {
		env := startKV(t)
		res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}}}
		a := newThrottle(t, env, "a", func(c *Config) {
			slow(c)
			c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
			c.Overrides = map[string]Limits{"google": {Rate: 1}}
		})
		got := waiting(t, a, "a.test", "google")
		until := time.Now().Add(30 * time.Minute)
		if err := Suspend(ctxT(t), env.state, "a.test", until, "its owner asked", "ops"); err != nil {
			t.Fatal(err)
		}
		refused(t, a, got, "google", "suspended", until)
	})
}

func TestWorkerShareFollowsRegistry(t *testing.T) {
	env := startKV(t)
	mod := func(c *Config) {
		c.Defaults = Limits{Rate: 100, Conns: 3}
		c.Heartbeat = 100 * time.Millisecond
		c.WorkerTTL = 600 * time.Millisecond
	}
	a := newThrottle(t, env, "a", mod)
	if s := a.Snapshot("x.test"); s.LiveWorkers != 1 || s.WorkerRate != 100 || s.WorkerConns != 3 {
		t.Fatalf("alone: %+v", s)
	}
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)
	if s := a.Snapshot("x.test"); s.WorkerRate != 50 || s.Share != 0.5 {
		t.Fatalf("two workers: %+v", s)
	}
	// The three connections are split 2 and 1, by the workers' places.
	if ca, cb := a.Snapshot("x.test").WorkerConns, b.Snapshot("x.test").WorkerConns; ca+cb != 3 || min(ca, cb) != 1 {
		t.Fatalf("two workers: connection shares %d and %d, want 2 and 1", ca, cb)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "share back after a clean stop", func() bool { return a.Snapshot("x.test").WorkerRate == 100 })

	// A crash leaves the key behind: the worker is dropped when its
	// heartbeat is older than WorkerTTL.
	c := newThrottle(t, env, "c", mod)
	waitLive(t, 2, a)
	_ = c.shutdown(false)
	eventually(t, 3*time.Second, "share back after a crash", func() bool { return a.Live() == 1 })
}

func TestConnsShare(t *testing.T) {
	env := startKV(t)
	mod := func(c *Config) { c.Defaults.Conns = 2 }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)
	p := mustAdmit(t, a, "c.test")
	if q, r := a.Admit(ctxT(t), "c.test", "", ""); q != nil || r.Reason != "conns" {
		t.Fatalf("second connection on A: %v %+v, want refused for conns", q, r)
	}
	attempt(t, b, "c.test", resDelivered) // B has its own share
	p.Done([]classify.Result{resDelivered})
	attempt(t, a, "c.test", resDelivered)
	if n := a.Snapshot("c.test").InFlight; n != 0 {
		t.Fatalf("in flight = %d after Done", n)
	}

	if err := SetConns(ctxT(t), env.state, "c.test", 4, time.Now().Add(time.Hour), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "conns override", func() bool { return a.Snapshot("c.test").WorkerConns == 2 })
}

func TestBreakerOpensHalfOpensAndCloses(t *testing.T) {
	env := startKV(t)
	var recovered atomic.Int32
	mod := func(c *Config) {
		c.BreakerFailures = 3
		c.BreakerCooldown = 300 * time.Millisecond
		c.Defaults.Rate = 1000
		c.OnRecover = func(dest string, rate float64) {
			if dest == "down.test" && rate == 1000 {
				recovered.Add(1)
			}
		}
	}
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)

	// outflow's own signals never count.
	for range 10 {
		attempt(t, a, "down.test", resLocal)
	}
	for range 2 {
		attempt(t, a, "down.test", resConnFail)
	}
	attempt(t, a, "down.test", resDelivered) // an answer resets the run
	for range 2 {
		attempt(t, a, "down.test", resConnFail)
	}
	if s := a.Snapshot("down.test"); s.Breaker != BreakerClosed {
		t.Fatalf("breaker %s before the third consecutive failure", s.Breaker)
	}
	attempt(t, a, "down.test", resConnFail)
	if p, r := a.Admit(ctxT(t), "down.test", "", ""); p != nil || r.Reason != "breaker-open" {
		t.Fatalf("after 3 failures: %v %+v, want breaker-open", p, r)
	}
	eventually(t, 5*time.Second, "B sees the open breaker", func() bool {
		p, r := b.Admit(ctxT(t), "down.test", "", "")
		if p != nil {
			p.Done(nil)
		}
		return p == nil && r.Reason == "breaker-open"
	})

	// After the cooling period, one probe per worker.
	var probeA Permit
	eventually(t, 2*time.Second, "half-open", func() bool {
		probeA, _ = a.Admit(ctxT(t), "down.test", "", "")
		return probeA != nil
	})
	if p, r := a.Admit(ctxT(t), "down.test", "", ""); p != nil || r.Reason != "breaker-half-open" {
		t.Fatalf("second attempt while probing: %v %+v", p, r)
	}
	probeB := mustAdmit(t, b, "down.test")
	if s := b.Snapshot("down.test"); s.Breaker != BreakerHalfOpen {
		t.Fatalf("B breaker = %s, want half-open", s.Breaker)
	}

	probeA.Done([]classify.Result{resDelivered})
	if s := a.Snapshot("down.test"); s.Breaker != BreakerClosed {
		t.Fatalf("A breaker = %s after a good probe", s.Breaker)
	}
	eventually(t, 5*time.Second, "B sees the close", func() bool { return b.Snapshot("down.test").Breaker == BreakerClosed })
	attempt(t, b, "down.test", resDelivered) // B admits again though its probe is out
	probeB.Done([]classify.Result{resDelivered})
	eventually(t, 2*time.Second, "OnRecover", func() bool { return recovered.Load() >= 1 })
	st, err := GetState(ctxT(t), env.state, "down.test")
	if err != nil || st.Breaker != BreakerClosed || st.UpdatedBy != "a" {
		t.Fatalf("state %+v %v", st, err)
	}
	if n := recovered.Load(); n != 1 {
		t.Fatalf("OnRecover fired %d times, want once", n)
	}
}

func TestBreakerProbeFailureReopens(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.BreakerFailures = 1; c.BreakerCooldown = 200 * time.Millisecond })
	attempt(t, a, "down.test", resConnFail)
	var probe Permit
	eventually(t, 2*time.Second, "half-open", func() bool {
		probe, _ = a.Admit(ctxT(t), "down.test", "", "")
		return probe != nil
	})
	probe.Done([]classify.Result{resConnFail})
	if p, r := a.Admit(ctxT(t), "down.test", "", ""); p != nil || r.Reason != "breaker-open" || time.Until(r.Until) < 100*time.Millisecond {
		t.Fatalf("after a failed probe: %v %+v", p, r)
	}
}

func TestAutomationSuspendsAndIgnoresLocalSignals(t *testing.T) {
	env := startKV(t)
	rule := AutoRule{Name: "too-many", Pattern: `4\.7\.0 .*too many`, Threshold: 3, Window: time.Minute, Action: ActionSuspend, For: time.Hour}
	// No learned rate either: its pacing of the throttled attempts below
	// is not what this test is about.
	mod := func(c *Config) { c.Automation = []AutoRule{rule}; c.DecreaseFor = time.Hour; c.NoLearn = true }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)

	// Local signals that match the pattern never count.
	for range 10 {
		attempt(t, a, "local.test", resLocal)
	}
	// Nor does a breaker or suspension refusal logged as local-<reason>.
	for range 5 {
		attempt(t, a, "local.test", classify.Result{Class: classify.Transient, Rule: "local-suspended", Text: "4.7.0 too many"})
	}
	if s := a.Snapshot("local.test"); s.Suspended {
		t.Fatal("local signals suspended the destination")
	}

	attempt(t, a, "auto.test", resThrottled)
	attempt(t, a, "auto.test", resThrottled, resThrottled, resThrottled) // one attempt counts once
	if s := a.Snapshot("auto.test"); s.Suspended {
		t.Fatal("suspended after 2 matching attempts, threshold is 3")
	}
	attempt(t, a, "auto.test", resThrottled)
	if p, r := a.Admit(ctxT(t), "auto.test", "", ""); p != nil || r.Reason != "suspended" {
		t.Fatalf("A after 3 matches: %v %+v", p, r)
	}
	eventually(t, 5*time.Second, "B suspended too", func() bool {
		p, r := b.Admit(ctxT(t), "auto.test", "", "")
		if p != nil {
			p.Done(nil)
		}
		return p == nil && r.Reason == "suspended"
	})
	st, err := GetState(ctxT(t), env.state, "auto.test")
	if err != nil || st.Reason != "automation: too-many" || time.Until(st.SuspendedUntil) < 59*time.Minute {
		t.Fatalf("state %+v %v", st, err)
	}
	if _, err := GetState(ctxT(t), env.state, "local.test"); err != nil {
		t.Fatal(err)
	}
	if e, err := env.state.Get(ctxT(t), StateKey("local.test")); err == nil {
		t.Fatalf("local signals wrote state: %s", e.Value())
	}
}

func TestAutomationRateAction(t *testing.T) {
	env := startKV(t)
	rule := AutoRule{Name: "slow", Rule: "rate-", Class: "throttled", Threshold: 2, Window: time.Minute, Action: ActionRate, Value: 2, For: time.Hour}
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Automation = []AutoRule{rule}
		c.Defaults.Rate = 100
		c.DecreaseFor = time.Hour
	})
	attempt(t, a, "r.test", resThrottled) // cut: 50
	attempt(t, a, "r.test", resThrottled) // rule fires: override 2 × factor 0.5
	eventually(t, 5*time.Second, "override applied", func() bool {
		st, err := GetState(ctxT(t), env.state, "r.test")
		return err == nil && st.RateOverride == 2 && a.Snapshot("r.test").FleetRate == 1
	})
}

func TestAdaptiveRateRampsBack(t *testing.T) {
	env := startKV(t)
	reg := prometheus.NewRegistry()
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 1000
		c.DecreaseFor = 150 * time.Millisecond
		c.IncreaseEvery = 50 * time.Millisecond
		c.IncreaseStep = 0.25
		c.Registerer = reg
	})
	attempt(t, a, "ramp.test", resThrottled)
	if f := a.Snapshot("ramp.test").Factor; f != 0.5 {
		t.Fatalf("factor %v after a throttle", f)
	}
	attempt(t, a, "ramp.test", resDelivered)
	if f := a.Snapshot("ramp.test").Factor; f != 0.5 {
		t.Fatalf("factor %v: ramped before DecreaseFor", f)
	}
	eventually(t, 5*time.Second, "ramped back to 1", func() bool {
		attempt(t, a, "ramp.test", resDelivered)
		return a.Snapshot("ramp.test").Factor == 1
	})
	for range 50 {
		attempt(t, a, "ramp.test", resDelivered)
	}
	if n := metricValue(t, a.m.transitions.WithLabelValues("factor-ramp")); n != 2 {
		t.Fatalf("%v ramp writes, want 2 (0.5 -> 0.75 -> 1)", n)
	}
	if n := metricValue(t, a.m.transitions.WithLabelValues("factor-cut")); n != 1 {
		t.Fatalf("%v cut writes, want 1", n)
	}
}

// TestFactorRuleSlowsALearnedRate: an automation rule's factor slows a
// destination whose rate was learned (nothing configured), as it slows a
// configured one, and ramps back to the learned rate after its for.
// Before, the rule was written and logged, and the learned rate went on
// unchanged.
func TestFactorRuleSlowsALearnedRate(t *testing.T) {
	env := startKV(t)
	rule := AutoRule{Name: "busy", Pattern: "slow down", Action: ActionFactor, Value: 0.5, For: 200 * time.Millisecond}
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Automation = []AutoRule{rule}
		c.IncreaseEvery = 50 * time.Millisecond
		c.IncreaseStep = 0.25
	})
	// A learned 1000/s, as a seed would write it, neither cut nor stepped
	// for the test's length.
	if _, _, _, _, err := updateStateIn(ctxT(t), env.state, "fl.test", "a", a.frame(), func(s *DestState, now time.Time) bool {
		s.LearnedRate, s.LearnedHold, s.LearnedNext, s.LearnedCutAt, s.LearnedSince = 1000, now.Add(time.Hour), now.Add(time.Hour), now, now
		s.regrid(now, 0, 1000)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the learned rate seen", func() bool { return a.Snapshot("fl.test").FleetRate == 1000 })
	busy := classify.Result{Class: classify.Transient, Scope: classify.ScopeRecipient, Rule: "mailbox-busy", Code: 451, Enhanced: "4.2.1", Text: "slow down"}
	attempt(t, a, "fl.test", busy)
	if st := a.Snapshot("fl.test"); st.Factor != 0.5 || st.FleetRate != 500 || st.RateSource != "learned" {
		t.Fatalf("after the factor rule: factor %v, fleet rate %v (%s); want 0.5 of the learned 1000/s", st.Factor, st.FleetRate, st.RateSource)
	}
	eventually(t, 5*time.Second, "ramped back to the learned rate", func() bool {
		attempt(t, a, "fl.test", resDelivered)
		st := a.Snapshot("fl.test")
		return st.Factor == 1 && st.FleetRate == 1000
	})
	if lr := a.Snapshot("fl.test").LearnedRate; lr != 1000 {
		t.Errorf("learned rate %v after the factor ended, want 1000 as it was", lr)
	}
}

// TestPlacesUnderATemporaryRateReachAHorizon: envelopes refused while a
// factor cut (or a pin with an end) holds a configured rate down take
// places only a horizon ahead, and the rest are parked to ask again, as at
// a learned rate: the rate climbs back by itself, and places given at the
// cut's spacing would keep the backlog at it after the ramp. Before, 200
// refusals at 10/s halved had places reaching 40 s ahead, 0.2 s apart,
// whatever the factor did meanwhile.
func TestPlacesUnderATemporaryRateReachAHorizon(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 10
		c.MaxWait = -1 // never wait: every admission past the first is refused for the rate
	})
	furthest := func(dom string) time.Duration {
		var far time.Duration
		for range 200 {
			p, r := a.Admit(ctxT(t), dom, "", "")
			if p != nil {
				p.Done([]classify.Result{resDelivered})
				continue
			}
			if r.Reason != "rate" {
				t.Fatalf("%s refused %+v, want for the rate", dom, r)
			}
			far = max(far, time.Until(r.Until))
		}
		return far
	}
	attempt(t, a, "cut.test", resThrottled) // factor 0.5: 5/s
	if st := a.Snapshot("cut.test"); st.FleetRate != 5 {
		t.Fatalf("fleet rate %v after a throttle, want 5", st.FleetRate)
	}
	if far := furthest("cut.test"); far > 2*parkHorizon+time.Second {
		t.Errorf("factor cut: a place %v ahead, want none beyond two horizons (%v)", far.Round(time.Second), 2*parkHorizon)
	}
	if err := SetRate(ctxT(t), env.state, "pin.test", 5, time.Now().Add(time.Hour), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the pin seen", func() bool { return a.Snapshot("pin.test").FleetRate == 5 })
	if far := furthest("pin.test"); far > 2*parkHorizon+time.Second {
		t.Errorf("pin with an end: a place %v ahead, want none beyond two horizons (%v)", far.Round(time.Second), 2*parkHorizon)
	}
	// A configured rate at its full factor stays: its places are not parked.
	if far := furthest("full.test"); far < 15*time.Second {
		t.Errorf("configured rate: the furthest place %v ahead, want 200 places at 10/s (20 s)", far.Round(time.Second))
	}
}

func TestSetRateFromOutside(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 10 })
	if err := SetRate(ctxT(t), env.state, "s.test", 40, time.Now().Add(time.Hour), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "override", func() bool { return a.Snapshot("s.test").FleetRate == 40 })
	if err := SetRate(ctxT(t), env.state, "s.test", 0, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "back to configured", func() bool { return a.Snapshot("s.test").FleetRate == 10 })
	if err := Suspend(ctxT(t), env.state, "other.test", time.Time{}, "", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "suspended until resumed; refusals look again within the hour", func() bool {
		p, r := a.Admit(ctxT(t), "other.test", "", "")
		if p != nil {
			p.Done(nil)
			return false
		}
		return r.Reason == "suspended" && time.Until(r.Until) > 59*time.Minute && time.Until(r.Until) <= time.Hour
	})
	list, err := ListStates(ctxT(t), env.state)
	if err != nil || len(list) != 2 || list[0].Dest != "other.test" || list[1].Dest != "s.test" || !list[0].SuspendedUntil.Equal(SuspendForever) {
		t.Fatalf("ListStates = %+v, %v", list, err)
	}
	if list[1].Factor != 1 || list[1].Breaker != BreakerClosed {
		t.Fatalf("not normalized: %+v", list[1])
	}
	if err := SetRate(ctxT(t), env.state, "s.test", -1, time.Time{}, "ops"); err == nil {
		t.Fatal("negative rate accepted")
	}
}

// TestAggregateRate checks the bucket math across the fleet: two workers
// admitting as fast as they can grant, together, the configured rate.
func TestAggregateRate(t *testing.T) {
	env := startKV(t)
	const rate = 50.0
	mod := func(c *Config) { c.Defaults.Rate = rate; c.MaxWait = 10 * time.Second }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)

	const window = 2 * time.Second
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(window))
	defer cancel()
	var granted [2]atomic.Int64
	admitUntilDone(ctx, "agg.test", 4, []*Throttle{a, b}, func(i int, at time.Time) {
		if !at.After(start.Add(window)) {
			granted[i].Add(1)
		}
	})
	got := granted[0].Load() + granted[1].Load()
	// Each worker starts with one token, then earns rate/2 per second.
	want := rate*window.Seconds() + 2
	tol := 0.1 * rate * window.Seconds()
	t.Logf("granted %d (a %d, b %d), want %.0f ± %.0f", got, granted[0].Load(), granted[1].Load(), want, tol)
	if d := float64(got) - want; d > tol || d < -tol {
		t.Fatalf("granted %d in %s, want %.0f ± %.0f", got, window, want, tol)
	}
	for i := range granted {
		if n := float64(granted[i].Load()); n < want/2-tol || n > want/2+tol {
			t.Fatalf("worker %d granted %v, want about half", i, n)
		}
	}
}

// TestRateRefusalsComeBackSpaced: refused envelopes are told to come back
// one fleet-rate interval apart, and the worker keeps no token for them
// (they may come back to another worker), so a returning envelope takes
// an ordinary token.
func TestRateRefusalsComeBackSpaced(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 10; c.MaxWait = -1 })
	attempt(t, a, "sp.test", resDelivered) // the first token
	var untils []time.Time
	for range 4 {
		p, r := a.Admit(ctxT(t), "sp.test", "", "")
		if p != nil || r.Reason != "rate" {
			t.Fatalf("want a rate refusal, got %v %+v", p, r)
		}
		untils = append(untils, r.Until)
	}
	for i := 1; i < len(untils); i++ {
		if d := untils[i].Sub(untils[i-1]); d < 99*time.Millisecond || d > 101*time.Millisecond {
			t.Fatalf("refusals %d and %d are %s apart, want 100ms", i-1, i, d)
		}
	}
	if n := a.Snapshot("sp.test").Deferred; n < 3 || n > 5 {
		t.Fatalf("deferred = %d, want about 4", n)
	}
	// Coming back at its time, an envelope is admitted with a fresh token.
	eventually(t, 2*time.Second, "first return due", func() bool { return !time.Now().Before(untils[0]) })
	attempt(t, a, "sp.test", resDelivered)
}

func TestHotPathWritesNothing(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults = Limits{Rate: 1e6, Conns: 100} })
	attempt(t, a, "hot.test", resThrottled) // one transition
	eventually(t, 5*time.Second, "cut written", func() bool {
		_, err := env.state.Get(ctxT(t), StateKey("hot.test"))
		return err == nil
	})
	info := func() uint64 {
		s, err := env.js.Stream(ctxT(t), "KV_outflow_dest")
		if err != nil {
			t.Fatal(err)
		}
		i, err := s.Info(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		return i.State.LastSeq
	}
	before := info()
	for range 2000 {
		attempt(t, a, "hot.test", resDelivered)
		attempt(t, a, "other.test", resDelivered)
	}
	if after := info(); after != before {
		t.Fatalf("hot path wrote %d KV messages", after-before)
	}
}

// BenchmarkAdmitDone is the hot path: Admit, then Done with a delivered
// result, against a real KV (never touched per call).
func BenchmarkAdmitDone(b *testing.B) {
	env := startKV(b)
	for _, bc := range []struct {
		name   string
		limits Limits
	}{
		{"unlimited", Limits{}},
		{"limited", Limits{Rate: 1e9, Conns: 1 << 20}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			th := newThrottle(b, env, "bench-"+bc.name, func(c *Config) { c.Defaults = bc.limits })
			ctx := context.Background()
			res := []classify.Result{resDelivered}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					p, r := th.Admit(ctx, "bench.test", "", "")
					if p == nil {
						b.Errorf("refused: %+v", r)
						return
					}
					p.Done(res)
				}
			})
		})
	}
}

// metricValue reads a gauge's or counter's current value.
func metricValue(t testing.TB, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	switch {
	case d.Gauge != nil:
		return d.Gauge.GetValue()
	case d.Counter != nil:
		return d.Counter.GetValue()
	}
	t.Fatal("not a gauge or counter")
	return 0
}

func TestIdleStateIsForgotten(t *testing.T) {
	env := startKV(t)
	reg := prometheus.NewRegistry()
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 100
		c.Registerer = reg
		c.stateIdleTTL = 300 * time.Millisecond
	})
	if err := SetRate(ctxT(t), env.state, "idle.test", 5, time.Now().Add(400*time.Millisecond), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "metric exported", func() bool { return gathered(t, reg, "idle.test") })
	eventually(t, 5*time.Second, "state deleted after the override ended", func() bool {
		_, err := env.state.Get(ctxT(t), StateKey("idle.test"))
		return err != nil
	})
	eventually(t, 5*time.Second, "metric series dropped", func() bool { return !gathered(t, reg, "idle.test") })
	if s := a.Snapshot("idle.test"); s.FleetRate != 100 {
		t.Fatalf("rate %v", s.FleetRate)
	}
}

// TestForgottenStateLeavesNothing: an idle destination's state goes with
// its history, and the marker that tells the other workers is dropped from
// the stream once they have had the time to see it, so that a bucket does
// not keep every destination ever forgotten and every start read them all
// again. A marker a release before left is dropped too. The bucket's
// configuration is not changed (a release before must still open it).
func TestForgottenStateLeavesNothing(t *testing.T) {
	env := startKV(t)
	ctx := ctxT(t)
	// The old way: states deleted with a marker that stays.
	legacy, again := StateKey("legacy.test"), StateKey("again.test")
	for _, key := range []string{legacy, again} {
		if _, err := env.state.Put(ctx, key, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		if err := env.state.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	st, err := env.js.Stream(ctx, "KV_outflow_dest")
	if err != nil {
		t.Fatal(err)
	}
	cfgBefore, _ := st.Info(ctx)
	th := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 100
		c.StateStream = st
		c.stateIdleTTL = 300 * time.Millisecond
		c.markerTTL, c.markerSweep = time.Second, 200*time.Millisecond
	})
	if err := SetRate(ctx, env.state, "idle.test", 5, time.Now().Add(400*time.Millisecond), "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "idle.test's state applied", func() bool { return th.Snapshot("idle.test").FleetRate == 5 })
	// Kept: a state written again after its key's marker.
	if err := SetRate(ctx, env.state, "again.test", 7, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{StateKey("idle.test"), legacy} {
		eventually(t, 15*time.Second, "nothing left of "+key, func() bool {
			_, err := st.GetLastMsgForSubject(ctx, "$KV.outflow_dest."+key)
			return errors.Is(err, jetstream.ErrMsgNotFound)
		})
	}
	if s, err := GetState(ctx, env.state, "again.test"); err != nil || s.RateOverride != 7 {
		t.Errorf("the state written after its marker: %+v, %v", s, err)
	}
	if info, _ := st.Info(ctx); info.Config.AllowMsgTTL != cfgBefore.Config.AllowMsgTTL || info.Config.SubjectDeleteMarkerTTL != 0 {
		t.Errorf("the bucket's stream was changed: %+v", info.Config)
	}
}

// gathered reports whether any outflow_dest_* series has dest=dest.
func gathered(t testing.TB, reg *prometheus.Registry, dest string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "dest" && l.GetValue() == dest {
					return true
				}
			}
		}
	}
	return false
}

// admitUntilDone runs per goroutines for each of ths, admitting to domain
// and delivering until ctx ends; granted is called with the index of the
// throttle and the time of each grant.
func admitUntilDone(ctx context.Context, domain string, per int, ths []*Throttle, granted func(i int, at time.Time)) {
	var wg sync.WaitGroup
	for i, th := range ths {
		for range per {
			wg.Go(func() {
				for ctx.Err() == nil {
					p, _ := th.Admit(ctx, domain, "", "")
					if p == nil {
						continue
					}
					granted(i, time.Now())
					p.Done([]classify.Result{resDelivered})
				}
			})
		}
	}
	wg.Wait()
}

// TestAutomationNeverSpeedsUp: an automation rule slows a destination down
// for its time and no more. It leaves an operator's pin (until changed)
// as it is, above or below its own value; joins a timed override (the
// lower value until the later end); does nothing where the rate in force
// is already at or under its value; and the same for connections. A
// throttle's cut during a factor rule does not end the rule's hold early.
func TestAutomationNeverSpeedsUp(t *testing.T) {
	env := startKV(t)
	rateRule := AutoRule{Name: "r", Class: "throttled", Threshold: 1, Action: ActionRate, Value: 10, For: 10 * time.Minute}
	connsRule := AutoRule{Name: "c", Class: "throttled", Threshold: 1, Action: ActionConns, Value: 4, For: 10 * time.Minute}
	factorRule := AutoRule{Name: "f", Class: "throttled", Threshold: 1, Action: ActionFactor, Value: 0.5, For: 15 * time.Minute}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.Automation = []AutoRule{rateRule, connsRule, factorRule}
		c.Defaults.Rate = 100
	})
	apply := func(dest string, rule int, set func(s *DestState, now time.Time)) (DestState, time.Time) {
		t.Helper()
		d := th.getDest(dest)
		d.mu.Lock()
		defer d.mu.Unlock()
		now := th.now()
		set(&d.state, now)
		th.automate(d, &th.rules[rule], now)
		return d.state, now
	}
	for _, pin := range []float64{2, 20} {
		s, _ := apply(fmt.Sprintf("pin%v.test", pin), 0, func(s *DestState, _ time.Time) { s.RateOverride = pin })
		if s.RateOverride != pin || !s.RateUntil.IsZero() {
			t.Errorf("operator pin %v: override %v until %v, want it as it was", pin, s.RateOverride, s.RateUntil)
		}
	}
	s, now := apply("timed.test", 0, func(s *DestState, now time.Time) { s.RateOverride, s.RateUntil = 3, now.Add(5*time.Minute) })
	if s.RateOverride != 3 || !s.RateUntil.Equal(now.Add(10*time.Minute)) {
		t.Errorf("timed override 3 for 5m and a rule of 10 for 10m: %v until +%v, want 3 until +10m", s.RateOverride, s.RateUntil.Sub(now))
	}
	s, _ = apply("slow.test", 0, func(s *DestState, now time.Time) {
		s.LearnedRate, s.Grid = 5, []GridSegment{{From: now.Add(-time.Minute), Rate: 5}}
	})
	if _, ok := s.rateOverride(th.now()); ok {
		t.Errorf("a rule of 10/s over a learned 5/s set an override of %v", s.RateOverride)
	}
	s, _ = apply("fast.test", 0, func(*DestState, time.Time) {})
	if s.RateOverride != 10 {
		t.Errorf("a rule of 10/s over a configured 100/s: override %v", s.RateOverride)
	}
	// The throttle that fires a rule has just cut the factor (100/s to
	// 5/s here, for a minute): the rule still holds 10/s for its for.
	s, _ = apply("cut.test", 0, func(s *DestState, now time.Time) { s.Factor, s.FactorUntil = 0.05, now.Add(time.Minute) })
	if s.RateOverride != 10 {
		t.Errorf("a rule of 10/s after a cut of a configured 100/s to 5/s: override %v, want 10", s.RateOverride)
	}
	s, _ = apply("conns.test", 1, func(s *DestState, _ time.Time) { s.ConnsOverride = 2 })
	if s.ConnsOverride != 2 || !s.ConnsUntil.IsZero() {
		t.Errorf("operator's 2 connections: %v until %v after a rule of 4", s.ConnsOverride, s.ConnsUntil)
	}
	d := th.getDest("factor.test")
	d.mu.Lock()
	now = th.now()
	th.automate(d, &th.rules[2], now)
	th.cutFactor(d, now.Add(time.Second), d.state.RateFactor())
	f, until := d.state.RateFactor(), d.state.FactorUntil
	d.mu.Unlock()
	if f != 0.25 || until.Before(now.Add(15*time.Minute)) {
		t.Errorf("a cut during a 15m factor rule: factor %v until +%v, want 0.25 until +15m", f, until.Sub(now))
	}
}

// TestAutomationFiresOnceForTheFleet: a rule fired by one worker is in
// force for every worker until its for ends: another worker counting the
// same replies does not fire it again (which moved its end, wrote a
// second transition and, after an operator's Resume, suspended again).
func TestAutomationFiresOnceForTheFleet(t *testing.T) {
	env := startKV(t)
	rate := AutoRule{Name: "slow", Class: "throttled", Threshold: 1, Window: time.Minute, Action: ActionRate, Value: 50, For: time.Hour}
	stop := AutoRule{Name: "stop", Rule: "zz-", Threshold: 1, Window: time.Minute, Action: ActionSuspend, For: time.Hour}
	regB := prometheus.NewRegistry()
	mod := func(c *Config) {
		c.Automation = []AutoRule{rate, stop}
		c.Defaults.Rate = 1000
		c.DecreaseFor = time.Hour
		c.NoLearn = true
	}
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", func(c *Config) { mod(c); c.Registerer = regB })
	attempt(t, a, "r.test", resThrottled)
	var first DestState
	eventually(t, 5*time.Second, "the override on B", func() bool {
		st, err := GetState(ctxT(t), env.state, "r.test")
		first = st
		return err == nil && st.RateOverride == 50 && b.Snapshot("r.test").FleetRate > 0 && b.Snapshot("r.test").FleetRate <= 50
	})
	attempt(t, b, "r.test", resThrottled)
	attempt(t, b, "r.test", resThrottled)
	st, err := GetState(ctxT(t), env.state, "r.test")
	if err != nil || !st.RateUntil.Equal(first.RateUntil) {
		t.Fatalf("B's matches moved the rule's end from %v to %v (%v)", first.RateUntil, st.RateUntil, err)
	}
	if n := metricValue(t, b.m.transitions.WithLabelValues("rate-override")); n != 0 {
		t.Fatalf("B wrote %v rate-override transitions for a rule in force", n)
	}

	// A suspension an operator lifts stays lifted for the rule's time.
	stopped := classify.Result{Class: classify.Transient, Rule: "zz-stop", Code: 421, Text: "stop"}
	attempt(t, a, "s.test", stopped)
	eventually(t, 5*time.Second, "B suspended", func() bool { return b.Snapshot("s.test").Suspended })
	if _, err := Resume(ctxT(t), env.state, "s.test", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "B resumed", func() bool { return !b.Snapshot("s.test").Suspended })
	attempt(t, b, "s.test", stopped)
	if b.Snapshot("s.test").Suspended {
		t.Fatal("one more match after the operator's Resume suspended again")
	}
	if st, err := GetState(ctxT(t), env.state, "s.test"); err != nil || st.Suspended(time.Now()) {
		t.Fatalf("one more match after the operator's Resume suspended again: %+v, %v", st, err)
	}
}

// TestMarkerDueOnceInAFleet: of the live workers, one drops a given
// marker once markerTTL has passed; the others only at twice that, should
// it still be there.
func TestMarkerDueOnceInAFleet(t *testing.T) {
	th := &Throttle{cfg: Config{markerTTL: time.Hour}}
	at := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, key := range []string{"dest.gmail.com", "dest.yahoo.com", "dest.example.org"} {
		m := marker{seq: 7, at: at}
		owners := 0
		for rank := int64(0); rank < 3; rank++ {
			if th.markerDue(key, m, at.Add(30*time.Minute), 3, rank) {
				t.Errorf("%s: due for rank %d before markerTTL", key, rank)
			}
			if th.markerDue(key, m, at.Add(time.Hour), 3, rank) {
				owners++
			}
			if !th.markerDue(key, m, at.Add(2*time.Hour), 3, rank) {
				t.Errorf("%s: not due for rank %d at twice markerTTL", key, rank)
			}
		}
		if owners != 1 {
			t.Errorf("%s: due for %d workers at markerTTL, want 1", key, owners)
		}
	}
}

// TestFNV32aMatchesHashFNV: place's own FNV-1a is hash/fnv's.
func TestFNV32aMatchesHashFNV(t *testing.T) {
	for _, s := range []string{"", "gmail.com", "xn--bcher-kva.example", "google@192.0.2.10"} {
		h := fnv.New32a()
		_, _ = h.Write([]byte(s))
		if got, want := fnv32a(s), h.Sum32(); got != want {
			t.Errorf("fnv32a(%q) = %#x, want %#x", s, got, want)
		}
	}
}
