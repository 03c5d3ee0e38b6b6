package worker

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// fakeClock is a settable wall clock for a deliverer.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time        { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) add(d time.Duration)   { c.ns.Add(int64(d)) }
func newFakeClock(at time.Time) *fakeClock { c := &fakeClock{}; c.ns.Store(at.UnixNano()); return c }

// clockSetup is a queue, notice counters, a clock at t0 and a deliverer
// on it, with the DSN configuration mut gives.
func clockSetup(t *testing.T, mut func(*DSNConfig)) (e *env, m *DSNMetrics, cfg *DSNConfig, clock *fakeClock, d *deliverer, t0 time.Time) {
	e = newEnv(t, nil)
	m = NewDSNMetrics(prometheus.NewRegistry())
	cfg = dsnConfig(m)
	mut(cfg)
	t0 = time.Now()
	clock = newFakeClock(t0)
	return e, m, cfg, clock, clockDeliverer(t, e, cfg, clock), t0
}

// clockDeliverer is noticeDeliverer on clock.
func clockDeliverer(t *testing.T, e *env, cfg *DSNConfig, clock *fakeClock) *deliverer {
	t.Helper()
	p, err := New(Config{WorkerID: "w", Queue: e.q, Sender: e.snd, Logger: zerolog.Nop(), DSN: cfg, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	return &deliverer{Pool: p, id: "w/0"}
}

// partOf is part n of a message of parts parts to rcpt, submitted at.
func partOf(msg string, n, parts int, rcpt string, at time.Time) *queue.Envelope {
	return &queue.Envelope{ID: msg + "-" + string(rune('0'+n)), MsgID: msg, Parts: parts, Tenant: "t1", From: "app@src.test",
		Rcpts: []string{rcpt}, Dest: queue.Domain(rcpt), Body: []byte("Subject: hi\r\n\r\nx\r\n"), Source: queue.SourceSMTP,
		SubmittedAt: at, Deadline: at.Add(24 * time.Hour)}
}

// deferPart runs delayNotice for env deferred with a 451 and returns the
// next state, as deferRest writes it.
func deferPart(t *testing.T, d *deliverer, env *queue.Envelope) *queue.Envelope {
	t.Helper()
	next := env.Clone()
	o := &outcome{lead: classify.Result{Class: classify.Transient, Code: 451, Enhanced: "4.3.0", Text: "later"}, host: "mx." + env.Dest, body: env.Body}
	if err := d.delayNotice(context.Background(), env, next, o); err != nil {
		t.Fatal(err)
	}
	return next
}

// TestMultiPartDelayWarningOnce: the parts of one message deferred past
// the warning time share one delayed notice listing every recipient still
// deferred (not one that was delivered meanwhile); siblings deferred later
// send none, the claimer run again queues the same one, and a part first
// deferred after the warning, which it could not list, warns on its own.
func TestMultiPartDelayWarningOnce(t *testing.T) {
	e, m, _, clock, d, t0 := clockSetup(t, func(c *DSNConfig) { c.DelayWarning = time.Hour })
	ctx := context.Background()
	a, b, c, late := partOf("m", 1, 4, "a@one.test", t0), partOf("m", 2, 4, "b@two.test", t0), partOf("m", 3, 4, "c@three.test", t0), partOf("m", 4, 4, "d@four.test", t0)

	clock.add(time.Minute)
	a, b, c = deferPart(t, d, a), deferPart(t, d, b), deferPart(t, d, c)
	if a.DelayNoted != 1 || a.DelayWarned || counterValue(m.Sent.WithLabelValues("delayed")) != 0 {
		t.Fatalf("before the warning time: noted %d warned %v", a.DelayNoted, a.DelayWarned)
	}
	ops := e.q.Ops()
	if again := deferPart(t, d, a); again.DelayNoted != 1 || e.q.Ops()["sent_put"] != ops["sent_put"] {
		t.Fatal("a part deferred again with the same recipients must not write its note again")
	}
	d.endDelay(ctx, c) // c delivered at a retry

	clock.add(time.Hour)
	for range 2 { // the claim, then the claimer run again after a crash
		if next := deferPart(t, d, a); !next.DelayWarned {
			t.Fatal("the claimer is not marked")
		}
	}
	if next := deferPart(t, d, b); !next.DelayWarned {
		t.Fatal("a listed sibling is not marked")
	}
	if next := deferPart(t, d, late); !next.DelayWarned {
		t.Fatal("an unlisted part is not marked")
	}
	if n := counterValue(m.Sent.WithLabelValues("delayed")); n != 3 { // the claim twice (one id), the late part
		t.Fatalf("%v delayed notices queued", n)
	}
	items, err := e.q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil || len(items) != 2 {
		t.Fatalf("%d notices in the queue (%v); want the message's and the late part's", len(items), err)
	}
	e.startPool(nil)
	waitUntil(t, "two warnings at the MX", func() bool { return len(reports(e.mx)) == 2 })
	var got []string
	for _, r := range reports(e.mx) {
		got = append(got, strings.Join(finalRcpts(r.Data), ","))
	}
	if strings.Join(got, " ") != "b@two.test,a@one.test d@four.test" && strings.Join(got, " ") != "d@four.test b@two.test,a@one.test" {
		t.Fatalf("warnings list %q", got)
	}
	// Each listed part's history names the one warning.
	for _, id := range []string{a.ID, b.ID} {
		e.waitEvent(id, queue.EventDSN)
	}
}

// TestSinglePartDelayNoRecord: a message of one destination warns on its
// own and reads or writes no record for it.
func TestSinglePartDelayNoRecord(t *testing.T) {
	e, m, _, clock, d, t0 := clockSetup(t, func(c *DSNConfig) { c.DelayWarning = time.Hour })
	one := partOf("s", 1, 1, "a@one.test", t0)
	one.ID = "s"
	before := e.q.Ops()
	clock.add(time.Minute)
	one = deferPart(t, d, one)
	clock.add(time.Hour)
	one = deferPart(t, d, one)
	after := e.q.Ops()
	if !one.DelayWarned || counterValue(m.Sent.WithLabelValues("delayed")) != 1 {
		t.Fatal("no warning")
	}
	// The warning itself is one keyed enqueue (its key's record, one
	// write) and the rate's allowance (one read and one write); nothing
	// else touched the SENT bucket.
	if gets, puts := after["sent_get"]-before["sent_get"], after["sent_put"]-before["sent_put"]; gets != 1 || puts != 2 {
		t.Fatalf("%d SENT reads and %d writes for a single-destination warning", gets, puts)
	}
}

// TestScheduledDelayCountsFromSendAt: a message submitted for later is
// warned about a delay counted from the time it was to be sent, not from
// its submission.
func TestScheduledDelayCountsFromSendAt(t *testing.T) {
	_, m, _, clock, d, t0 := clockSetup(t, func(c *DSNConfig) { c.DelayWarning = time.Hour })
	one := partOf("s", 1, 1, "a@one.test", t0)
	one.ID, one.SendAt = "s", t0.Add(3*time.Hour)
	clock.add(3*time.Hour + time.Minute) // its first attempt, at its time, fails
	one = deferPart(t, d, one)
	clock.add(50 * time.Minute)
	if one = deferPart(t, d, one); one.DelayWarned || counterValue(m.Sent.WithLabelValues("delayed")) != 0 {
		t.Fatal("warned 51 minutes after its time, nearly four hours after its submission")
	}
	clock.add(10 * time.Minute)
	if one = deferPart(t, d, one); !one.DelayWarned {
		t.Fatal("no warning an hour after its time")
	}
}

// TestPassReportAtDeadline: a part that never reaches its pass holds its
// sibling's failure back only until the deadline; the report then lists
// what the record held, and the late part reports on its own. A pass
// completed in time owes nothing at its deadline.
func TestPassReportAtDeadline(t *testing.T) {
	e, m, cfg, clock, d, t0 := clockSetup(t, func(c *DSNConfig) { c.PassTimeout = time.Minute })
	ctx := context.Background()
	bounce := func(env *queue.Envelope) {
		t.Helper()
		o := &outcome{bounced: []rcptResult{{env.Rcpts[0], classify.Result{Class: classify.Permanent, Code: 550, Enhanced: "5.1.1", Text: "no"}, classify.StageRcpt}},
			host: "mx." + env.Dest, body: env.Body}
		if err := d.attemptNotices(ctx, env, o); err != nil {
			t.Fatal(err)
		}
	}
	first, stuck := partOf("m", 1, 2, "gone@one.test", t0), partOf("m", 2, 2, "gone@two.test", t0)
	done1, done2 := partOf("k", 1, 2, "gone@one.test", t0), partOf("k", 2, 2, "gone@two.test", t0)
	bounce(first)
	bounce(done1)
	// done2 completes k's pass in another process: this one still waits.
	other := clockDeliverer(t, e, cfg, clock)
	if err := other.attemptNotices(ctx, done2, &outcome{bounced: []rcptResult{{"gone@two.test", classify.Result{Class: classify.Permanent, Code: 550, Text: "no"}, classify.StageRcpt}}, body: done2.Body}); err != nil {
		t.Fatal(err)
	}
	d.closePasses(ctx)
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 1 {
		t.Fatalf("before the deadline: %v failed notices (want k's, completed)", n)
	}
	clock.add(time.Minute)
	d.closePasses(ctx)
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 2 {
		t.Fatalf("at the deadline: %v failed notices, want 2 (k's, m's)", n)
	}
	d.closePasses(ctx) // nothing left to wait on
	bounce(stuck)      // finally pulled: on its own
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 3 {
		t.Fatalf("the late part: %v failed notices, want 3", n)
	}
	e.startPool(nil)
	waitUntil(t, "three reports at the MX", func() bool { return len(reports(e.mx)) == 3 })
	var lists []string
	for _, r := range reports(e.mx) {
		lists = append(lists, strings.Join(finalRcpts(r.Data), ","))
	}
	joined := " " + strings.Join(lists, " ") + " "
	for _, want := range []string{" gone@one.test,gone@two.test ", " gone@one.test ", " gone@two.test "} {
		if !strings.Contains(joined, want) {
			t.Fatalf("reports list %q; want k's two recipients, then m's one and one", lists)
		}
	}
}

// TestPassDeadlineInRunningPool: a running pool sends a pass's report at
// its deadline while a sibling's attempt is still in flight (a stalled
// server); the sibling's own failure comes as a report of its own.
func TestPassDeadlineInRunningPool(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free)
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "stall@") {
			<-release
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		return bounceGone(stage, arg)
	})
	// A sender that waits for the stalled reply longer than the test: the
	// stalled part does not reach its pass until it is released.
	patient, err := sender.New(sender.Config{Hostname: "outflow.test", Relay: e.mx.Addr(), RelayTLS: "none", CommandTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { patient.Close() })
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) {
		c.Sender = patient
		c.DSN = dsnConfig(m)
		c.DSN.PassTimeout = 300 * time.Millisecond
	})
	e.submitParts("gone@dest.test", "stall@other.test")
	waitUntil(t, "the report at the deadline", func() bool { return len(reports(e.mx)) == 1 })
	if got := finalRcpts(reports(e.mx)[0].Data); strings.Join(got, ",") != "gone@dest.test" {
		t.Fatalf("the deadline's report lists %v", got)
	}
	free()
	waitUntil(t, "the stalled part's own report", func() bool { return len(reports(e.mx)) == 2 })
	if got := finalRcpts(reports(e.mx)[1].Data); strings.Join(got, ",") != "stall@other.test" {
		t.Fatalf("the late part's report lists %v", got)
	}
}

