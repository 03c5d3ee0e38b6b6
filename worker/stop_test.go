package worker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// stopAckWait is the ack wait of the stop tests: far longer than any of
// their deadlines, so that mail delivered within one came back through a
// give-back, not through the ack wait running out.
const stopAckWait = time.Minute

// soon is how long the stop tests give another process to deliver what a
// stopped one gave back: well inside stopAckWait.
const soon = 10 * time.Second

// newStopEnv is newEnvMX with a queue whose ack wait is stopAckWait.
func newStopEnv(t *testing.T, mx fakemx.Options) *env {
	t.Helper()
	dir := t.TempDir()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, emb: emb, dir: dir}
	t.Cleanup(func() { e.stopPool(); e.emb.Shutdown() })
	e.q = connect(t, emb, stopAckWait)
	t.Cleanup(func() { e.q.Close() })
	e.mx = fakemx.Start(t, mx)
	// Timeouts well past the tests' graces: a send they hold is cut by
	// the grace, not by its own timeout, on a loaded machine too.
	e.snd, err = sender.New(sender.Config{Hostname: "outflow.test", Relay: e.mx.Addr(), RelayTLS: "none",
		FinalDotTimeout: 10 * time.Second, CommandTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.snd.Close() })
	return e
}

// stoppable is a pool run by a stop test: stop cancels its context and
// returns once Run has, logs holds its lines.
type stoppable struct {
	cancel context.CancelFunc
	done   chan struct{}
	logs   *syncBuf
}

// runPool runs a pool on q (with mut applied to its config) until the
// returned pool is stopped, at the latest when the test ends.
func (e *env) runPool(q *queue.Queue, grace time.Duration, mut func(*Config)) *stoppable {
	e.t.Helper()
	s := &stoppable{done: make(chan struct{}), logs: &syncBuf{}}
	cfg := Config{WorkerID: "w-stop", Workers: 1, Retry: fastRetry, RateLimit: fastRL,
		Budget: backoff.Budget{MaxAttempts: 4, MaxAge: time.Hour}, Queue: q, Sender: e.snd, Logger: zerolog.New(s.logs)}
	if mut != nil {
		mut(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { defer close(s.done); _ = p.Run(ctx, grace) }()
	e.t.Cleanup(s.stop)
	return s
}

func (s *stoppable) stop() {
	s.cancel()
	<-s.done
}

// stoppedLine is the pool's line saying what its stop gave back.
func (s *stoppable) stoppedLine(t *testing.T) string {
	t.Helper()
	for l := range strings.Lines(s.logs.String()) {
		if strings.Contains(l, "workers stopped") {
			return l
		}
	}
	t.Fatalf("no line about the stop in\n%s", s.logs.String())
	return ""
}

// blockOnce is a fakemx hook that holds the first session to reach stage
// there until released (or the fake MX closes), and lets every other
// pass.
type blockOnce struct {
	stage   fakemx.Stage
	first   atomic.Bool
	reached chan struct{} // closed when the first session reaches stage
	release chan struct{}
	once    sync.Once
}

func newBlockOnce(t *testing.T, stage fakemx.Stage) *blockOnce {
	b := &blockOnce{stage: stage, reached: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(b.let) // before the fake MX closes, which waits for its hooks
	return b
}

func (b *blockOnce) hook(stage fakemx.Stage, _ string) *smtp.SMTPError {
	if stage == b.stage && b.first.CompareAndSwap(false, true) {
		close(b.reached)
		<-b.release
	}
	return nil
}

func (b *blockOnce) let() { b.once.Do(func() { close(b.release) }) }

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not within 30 s", what)
	}
}

// holdFirstSend holds the first Send until released, then delegates.
type holdFirstSend struct {
	Sender
	first   atomic.Bool
	started chan struct{}
	release chan struct{}
}

func (h *holdFirstSend) Send(ctx context.Context, m *sender.Message) sender.Result {
	if h.first.CompareAndSwap(false, true) {
		close(h.started)
		<-h.release
	}
	return h.Sender.Send(ctx, m)
}

// stopWithOneWaiting runs a pool of one worker busy with the first of
// two envelopes while the second waits fetched in its pull, and stops
// it; the busy worker finishes its delivery within the grace. (With a
// third, the pull may or may not have fetched it by the stop.)
func stopWithOneWaiting(t *testing.T, e *env) *stoppable {
	t.Helper()
	snd := &holdFirstSend{Sender: e.snd, started: make(chan struct{}), release: make(chan struct{})}
	a := e.runPool(e.q, 10*time.Second, func(c *Config) { c.Sender = snd })
	for _, r := range []string{"a@dest.test", "b@dest.test"} {
		e.submit(r)
	}
	waitClosed(t, snd.started, "the first send")
	testutil.WaitFor(t, 15*time.Second, "a second envelope fetched", func() bool { return e.q.Ops()["fetched"] >= 2 })
	a.cancel()
	close(snd.release)
	<-a.done
	return a
}

// saysOneFetchedGivenBack checks a's line about its stop. The pull gives
// the waiting envelope back (fetched_not_taken), or, when the worker,
// free again, takes it in the same instant, the worker does
// (taken_not_sent).
func saysOneFetchedGivenBack(t *testing.T, a *stoppable) {
	t.Helper()
	if l := a.stoppedLine(t); !strings.Contains(l, `"given_back":1`) || !strings.Contains(l, `"cut_before_final_dot":0`) {
		t.Fatalf("stop line %s, want the one fetched envelope given back", l)
	}
}

// TestStopGivesBackFetchedEnvelopes: an envelope a stopping process had
// fetched and not started is given back, and delivered at once by
// another process, or by the same data dir's daemon restarted (embedded
// server and all), not after the ack wait. The restart is what a plain
// nak missed: the server kept "hand it out again" in memory only, and the
// restarted one waited out the ack wait since the fetch.
func TestStopGivesBackFetchedEnvelopes(t *testing.T) {
	t.Run("another process", func(t *testing.T) {
		e := newStopEnv(t, fakemx.Options{})
		a := stopWithOneWaiting(t, e)
		q := connect(t, e.emb, stopAckWait)
		defer q.Close()
		e.runPool(q, 5*time.Second, nil)
		if err := e.mx.WaitForMessages(2, soon); err != nil {
			t.Fatal(err)
		}
		saysOneFetchedGivenBack(t, a)
	})
	t.Run("restart", func(t *testing.T) {
		e := newStopEnv(t, fakemx.Options{})
		a := stopWithOneWaiting(t, e)
		e.q.Close()
		e.emb.Shutdown()
		emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: e.dir})
		if err != nil {
			t.Fatal(err)
		}
		e.emb = emb
		e.q = connect(t, emb, stopAckWait)
		e.runPool(e.q, 5*time.Second, nil)
		if err := e.mx.WaitForMessages(2, soon); err != nil {
			t.Log(a.stoppedLine(t))
			t.Fatal(err)
		}
		saysOneFetchedGivenBack(t, a)
	})
}

