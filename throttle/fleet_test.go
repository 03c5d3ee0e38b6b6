package throttle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/testutil"
)

// grantAll admits dest on every worker until each refuses, and returns
// the permits granted (the fleet's attempts in flight) and the reasons
// of the refusals.
func grantAll(t *testing.T, dest string, ths ...*Throttle) ([]Permit, []string) {
	t.Helper()
	var ps []Permit
	var why []string
	for _, th := range ths {
		for {
			p, r := th.Admit(ctxT(t), dest, "", "")
			if p == nil {
				why = append(why, r.Reason)
				break
			}
			ps = append(ps, p)
			if len(ps) > 50 {
				t.Fatalf("%s: more than 50 admitted", dest)
			}
		}
	}
	return ps, why
}

func doneAll(ps []Permit, res classify.Result) {
	for _, p := range ps {
		p.Done([]classify.Result{res})
	}
}

// TestConnsLimitHeldFleetWide: a fleet connection limit is the fleet's,
// whatever the number of workers. Each worker held ceil(conns/live), at
// least one, before: 1 connection gave 3 with three workers, 4 gave 6.
func TestConnsLimitHeldFleetWide(t *testing.T) {
	for _, conns := range []int{1, 3, 4} {
		t.Run(fmt.Sprint(conns), func(t *testing.T) {
			env := startKV(t)
			var ths []*Throttle
			for _, id := range []string{"a", "b", "c"} {
				ths = append(ths, newThrottle(t, env, id, func(c *Config) { c.Defaults.Conns = conns; c.LearnInitial = -1 }))
			}
			waitLive(t, 3, ths...)
			ps, why := grantAll(t, "c.test", ths...)
			if len(ps) != conns {
				t.Fatalf("fleet granted %d connections at once, want %d", len(ps), conns)
			}
			shares := 0
			for _, th := range ths {
				shares += th.Snapshot("c.test").WorkerConns
			}
			if shares != conns {
				t.Fatalf("workers' shares add up to %d, want %d", shares, conns)
			}
			for _, r := range why {
				if r != "conns" {
					t.Fatalf("refused for %q, want conns", r)
				}
			}
			// A connection given back is taken again, by its worker.
			doneAll(ps, resDelivered)
			if ps, _ = grantAll(t, "c.test", ths...); len(ps) != conns {
				t.Fatalf("after Done: fleet granted %d, want %d", len(ps), conns)
			}
			doneAll(ps, resDelivered)
		})
	}
}

