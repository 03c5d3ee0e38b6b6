package worker

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// submitParts submits one SMTP message and returns every part's id.
func (e *env) submitParts(rcpts ...string) []string {
	e.t.Helper()
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: rcpts, Source: queue.SourceSMTP,
		Body: []byte("Subject: hi\r\nFrom: app@src.test\r\nMessage-ID: <x@src.test>\r\n\r\nhello\r\n")})
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// noticeDeliverer is a deliverer of a pool that is not running, for
// tests that generate notices directly.
func noticeDeliverer(t *testing.T, q *queue.Queue, snd Sender, cfg *DSNConfig) *deliverer {
	t.Helper()
	p, err := New(Config{WorkerID: "w", Queue: q, Sender: snd, Logger: zerolog.Nop(), DSN: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return &deliverer{Pool: p, id: "w/0"}
}

// finalRcpts returns the Final-Recipient addresses a report lists.
func finalRcpts(report []byte) []string {
	var out []string
	for _, l := range strings.Split(string(report), "\r\n") {
		if a, ok := strings.CutPrefix(l, "Final-Recipient: rfc822; "); ok {
			out = append(out, a)
		}
	}
	return out
}

// TestMultiPartFailuresShareOneDSN: a message to two domains whose
// recipients both get 550 is two envelopes, and one report listing both.
func TestMultiPartFailuresShareOneDSN(t *testing.T) {
	e := newEnv(t, bounceGone)
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m) })
	ids := e.submitParts("gone@dest.test", "gone@other.test")
	if len(ids) != 2 {
		t.Fatalf("want two parts, got %v", ids)
	}
	for _, id := range ids {
		e.waitEvent(id, queue.EventBounced)
	}
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
	waitUntil(t, "the queue empty", func() bool {
		items, err := e.q.List(context.Background(), queue.Filter{State: queue.StateQueued})
		return err == nil && len(items) == 0
	})
	if got := finalRcpts(reports(e.mx)[0].Data); strings.Join(got, ",") != "gone@dest.test,gone@other.test" {
		t.Fatalf("report lists %v", got)
	}
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 1 || len(reports(e.mx)) != 1 {
		t.Fatalf("%v failed notices queued, %d reports at the MX; want one", n, len(reports(e.mx)))
	}
	// Each part's history names the one report, with its own recipient.
	var reasons []string
	for i, id := range ids {
		for _, ev := range e.waitEvent(id, queue.EventDSN) {
			if ev.Type == queue.EventDSN {
				if want := []string{"gone@dest.test", "gone@other.test"}[i]; strings.Join(ev.Recipients, ",") != want {
					t.Errorf("%s: dsn event for %v, want %s", id, ev.Recipients, want)
				}
				reasons = append(reasons, ev.Reason)
			}
		}
	}
	if len(reasons) != 2 || reasons[0] != reasons[1] || !strings.HasPrefix(reasons[0], "failed notice k") {
		t.Fatalf("dsn events %q", reasons)
	}
}

// windowOnceGate refuses each destination's first admission for the
// first-contact window, as a worker of a fleet splitting learn-initial
// does, then admits.
type windowOnceGate struct {
	throttle.OpenGate
	mu   sync.Mutex
	seen map[string]bool
}

func (g *windowOnceGate) Admit(ctx context.Context, dest, tenant, source string) (throttle.Permit, throttle.Refusal) {
	g.mu.Lock()
	first := !g.seen[dest]
	if g.seen == nil {
		g.seen = map[string]bool{}
	}
	g.seen[dest] = true
	g.mu.Unlock()
	if first {
		return nil, throttle.Refusal{Until: time.Now().Add(100 * time.Millisecond), Reason: "window"}
	}
	return g.OpenGate.Admit(ctx, dest, tenant, source)
}

