package worker

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// panickySender panics on its first panics calls, then delegates.
type panickySender struct {
	Sender
	panics   atomic.Int32
	panicked chan struct{} // closed at the first panic
}

func newPanickySender(s Sender, n int32) *panickySender {
	p := &panickySender{Sender: s, panicked: make(chan struct{})}
	p.panics.Store(n)
	return p
}

func (p *panickySender) Send(ctx context.Context, m *sender.Message) sender.Result {
	if left := p.panics.Add(-1); left >= 0 {
		if left == 0 {
			close(p.panicked)
		}
		panic("sender bug")
	}
	return p.Sender.Send(ctx, m)
}

// throttleConfig is a throttle config for worker w-test on e's queue: its
// shared state and registry buckets opened.
func throttleConfig(t *testing.T, e *env) throttle.Config {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := throttle.Config{WorkerID: "w-test"}
	var err error
	if c.State, err = throttle.OpenState(ctx, e.q); err != nil {
		t.Fatal(err)
	}
	if c.Registry, err = throttle.OpenRegistry(ctx, e.q); err != nil {
		t.Fatal(err)
	}
	return c
}

// newThrottle starts a throttle on e's buckets with defaults as the
// configured limits of every destination.
func newThrottle(t *testing.T, e *env, defaults throttle.Limits) *throttle.Throttle {
	t.Helper()
	c := throttleConfig(t, e)
	c.Defaults = defaults
	th, err := throttle.New(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = th.Close() })
	return th
}

// TestPanickingSendIsRedelivered: a sender that panics must neither keep
// the envelope's ack alive for ever (it would never be handed out again)
// nor keep the destination's in-flight slot (with a connection limit of
// one, the destination would refuse every later attempt).
func TestPanickingSendIsRedelivered(t *testing.T) {
	e := newEnv(t, nil)
	th := newThrottle(t, e, throttle.Limits{Conns: 1})
	snd := newPanickySender(e.snd, 1)
	e.startPool(func(c *Config) {
		c.Sender, c.Gate = snd, th
		// A heartbeat left running would reset the 2 s ack wait many
		// times over.
		c.ProgressEvery = 50 * time.Millisecond
	})
	defer e.stopPool()
	id := e.submit("r@dest.test")
	select {
	case <-snd.panicked:
	case <-time.After(30 * time.Second):
		t.Fatal("the sender was never called")
	}
	e.waitEvent(id, queue.EventDelivered)
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("%d messages delivered, want 1", n)
	}
	testutil.WaitFor(t, 10*time.Second, "in-flight count back to zero", func() bool {
		return th.Snapshot("dest.test").InFlight == 0
	})
	if st := th.Snapshot("dest.test"); st.Breaker != "closed" {
		t.Fatalf("breaker %s after a panic, want closed (a panic is no signal from the destination)", st.Breaker)
	}
}

// pausingGate admits everything, but its first Admit waits until resume is
// closed: the worker holding that envelope stands still as if its process
// had been stopped, with no heartbeat to keep the ack alive.
type pausingGate struct {
	throttle.OpenGate
	first   atomic.Bool
	paused  chan struct{} // closed when the first Admit starts waiting
	resume  chan struct{}
	resumed chan struct{} // closed when the first Admit returns
}

func newPausingGate() *pausingGate {
	return &pausingGate{paused: make(chan struct{}), resume: make(chan struct{}), resumed: make(chan struct{})}
}

func (g *pausingGate) Admit(ctx context.Context, domain, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if g.first.CompareAndSwap(false, true) {
		close(g.paused)
		defer close(g.resumed)
		select {
		case <-g.resume:
		case <-ctx.Done():
			return nil, throttle.Refusal{Until: time.Now(), Reason: "canceled"}
		}
	}
	return g.OpenGate.Admit(ctx, domain, tenant, source)
}

// startSecondPool runs another worker process's pool on its own connection
// to e's server, until the test ends.
func (e *env) startSecondPool(id string) {
	e.t.Helper()
	q := connect(e.t, e.emb, 2*time.Second)
	p, err := New(Config{WorkerID: id, Workers: 2, Retry: fastRetry, RateLimit: fastRL,
		Budget: backoff.Budget{MaxAttempts: 4, MaxAge: time.Hour}, Queue: q, Sender: e.snd, Logger: zerolog.Nop()})
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx, 5*time.Second) }()
	e.t.Cleanup(func() { cancel(); <-done; q.Close() })
}

