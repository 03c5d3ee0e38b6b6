package worker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// fast lanes, so a fault matrix runs in seconds; the shape of the
// computation is the production one.
var (
	fastRetry = backoff.Backoff{Lane: backoff.LaneRetry, Base: 50 * time.Millisecond, Min: 20 * time.Millisecond,
		Cap: 200 * time.Millisecond, Multiplier: 2, ContentionWindow: 10 * time.Millisecond}
	fastRL = backoff.Backoff{Lane: backoff.LaneRateLimit, Base: 100 * time.Millisecond, Min: 50 * time.Millisecond,
		Cap: 300 * time.Millisecond, Multiplier: 2, ContentionWindow: 10 * time.Millisecond}
)

type env struct {
	t    *testing.T
	emb  *queue.Embedded
	dir  string
	q    *queue.Queue
	mx   *fakemx.Server
	snd  *sender.Sender
	pool *Pool // the last one startPool started
	stop context.CancelFunc
	done chan struct{}
}

// connect is a queue on emb with the given ack wait; the caller closes it.
func connect(t *testing.T, emb *queue.Embedded, ackWait time.Duration) *queue.Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := testqueue.ConnectInProcess(ctx, emb, queue.Options{AckWait: ackWait})
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// newEnv starts an embedded server, a fake MX with hook, and a sender
// relaying to it.
func newEnv(t *testing.T, hook fakemx.Hook) *env {
	t.Helper()
	return newEnvMX(t, fakemx.Options{Hook: hook})
}

// newEnvMX is newEnv with a fake MX of the given options.
func newEnvMX(t *testing.T, mx fakemx.Options) *env {
	t.Helper()
	dir := t.TempDir()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, emb: emb, dir: dir}
	t.Cleanup(func() { e.stopPool(); e.emb.Shutdown() })
	e.q = connect(t, emb, 2*time.Second)
	t.Cleanup(func() { e.q.Close() })
	e.mx = fakemx.Start(t, mx)
	e.snd, err = sender.New(sender.Config{Hostname: "outflow.test", Relay: e.mx.Addr(), RelayTLS: "none",
		FinalDotTimeout: 2 * time.Second, CommandTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.snd.Close() })
	return e
}

func (e *env) startPool(mut func(*Config)) {
	e.t.Helper()
	cfg := Config{WorkerID: "w-test", Workers: 2, Retry: fastRetry, RateLimit: fastRL,
		Budget: backoff.Budget{MaxAttempts: 4, MaxAge: time.Hour}, Queue: e.q, Sender: e.snd, Logger: zerolog.Nop()}
	if mut != nil {
		mut(&cfg)
	}
	p, err := New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	e.pool = p
	ctx, cancel := context.WithCancel(context.Background())
	e.stop = cancel
	e.done = make(chan struct{})
	go func() { defer close(e.done); _ = p.Run(ctx, 5*time.Second) }()
}

func (e *env) stopPool() {
	if e.stop != nil {
		e.stop()
		<-e.done
		e.stop = nil
	}
}

func (e *env) submit(rcpts ...string) string {
	e.t.Helper()
	return e.submitAs("t1", rcpts...)
}

// submitAs is submit for tenant.
func (e *env) submitAs(tenant string, rcpts ...string) string {
	e.t.Helper()
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: tenant, From: "app@src.test", Rcpts: rcpts,
		Body: []byte("Subject: hi\r\nMessage-ID: <x@src.test>\r\n\r\nhello\r\n")})
	if err != nil {
		e.t.Fatal(err)
	}
	return ids[0]
}

// events returns the event types recorded for id.
func (e *env) events(id string) []string {
	evs, err := e.q.History(context.Background(), id, time.Time{})
	if err != nil && !errors.Is(err, queue.ErrNotFound) {
		e.t.Fatal(err)
	}
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return out
}

