package worker

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/queue"
)

// deliveredEvent returns id's delivered event.
func (e *env) deliveredEvent(id string) queue.Event {
	e.t.Helper()
	for _, ev := range e.waitEvent(id, queue.EventDelivered) {
		if ev.Type == queue.EventDelivered {
			return ev
		}
	}
	panic("unreachable")
}

// An envelope sent with a return path keeps, on its delivered event, what
// its sender's notice needs when a bounce comes back later; BouncedLater
// then sends that notice once, for the recipients that asked for it, with
// the remote server's diagnostic and the header it returned.
func TestBouncedLaterNotifiesTheSender(t *testing.T) {
	e := newEnv(t, nil)
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m); c.ReturnPath = prefixReturnPath{} })
	params := &queue.DSNParams{EnvID: "env-7", Rcpts: map[string]queue.RcptDSN{
		"Gone@dest.test":  {ORcpt: "gone@old.test", ORcptType: "rfc822"},
		"never@dest.test": {Notify: []string{queue.NotifyNever}},
	}}
	id := e.submitSMTP("app@src.test", params, "Gone@dest.test", "never@dest.test", "ok@dest.test")
	ev := e.deliveredEvent(id)
	n := ev.Notify
	if n == nil || n.Sender != "app@src.test" || n.EnvID != "env-7" || n.MessageID != "<x@src.test>" || n.Submitted.IsZero() ||
		n.Source != queue.SourceSMTP {
		t.Fatalf("delivered event's notify: %+v", n)
	}
	if len(n.Rcpts) != 2 || n.Rcpts[0] != (queue.NotifyRcpt{Rcpt: "Gone@dest.test", ORcpt: "gone@old.test", ORcptType: "rfc822"}) ||
		n.Rcpts[1].Rcpt != "ok@dest.test" {
		t.Fatalf("notify's recipients %+v, want Gone (with its ORCPT) and ok, not the NOTIFY=NEVER one", n.Rcpts)
	}

	later := []dsn.Recipient{
		{Final: "gone@dest.test", Action: dsn.Failed, Status: "5.1.1", RemoteMTA: "mbox.dest.test", Diagnostic: "550 5.1.1 <gone@dest.test>: User unknown"},
		{Final: "never@dest.test", Action: dsn.Failed, Status: "5.2.2", Diagnostic: "552 5.2.2 over quota"},
	}
	returned := []byte("Return-Path: <b." + id + "@rp.test>\r\nSubject: hi\r\nFrom: app@src.test")
	for range 2 { // a report sent again queues no second notice
		if err := e.pool.BouncedLater(context.Background(), &ev, later, returned); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, "the notice at the MX", func() bool { return len(reports(e.mx)) == 1 })
	r := reports(e.mx)[0]
	if strings.Join(r.Rcpts, ",") != "app@src.test" {
		t.Fatalf("notice went to %v", r.Rcpts)
	}
	body := string(r.Data)
	for _, want := range []string{"Final-Recipient: rfc822; Gone@dest.test", "Original-Recipient: rfc822;gone@old.test",
		"Original-Envelope-Id: env-7", "Status: 5.1.1", "Remote-MTA: dns; mbox.dest.test",
		"Diagnostic-Code: smtp; 550 5.1.1 <gone@dest.test>: User unknown", "which reported\r\nlater",
		"In-Reply-To: <x@src.test>", "Content-Type: text/rfc822-headers", "Subject: hi"} {
		if !strings.Contains(body, want) {
			t.Errorf("notice lacks %q:\n%s", want, body)
		}
	}
	if strings.Contains(body, "never@dest.test") {
		t.Error("the NOTIFY=NEVER recipient is in the notice")
	}
	var notices []string
	for _, ev := range e.waitEvent(id, queue.EventDSN) {
		if ev.Type == queue.EventDSN {
			notices = append(notices, ev.Reason)
		}
	}
	if len(notices) != 2 || notices[0] != notices[1] || !strings.HasPrefix(notices[0], "failed notice ") {
		t.Fatalf("dsn events %q: want the same notice named twice", notices)
	}
	if got := counterValue(m.Sent.WithLabelValues("failed")); got != 2 {
		t.Errorf("outflow_dsn_total{action=failed} = %v, want 2 (queued twice, deduplicated by the queue)", got)
	}
}

// No Notify where no notice is owed later: the attempt kept the sender
// (its bounces go there), or the sender gets no notices.
func TestNoLaterNotify(t *testing.T) {
	e := newEnv(t, nil)
	e.startPool(func(c *Config) { c.DSN = dsnConfig(nil); c.ReturnPath = prefixReturnPath{} })
	for _, s := range []*queue.Submission{
		{Tenant: "t2", From: "app@src.test", Source: queue.SourceSMTP}, // no return path for t2
		{Tenant: "t1", From: "", Source: queue.SourceSMTP},             // null sender
		{Tenant: "t1", From: "app@src.test", Source: queue.SourceAPI},  // notices off for API mail
		{Tenant: "t1", From: "app@src.test", Source: queue.SourceSMTP, DSN: &queue.DSNParams{Rcpts: map[string]queue.RcptDSN{
			"r@dest.test": {Notify: []string{queue.NotifyDelay}}}}}, // no FAILURE asked
		{Tenant: "t1", From: "app@src.test", Source: queue.SourceSMTP, // a report, from a sender
			Body: []byte("Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n--b--\r\n")},
	} {
		s.Rcpts = []string{"r@dest.test"}
		if s.Body == nil {
			s.Body = []byte("Subject: x\r\n\r\nx\r\n")
		}
		ids, err := e.q.Enqueue(context.Background(), s)
		if err != nil {
			t.Fatal(err)
		}
		if ev := e.deliveredEvent(ids[0]); ev.Notify != nil {
			t.Errorf("%s from %q (%s): notify %+v", s.Tenant, s.From, s.Source, ev.Notify)
		}
	}
	// A process without notices queues none, and says no error.
	p, err := New(Config{Queue: e.q, Sender: e.snd})
	if err != nil {
		t.Fatal(err)
	}
	ev := &queue.Event{ID: "x", Tenant: "t1", Notify: &queue.Notify{Sender: "app@src.test", Source: queue.SourceSMTP,
		Rcpts: []queue.NotifyRcpt{{Rcpt: "a@dest.test"}}}}
	if err := p.BouncedLater(context.Background(), ev, []dsn.Recipient{{Final: "a@dest.test", Action: dsn.Failed}}, nil); err != nil {
		t.Fatal(err)
	}
	// A tenant whose notices were turned off after the delivery gets none
	// when the bounce comes.
	m := NewDSNMetrics(prometheus.NewRegistry())
	off := false
	cfg := dsnConfig(m)
	cfg.Tenants = map[string]TenantDSN{"t1": {Enabled: &off}}
	if p, err = New(Config{Queue: e.q, Sender: e.snd, DSN: cfg}); err != nil {
		t.Fatal(err)
	}
	if err := p.BouncedLater(context.Background(), ev, []dsn.Recipient{{Final: "a@dest.test", Action: dsn.Failed}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(m.Skipped.WithLabelValues(skipTenantOff)); got != 1 || counterValue(m.Sent.WithLabelValues("failed")) != 0 {
		t.Fatalf("tenant off: skipped %v", got)
	}
}
