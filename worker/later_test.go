package worker

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/internal/fakemx"
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
// its sender's notices need when a report comes back later; ReportedLater
// then sends one notice per action (failed, delayed, delivered) for the
// recipients whose NOTIFY asks for it, once however often the report
// comes, with the remote server's status and diagnostic and the header it
// returned, and the submitted ORCPT, never the report's. The MX offers DSN,
// so it took NOTIFY and owes the success report itself. The message is
// split per recipient, as serve splits a tenant's with a return path (an
// envelope of several goes out with its own sender), and the listener
// hands each envelope's delivered event the report's blocks.
func TestReportedLaterNotifiesTheSender(t *testing.T) {
	e := newEnvMX(t, fakemx.Options{DSN: true})
	m := NewDSNMetrics(prometheus.NewRegistry())
	e.startPool(func(c *Config) { c.DSN = dsnConfig(m); c.ReturnPath = prefixReturnPath{} })
	params := &queue.DSNParams{EnvID: "env-7", Rcpts: map[string]queue.RcptDSN{
		"Gone@dest.test":  {ORcpt: "gone@old.test", ORcptType: "rfc822"},
		"never@dest.test": {Notify: []string{queue.NotifyNever}},
		"yes@dest.test":   {Notify: []string{queue.NotifySuccess, queue.NotifyFailure}},
	}}
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "app@src.test", Source: queue.SourceSMTP,
		Rcpts: []string{"Gone@dest.test", "never@dest.test", "ok@dest.test", "yes@dest.test"}, DSN: params, PerRecipient: true,
		Body: []byte("Subject: hi\r\nFrom: app@src.test\r\nMessage-ID: <x@src.test>\r\n\r\nhello\r\n")})
	if err != nil || len(ids) != 4 {
		t.Fatalf("ids %v, %v", ids, err)
	}
	var evs []queue.Event // the delivered events that owe notices: Gone's, ok's and yes's
	for i, id := range ids {
		ev := e.deliveredEvent(id)
		n := ev.Notify
		if i == 1 {
			if n != nil {
				t.Fatalf("the NOTIFY=NEVER recipient's delivered event has notify %+v", n)
			}
			continue
		}
		if n == nil || n.Sender != "app@src.test" || n.EnvID != "env-7" || n.MessageID != "<x@src.test>" || n.Submitted.IsZero() ||
			n.Source != queue.SourceSMTP || len(n.Rcpts) != 1 {
			t.Fatalf("delivered event %s's notify: %+v", id, n)
		}
		evs = append(evs, ev)
	}
	if r := evs[0].Notify.Rcpts[0]; r.Rcpt != "Gone@dest.test" || r.ORcpt != "gone@old.test" {
		t.Errorf("Gone's notify %+v, want it with its ORCPT", r)
	}
	if r := evs[1].Notify.Rcpts[0]; r.Rcpt != "ok@dest.test" || strings.Join(r.Notify, ",") != "FAILURE,DELAY" {
		t.Errorf("ok's notify %+v, want the default kinds", r)
	}
	if r := evs[2].Notify.Rcpts[0]; r.Rcpt != "yes@dest.test" || strings.Join(r.Notify, ",") != "FAILURE,SUCCESS" {
		t.Errorf("yes's notify %+v, want its NOTIFY", r)
	}

	later := []dsn.Recipient{
		{Final: "gone@dest.test", Action: dsn.Failed, Status: "5.1.1", RemoteMTA: "mbox.dest.test", Diagnostic: "550 5.1.1 <gone@dest.test>: User unknown"},
		{Final: "never@dest.test", Action: dsn.Failed, Status: "5.2.2", Diagnostic: "552 5.2.2 over quota"},
		{Final: "ok@dest.test", Action: dsn.Delayed, Status: "4.4.1", Diagnostic: "451 4.4.1 no answer from the next hop",
			Original: "alias@elsewhere.test"}, // the report's own Original-Recipient is not passed on
		{Final: "ok@dest.test", Action: "bogus", Status: "5.1.1"},        // an action word no notice is for
		{Final: "ok@dest.test", Action: dsn.Delivered, Status: "2.0.0"},  // ok asked for no success notice
		{Final: "yes@dest.test", Action: dsn.Delivered, Status: "2.0.0"}, // yes did
	}
	for _, ev := range evs {
		returned := []byte("Return-Path: <b." + ev.ID + "@rp.test>\r\nSubject: hi\r\nFrom: app@src.test")
		for range 2 { // a report sent again queues no second notice
			if err := e.pool.ReportedLater(context.Background(), &ev, later, returned); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitUntil(t, "three notices at the MX", func() bool { return len(reports(e.mx)) == 3 })
	byAction := map[string]string{}
	for _, r := range reports(e.mx) {
		if strings.Join(r.Rcpts, ",") != "app@src.test" {
			t.Fatalf("a notice went to %v", r.Rcpts)
		}
		body := string(r.Data)
		for _, a := range []string{"failed", "delayed", "delivered"} {
			if strings.Contains(body, "Action: "+a) {
				byAction[a] = body
			}
		}
		if strings.Contains(body, "never@dest.test") || strings.Contains(body, "alias@elsewhere.test") {
			t.Errorf("the NOTIFY=NEVER recipient, or the report's Original-Recipient, is in a notice:\n%s", body)
		}
	}
	for action, wants := range map[string][]string{
		"failed": {"Final-Recipient: rfc822; Gone@dest.test", "Original-Recipient: rfc822;gone@old.test",
			"Original-Envelope-Id: env-7", "Status: 5.1.1", "Remote-MTA: dns; mbox.dest.test",
			"Diagnostic-Code: smtp; 550 5.1.1 <gone@dest.test>: User unknown", "which reported\r\nlater",
			"In-Reply-To: <x@src.test>", "Content-Type: text/rfc822-headers", "Subject: hi"},
		"delayed":   {"Final-Recipient: rfc822; ok@dest.test", "Status: 4.4.1", "no answer from the next hop"},
		"delivered": {"Final-Recipient: rfc822; yes@dest.test", "Status: 2.0.0"},
	} {
		body, ok := byAction[action]
		if !ok {
			t.Errorf("no %s notice", action)
			continue
		}
		for _, want := range wants {
			if !strings.Contains(body, want) {
				t.Errorf("%s notice lacks %q:\n%s", action, want, body)
			}
		}
		if action != "delayed" && strings.Contains(body, "ok@dest.test") {
			t.Errorf("ok@ in the %s notice", action)
		}
	}
	var notices []string
	for _, d := range evs {
		for _, ev := range e.waitEvent(d.ID, queue.EventDSN) {
			if ev.Type == queue.EventDSN {
				notices = append(notices, ev.Reason)
			}
		}
	}
	slices.Sort(notices)
	if len(notices) != 6 || len(slices.Compact(slices.Clone(notices))) != 3 {
		t.Fatalf("dsn events %q: want three notices, each named twice", notices)
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
			"r@dest.test": {Notify: []string{queue.NotifyNever}}}}}, // no notice asked
		{Tenant: "t1", From: "app@src.test", Source: queue.SourceSMTP, DSN: &queue.DSNParams{Rcpts: map[string]queue.RcptDSN{
			"r@dest.test": {Notify: []string{queue.NotifySuccess}}}}}, // the MX took no NOTIFY: its relayed notice went at delivery
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
	if err := p.ReportedLater(context.Background(), ev, []dsn.Recipient{{Final: "a@dest.test", Action: dsn.Failed}}, nil); err != nil {
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
	if err := p.ReportedLater(context.Background(), ev, []dsn.Recipient{{Final: "a@dest.test", Action: dsn.Failed}}, nil); err != nil {
		t.Fatal(err)
	}
	if got := counterValue(m.Skipped.WithLabelValues(skipTenantOff)); got != 1 || counterValue(m.Sent.WithLabelValues("failed")) != 0 {
		t.Fatalf("tenant off: skipped %v", got)
	}
}