func (e *env) waitEvent(id, typ string) []queue.Event {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		evs, _ := e.q.History(context.Background(), id, time.Time{})
		for _, ev := range evs {
			if ev.Type == typ {
				return evs
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("no %q event for %s within 30s; have %v", typ, id, e.events(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countPrefix(list []string, typ string) int {
	n := 0
	for _, s := range list {
		if s == typ {
			n++
		}
	}
	return n
}

func TestTransientThenSuccess(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && calls.Add(1) == 1 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	reg := prometheus.NewRegistry()
	e.startPool(func(c *Config) { c.Metrics = NewMetrics(reg) })
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	if got := len(e.mx.Messages()); got != 1 {
		t.Fatalf("delivered %d messages, want 1", got)
	}
	// The deferral is counted for OutflowLongLivedRetries: a message ready
	// since its submission, moments ago.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var age float64 = -1
	for _, mf := range mfs {
		for _, s := range mf.GetMetric() {
			if mf.GetName() == "outflow_deferred_message_age_seconds" && s.GetLabel()[0].GetValue() == "retry" {
				age = s.GetGauge().GetValue()
			}
		}
	}
	if age <= 0 || age > 60 {
		t.Errorf("outflow_deferred_message_age_seconds{lane=retry} = %v after the deferral, want the message's age (a few seconds)", age)
	}
	evs := e.events(id)
	if strings.Join(evs, ",") != "queued,deferred,delivered" {
		t.Fatalf("events = %v", evs)
	}
	hist, _ := e.q.History(context.Background(), id, time.Time{})
	var rec backoff.Record
	for _, ev := range hist {
		if ev.Type == queue.EventDeferred {
			if err := rec.UnmarshalJSON(ev.Decision); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rec.Lane != "retry" || rec.Class != "transient" || rec.Code != 451 || rec.DelayMs <= 0 || rec.JitterSeed == 0 || !strings.HasPrefix(rec.WorkerID, "w-test/") {
		t.Fatalf("decision record = %+v", rec)
	}
	// Recompute the logged delay from its seed: the record is reproducible.
	again := fastRetry.Decide(rec.Decision.Attempt, rec.WorkerID, rec.JitterSeed, 0)
	if again.DelayMs != rec.DelayMs {
		t.Fatalf("recomputed delay %d ms, logged %d ms", again.DelayMs, rec.DelayMs)
	}
}

func TestAlwaysTransientEndsInDeadLetters(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	e.startPool(nil)
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDead)
	it, err := e.q.Find(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if it.State != queue.StateDead || it.Env.Attempt != 4 || !strings.HasPrefix(it.DeadReason, "max-attempts") {
		t.Fatalf("dead letter = state %s attempt %d reason %q", it.State, it.Env.Attempt, it.DeadReason)
	}
	if len(it.Env.History) != 4 {
		t.Fatalf("evidence has %d attempts, want 4: %+v", len(it.Env.History), it.Env.History)
	}
	for _, a := range it.Env.History {
		if a.Code != 451 || a.Class != "transient" {
			t.Fatalf("evidence entry %+v", a)
		}
	}
	if n := countPrefix(e.events(id), queue.EventDeferred); n != 3 {
		t.Fatalf("%d deferrals, want 3", n)
	}
	if got := e.mx.Transactions(); got != 4 {
		t.Fatalf("fake MX saw %d transactions, want 4", got)
	}
}

// TestDeadLetterDecisionRecorded: the attempt that spends the budget is a
// decision like the others: one decision line (outcome "dead") and a dead
// event, both with its reply, rule and worker, so that a postmortem that
// selects a message's decision lines sees how it ended.
func TestDeadLetterDecisionRecorded(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	var logs testutil.SyncBuffer
	e.startPool(func(c *Config) { c.Budget.MaxAttempts = 2; c.Logger = zerolog.New(&logs) })
	id := e.submit("r@dest.test")
	var rec backoff.Record
	for _, ev := range e.waitEvent(id, queue.EventDead) {
		if ev.Type == queue.EventDead {
			if err := rec.UnmarshalJSON(ev.Decision); err != nil {
				t.Fatalf("dead event without a decision record: %v (%s)", err, ev.Decision)
			}
		}
	}
	if rec.Attempt != 2 || rec.Class != "transient" || rec.Rule == "" || rec.Code != 451 || rec.EnhancedCode != "4.3.0" || !strings.HasPrefix(rec.WorkerID, "w-test/") {
		t.Errorf("dead event's record = %+v", rec)
	}
	var line map[string]any
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"outcome":"dead"`) {
			if line != nil {
				t.Errorf("two dead decision lines: %s", logs.String())
			}
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line == nil || line["message"] != backoff.DecisionMessage || line["msg_id"] != id || line["attempt"] != 2.0 ||
		line["code"] != 451.0 || line["class"] != "transient" || !strings.HasPrefix(line["worker_id"].(string), "w-test/") {
		t.Errorf("dead decision line = %v; logs:\n%s", line, logs.String())
	}
}

func TestThrottledUsesRateLimitLaneAndKeepsBudget(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && calls.Add(1) <= 5 {
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28}, Message: "Our system has detected an unusual rate of unsolicited mail. To protect our users, mail has been temporarily rate limited."}
		}
		return nil
	})
	e.startPool(nil) // budget: 4 attempts, yet 5 throttles must not kill it
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDelivered)
	evs := e.events(id)
	if countPrefix(evs, queue.EventThrottled) != 5 || countPrefix(evs, queue.EventDead) != 0 {
		t.Fatalf("events = %v", evs)
	}
	hist, _ := e.q.History(context.Background(), id, time.Time{})
	for _, ev := range hist {
		if ev.Type == queue.EventThrottled {
			var rec backoff.Record
			_ = rec.UnmarshalJSON(ev.Decision)
			if rec.Lane != "ratelimit" || rec.Class != "throttled" || rec.DelayMs < fastRL.Min.Milliseconds() {
				t.Fatalf("throttle record %+v", rec)
			}
		}
	}
}

func TestPermanentBouncesAfterOneAttempt(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		return nil
	})
	e.startPool(nil)
	id := e.submit("gone@dest.test", "ok@dest.test")
	evs := e.waitEvent(id, queue.EventDelivered)
	e.waitEvent(id, queue.EventBounced)
	var bounced []string
	for _, ev := range evs {
		if ev.Type == queue.EventBounced {
			bounced = ev.Recipients
		}
	}
	evs, _ = e.q.History(context.Background(), id, time.Time{})
	for _, ev := range evs {
		if ev.Type == queue.EventBounced {
			bounced = ev.Recipients
			if !strings.Contains(ev.Reason, "no such user") {
				t.Fatalf("bounce reason %q", ev.Reason)
			}
		}
	}
	if strings.Join(bounced, ",") != "gone@dest.test" {
		t.Fatalf("bounced %v", bounced)
	}
	if got := e.mx.Transactions(); got != 1 {
		t.Fatalf("%d transactions, want 1", got)
	}
	msgs := e.mx.Messages()
	if len(msgs) != 1 || strings.Join(msgs[0].Rcpts, ",") != "ok@dest.test" {
		t.Fatalf("delivered %+v", msgs)
	}
	if _, err := e.q.Find(context.Background(), id); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("envelope still stored after its end: %v", err)
	}
}

func TestMixedRecipientsDeferOnlyTheDeferred(t *testing.T) {
	var calls sync.Map
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "later@") {
			if _, seen := calls.LoadOrStore(arg, true); !seen {
				return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "temporary local problem"}
			}
		}
		return nil
	})
	e.startPool(nil)
	id := e.submit("now@dest.test", "later@dest.test")
	deadline := time.Now().Add(30 * time.Second)
	for len(e.mx.Messages()) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	msgs := e.mx.Messages()
	if len(msgs) != 2 {
		t.Fatalf("got %d deliveries, want 2 (one per recipient)", len(msgs))
	}
	if strings.Join(msgs[0].Rcpts, ",") != "now@dest.test" || strings.Join(msgs[1].Rcpts, ",") != "later@dest.test" {
		t.Fatalf("deliveries %v then %v", msgs[0].Rcpts, msgs[1].Rcpts)
	}
	e.waitEvent(id, queue.EventDeferred)
}

func TestLostAfterFinalDotIsUnknown(t *testing.T) {
	var calls atomic.Int32
	hook := func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageDot && calls.Add(1) == 1 {
			return fakemx.Drop
		}
		return nil
	}
	t.Run("retry", func(t *testing.T) {
		calls.Store(0)
		e := newEnv(t, hook)
		e.startPool(nil)
		id := e.submit("r@dest.test")
		e.waitEvent(id, queue.EventDelivered)
		evs := e.events(id)
		if countPrefix(evs, queue.EventDeferred) != 1 {
			t.Fatalf("events %v, want one deferral after the unknown outcome", evs)
		}
		hist, _ := e.q.History(context.Background(), id, time.Time{})
		for _, ev := range hist {
			if ev.Type == queue.EventDeferred {
				var rec backoff.Record
				_ = rec.UnmarshalJSON(ev.Decision)
				if rec.Class != classify.Unknown.String() {
					t.Fatalf("class %q, want unknown", rec.Class)
				}
			}
		}
	})
	t.Run("hold", func(t *testing.T) {
		calls.Store(0)
		e := newEnv(t, hook)
		e.startPool(func(c *Config) { c.Unknown = UnknownHold })
		id := e.submit("r@dest.test")
		e.waitEvent(id, queue.EventHeld)
		items, err := e.q.List(context.Background(), queue.Filter{State: queue.StateUnknown})
		if err != nil || len(items) != 1 || items[0].Env.ID != id {
			t.Fatalf("held list = %+v, %v", items, err)
		}
		if n := len(e.mx.Messages()); n != 0 {
			t.Fatalf("%d messages delivered while held", n)
		}
		// An operator replays it: delivered.
		if _, err := e.q.Replay(context.Background(), id, nil); err != nil {
			t.Fatal(err)
		}
		if err := e.mx.WaitForMessages(1, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCrashAfterSentMarkerDeliversOnce: a worker that recorded the SENT
// marker and died before its ack must not cause a second delivery when the
// server hands the envelope to another worker.
func TestCrashAfterSentMarkerDeliversOnce(t *testing.T) {
	e := newEnv(t, nil)
	id := e.submit("r@dest.test")
	// Worker 1, on its own connection: deliver, mark SENT, then "die".
	q1 := connect(t, e.emb, 2*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	work, err := q1.Messages(ctx, queue.LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := <-work
	body, _ := q1.EnvelopeBody(ctx, d.Env)
	res := e.snd.Send(ctx, &sender.Message{ID: id, From: d.Env.From, Rcpts: d.Env.Rcpts, Domain: d.Env.Dest, Body: body})
	if res.Rcpts[0].Outcome.Code != 250 {
		t.Fatalf("send: %+v", res.Rcpts[0].Outcome)
	}
	if err := d.Delivered(ctx, d.Env.Rcpts, false); err != nil { // SENT written, no ack
		t.Fatal(err)
	}
	cancel()
	q1.Close() // the process is gone; its envelope is unacknowledged
	// Worker 2 gets it after the ack wait and must recognise it.
	e.startPool(nil)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := e.q.Find(context.Background(), id); errors.Is(err, queue.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("redelivered envelope was never acknowledged")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := e.mx.Transactions(); n != 1 {
		t.Fatalf("%d SMTP transactions, want exactly 1", n)
	}
}

// TestScheduledSurvivesRestart: an envelope scheduled before a restart of
// the server fires at its time afterwards and continues its budget.
func TestScheduledSurvivesRestart(t *testing.T) {
	var calls atomic.Int32
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && calls.Add(1) == 1 {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "later"}
		}
		return nil
	})
	slow := fastRetry
	slow.Min, slow.Base, slow.Cap = 2*time.Second, 2*time.Second, 2*time.Second
	e.startPool(func(c *Config) { c.Retry = slow })
	id := e.submit("r@dest.test")
	e.waitEvent(id, queue.EventDeferred)
	it, err := e.q.Find(context.Background(), id)
	if err != nil || it.State != queue.StateDeferred || it.Env.Attempt != 1 {
		t.Fatalf("before restart: %+v, %v", it, err)
	}
	due := it.NextAt
	// Restart everything: pool, connection and the embedded server.
	e.stopPool()
	e.q.Close()
	e.emb.Shutdown()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: e.dir})
	if err != nil {
		t.Fatal(err)
	}
	e.emb = emb
	e.q = connect(t, emb, 2*time.Second)
	e.startPool(func(c *Config) { c.Retry = slow })
	if err := e.mx.WaitForMessages(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(due) {
		t.Fatalf("delivered before its scheduled time %v", due)
	}
	evs := e.waitEvent(id, queue.EventDelivered)
	last := evs[len(evs)-1]
	if last.Type != queue.EventDelivered || last.Attempt != 2 {
		t.Fatalf("last event %s attempt %d, want delivered on attempt 2 (budget continued)", last.Type, last.Attempt)
	}
}

// TestRelayAuthFailureDefersNotBounces: a smarthost that refuses our
// credentials is a configuration problem; the mail waits on the retry lane
// instead of bouncing.
func TestRelayAuthFailureDefersNotBounces(t *testing.T) {
	e := newEnv(t, nil)
	relay := fakemx.Start(t, fakemx.Options{Users: map[string]string{"outflow": "right"}, RequireAuth: true})
	snd, err := sender.New(sender.Config{Hostname: "outflow.test", Relay: relay.Addr(), RelayTLS: "none",
		RelayUsername: "outflow", RelayPassword: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { snd.Close() })
	e.snd = snd
	e.startPool(nil)
	id := e.submit("r@dest.test")
	evs := e.waitEvent(id, queue.EventDeferred)
	if countPrefix(e.events(id), queue.EventBounced) != 0 {
		t.Fatalf("bounced on a relay AUTH failure: %v", evs)
	}
	if _, failed := relay.AuthAttempts(); failed != 1 {
		t.Fatalf("%d failed logins, want 1", failed)
	}
}

// syncBuf is the shared goroutine-safe log sink.
type syncBuf = testutil.SyncBuffer

// TestDeliveredAndDeadInOneAttempt: one recipient accepted, the other's
// budget spent in the same attempt. The dead letter's step acknowledges the
// original; recording the delivered recipient must not try again.
func TestDeliveredAndDeadInOneAttempt(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "never@") {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "later"}
		}
		return nil
	})
	var logs syncBuf
	e.startPool(func(c *Config) {
		c.Budget = backoff.Budget{MaxAttempts: 1, MaxAge: time.Hour}
		c.Logger = zerolog.New(&logs)
	})
	id := e.submit("ok@dest.test", "never@dest.test")
	e.waitEvent(id, queue.EventDead)
	e.waitEvent(id, queue.EventDelivered)
	it, err := e.q.Find(context.Background(), id)
	if err != nil || it.State != queue.StateDead || strings.Join(it.Env.Rcpts, ",") != "never@dest.test" {
		t.Fatalf("after the attempt: %+v, %v", it, err)
	}
	if strings.Contains(logs.String(), "delivery step failed") {
		t.Fatalf("a durable step failed:\n%s", logs.String())
	}
}

// TestDecisionLinesNameRecipients: each decision line names the recipients
// its outcome is about, so the log answers "what became of mail to X" as
// Postfix's to=<…> does: the delivered one, the bounced one, the deferred
// one and, when its budget is spent, the dead one. The deferral's record
// is the deferred recipient's reply, not the reply of one bounced in the
// same attempt.
func TestDecisionLinesNameRecipients(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		switch {
		case stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		case stage == fakemx.StageRcpt && strings.HasPrefix(arg, "slow@"):
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	})
	var logs testutil.SyncBuffer
	e.startPool(func(c *Config) { c.Budget.MaxAttempts = 2; c.Logger = zerolog.New(&logs) })
	id := e.submit("gone@dest.test", "ok@dest.test", "slow@dest.test")
	e.waitEvent(id, queue.EventDead)
	rcpts := map[string]string{} // outcome -> rcpts
	for _, l := range strings.Split(logs.String(), "\n") {
		var line struct {
			Message, Outcome, Class string
			Code                    int
			Rcpts                   []string
		}
		if json.Unmarshal([]byte(l), &line) != nil || line.Message != backoff.DecisionMessage {
			continue
		}
		rcpts[line.Outcome] = strings.Join(line.Rcpts, ",")
		if line.Outcome == "deferred" && (line.Class != "transient" || line.Code != 451) {
			// The bounced recipient's 550 came first in the same attempt;
			// the deferral is about the 451.
			t.Errorf("deferred line says %s %d, want transient 451: %s", line.Class, line.Code, l)
		}
	}
	for outcome, want := range map[string]string{"bounced": "gone@dest.test", "delivered": "ok@dest.test",
		"deferred": "slow@dest.test", queue.EventDead: "slow@dest.test"} {
		if rcpts[outcome] != want {
			t.Errorf("%s line names %q, want %q; logs:\n%s", outcome, rcpts[outcome], want, logs.String())
		}
	}
}

// TestScheduledMailJoinsItsTenantsFreshMail: a message sent later is not
// delivered from the retry lane when its time comes, but moved to its
// tenant's fresh mail (logged, with its time) and delivered from there, no
// earlier than asked and once.
func TestScheduledMailJoinsItsTenantsFreshMail(t *testing.T) {
	e := newEnv(t, nil)
	var logs testutil.SyncBuffer
	e.startPool(func(c *Config) { c.Logger = zerolog.New(&logs) })
	at := time.Now().Add(1500 * time.Millisecond)
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"r@dest.test"},
		Body: []byte("Subject: later\r\n\r\nhello\r\n"), SendAt: at})
	if err != nil {
		t.Fatal(err)
	}
	evs := e.waitEvent(ids[0], queue.EventDelivered)
	if last := evs[len(evs)-1]; last.Time.Before(at) {
		t.Fatalf("delivered at %v, before %v", last.Time, at)
	}
	// The move's line is written after the copy is stored, and a worker
	// may deliver the copy before it is.
	testutil.WaitFor(t, 10*time.Second, "the move's log line", func() bool {
		for _, l := range strings.Split(logs.String(), "\n") {
			var line map[string]any
			if json.Unmarshal([]byte(l), &line) == nil && line["message"] == "scheduled message due: moved to its tenant's fresh mail" &&
				line["msg_id"] == ids[0] && line["tenant"] == "t1" && line["send_at"] != nil {
				return true
			}
		}
		return false
	})
	if n := len(e.mx.Messages()); n != 1 {
		t.Fatalf("delivered %d messages, want 1", n)
	}
}

// TestDroppedWhileDelivering: a message cancelled while its attempt is
// under way is not rescheduled, nor held, after it: nothing left in the
// queue, a line saying why, and the attempt's own event, its only record
// (after the final dot the server may have taken the message), saying
// that its step was not written.
func TestDroppedWhileDelivering(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stage  fakemx.Stage
		reply  *smtp.SMTPError
		policy UnknownPolicy
		event  string
		says   string
	}{
		{"deferred at RCPT", fakemx.StageRcpt, &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"},
			UnknownRetry, queue.EventDeferred, "try again later"},
		{"cut after the final dot, unknown-policy hold", fakemx.StageDot, fakemx.Drop, UnknownHold, queue.EventHeld, "reading reply to BDAT"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inStage, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
				if stage == tc.stage {
					once.Do(func() { close(inStage); <-release })
					return tc.reply
				}
				return nil
			})
			var logs testutil.SyncBuffer
			e.startPool(func(c *Config) { c.Logger, c.Unknown = zerolog.New(&logs), tc.policy })
			id := e.submit("r@dest.test")
			select {
			case <-inStage:
			case <-time.After(15 * time.Second):
				t.Fatal("no attempt within 15s")
			}
			if _, err := e.q.DropBy(context.Background(), id, "api"); err != nil {
				t.Fatal(err)
			}
			close(release)
			testutil.WaitFor(t, 15*time.Second, "the drop's line", func() bool {
				return strings.Contains(logs.String(), "dropped while being delivered")
			})
			if _, err := e.q.Find(context.Background(), id); !errors.Is(err, queue.ErrNotFound) {
				t.Fatalf("the dropped message is still queued: %v", err)
			}
			evs := e.waitEvent(id, tc.event)
			var types []string
			for _, ev := range evs {
				types = append(types, ev.Type)
			}
			if got, want := strings.Join(types, ","), "queued,dropped,"+tc.event; got != want {
				t.Fatalf("events %s, want %s", got, want)
			}
			if r := evs[2].Reason; !strings.Contains(r, tc.says) || !strings.Contains(r, "dropped while this attempt ran: not "+tc.event) {
				t.Fatalf("the attempt's event says %q, want %q and that it was not %s", r, tc.says, tc.event)
			}
		})
	}
}