// TestLearnedConnsFloorFleetWide: a learned connection limit of one holds
// the fleet to one connection. Each worker took one at least before, so
// a provider allowing one got three, and the learner cut "from 1 to 1"
// for good.
func TestLearnedConnsFloorFleetWide(t *testing.T) {
	env := startKV(t)
	var ths []*Throttle
	for _, id := range []string{"a", "b", "c"} {
		ths = append(ths, newThrottle(t, env, id, func(c *Config) { c.LearnInitial = -1 }))
	}
	waitLive(t, 3, ths...)
	// Learned two connections; the hold of that cut is over.
	if _, _, _, _, err := updateState(ctxT(t), env.state, "k.test", "a", func(s *DestState, now time.Time) bool {
		s.LearnedConns, s.LearnedSince, s.LearnedCutAt = 2, now, now
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for _, th := range ths {
		eventually(t, 5*time.Second, "learned 2 seen", func() bool { return th.Snapshot("k.test").FleetConns == 2 })
	}
	ps, _ := grantAll(t, "k.test", ths...)
	if len(ps) != 2 {
		t.Fatalf("fleet granted %d connections under a learned 2", len(ps))
	}
	// The provider allows one: the second is "too many connections".
	ps[1].Done([]classify.Result{resConn})
	for _, th := range ths {
		eventually(t, 5*time.Second, "cut to 1 seen", func() bool { return th.Snapshot("k.test").FleetConns == 1 })
	}
	ps[0].Done([]classify.Result{resDelivered})
	// The worker that met the throttle opens nothing in the refused
	// attempt's place for connsRetry (connPaused).
	time.Sleep(connsRetry)
	for round := range 3 {
		ps, _ = grantAll(t, "k.test", ths...)
		if len(ps) != 1 {
			t.Fatalf("round %d: fleet granted %d connections under a learned 1", round, len(ps))
		}
		doneAll(ps, resDelivered)
	}
}

// TestFirstWindowHeldFleetWide: the first-contact window is LearnInitial
// attempts in flight for the fleet, not one per worker at least; a worker
// with no share opens once another's attempts were delivered.
func TestFirstWindowHeldFleetWide(t *testing.T) {
	env := startKV(t)
	var ths []*Throttle
	for _, id := range []string{"a", "b", "c"} {
		ths = append(ths, newThrottle(t, env, id, func(c *Config) { c.Heartbeat = 50 * time.Millisecond })) // LearnInitial 2
	}
	waitLive(t, 3, ths...)
	var none *Throttle
	var ps []Permit
	for _, th := range ths {
		got, why := grantAll(t, "w.test", th)
		if why[0] != "window" {
			t.Fatalf("%s refused for %q, want window", th.cfg.WorkerID, why[0])
		}
		if len(got) == 0 {
			none = th
		}
		ps = append(ps, got...)
	}
	if len(ps) != DefaultLearnInitial || none == nil {
		t.Fatalf("fleet granted %d at first contact, want %d (one worker none)", len(ps), DefaultLearnInitial)
	}
	doneAll(ps, resDelivered)
	eventually(t, 5*time.Second, "the worker without a share opens after the others' deliveries", func() bool {
		p, _ := none.Admit(ctxT(t), "w.test", "", "")
		if p != nil {
			p.Done([]classify.Result{resDelivered})
		}
		return p != nil
	})
}

// TestSameWorkerIDCountsTwice: two processes with one worker id (two
// containers that are both PID 1 on a host network, a config copied with
// its worker-id) are two live workers, each with half the rate. They
// wrote one registry key before, and each sent at the whole rate.
func TestSameWorkerIDCountsTwice(t *testing.T) {
	env := startKV(t)
	mod := func(c *Config) {
		c.Defaults = Limits{Rate: 10, Conns: 2}
		c.Heartbeat = 100 * time.Millisecond
		c.WorkerTTL = 600 * time.Millisecond
	}
	a := newThrottle(t, env, "outflow", mod)
	b := newThrottle(t, env, "outflow", mod)
	waitLive(t, 2, a, b)
	for _, th := range []*Throttle{a, b} {
		if s := th.Snapshot("x.test"); s.WorkerRate != 5 || s.WorkerConns != 1 {
			t.Fatalf("worker rate %v, conns %d; want 5 and 1", s.WorkerRate, s.WorkerConns)
		}
	}
	ws, err := ListWorkers(ctxT(t), env.registry)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID != "outflow" || ws[1].ID != "outflow" || ws[0].Instance == ws[1].Instance {
		t.Fatalf("registry lists %+v, want two workers \"outflow\" with their instances", ws)
	}
	// A crashed one's record expires as any other's, and a clean stop
	// deletes only its own.
	_ = b.shutdown(false)
	eventually(t, 5*time.Second, "the crashed twin forgotten", func() bool { return a.Live() == 1 })
	c := newThrottle(t, env, "outflow", mod)
	waitLive(t, 2, a, c)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the stopped twin forgotten", func() bool { return a.Live() == 1 })
	if s := a.Snapshot("x.test"); s.WorkerRate != 10 {
		t.Fatalf("alone again: worker rate %v, want 10", s.WorkerRate)
	}
}

// failingKV fails the writes of a state bucket while down, as a KV whose
// stream leader is being elected answers; failed is signalled at each.
type failingKV struct {
	jetstream.KeyValue
	down   atomic.Bool
	failed chan struct{}
}

var errNoLeader = errors.New("nats: no responders available for request")

func (f *failingKV) fail() error {
	select {
	case f.failed <- struct{}{}:
	default:
	}
	return errNoLeader
}

func (f *failingKV) Update(ctx context.Context, k string, v []byte, rev uint64) (uint64, error) {
	if f.down.Load() {
		return 0, f.fail()
	}
	return f.KeyValue.Update(ctx, k, v, rev)
}

func (f *failingKV) Create(ctx context.Context, k string, v []byte, o ...jetstream.KVCreateOpt) (uint64, error) {
	if f.down.Load() {
		return 0, f.fail()
	}
	return f.KeyValue.Create(ctx, k, v, o...)
}

// TestFailedCutWrittenWhenKVBack: a cut whose write failed is written when
// the bucket takes writes again, and every worker slows. It was logged and
// dropped before: the worker that cut did not cut again for DecreaseFor,
// and no other worker ever saw it.
func TestFailedCutWrittenWhenKVBack(t *testing.T) {
	env := startKV(t)
	fk := &failingKV{KeyValue: env.state, failed: make(chan struct{}, 1)}
	mod := func(c *Config) { c.Defaults.Rate = 20; c.NoLearn = true }
	a := newThrottle(t, env, "a", func(c *Config) { mod(c); c.State = fk })
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)
	attempt(t, b, "x.test", resDelivered)
	fk.down.Store(true)
	attempt(t, a, "x.test", resThrottled)
	select {
	case <-fk.failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the cut's write was never tried")
	}
	if f := b.Snapshot("x.test").Factor; f != 1 {
		t.Fatalf("B's factor %v while the bucket failed writes", f)
	}
	fk.down.Store(false)
	eventually(t, 10*time.Second, "B sees the cut", func() bool { return b.Snapshot("x.test").Factor == DefaultDecreaseFactor })
	st, err := GetState(ctxT(t), env.state, "x.test")
	if err != nil || st.Factor != DefaultDecreaseFactor || st.UpdatedBy != "a" {
		t.Fatalf("stored %+v, %v; want A's cut", st, err)
	}
	if f := a.Snapshot("x.test").Factor; f != DefaultDecreaseFactor {
		t.Fatalf("A's factor %v, want %v", f, DefaultDecreaseFactor)
	}
}

// TestOperatorChangeLoggedAtInfo: an operator's change to a destination's
// state is in every daemon's log at Info (when it came, who made it);
// another worker's stays at Debug, its writer having logged it.
func TestOperatorChangeLoggedAtInfo(t *testing.T) {
	env := startKV(t)
	var buf testutil.SyncBuffer
	a := newThrottle(t, env, "a", func(c *Config) {
		c.Defaults.Rate = 20
		c.Logger = zerolog.New(&buf).Level(zerolog.InfoLevel)
	})
	b := newThrottle(t, env, "b", func(c *Config) { c.Defaults.Rate = 20 })
	waitLive(t, 2, a, b)

	// Another worker's cut: its writer's line, none here at Info.
	attempt(t, b, "x.test", resThrottled)
	eventually(t, 5*time.Second, "A sees B's cut", func() bool { return a.Snapshot("x.test").Factor < 1 })

	until := time.Now().Add(time.Hour)
	if err := Suspend(ctxT(t), env.state, "x.test", until, "provider incident", "admin:ops@host"); err != nil {
		t.Fatal(err)
	}
	var line map[string]any
	eventually(t, 5*time.Second, "the suspension logged at Info", func() bool {
		for l := range strings.Lines(buf.String()) {
			var m map[string]any
			if json.Unmarshal([]byte(l), &m) == nil && m["message"] == "observed destination state change" {
				line = m
				return true
			}
		}
		return false
	})
	if line["level"] != "info" || line["by"] != "admin:ops@host" || line["dest"] != "x.test" ||
		line["suspended"] != true || line["reason"] != "provider incident" {
		t.Fatalf("logged %v", line)
	}
	if n := strings.Count(buf.String(), "observed destination state change"); n != 1 {
		t.Fatalf("%d lines at Info, want only the operator's:\n%s", n, buf.String())
	}
	if _, err := Resume(ctxT(t), env.state, "x.test", "console:s1(t1)"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the console's resume logged", func() bool {
		return strings.Contains(buf.String(), `"by":"console:s1(t1)"`)
	})
}