// TestStopGivesBackASendCutBeforeItsFinalDot: a send that the end of the
// shutdown grace cuts while it waits for the reply to RCPT (the message
// itself not yet sent) offered the message to no server: the envelope goes back, with no attempt spent,
// and another process delivers it at once. Before, the cut send was
// recorded as a transient failure with the cancelled context, which
// failed, and the envelope waited for the ack wait with no event.
func TestStopGivesBackASendCutBeforeItsFinalDot(t *testing.T) {
	b := newBlockOnce(t, fakemx.StageRcpt)
	// Without CHUNKING: a pipelined BDAT sends the message with its RCPT,
	// and a cut while waiting for the RCPT reply may then come after the
	// server took it (the sender says so: StageDataEnd).
	e := newStopEnv(t, fakemx.Options{Hook: b.hook, HideExtensions: []string{"CHUNKING"}})
	a := e.runPool(e.q, 300*time.Millisecond, nil)
	id := e.submit("r@dest.test")
	waitClosed(t, b.reached, "the first RCPT")
	a.stop()
	b.let()
	q := connect(t, e.emb, stopAckWait)
	defer q.Close()
	e.runPool(q, 5*time.Second, nil)
	if err := e.mx.WaitForMessages(1, soon); err != nil {
		t.Fatal(err)
	}
	evs := e.waitEvent(id, queue.EventDelivered)
	if last := evs[len(evs)-1]; last.Attempt != 1 || countPrefix(e.events(id), queue.EventDeferred) != 0 {
		t.Fatalf("events %v, delivered at attempt %d: want delivered at the first attempt, nothing deferred", e.events(id), last.Attempt)
	}
	if l := a.stoppedLine(t); !strings.Contains(l, `"cut_before_final_dot":1`) || !strings.Contains(l, `"given_back":1`) {
		t.Fatalf("stop line %s, want the cut send given back", l)
	}
}