// TestResumedWorkerDoesNotResend: a worker that stands still between its
// first SENT check and the send (longer than the ack wait) must look again
// before sending; another worker got the envelope meanwhile and delivered
// it.
//
// Its heartbeat is what stands still here: its process connected with an
// ack wait of a minute, which it gave the consumers at its start and goes
// by (queue.Delivery.AckWait, asked again only once a minute old), and the
// second process's start lowers them to 2 s while the first one waits, so
// the first one's heartbeat (every 15 s) comes too late, as a stopped
// process's would not come at all.
func TestResumedWorkerDoesNotResend(t *testing.T) {
	e := newEnv(t, nil)
	id := e.submit("r@dest.test")
	slow := connect(t, e.emb, time.Minute)
	defer slow.Close()
	gate := newPausingGate()
	var logs syncBuf
	e.startPool(func(c *Config) { c.Queue, c.Gate, c.Workers, c.Logger = slow, gate, 1, zerolog.New(&logs) })
	defer e.stopPool()
	defer func() {
		select {
		case <-gate.resume:
		default:
			close(gate.resume) // a failed test must not leave the worker waiting
		}
	}()
	select {
	case <-gate.paused:
	case <-time.After(30 * time.Second):
		t.Fatal("the first worker never took the envelope")
	}
	// The second worker gets the envelope once the ack wait has passed.
	e.startSecondPool("w-other")
	e.waitEvent(id, queue.EventDelivered)
	close(gate.resume)
	<-gate.resumed
	testutil.WaitFor(t, 30*time.Second, "the resumed worker acknowledges (or sends)", func() bool {
		return strings.Contains(logs.String(), "another worker finished the envelope") || e.mx.Transactions() > 1
	})
	if n := e.mx.Transactions(); n != 1 {
		t.Fatalf("%d SMTP transactions, want 1 (the resumed worker sent again)", n)
	}
	if strings.Contains(logs.String(), "delivery step failed") {
		t.Fatalf("the resumed worker's acknowledgement failed:\n%s", logs.String())
	}
}

// TestPanicEveryTimeIsHeld: a delivery that panics every time is handed
// out panicHold times and then held for an operator, with a held event
// naming the panic, instead of going round for ever; once the fault is
// gone, queue replay delivers it.
func TestPanicEveryTimeIsHeld(t *testing.T) {
	e := newEnv(t, nil)
	snd := newPanickySender(e.snd, 1000)
	e.startPool(func(c *Config) { c.Sender = snd; c.ProgressEvery = 50 * time.Millisecond })
	defer e.stopPool()
	id := e.submit("r@dest.test")
	evs := e.waitEvent(id, queue.EventHeld)
	if last := evs[len(evs)-1]; !strings.Contains(last.Reason, "panicked") || !strings.Contains(last.Reason, "sender bug") {
		t.Fatalf("held event %+v, want the panic", last)
	}
	if calls := 1000 - snd.panics.Load(); calls != panicHold {
		t.Fatalf("the sender was called %d times, want %d", calls, panicHold)
	}
	it, err := e.q.Find(context.Background(), id)
	if err != nil || it.State != queue.StateUnknown {
		t.Fatalf("item %+v, %v: want it held (unknown)", it, err)
	}
	snd.panics.Store(0) // fixed
	if _, err := e.q.Replay(context.Background(), id, nil); err != nil {
		t.Fatal(err)
	}
	e.waitEvent(id, queue.EventDelivered)
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("%d messages delivered, want 1", n)
	}
}

// TestGivenBackThenOnePanicIsNotHeld: an envelope that waited in a busy
// process and was given back unstarted twice (queue's fetchOnce: a nak
// after half the ack wait) comes back with the server's delivery count at
// three or more. Its delivery then panics once while the fleet's panic
// count cannot be kept (here an unreadable counter). Before, the count
// fell back on the hand-outs, three, and the one panic held the envelope
// for an operator; it now counts this process's panics, and the envelope
// is left to be handed out again.
func TestGivenBackThenOnePanicIsNotHeld(t *testing.T) {
	e := newEnv(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id := e.submit("r@dest.test")
	pull, stopPull := context.WithCancel(ctx)
	defer stopPull()
	work, err := e.q.Messages(pull, queue.LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	// Nobody takes it: given back after each half ack wait (1 s).
	testutil.WaitFor(t, 20*time.Second, "two give-backs", func() bool { return e.q.Ops()["given_back"] >= 2 })
	var d *queue.Delivery
	select {
	case d = <-work:
	case <-ctx.Done():
		t.Fatal("the envelope was not handed out again")
	}
	stopPull()
	if d.Env.ID != id || d.Deliveries < panicHold {
		t.Fatalf("%s handed out %d times, want %s after two give-backs", d.Env.ID, d.Deliveries, id)
	}
	// The fleet's counter unreadable: CountPanic fails.
	ci := e.emb.InProcessInfo()
	nc, err := nats.Connect("", nats.InProcessServer(e.emb.Server()), nats.UserInfo(ci.User, ci.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.BucketSent)
	if err != nil {
		t.Fatal(err)
	}
	key := "panics." + d.Env.SentKey() + "." + strconv.FormatInt(d.Env.SubmittedAt.UnixNano(), 10)
	if _, err := kv.Put(ctx, key, []byte("garbled")); err != nil {
		t.Fatal(err)
	}
	if _, err := d.CountPanic(ctx); err == nil {
		t.Fatal("CountPanic kept counting over an unreadable counter")
	}
	p, err := New(Config{WorkerID: "w", Queue: e.q, Sender: newPanickySender(e.snd, 1), Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	(&deliverer{Pool: p, id: "w/0"}).safeHandle(ctx, d)
	it, err := e.q.Find(ctx, id)
	if err != nil || it.State != queue.StateQueued {
		t.Fatalf("after one panic: %+v, %v; want it queued, to be handed out again, not held", it, err)
	}
}