// TestPassWaitKeepsLittle: a pass waited on keeps at most passWaitBody of
// the original, in a copy, and returns a trimmed one as its header only.
func TestPassWaitKeepsLittle(t *testing.T) {
	var p passWaits
	env := partOf("m", 1, 2, "a@one.test", time.Now())
	env.DSN = &queue.DSNParams{Ret: "FULL"}
	body := []byte("Subject: big\r\n\r\n" + strings.Repeat("x", 2*passWaitBody))
	p.wait(env, body, time.Now())
	w := p.take(time.Now())
	if len(w) != 1 || len(w[0].body) != passWaitBody || cap(w[0].body) > 2*passWaitBody || w[0].e.DSN.Ret != "HDRS" || env.DSN.Ret != "FULL" {
		t.Fatalf("kept %d bytes (cap %d), RET %s; the part's RET %s", len(w[0].body), cap(w[0].body), w[0].e.DSN.Ret, env.DSN.Ret)
	}
}

// A delay notice gives each deferred recipient its own reply, not the
// first deferred recipient's.
func TestDelayReportsOwnReplies(t *testing.T) {
	_, _, _, _, d, t0 := clockSetup(t, func(*DSNConfig) {})
	env := partOf("m", 1, 1, "a@one.test", t0)
	env.Rcpts = []string{"a@one.test", "b@one.test", "c@one.test"}
	later := classify.Result{Class: classify.Transient, Code: 451, Enhanced: "4.3.0", Text: "later"}
	full := classify.Result{Class: classify.Transient, Code: 452, Enhanced: "4.2.2", Text: "mailbox full"}
	o := &outcome{lead: later, host: "mx.one.test",
		results: []classify.Result{later, {Class: classify.Delivered, Code: 250}, full}}
	next := env.Clone()
	next.Rcpts = []string{"a@one.test", "c@one.test"}
	got := d.delayReports(env, next, o)
	if len(got) != 2 || got[0].Status != "4.3.0" || got[0].Diagnostic != "451 4.3.0 later" ||
		got[1].Final != "c@one.test" || got[1].Status != "4.2.2" || got[1].Diagnostic != "452 4.2.2 mailbox full" {
		t.Fatalf("delay reports %+v", got)
	}
}