// TestMomentaryRefusalKeepsThePass: a part refused for a moment (the
// first-contact window) has not had its first pass; both parts' failures
// are one report. Ending the pass at such a refusal sent one report per
// domain.
func TestMomentaryRefusalKeepsThePass(t *testing.T) {
	e := newEnv(t, bounceGone)
	m := NewDSNMetrics(prometheus.NewRegistry())
	gate := &windowOnceGate{}
	e.startPool(func(c *Config) { c.DSN, c.Gate = dsnConfig(m), gate })
	ids := e.submitParts("gone@dest.test", "gone@other.test")
	for _, id := range ids {
		e.waitEvent(id, queue.EventBounced)
	}
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) >= 1 })
	waitUntil(t, "the queue empty", func() bool {
		items, err := e.q.List(context.Background(), queue.Filter{})
		return err == nil && len(items) == 0
	})
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 1 || len(reports(e.mx)) != 1 {
		t.Fatalf("%v failed notices queued, %d reports at the MX; want one listing both", n, len(reports(e.mx)))
	}
	if got := finalRcpts(reports(e.mx)[0].Data); strings.Join(got, ",") != "gone@dest.test,gone@other.test" {
		t.Fatalf("report lists %v", got)
	}
}

// TestDeferredPartDoesNotHoldTheReport: one part bounces, the other is
// deferred; the bounce is reported at the other's first deferral, and the
// deferred recipient's later failure is a report of its own.
func TestDeferredPartDoesNotHoldTheReport(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "later@") {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
		}
		return bounceGone(stage, arg)
	})
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m) })
	ids := e.submitParts("gone@dest.test", "later@other.test")
	e.waitEvent(ids[1], queue.EventDead)
	waitUntil(t, "two reports at the MX", func() bool { return len(reports(e.mx)) == 2 })
	rs := reports(e.mx)
	first, second := finalRcpts(rs[0].Data), finalRcpts(rs[1].Data)
	if strings.Join(first, ",") != "gone@dest.test" || strings.Join(second, ",") != "later@other.test" {
		t.Fatalf("reports list %v then %v", first, second)
	}
	if !bytes.Contains(rs[1].Data, []byte("Status: 5.4.7")) {
		t.Fatalf("the dead part's report:\n%s", rs[1].Data)
	}
}

// TestPassReportOnceAcrossCrash: the part completing a pass, run again
// after a crash before its durable step, queues the one report again under
// the same id: one report, listing both parts' recipients.
func TestPassReportOnceAcrossCrash(t *testing.T) {
	e := newEnv(t, nil)
	m := NewDSNMetrics(prometheus.NewRegistry())
	d := noticeDeliverer(t, e.q, e.snd, dsnConfig(m))
	part := func(n, rcpt string) (*queue.Envelope, *outcome) {
		env := &queue.Envelope{ID: "m-" + n, MsgID: "m", Parts: 2, Tenant: "t1", From: "app@src.test", Rcpts: []string{rcpt},
			Dest: queue.Domain(rcpt), Body: []byte("Subject: hi\r\n\r\nx\r\n"), Source: queue.SourceSMTP, SubmittedAt: time.Now()}
		o := &outcome{bounced: []rcptResult{{rcpt, classify.Result{Class: classify.Permanent, Code: 550, Enhanced: "5.1.1", Text: "no"}, classify.StageRcpt}},
			host: "mx." + env.Dest, body: env.Body}
		return env, o
	}
	ctx := context.Background()
	env1, o1 := part("1", "gone@dest.test")
	if err := d.attemptNotices(ctx, env1, o1); err != nil {
		t.Fatal(err)
	}
	if !env1.PassNoted || counterValue(m.Sent.WithLabelValues("failed")) != 0 {
		t.Fatal("the first part must record its pass and send nothing")
	}
	for range 2 { // the second part, then the same part run again
		env2, o2 := part("2", "gone@other.test")
		if err := d.attemptNotices(ctx, env2, o2); err != nil {
			t.Fatal(err)
		}
	}
	items, err := e.q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 {
		t.Fatalf("%d envelopes queued for one pass report", len(items))
	}
	e.startPool(nil)
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
	if got := finalRcpts(reports(e.mx)[0].Data); strings.Join(got, ",") != "gone@dest.test,gone@other.test" {
		t.Fatalf("report lists %v", got)
	}
}

