package worker

import (
	"bytes"
	"context"
	"mime"
	"net/mail"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

func bounceGone(stage fakemx.Stage, arg string) *smtp.SMTPError {
	if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
	}
	return nil
}

func (e *env) submitSMTP(from string, dsnp *queue.DSNParams, rcpts ...string) string {
	e.t.Helper()
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: from, Rcpts: rcpts, Source: queue.SourceSMTP,
		DSN: dsnp, Body: []byte("Subject: hi\r\nFrom: app@src.test\r\nMessage-ID: <x@src.test>\r\n\r\nhello\r\n")})
	if err != nil {
		e.t.Fatal(err)
	}
	return ids[0]
}

// reports returns the messages the MX received with a null reverse path.
func reports(mx *fakemx.Server) []fakemx.Message {
	var out []fakemx.Message
	for _, m := range mx.Messages() {
		if m.From == "" {
			out = append(out, m)
		}
	}
	return out
}

func dsnConfig(m *DSNMetrics) *DSNConfig {
	return &DSNConfig{ReportingMTA: "outflow.test", Metrics: m}
}

// TestBounceSendsDSN: a 550 for one recipient sends one failure report,
// with a null reverse path, to the envelope sender, through the queue;
// the original's history names it.
func TestBounceSendsDSN(t *testing.T) {
	e := newEnv(t, bounceGone)
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m) })
	id := e.submitSMTP("app@src.test", nil, "gone@dest.test", "ok@dest.test")
	evs := e.waitEvent(id, queue.EventDSN)
	var reason string
	for _, ev := range evs {
		if ev.Type == queue.EventDSN {
			reason = ev.Reason
		}
	}
	if !strings.HasPrefix(reason, "failed notice k") || !strings.HasSuffix(reason, " to app@src.test") {
		t.Fatalf("dsn event reason %q", reason)
	}
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
	r := reports(e.mx)[0]
	if strings.Join(r.Rcpts, ",") != "app@src.test" {
		t.Fatalf("report went to %v", r.Rcpts)
	}
	msg, err := mail.ReadMessage(bytes.NewReader(r.Data))
	if err != nil {
		t.Fatal(err)
	}
	mt, params, _ := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if mt != "multipart/report" || params["report-type"] != "delivery-status" {
		t.Fatalf("Content-Type %q", msg.Header.Get("Content-Type"))
	}
	for _, want := range []string{"Final-Recipient: rfc822; gone@dest.test", "Action: failed", "Status: 5.1.1",
		"Diagnostic-Code: smtp; 550 5.1.1 no such user", "Subject: hi"} {
		if !bytes.Contains(r.Data, []byte(want)) {
			t.Errorf("report lacks %q:\n%s", want, r.Data)
		}
	}
	if bytes.Contains(r.Data, []byte("ok@dest.test")) {
		t.Error("the delivered recipient is in the failure report")
	}
	if got := counterValue(m.Sent.WithLabelValues("failed")); got != 1 {
		t.Errorf("outflow_dsn_total{action=failed} = %v", got)
	}
}

// TestDSNSkipped: no report for a null reverse path, for NOTIFY=NEVER, for
// a tenant turned off, or to a suppressed sender.
func TestDSNSkipped(t *testing.T) {
	e := newEnv(t, bounceGone)
	m := NewDSNMetrics(prometheus.NewRegistry())
	off := false
	e.startPool(func(c *Config) {
		c.DSN = dsnConfig(m)
		c.DSN.Tenants = map[string]TenantDSN{"t2": {Enabled: &off}}
		c.DSN.Suppressions = fixedSuppressions{"t1/blocked@src.test": true}
	})
	skipped := func(reason string) float64 { return counterValue(m.Skipped.WithLabelValues(reason)) }

	e.submitSMTP("", nil, "gone@dest.test")
	waitUntil(t, "the null sender's report skipped", func() bool { return skipped(skipNullSender) == 1 })
	e.submitSMTP("app@src.test", &queue.DSNParams{Rcpts: map[string]queue.RcptDSN{"gone@dest.test": {Notify: []string{"NEVER"}}}}, "gone@dest.test")
	waitUntil(t, "NOTIFY=NEVER skipped", func() bool { return skipped(skipNotify) == 1 })
	e.submitSMTP("blocked@src.test", nil, "gone@dest.test")
	waitUntil(t, "a suppressed sender skipped", func() bool { return skipped(skipSuppressed) == 1 })
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t2", From: "app@src.test", Rcpts: []string{"gone@dest.test"},
		Source: queue.SourceSMTP, Body: []byte("Subject: x\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "a tenant turned off skipped", func() bool { return skipped(skipTenantOff) == 1 })
	// An API submission gets none by default.
	if _, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"gone@dest.test"},
		Source: queue.SourceAPI, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "an API submission skipped", func() bool { return skipped(skipTenantOff) == 2 })
	// A two-part API message delivered in full owed no notice: none is
	// counted skipped (each part counted one).
	both, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"ok@dest.test", "ok@other.test"},
		Source: queue.SourceAPI, Body: []byte("Subject: x\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range both {
		e.waitEvent(id, queue.EventDelivered)
	}
	if n := skipped(skipTenantOff); n != 2 {
		t.Fatalf("skipped for a tenant turned off: %v, want still 2", n)
	}
	e.waitEvent(ids[0], queue.EventBounced)
	if n := len(reports(e.mx)); n != 0 || counterValue(m.Sent.WithLabelValues("failed")) != 0 {
		t.Fatalf("%d reports sent", n)
	}
}