// stopGate's first admission waits until its context ends, as one on a
// slow destination's rate can for longer than the shutdown grace.
type stopGate struct {
	throttle.OpenGate
	first   atomic.Bool
	waiting chan struct{} // closed when the first admission waits
}

func (g *stopGate) Admit(ctx context.Context, domain, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if g.first.CompareAndSwap(false, true) {
		close(g.waiting)
		<-ctx.Done()
		return nil, throttle.Refusal{Until: time.Now(), Reason: "canceled"}
	}
	return g.OpenGate.Admit(ctx, domain, tenant, source)
}

// TestStopGivesBackAnAdmissionWait: a worker that took an envelope and
// waits for its admission has sent nothing; the stop ends the wait and
// gives the envelope back at once, rather than after the grace (and
// then, its deferral written with the cancelled context failing, after
// the ack wait).
func TestStopGivesBackAnAdmissionWait(t *testing.T) {
	e := newStopEnv(t, fakemx.Options{})
	gate := &stopGate{waiting: make(chan struct{})}
	a := e.runPool(e.q, 20*time.Second, func(c *Config) { c.Gate = gate })
	id := e.submit("r@dest.test")
	waitClosed(t, gate.waiting, "the admission wait")
	a.cancel()
	select {
	case <-a.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the stop waits for the admission (grace 20 s) instead of giving the envelope back")
	}
	q := connect(t, e.emb, stopAckWait)
	defer q.Close()
	e.runPool(q, 5*time.Second, nil)
	if err := e.mx.WaitForMessages(1, soon); err != nil {
		t.Fatal(err)
	}
	e.waitEvent(id, queue.EventDelivered)
	if l := a.stoppedLine(t); !strings.Contains(l, `"taken_not_sent":1`) {
		t.Fatalf("stop line %s, want the waiting envelope given back", l)
	}
}

// TestStopRecordsASendCutAfterItsFinalDot: a send cut by the end of the
// shutdown grace while it waits for the reply to its final dot may have
// been delivered. It is not given back for an immediate resend: its
// outcome is recorded as unknown and the unknown policy decides, a retry
// after the backoff (an hour here) or a hold. The original is
// acknowledged, so nothing hands it out again early. Before, recording
// with the cancelled context failed, and the envelope was sent again
// after the ack wait whatever the policy.
func TestStopRecordsASendCutAfterItsFinalDot(t *testing.T) {
	slow := fastRetry
	slow.Base, slow.Min, slow.Cap = time.Hour, time.Hour, time.Hour
	for _, tc := range []struct {
		policy UnknownPolicy
		state  queue.State
		event  string
	}{
		{UnknownRetry, queue.StateDeferred, queue.EventDeferred},
		{UnknownHold, queue.StateUnknown, queue.EventHeld},
	} {
		t.Run(string(tc.policy), func(t *testing.T) {
			b := newBlockOnce(t, fakemx.StageDot)
			e := newStopEnv(t, fakemx.Options{Hook: b.hook})
			a := e.runPool(e.q, 300*time.Millisecond, func(c *Config) { c.Retry, c.Unknown = slow, tc.policy })
			id := e.submit("r@dest.test")
			waitClosed(t, b.reached, "the final dot")
			a.stop()
			b.let()
			it, err := e.q.Find(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			if it.State != tc.state || it.Env.Attempt != 1 || it.Env.LastClass != "unknown" {
				t.Fatalf("after the stop: %s, attempt %d, last class %q; want %s after one unknown attempt (a %s state is still in the work lane)",
					it.State, it.Env.Attempt, it.Env.LastClass, tc.state, queue.StateQueued)
			}
			if tc.state == queue.StateDeferred && it.NextAt.Before(time.Now().Add(30*time.Minute)) {
				t.Fatalf("next attempt at %v, want the hour's backoff", it.NextAt)
			}
			if !strings.Contains(it.Env.LastReply, errGraceEnded.Error()) {
				t.Fatalf("last reply %q does not say the stop cut it", it.Env.LastReply)
			}
			e.waitEvent(id, tc.event)
			if l := a.stoppedLine(t); !strings.Contains(l, `"cut_after_final_dot":1`) || !strings.Contains(l, `"given_back":0`) {
				t.Fatalf("stop line %s, want the cut send recorded, nothing given back", l)
			}
		})
	}
}