// TestPassReportSurvivesRestartAfterDrop: a process bounces one part of a
// two-part message (its note in the pass record, the pass left open, a
// timer for its deadline), an operator drops the other part before it
// reaches its pass, and the process stops. Before, the timer was in its
// memory only and nothing else could end the pass (the part that would
// complete it was gone), so the sender never heard of the bounce. The
// wait is now kept in the SENT bucket, and the process started next
// takes it up and sends the report at the deadline.
func TestPassReportSurvivesRestartAfterDrop(t *testing.T) {
	e := newEnv(t, bounceGone)
	m := NewDSNMetrics(prometheus.NewRegistry())
	cfg := dsnConfig(m)
	cfg.PassTimeout = 500 * time.Millisecond
	ids := e.submitParts("gone@one.test", "gone@two.test")
	if len(ids) != 2 {
		t.Fatalf("want two parts, got %v", ids)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d, stopPull := testqueue.Take(t, ctx, e.q, queue.LaneWork)
	stopPull()
	first := noticeDeliverer(t, e.q, e.snd, cfg) // the process that stops
	if err := first.handle(ctx, d); err != nil {
		t.Fatal(err)
	}
	if n := counterValue(m.Sent.WithLabelValues("failed")); n != 0 {
		t.Fatalf("%v failed notices with the other part still to come", n)
	}
	other := ids[0]
	if other == d.Env.ID {
		other = ids[1]
	}
	if _, err := e.q.Drop(ctx, other); err != nil {
		t.Fatal(err)
	}
	// first stops here, before the deadline; the next process starts.
	e.startPool(func(c *Config) { c.DSN = cfg })
	testutil.WaitFor(t, 15*time.Second, "the report after the restart", func() bool { return len(reports(e.mx)) == 1 })
	if got := finalRcpts(reports(e.mx)[0].Data); strings.Join(got, ",") != d.Env.Rcpts[0] {
		t.Fatalf("report lists %v, want %s", got, d.Env.Rcpts[0])
	}
}

// TestSenderRateAcrossFleet: two worker pools on two connections to one
// JetStream share each address's allowance; together they queue at most
// the rate.
func TestSenderRateAcrossFleet(t *testing.T) {
	e := newEnv(t, nil)
	const rate, each = 3, 4
	var ds []*deliverer
	var ms []*DSNMetrics
	for _, q := range []*queue.Queue{e.q, connect(t, e.emb, 2*time.Second)} {
		m := NewDSNMetrics(prometheus.NewRegistry())
		cfg := dsnConfig(m)
		cfg.SenderRate = rate
		ds, ms = append(ds, noticeDeliverer(t, q, e.snd, cfg)), append(ms, m)
	}
	ctx := context.Background()
	for i := range each {
		for j, d := range ds {
			id := string(rune('a'+j)) + string(rune('0'+i))
			env := &queue.Envelope{ID: id, MsgID: id, Tenant: "t1", From: "App@src.test", Rcpts: []string{"gone@dest.test"},
				Dest: "dest.test", Body: []byte("Subject: hi\r\n\r\nx\r\n"), Source: queue.SourceSMTP, SubmittedAt: time.Now()}
			o := &outcome{bounced: []rcptResult{{"gone@dest.test", classify.Result{Class: classify.Permanent, Code: 550, Text: "no"}, classify.StageRcpt}}, body: env.Body}
			if err := d.bounceNotice(ctx, env, o); err != nil {
				t.Fatal(err)
			}
		}
	}
	sent, limited := 0.0, 0.0
	for _, m := range ms {
		sent += counterValue(m.Sent.WithLabelValues("failed"))
		limited += counterValue(m.Skipped.WithLabelValues(skipRate))
	}
	if sent != rate || limited != 2*each-rate {
		t.Fatalf("fleet queued %v notices and limited %v; want %d and %d", sent, limited, rate, 2*each-rate)
	}
	items, err := e.q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != rate {
		t.Fatalf("%d notices in the queue; want %d", len(items), rate)
	}
}