// TestDSNOnceAcrossRetries: the same notice generated twice (an attempt
// run again after a crash before its ack) is queued once.
func TestDSNOnceAcrossRetries(t *testing.T) {
	e := newEnv(t, nil)
	m := NewDSNMetrics(prometheus.NewRegistry())
	d := noticeDeliverer(t, e.q, e.snd, dsnConfig(m))
	env := &queue.Envelope{ID: "abc", MsgID: "abc", Tenant: "t1", From: "app@src.test", Rcpts: []string{"gone@dest.test"},
		Dest: "dest.test", Body: []byte("Subject: hi\r\n\r\nx\r\n"), Source: queue.SourceSMTP, Step: 3, SubmittedAt: time.Now()}
	o := &outcome{bounced: []rcptResult{{"gone@dest.test", classify.Result{Class: classify.Permanent, Code: 550, Enhanced: "5.1.1", Text: "no"}, classify.StageRcpt}},
		host: "mx.dest.test", body: env.Body}
	for range 2 {
		if err := d.bounceNotice(context.Background(), env, o); err != nil {
			t.Fatal(err)
		}
	}
	items, err := e.q.List(context.Background(), queue.Filter{State: queue.StateQueued})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 1 {
		t.Fatalf("%d envelopes queued for one notice generated twice", len(items))
	}
	e.startPool(nil)
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
}

func TestSenderRate(t *testing.T) {
	r := senderRate{perHour: 2}
	now := time.Now()
	if !r.allow("A@x", now) || !r.allow("a@x", now) || r.allow("a@X", now) {
		t.Fatal("want two, then refused (case-insensitive)")
	}
	if !r.allow("b@x", now) {
		t.Fatal("another address has its own allowance")
	}
	if !r.allow("a@x", now.Add(31*time.Minute)) || r.allow("a@x", now.Add(31*time.Minute)) {
		t.Fatal("half an hour refills one of two per hour")
	}
}

type fixedSuppressions map[string]bool

func (f fixedSuppressions) Suppressed(_ context.Context, tenant, addr string) (*queue.Suppression, error) {
	if f[tenant+"/"+addr] {
		return &queue.Suppression{Tenant: tenant, Address: addr}, nil
	}
	return nil, nil
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestDeadLetterSendsDSN: a recipient deferred until its attempt budget is
// spent gets a failure report with 5.4.7 (RFC 3463: delivery time
// expired) and the last temporary reply as its diagnostic.
func TestDeadLetterSendsDSN(t *testing.T) {
	e := newEnv(t, func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "later@") {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
		}
		return nil
	})
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m) })
	id := e.submitSMTP("app@src.test", nil, "later@dest.test")
	e.waitEvent(id, queue.EventDead)
	waitUntil(t, "the report at the MX", func() bool { return len(reports(e.mx)) == 1 })
	r := reports(e.mx)[0].Data
	for _, want := range []string{"Final-Recipient: rfc822; later@dest.test", "Action: failed", "Status: 5.4.7",
		"Diagnostic-Code: smtp; 451 4.3.0 try later"} {
		if !bytes.Contains(r, []byte(want)) {
			t.Errorf("report lacks %q:\n%s", want, r)
		}
	}
}

// suspendDestGate refuses dest.test as suspended, for a moment at a time,
// and admits every other destination.
type suspendDestGate struct {
	throttle.OpenGate
	refused atomic.Int32
}

func (g *suspendDestGate) Admit(ctx context.Context, dest, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if dest == "dest.test" {
		g.refused.Add(1)
		return nil, throttle.Refusal{Until: time.Now().Add(100 * time.Millisecond), Reason: "suspended", Detail: "dest.test: suspended by an operator"}
	}
	return g.OpenGate.Admit(ctx, dest, tenant, source)
}