// TestStaleBreakerOpenNotRetriedAfterClose: a breaker-open whose write
// failed, and waits to be tried again, is out of date once the probe's
// success has closed the breaker: tried again, it reopened a healthy
// destination for the whole fleet for a cooldown. The window watched is
// longer than the retry's longest wait (opRetryMax), so the retry is due
// inside it.
func TestStaleBreakerOpenNotRetriedAfterClose(t *testing.T) {
	env := startKV(t)
	fk := &failingKV{KeyValue: env.state, failed: make(chan struct{}, 1)}
	a := newThrottle(t, env, "a", func(c *Config) {
		c.State = fk
		c.BreakerFailures, c.BreakerCooldown = 1, 200*time.Millisecond
	})
	fk.down.Store(true)
	attempt(t, a, "x.test", resConnFail)
	select {
	case <-fk.failed:
	case <-time.After(10 * time.Second):
		t.Fatal("the breaker-open's write was never tried")
	}
	var probe Permit
	eventually(t, 5*time.Second, "half-open", func() bool {
		probe, _ = a.Admit(ctxT(t), "x.test", "", "")
		return probe != nil
	})
	probe.Done([]classify.Result{resDelivered})
	if s := a.Snapshot("x.test"); s.Breaker != BreakerClosed {
		t.Fatalf("breaker %s after a good probe, want closed", s.Breaker)
	}
	fk.down.Store(false)
	deadline := time.Now().Add(opRetryMax + time.Second)
	for time.Now().Before(deadline) {
		st, err := GetState(ctxT(t), env.state, "x.test")
		if err != nil {
			t.Fatal(err)
		}
		if b := st.BreakerAt(time.Now()); b == BreakerOpen {
			t.Fatalf("stored breaker %s after the probe closed it (the failed open tried again)", b)
		}
		if s := a.Snapshot("x.test"); s.Breaker == BreakerOpen {
			t.Fatalf("A's breaker open again after the probe closed it")
		}
		time.Sleep(50 * time.Millisecond) // a poll of a state that must not change
	}
}