// TestSuspendedMailIsWarnedOfItsDelay: mail a suspension holds past
// dsn-delay-warning gets its delay notice, as mail an attempt deferred
// does, saying why and with no Last-Attempt-Date (there was none); the
// first notice used to be the failure at the deadline.
func TestSuspendedMailIsWarnedOfItsDelay(t *testing.T) {
	e := newEnv(t, nil)
	m := NewDSNMetrics(prometheus.NewRegistry())
	gate := &suspendDestGate{}
	e.startPool(func(c *Config) {
		c.DSN = dsnConfig(m)
		c.DSN.DelayWarning = 300 * time.Millisecond
		c.Gate = gate
	})
	// Submitted with a deadline 3 s on, as --max-age 3s would.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	short, err := testqueue.ConnectInProcess(ctx, e.emb, queue.Options{AckWait: 2 * time.Second, DeadlineAfter: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	if _, err := short.Enqueue(ctx, &queue.Submission{Tenant: "t1", From: "app@src.test", Rcpts: []string{"held@dest.test"}, Source: queue.SourceSMTP,
		Body: []byte("Subject: hi\r\nFrom: app@src.test\r\nMessage-ID: <x@src.test>\r\n\r\nhello\r\n")}); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the delay notice at the MX", func() bool { return len(reports(e.mx)) == 1 })
	r := reports(e.mx)[0].Data
	for _, want := range []string{"Final-Recipient: rfc822; held@dest.test", "Action: delayed", "Status: 4.0.0",
		"Diagnostic-Code: x-outflow; outflow: delivery to the destination is", "suspended by an operator", "Will-Retry-Until:"} {
		if !bytes.Contains(r, []byte(want)) {
			t.Errorf("notice lacks %q:\n%s", want, r)
		}
	}
	if bytes.Contains(r, []byte("Last-Attempt-Date")) {
		t.Errorf("a Last-Attempt-Date for mail never tried:\n%s", r)
	}
	n := gate.refused.Load()
	waitUntil(t, "more refusals after the notice", func() bool { return gate.refused.Load() > n+2 })
	if got := counterValue(m.Sent.WithLabelValues("delayed")); got != 1 {
		t.Errorf("outflow_dsn_total{action=delayed} = %v, want one warning", got)
	}
	// Past its deadline, never tried: the failure has no
	// Last-Attempt-Date either (RFC 3464 §2.3.7).
	waitUntil(t, "the failure notice at the MX", func() bool { return len(reports(e.mx)) == 2 })
	r = reports(e.mx)[1].Data
	if !bytes.Contains(r, []byte("Action: failed")) || !bytes.Contains(r, []byte("Status: 5.4.7")) || bytes.Contains(r, []byte("Last-Attempt-Date")) {
		t.Errorf("the failure of mail never tried:\n%s", r)
	}
}

// TestRemoteMTAAddressLiteral: a server known by its address (a relay at
// [::1]:587, an MX host given as an IP) is named in Remote-MTA and in the
// notice's text as an address literal, [IPv6:::1] or [127.0.0.1], the
// form Reporting-MTA has for a --hostname that is one; before, it was
// "dns; ::1", a bare address given as a domain name. A host name is kept.
func TestRemoteMTAAddressLiteral(t *testing.T) {
	res := classify.Result{Code: 550, Enhanced: "5.1.1", Text: "no such user"}
	for host, want := range map[string]string{
		"::1": "[IPv6:::1]", "2001:DB8::1": "[IPv6:2001:db8::1]", "fe80::1%eth0": "[IPv6:fe80::1]",
		"127.0.0.1": "[127.0.0.1]", "::ffff:127.0.0.1": "[127.0.0.1]",
		"mx.dest.test": "mx.dest.test", "": "",
	} {
		if got := rcptReport("bad@dest.test", dsn.Failed, res, host, time.Time{}).RemoteMTA; got != want {
			t.Errorf("host %q: Remote-MTA name %q, want %q", host, got, want)
		}
	}
	b, err := dsn.Build(&dsn.Report{ReportingMTA: "[IPv6:::1]", From: "MAILER-DAEMON@src.test", To: "app@src.test", ID: "r1",
		Recipients: []dsn.Recipient{rcptReport("bad@dest.test", dsn.Failed, res, "::1", time.Time{})}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Reporting-MTA: dns; [IPv6:::1]\r\n", "Remote-MTA: dns; [IPv6:::1]\r\n", "([IPv6:::1])"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("notice lacks %q:\n%s", want, b)
		}
	}
}
