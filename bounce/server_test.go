package bounce

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/internal/ascii"
	tu "github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
)

// fakeStore holds envelopes' events and records what the listener
// publishes; fail makes the next publishes fail.
type fakeStore struct {
	mu        sync.Mutex
	hist      map[string][]queue.Event
	published []queue.Event
	fail      int
	syncs     int
	failSync  bool
}

func (f *fakeStore) History(_ context.Context, id string, _ time.Time) ([]queue.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.hist[id]
	if !ok {
		return nil, fmt.Errorf("%w: no events for %s", queue.ErrNotFound, id)
	}
	return h, nil
}

func (f *fakeStore) PublishEvent(_ context.Context, typ string, ev *queue.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("no responders")
	}
	ev.Type = typ
	f.published = append(f.published, *ev)
	return nil
}

func (f *fakeStore) SyncOutcomes(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.syncs++
	if f.failSync {
		return errors.New("fsync: input/output error")
	}
	return nil
}

func (f *fakeStore) events() []queue.Event {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]queue.Event(nil), f.published...)
}

type fakeSuppressions struct {
	mu   sync.Mutex
	list []queue.Suppression
}

func (f *fakeSuppressions) AddFirst(_ context.Context, s queue.Suppression) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.list = append(f.list, s)
	return true, nil
}

func (f *fakeSuppressions) entries() []queue.Suppression {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]queue.Suppression(nil), f.list...)
}

type listener struct {
	srv   *Server
	addr  string
	rp    *ReturnPath
	store *fakeStore
	sup   *fakeSuppressions
	reg   *prometheus.Registry
	log   *tu.SyncBuffer
}

// startListener serves a listener on loopback with one delivered envelope:
// env1 of tenant shop, delivered to bob and alice at dest.example.
func startListener(t *testing.T, mut func(*Config)) *listener {
	t.Helper()
	l := &listener{rp: testReturnPath(), reg: prometheus.NewRegistry(), sup: &fakeSuppressions{}, log: &tu.SyncBuffer{},
		store: &fakeStore{hist: map[string][]queue.Event{"env1": {
			{Type: queue.EventQueued, ID: "env1", MsgID: "msg1", Tenant: "shop", Dest: "dest.example"},
			{Type: queue.EventDelivered, ID: "env1", MsgID: "msg1", Tenant: "shop", Dest: "dest.example",
				Recipients: []string{"Bob@dest.example", "alice@dest.example"}},
		}}}}
	cfg := Config{Addr: "127.0.0.1:0", Hostname: "bounces.test", ID: "w1/bounce", ReturnPath: l.rp, Store: l.store,
		Suppressions: l.sup, Registerer: l.reg, Logger: zerolog.New(l.log)}
	if mut != nil {
		mut(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	l.srv, l.addr = srv, ln.Addr().String()
	return l
}

// send delivers msg to the listener, addressed to rcpts, and returns the
// server's answer (nil for 250).
func (l *listener) send(t *testing.T, rcpts []string, msg []byte) error {
	t.Helper()
	c, err := smtp.Dial(l.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return tu.Send(c, "", rcpts, msg)
}

func (l *listener) returnPath(id string) string {
	return l.rp.Address("shop", id, "app@shop.example", time.Now())
}

func (l *listener) count(result string) float64 {
	var m dto.Metric
	if err := l.srv.results.WithLabelValues(result).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// failureDSN is a report as a receiving MTA writes it, through the dsn
// package's writer.
func failureDSN(t *testing.T, rcpts ...dsn.Recipient) []byte {
	t.Helper()
	msg, err := dsn.Build(&dsn.Report{ReportingMTA: "mx.dest.example", From: "MAILER-DAEMON@mx.dest.example",
		To: "whoever@rp.example.org", ID: "r1", ArrivalDate: time.Now(), Recipients: rcpts,
		Original: []byte("Message-ID: <m1@shop.example>\r\nSubject: hi\r\n\r\nbody\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	return msg
}

// A hard bounce mailed back after the 250: the recipient's bounced event,
// marked async, on the envelope, and the recipient suppressed for the
// envelope's tenant, before the 250.
func TestAsyncHardBounceRecordedAndSuppressed(t *testing.T) {
	l := startListener(t, nil)
	msg := failureDSN(t, dsn.Recipient{Final: "bob@DEST.example", Action: dsn.Failed, Status: "5.1.1",
		RemoteMTA: "mbox.dest.example", Diagnostic: "550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown"})
	if err := l.send(t, []string{l.returnPath("env1")}, msg); err != nil {
		t.Fatalf("answered %v", err)
	}
	evs := l.store.events()
	if len(evs) != 1 {
		t.Fatalf("%d events, want 1: %+v", len(evs), evs)
	}
	ev := evs[0]
	if ev.Type != queue.EventBounced || !ev.Async || ev.ID != "env1" || ev.MsgID != "msg1" || ev.Tenant != "shop" ||
		ev.Dest != "dest.example" || ev.Worker != "w1/bounce" || len(ev.Recipients) != 1 || ev.Recipients[0] != "bob@dest.example" ||
		!strings.Contains(ev.Reason, "User unknown") {
		t.Fatalf("event %+v", ev)
	}
	sup := l.sup.entries()
	if len(sup) != 1 || sup[0].Tenant != "shop" || sup[0].Address != "bob@dest.example" || sup[0].Source != queue.SuppressBounce {
		t.Fatalf("suppressions %+v", sup)
	}
	if n := l.count(ResultBounced); n != 1 {
		t.Fatalf("bounced counted %v", n)
	}
	if l.store.syncs != 1 {
		t.Fatalf("%d syncs before the 250, want one group commit", l.store.syncs)
	}
}

// A failure about the message, not the address (content refused as spam,
// a policy block), is recorded but suppresses nobody: the rule a bounce
// during delivery follows.
func TestAsyncPolicyBounceNotSuppressed(t *testing.T) {
	l := startListener(t, nil)
	msg := failureDSN(t, dsn.Recipient{Final: "alice@dest.example", Action: dsn.Failed, Status: "5.7.1",
		Diagnostic: "550 5.7.1 Message rejected as spam by Content Filtering"})
	if err := l.send(t, []string{l.returnPath("env1")}, msg); err != nil {
		t.Fatal(err)
	}
	if evs := l.store.events(); len(evs) != 1 || evs[0].Type != queue.EventBounced || evs[0].Recipients[0] != "alice@dest.example" {
		t.Fatalf("events %+v", evs)
	}
	if sup := l.sup.entries(); len(sup) != 0 {
		t.Fatalf("a policy refusal suppressed %+v", sup)
	}
}

// Only this fleet's return paths are taken: anyone can connect to port
// 25, and a forged address must suppress nobody.
func TestForgedReturnPathRefusedAtRcpt(t *testing.T) {
	l := startListener(t, nil)
	good := l.returnPath("env1")
	local, domain, _ := strings.Cut(good, "@")
	forged := "b.env1." + strings.Split(local, ".")[2] + ".aaaaaaaaaaaaaaaa@" + domain
	for _, to := range []string{forged, "postmaster@rp.example.org", "someone@elsewhere.example"} {
		err := l.send(t, []string{to}, []byte("Subject: x\r\n\r\nx\r\n"))
		var se *smtp.SMTPError
		if !errors.As(err, &se) || se.Code != 550 || se.EnhancedCode != (smtp.EnhancedCode{5, 1, 1}) {
			t.Fatalf("RCPT %s answered %v, want 550 5.1.1", to, err)
		}
	}
	if n := l.count(ResultRefused); n != 3 {
		t.Fatalf("refused counted %v", n)
	}
	if evs := l.store.events(); len(evs) != 0 {
		t.Fatalf("events %+v", evs)
	}
}

// A report that cannot be stored now is answered 451 and taken when sent
// again: the 250 comes only after the event is stored.
func TestReportNotStoredIs451(t *testing.T) {
	l := startListener(t, nil)
	l.store.fail = 1
	msg := failureDSN(t, dsn.Recipient{Final: "bob@dest.example", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"})
	err := l.send(t, []string{l.returnPath("env1")}, msg)
	var se *smtp.SMTPError
	if !errors.As(err, &se) || se.Code != 451 {
		t.Fatalf("answered %v, want 451", err)
	}
	if len(l.sup.entries()) != 0 {
		t.Fatal("suppressed before the event was stored")
	}
	if err := l.send(t, []string{l.returnPath("env1")}, msg); err != nil {
		t.Fatalf("sent again: %v", err)
	}
	if len(l.store.events()) != 1 || len(l.sup.entries()) != 1 {
		t.Fatalf("events %+v, suppressions %+v", l.store.events(), l.sup.entries())
	}
	// Stored but not on disk (a failed fsync) is no 250 either.
	l.store.mu.Lock()
	l.store.failSync = true
	l.store.mu.Unlock()
	if err := l.send(t, []string{l.returnPath("env1")}, msg); !errors.As(err, &se) || se.Code != 451 {
		t.Fatalf("a failed sync answered %v, want 451", err)
	}
}

// Reports taken and not recorded: each counted by what it was.
func TestReportsTakenNotRecorded(t *testing.T) {
	l := startListener(t, nil)
	rp := l.returnPath("env1")
	cases := []struct {
		name, result string
		to           string
		msg          []byte
	}{
		{"a delay", ResultNoFailure, rp, failureDSN(t, dsn.Recipient{Final: "bob@dest.example", Action: dsn.Delayed, Status: "4.4.7",
			Diagnostic: "451 4.4.7 mailbox busy"})},
		{"a recipient not delivered to", ResultUnmatched, rp, failureDSN(t, dsn.Recipient{Final: "carol@dest.example", Action: dsn.Failed,
			Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"})},
		{"an envelope without events", ResultUnknownMsg, l.returnPath("gone1"), failureDSN(t, dsn.Recipient{Final: "bob@dest.example",
			Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"})},
	}
	for _, tc := range cases {
		if err := l.send(t, []string{tc.to}, tc.msg); err != nil {
			t.Fatalf("%s: answered %v", tc.name, err)
		}
		if n := l.count(tc.result); n != 1 {
			t.Errorf("%s: %s counted %v", tc.name, tc.result, n)
		}
	}
	if evs := l.store.events(); len(evs) != 0 {
		t.Fatalf("recorded %+v", evs)
	}
	if sup := l.sup.entries(); len(sup) != 0 {
		t.Fatalf("suppressed %+v", sup)
	}
}

// What the listener cannot read is refused, 550 5.6.0 with why, not taken
// and dropped: its 250 means a report was read.
func TestUnreadableRefused(t *testing.T) {
	l := startListener(t, nil)
	rp := l.returnPath("env1")
	for _, tc := range []struct {
		name, result, why string
		msg               []byte
	}{
		{"free text", ResultUnparsed, "neither a delivery status notification",
			[]byte("From: MAILER-DAEMON@old.example\r\nSubject: failure\r\n\r\nI could not deliver your mail.\r\n")},
		{"a report without a recipient", ResultMalformed, "malformed report",
			[]byte("Content-Type: multipart/report; report-type=delivery-status; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain\r\n\r\nx\r\n--b\r\n" +
				"Content-Type: message/delivery-status\r\n\r\nReporting-MTA: dns; mx.example\r\n\r\n--b--\r\n")},
	} {
		err := l.send(t, []string{rp}, tc.msg)
		var se *smtp.SMTPError
		if !errors.As(err, &se) || se.Code != 550 || se.EnhancedCode != (smtp.EnhancedCode{5, 6, 0}) || !strings.Contains(se.Message, tc.why) {
			t.Fatalf("%s: answered %v, want 550 5.6.0 saying %q", tc.name, err, tc.why)
		}
		if n := l.count(tc.result); n != 1 {
			t.Errorf("%s: %s counted %v", tc.name, tc.result, n)
		}
	}
	if evs := l.store.events(); len(evs) != 0 {
		t.Fatalf("recorded %+v", evs)
	}
}

// A report larger than the limit is refused whole, 552.
func TestReportLongerThanKept(t *testing.T) {
	l := startListener(t, func(c *Config) { c.MaxMessageBytes = 4096 })
	// A DSN that returns a whole original (RET=FULL) of 20 KiB: its
	// status part comes first and is read; the rest is discarded, not
	// refused (a 552 lost the bounce for good).
	original := strings.Repeat(strings.Repeat("A", 76)+"\r\n", 20<<10/78)
	msg := []byte(strings.ReplaceAll(`From: MAILER-DAEMON@mx.dest.example
Subject: Undelivered Mail Returned to Sender
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status; boundary="b1"

--b1
Content-Type: text/plain

The mail could not be delivered.

--b1
Content-Type: message/delivery-status

Reporting-MTA: dns; mx.dest.example

Final-Recipient: rfc822; bob@dest.example
Action: failed
Status: 5.1.1
Diagnostic-Code: smtp; 550 5.1.1 no such user

--b1
Content-Type: message/rfc822

Message-ID: <m1@shop.example>
Subject: hi

`, "\n", "\r\n") + original + "\r\n--b1--\r\n")
	if err := l.send(t, []string{l.returnPath("env1")}, msg); err != nil {
		t.Fatalf("a report longer than kept: %v, want it taken", err)
	}
	if evs := l.store.events(); len(evs) != 1 || evs[0].Type != queue.EventBounced || evs[0].Recipients[0] != "bob@dest.example" {
		t.Fatalf("events %+v, want the bounce recorded", evs)
	}
	// A line longer than go-smtp's 2,000 octets (a returned header) is
	// no reason to refuse it either.
	long := []byte(strings.Replace(string(msg), "Subject: hi", "Subject: "+strings.Repeat("x", 3000), 1))
	if err := l.send(t, []string{l.returnPath("env1")}, long); err != nil {
		t.Fatalf("a report with a 3,000-octet line: %v", err)
	}
	// A complaint whose copy of the original runs past what is kept.
	arf := strings.Replace(string(arfReport(l.returnPath("env1"), "")), "Subject: hi\r\n", "Subject: hi\r\n\r\n"+original, 1)
	if err := l.send(t, []string{l.returnPath("env1")}, []byte(arf)); err != nil {
		t.Fatalf("a complaint longer than kept: %v", err)
	}
	if evs := l.store.events(); evs[len(evs)-1].Type != queue.EventComplained {
		t.Fatalf("events %+v, want the complaint recorded last", evs)
	}
}

// An abuse report (ARF) about a delivered message: a complained event and
// the complainer suppressed.
func TestComplaintRecordedAndSuppressed(t *testing.T) {
	l := startListener(t, nil)
	if err := l.send(t, []string{l.returnPath("env1")}, arfReport(l.returnPath("env1"), "")); err != nil {
		t.Fatal(err)
	}
	evs := l.store.events()
	if len(evs) != 1 || evs[0].Type != queue.EventComplained || !evs[0].Async || evs[0].Recipients[0] != "alice@dest.example" ||
		!strings.HasPrefix(evs[0].Reason, "abuse") {
		t.Fatalf("events %+v", evs)
	}
	sup := l.sup.entries()
	if len(sup) != 1 || sup[0].Address != "alice@dest.example" || sup[0].Source != queue.SuppressComplaint {
		t.Fatalf("suppressions %+v", sup)
	}
	if n := l.count(ResultComplaint); n != 1 {
		t.Fatalf("complaint counted %v", n)
	}
	// A report that the message is not spam, or of a virus, is recorded
	// and suppresses nobody.
	for _, typ := range []string{"not-spam", "virus"} {
		if err := l.send(t, []string{l.returnPath("env1")}, arfOfType(l.returnPath("env1"), "", typ)); err != nil {
			t.Fatal(err)
		}
	}
	if evs := l.store.events(); len(evs) != 3 || evs[1].Reason != "not-spam (DestFBL/1.0)" || evs[2].Type != queue.EventComplained {
		t.Fatalf("events %+v", evs)
	}
	if sup := l.sup.entries(); len(sup) != 1 {
		t.Fatalf("suppressions %+v", sup)
	}
}

// A feedback loop sends its reports to the one address registered with
// it, fbl@<return-path domain>: the report names its envelope by the
// return path in the original's Return-Path field. At that address a
// report whose original names no return path of this fleet (a forged one)
// records nothing.
func TestComplaintAtTheFeedbackAddress(t *testing.T) {
	l := startListener(t, nil)
	other := NewReturnPath([]byte("another key, another fleet......"), "rp.example.org", nil)
	if err := l.send(t, []string{"FBL@rp.example.org"}, arfReport("fbl@rp.example.org", other.Address("shop", "env1", "a@shop.example", time.Now()))); err != nil {
		t.Fatal(err)
	}
	if evs := l.store.events(); len(evs) != 0 {
		t.Fatalf("a forged original recorded %+v", evs)
	}
	if err := l.send(t, []string{"fbl@bounces.shop.example"}, arfReport("fbl@bounces.shop.example", l.returnPath("env1"))); err != nil {
		t.Fatal(err)
	}
	evs := l.store.events()
	if len(evs) != 1 || evs[0].Type != queue.EventComplained || evs[0].ID != "env1" || evs[0].Recipients[0] != "alice@dest.example" {
		t.Fatalf("events %+v", evs)
	}
	if sup := l.sup.entries(); len(sup) != 1 || sup[0].Address != "alice@dest.example" {
		t.Fatalf("suppressions %+v", sup)
	}
	if err := l.send(t, []string{"fbl@elsewhere.example"}, arfReport("fbl@elsewhere.example", l.returnPath("env1"))); err == nil {
		t.Fatal("the feedback address of a domain that is not a return path was taken")
	}
}

// arfReport is an abuse report about a message to alice@dest.example, as
// a provider's feedback loop writes it; originalReturnPath, when set, is
// the Return-Path of the original's header.
func arfReport(to, originalReturnPath string) []byte {
	return arfOfType(to, originalReturnPath, "abuse")
}

// arfOfType is arfReport with another Feedback-Type.
func arfOfType(to, originalReturnPath, typ string) []byte {
	rpLine := ""
	if originalReturnPath != "" {
		rpLine = "Return-Path: <" + originalReturnPath + ">\n"
	}
	return arf(to, typ, to, rpLine)
}

// arf is a report of type typ to to about a message to alice@dest.example,
// whose report part has mailFrom as its Original-Mail-From (none when "")
// and whose returned header starts with the fields fields (lines ended by
// \n).
func arf(to, typ, mailFrom, fields string) []byte {
	omf := ""
	if mailFrom != "" {
		omf = "Original-Mail-From: <" + mailFrom + ">\n"
	}
	return []byte(strings.ReplaceAll(`From: staff@fbl.dest.example
To: `+to+`
Subject: complaint about message from 192.0.2.10
MIME-Version: 1.0
Content-Type: multipart/report; report-type=feedback-report; boundary="arf"

--arf
Content-Type: text/plain

This is an email abuse report.

--arf
Content-Type: message/feedback-report

Feedback-Type: `+typ+`
User-Agent: DestFBL/1.0
Version: 1
`+omf+`Original-Rcpt-To: <alice@dest.example>
Source-IP: 192.0.2.10

--arf
Content-Type: text/rfc822-headers

`+fields+`Received: from out.shop.example (192.0.2.10) by mx.dest.example; Sun, 6 Dec 2026 12:00:00 +0000
Message-ID: <m1@shop.example>
Subject: hi

--arf--
`, "\n", "\r\n"))
}

// More connections than the limits are answered 421 at once: in all, and
// from one client, whose other connections are counted when they close.
func TestBounceListenerConnectionLimits(t *testing.T) {
	greeting := func(addr string) string {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 128)
		n, _ := c.Read(buf)
		return string(buf[:n])
	}
	l := startListener(t, func(c *Config) { c.MaxConnections = 1 })
	if g := greeting(l.addr); !strings.HasPrefix(g, "220 ") {
		t.Fatalf("first connection got %q", g)
	}
	if g := greeting(l.addr); !strings.HasPrefix(g, "421 4.7.0 Too many connections,") {
		t.Fatalf("second connection got %q", g)
	}

	l = startListener(t, func(c *Config) { c.MaxClientConnections = 2 })
	first, err := smtp.Dial(l.addr)
	if err != nil {
		t.Fatal(err)
	}
	if g := greeting(l.addr); !strings.HasPrefix(g, "220 ") {
		t.Fatalf("second connection got %q", g)
	}
	if g := greeting(l.addr); !strings.Contains(g, "from your address") {
		t.Fatalf("third connection from one client got %q", g)
	}
	_ = first.Quit()
	tu.WaitFor(t, 10*time.Second, "the closed connection to be counted out", func() bool {
		return strings.HasPrefix(greeting(l.addr), "220 ")
	})
}

// The failed recipients of real MTAs' reports (dsn/testdata/received)
// are suppressed when the report says the address is bad, whatever the
// MTA's phrasing, and not when it refuses the message.
func TestReceivedReportsSuppressOnlyBadAddresses(t *testing.T) {
	want := map[string]bool{ // file: suppressed
		"postfix-failed.eml":          true,  // 550 5.1.1 User unknown in virtual mailbox table
		"exim-failed.eml":             true,  // 550 5.1.1 ... User unknown (Status 5.0.0)
		"exchange-online-ndr.eml":     true,  // 550 5.1.10 RESOLVER.ADR.RecipientNotFound
		"gmail-nosuchuser.eml":        true,  // 550-5.1.1 The email account ... does not exist
		"sendmail-two-recipients.eml": true,  // 552 5.2.2 Mailbox full, as at delivery
		"global-utf8.eml":             true,  // 550 5.1.1, a UTF-8 address
		"base64-status.eml":           true,  // 550 5.2.1 Mailbox disabled
		"nested-mixed.eml":            false, // 550 5.7.1 rejected by content policy
	}
	cl := classify.Default()
	for file, suppress := range want {
		msg, err := os.ReadFile("../dsn/testdata/received/" + file)
		if err != nil {
			t.Fatal(err)
		}
		rep, err := dsn.ParseDSN(msg)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		n := 0
		for _, rc := range rep.Recipients {
			if rc.Action != dsn.Failed {
				continue
			}
			n++
			in, _ := diagnosticInput(rc)
			res := cl.Classify(in)
			got := res.Class == classify.Permanent && res.Scope == classify.ScopeRecipient
			if got != suppress {
				t.Errorf("%s: %s %q classified %v %v (%s): suppressed %v, want %v", file, rc.Final, rc.Diagnostic,
					res.Class, res.Scope, res.Rule, got, suppress)
			}
		}
		if n == 0 {
			t.Errorf("%s: no failed recipient", file)
		}
	}
}

// A report sent to two return paths, one of an envelope whose events are
// gone, records the other's bounce and syncs it before the 250: the
// unknown one does not hide what was recorded.
func TestReportToTwoReturnPaths(t *testing.T) {
	for _, order := range [][]string{{"env1", "gone1"}, {"gone1", "env1"}} {
		l := startListener(t, nil)
		msg := failureDSN(t, dsn.Recipient{Final: "bob@dest.example", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"})
		if err := l.send(t, []string{l.returnPath(order[0]), l.returnPath(order[1])}, msg); err != nil {
			t.Fatal(err)
		}
		if len(l.store.events()) != 1 || l.count(ResultBounced) != 1 {
			t.Fatalf("%v: events %+v, bounced counted %v", order, l.store.events(), l.count(ResultBounced))
		}
		l.store.mu.Lock()
		syncs := l.store.syncs
		l.store.mu.Unlock()
		if syncs != 1 {
			t.Fatalf("%v: %d syncs", order, syncs)
		}
	}
}

// fakeForwarder records the messages forwarded to the postmaster, or
// fails.
type fakeForwarder struct {
	mu   sync.Mutex
	subs []*queue.Submission
	fail bool
}

func (f *fakeForwarder) Enqueue(_ context.Context, s *queue.Submission) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return nil, errors.New("store down")
	}
	f.subs = append(f.subs, s)
	return []string{"fwd" + strconv.Itoa(len(f.subs))}, nil
}

func (f *fakeForwarder) sent() []*queue.Submission {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*queue.Submission(nil), f.subs...)
}

// Mail to postmaster@ or abuse@ a return-path domain is forwarded, from
// the null sender and with a Received field on top, to the operator's
// address before the 250, report or not; a report to a return path in the
// same transaction is recorded as well. Without an operator's address, and
// at other domains, they are refused; a loop is refused with 554, a store
// that fails is a 451.
func TestRoleAddressesForwarded(t *testing.T) {
	fwd := &fakeForwarder{}
	l := startListener(t, func(c *Config) { c.Postmaster, c.Forwarder = "ops@operator.example", fwd })
	letter := []byte("From: someone@isp.example\r\nSubject: your mail\r\n\r\nPlease stop.\r\n")
	if err := l.send(t, []string{"Postmaster@bounces.shop.example"}, letter); err != nil {
		t.Fatalf("postmaster: %v", err)
	}
	if err := l.send(t, []string{"abuse@bounces.shop.example", l.returnPath("env1")},
		failureDSN(t, dsn.Recipient{Final: "alice@dest.example", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "smtp; 550 5.1.1 no such user"})); err != nil {
		t.Fatalf("abuse and a return path: %v", err)
	}
	subs := fwd.sent()
	if len(subs) != 2 {
		t.Fatalf("forwarded %d messages, want 2", len(subs))
	}
	s := subs[0]
	if s.Tenant != ForwardTenant || s.From != "" || len(s.Rcpts) != 1 || s.Rcpts[0] != "ops@operator.example" || !s.IsReport {
		t.Fatalf("forwarded as %+v", s)
	}
	// Attached, not resent as itself: its From is anybody's, and would be
	// DKIM-signed as its domain.
	for _, want := range []string{"for <Postmaster@bounces.shop.example> (envelope-from <>);", "\r\nFrom: outflow bounce listener <MAILER-DAEMON@bounces.test>\r\n",
		"\r\nTo: <ops@operator.example>\r\n", "\r\nContent-Type: message/rfc822\r\n\r\n" + string(letter)} {
		if !bytes.Contains(s.Body, []byte(want)) {
			t.Fatalf("forwarded body lacks %q:\n%s", want, s.Body)
		}
	}
	if !bytes.HasPrefix(s.Body, []byte("Received: from ")) || bytes.HasPrefix(bytes.SplitN(s.Body, []byte("\r\n\r\n"), 2)[0], []byte("From: someone")) ||
		s.IdempotencyKey == "" || subs[1].IdempotencyKey == s.IdempotencyKey {
		t.Fatalf("forwarded %+v", s)
	}
	if evs := l.store.events(); len(evs) != 1 || evs[0].Type != queue.EventBounced {
		t.Fatalf("the report beside the abuse address: events %+v", evs)
	}
	if l.count(ResultForwarded) != 2 {
		t.Fatalf("forwarded counted %v", l.count(ResultForwarded))
	}

	var se *smtp.SMTPError
	if err := l.send(t, []string{"postmaster@elsewhere.example"}, letter); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("postmaster of another domain: %v, want 550", err)
	}
	loop := append([]byte(strings.Repeat("Received: by hop; now\r\n", maxHops+1)), letter...)
	if err := l.send(t, []string{"postmaster@bounces.shop.example"}, loop); !errors.As(err, &se) || se.Code != 554 || l.count(ResultLoop) != 1 {
		t.Fatalf("a loop: %v, want 554, counted", err)
	}
	fwd.mu.Lock()
	fwd.fail = true
	fwd.mu.Unlock()
	if err := l.send(t, []string{"postmaster@bounces.shop.example"}, letter); !errors.As(err, &se) || se.Code != 451 {
		t.Fatalf("store down: %v, want 451", err)
	}

	bare := startListener(t, nil)
	if err := bare.send(t, []string{"postmaster@bounces.shop.example"}, letter); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("no postmaster set: %v, want 550", err)
	}
	for _, pm := range []string{"abuse@bounces.shop.example", "ops@Bounces.Shop.Example"} {
		if _, err := New(Config{Addr: ":0", ReturnPath: testReturnPath(), Store: &fakeStore{}, Postmaster: pm, Forwarder: fwd}); err == nil {
			t.Fatalf("postmaster address %s, at a return-path domain, was taken", pm)
		}
	}
}

// A forward that a mailbox sends back to postmaster@ carries every hop it
// made (the original's trace fields are copied above the attachment), so a
// loop reaches maxHops and is refused instead of growing to the size
// limit. What the client says of itself stays printable ASCII outside the
// trace's comments.
func TestForwardLoopEnds(t *testing.T) {
	msg := []byte("Received: by mx.isp.test; now\r\nFrom: a@isp.test\r\n\r\nhi\r\n")
	info := forwardInfo{hostname: "bounces.test", postmaster: "ops@operator.example", to: []string{"postmaster@bounces.shop.example"},
		envFrom: "évil (x)@isp.test", helo: "mx\r\nX-Injected: 1", client: "192.0.2.1:25", at: time.Now()}
	rounds := 0
	for countReceived(msg) <= maxHops {
		if rounds++; rounds > maxHops {
			t.Fatalf("after %d rounds the forward still has %d Received fields", rounds, countReceived(msg))
		}
		// The operator's server takes the forward and sends it back.
		msg = append([]byte("Received: by mx.operator.example; now\r\n"), wrapForward(info, msg)...)
	}
	header, _, _ := bytes.Cut(wrapForward(info, msg), []byte("\r\n\r\n"))
	if !ascii.Is(header) || bytes.Contains(header, []byte("\nX-Injected")) || !bytes.Contains(header, []byte("from mx X-Injected: 1 (")) ||
		!bytes.Contains(header, []byte("envelope-from <??vil ?x?@isp.test>")) {
		t.Fatalf("trace of a client saying odd things:\n%s", header)
	}
}

// fakeNotifier records the notices the listener asks for; fail makes the
// next one fail.
type fakeNotifier struct {
	mu    sync.Mutex
	calls []notified
	fail  int
}

type notified struct {
	ev       queue.Event
	rcpts    []dsn.Recipient
	original string
}

func (f *fakeNotifier) ReportedLater(_ context.Context, ev *queue.Event, rcpts []dsn.Recipient, original []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail > 0 {
		f.fail--
		return errors.New("no responders")
	}
	f.calls = append(f.calls, notified{*ev, rcpts, string(original)})
	return nil
}

func (f *fakeNotifier) notices() []notified {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]notified(nil), f.calls...)
}

// A later bounce of an envelope whose delivered events say its sender is
// owed a notice is handed to the notifier before the 250, with the
// recipients the report failed, each under the address outflow delivered
// to, the remote server's diagnostic, and the returned header; a notifier
// that cannot queue it makes the answer 451. An envelope without Notify
// (its sender gets no notices) asks for none.
func TestLaterBounceNotifiesTheSender(t *testing.T) {
	n := &fakeNotifier{}
	l := startListener(t, func(c *Config) { c.Notifier = n })
	notify := &queue.Notify{Sender: "app@shop.example", EnvID: "e1", Rcpts: []queue.NotifyRcpt{{Rcpt: "Bob@dest.example"}}}
	l.store.mu.Lock()
	l.store.hist["env2"] = []queue.Event{
		{Type: queue.EventDelivered, ID: "env2", MsgID: "msg2", Tenant: "shop", Dest: "dest.example", Attempt: 1,
			Recipients: []string{"Bob@dest.example"}, Notify: notify},
		{Type: queue.EventDelivered, ID: "env2", MsgID: "msg2", Tenant: "shop", Dest: "dest.example", Attempt: 2,
			Recipients: []string{"carol@dest.example"}, Notify: &queue.Notify{Sender: "app@shop.example", EnvID: "e1",
				Rcpts: []queue.NotifyRcpt{{Rcpt: "carol@dest.example", ORcpt: "carol@old.example"}}}},
	}
	l.store.mu.Unlock()
	msg := failureDSN(t,
		dsn.Recipient{Final: "bob@dest.example", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"},
		dsn.Recipient{Final: "carol@dest.example", Action: dsn.Failed, Status: "5.2.2", RemoteMTA: "mbox.dest.example", Diagnostic: "552 5.2.2 full"},
		dsn.Recipient{Final: "dave@dest.example", Action: dsn.Delayed, Status: "4.2.2"})
	n.fail = 1
	var se *smtp.SMTPError
	if err := l.send(t, []string{l.returnPath("env2")}, msg); !errors.As(err, &se) || se.Code != 451 {
		t.Fatalf("a notice not queued answered %v, want 451", err)
	}
	if err := l.send(t, []string{l.returnPath("env2")}, msg); err != nil {
		t.Fatalf("sent again: %v", err)
	}
	calls := n.notices()
	if len(calls) != 1 {
		t.Fatalf("%d notices, want 1", len(calls))
	}
	c := calls[0]
	if c.ev.ID != "env2" || c.ev.MsgID != "msg2" || c.ev.Tenant != "shop" || c.ev.Notify == nil ||
		c.ev.Notify.Sender != "app@shop.example" || len(c.ev.Notify.Rcpts) != 2 || c.ev.Notify.Rcpts[1].ORcpt != "carol@old.example" {
		t.Fatalf("notice about %+v (notify %+v)", c.ev, c.ev.Notify)
	}
	if len(c.rcpts) != 2 || c.rcpts[0].Final != "bob@dest.example" || c.rcpts[0].RemoteMTA != "mx.dest.example" ||
		c.rcpts[0].Diagnostic != "550 5.1.1 no such user" || c.rcpts[1].Final != "carol@dest.example" ||
		c.rcpts[1].RemoteMTA != "mbox.dest.example" || c.rcpts[1].Status != "5.2.2" {
		t.Fatalf("notice's recipients %+v", c.rcpts)
	}
	if !strings.Contains(c.original, "Subject: hi") {
		t.Fatalf("returned header %q", c.original)
	}

	// A report of a success only (a server that was handed NOTIFY=SUCCESS)
	// records nothing and still goes to the notices.
	if err := l.send(t, []string{l.returnPath("env2")}, failureDSN(t,
		dsn.Recipient{Final: "carol@dest.example", Action: dsn.Delivered, Status: "2.0.0"})); err != nil {
		t.Fatal(err)
	}
	if calls := n.notices(); len(calls) != 2 || len(calls[1].rcpts) != 1 || calls[1].rcpts[0].Action != dsn.Delivered ||
		calls[1].rcpts[0].Final != "carol@dest.example" {
		t.Fatalf("success report's notice: %+v", calls[1:])
	}
	if l.count(ResultNoFailure) != 1 {
		t.Fatalf("no-failure counted %v", l.count(ResultNoFailure))
	}

	// env1's events carry no Notify: no notice.
	if err := l.send(t, []string{l.returnPath("env1")}, failureDSN(t,
		dsn.Recipient{Final: "bob@dest.example", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 no such user"})); err != nil {
		t.Fatal(err)
	}
	if len(n.notices()) != 2 {
		t.Fatalf("a notice for an envelope whose sender is owed none: %+v", n.notices()[2:])
	}
}

// TestAliasMembersReport: a report from a server that expanded the alias
// the message was delivered to, two members failed and one got it. One
// bounced event for the alias, not one per member, and no suppression:
// the alias works. Without the delivered member it is suppressed, once.
func TestAliasMembersReport(t *testing.T) {
	for _, withDelivered := range []bool{true, false} {
		l := startListener(t, nil)
		l.store.hist["env2"] = []queue.Event{
			{Type: queue.EventQueued, ID: "env2", MsgID: "msg2", Tenant: "shop", Dest: "dest.example"},
			{Type: queue.EventDelivered, ID: "env2", MsgID: "msg2", Tenant: "shop", Dest: "dest.example", Recipients: []string{"sales@dest.example"}},
		}
		members := []dsn.Recipient{
			{Final: "bob@internal.dest.example", Original: "sales@dest.example", OriginalType: "rfc822", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 user unknown"},
			{Final: "carol@internal.dest.example", Original: "sales@dest.example", OriginalType: "rfc822", Action: dsn.Failed, Status: "5.1.1", Diagnostic: "550 5.1.1 user unknown"},
		}
		if withDelivered {
			members = append(members, dsn.Recipient{Final: "dave@internal.dest.example", Original: "sales@dest.example", OriginalType: "rfc822", Action: dsn.Delivered, Status: "2.0.0"})
		}
		if err := l.send(t, []string{l.returnPath("env2")}, failureDSN(t, members...)); err != nil {
			t.Fatal(err)
		}
		bounced := 0
		for _, ev := range l.store.events() {
			if ev.Type == queue.EventBounced {
				bounced++
			}
		}
		if bounced != 1 {
			t.Errorf("delivered member %v: %d bounced events, want 1 for the alias", withDelivered, bounced)
		}
		if n := len(l.sup.entries()); withDelivered && n != 0 || !withDelivered && n != 1 {
			t.Errorf("delivered member %v: %d suppressions", withDelivered, n)
		}
	}
}

// TestFeedbackLoopReturnPathSpeltTwice: a report to the feedback-loop
// address whose original names the return path twice, in two spellings,
// is one complaint.
func TestFeedbackLoopReturnPathSpeltTwice(t *testing.T) {
	l := startListener(t, nil)
	rp := l.returnPath("env1")
	at := strings.LastIndexByte(rp, '@')
	variant := strings.ToUpper(rp[:2]) + rp[2:at] + "@" + strings.ToUpper(rp[at+1:])
	msg := arfReport("fbl@rp.example.org", rp)
	msg = []byte(strings.Replace(string(msg), "Message-ID: <m1@shop.example>", "Received-SPF: pass (domain of "+variant+" designates 192.0.2.10)\r\nMessage-ID: <m1@shop.example>", 1))
	if err := l.send(t, []string{"fbl@rp.example.org"}, msg); err != nil {
		t.Fatal(err)
	}
	if n := len(l.store.events()); n != 1 {
		t.Fatalf("%d events, want one complaint", n)
	}
}

// fblARF is an abuse report to the feedback-loop address about a message
// to alice@dest.example, whose report part has mailFrom as its
// Original-Mail-From (none when "") and whose returned header starts with
// the fields fields (lines ended by \n), with no Return-Path unless they
// have one.
func fblARF(mailFrom, fields string) []byte {
	return arf("fbl@rp.example.org", "abuse", mailFrom, fields)
}

// addEnvelope gives the listener's store another envelope of tenant shop,
// delivered to rcpts.
func (l *listener) addEnvelope(id string, rcpts ...string) {
	l.store.mu.Lock()
	defer l.store.mu.Unlock()
	l.store.hist[id] = []queue.Event{{Type: queue.EventDelivered, ID: id, MsgID: "msg-" + id, Tenant: "shop",
		Dest: "dest.example", Recipients: rcpts}}
}

// A report at the feedback-loop address names its envelope where its
// reporter put the return path, with no Return-Path in the original's
// header: in its Original-Mail-From (RFC 5965 §3.5, the original's
// envelope sender), or only in the original's Authentication-Results
// (smtp.mailfrom=, as Microsoft's JMRP returns it) or Received-SPF
// (envelope-from=). Each is a complaint recorded, the complainer
// suppressed.
func TestComplaintNamedWithoutReturnPathField(t *testing.T) {
	for _, tc := range []struct {
		name             string
		mailFrom, fields func(rp string) string
	}{
		{"Original-Mail-From", func(rp string) string { return rp }, func(string) string { return "" }},
		{"Authentication-Results", func(string) string { return "" }, func(rp string) string {
			return "Authentication-Results: mx.dest.example; spf=pass (sender IP is 192.0.2.10)\n smtp.mailfrom=" + rp +
				"; dkim=pass header.d=shop.example\n"
		}},
		{"Received-SPF", func(string) string { return "" }, func(rp string) string {
			return "Received-SPF: Pass (mx.dest.example: domain of rp.example.org designates 192.0.2.10 as permitted sender)\n" +
				" client-ip=192.0.2.10; envelope-from=" + rp + "; helo=out.shop.example;\n"
		}},
	} {
		l := startListener(t, nil)
		rp := l.returnPath("env1")
		if err := l.send(t, []string{"fbl@rp.example.org"}, fblARF(tc.mailFrom(rp), tc.fields(rp))); err != nil {
			t.Fatalf("%s: answered %v", tc.name, err)
		}
		evs := l.store.events()
		if len(evs) != 1 || evs[0].Type != queue.EventComplained || evs[0].ID != "env1" || evs[0].Recipients[0] != "alice@dest.example" {
			t.Errorf("%s: events %+v", tc.name, evs)
		}
		if sup := l.sup.entries(); len(sup) != 1 || sup[0].Address != "alice@dest.example" || sup[0].Source != queue.SuppressComplaint {
			t.Errorf("%s: suppressions %+v", tc.name, sup)
		}
		if n, u := l.count(ResultComplaint), l.count(ResultUnmatched); n != 1 || u != 0 {
			t.Errorf("%s: complaint counted %v, unmatched %v", tc.name, n, u)
		}
	}
}

// Where a report names its envelope in several places, the first that
// names a return path of this fleet decides: its Original-Mail-From, then
// the original's Return-Path, then its other fields. A return path whose
// MAC does not verify names nothing.
func TestFeedbackLoopReturnPathPrecedence(t *testing.T) {
	other := NewReturnPath([]byte("another key, another fleet......"), "rp.example.org", nil)
	for _, tc := range []struct {
		name             string
		mailFrom, fields func(l *listener) string
	}{
		{"Original-Mail-From before Return-Path", func(l *listener) string { return l.returnPath("env1") },
			func(l *listener) string { return "Return-Path: <" + l.returnPath("env2") + ">\n" }},
		{"Return-Path before Authentication-Results", func(*listener) string { return "" }, func(l *listener) string {
			return "Authentication-Results: mx.dest.example; spf=pass smtp.mailfrom=" + l.returnPath("env2") +
				"\nReturn-Path: <" + l.returnPath("env1") + ">\n"
		}},
		{"a forged Original-Mail-From", func(*listener) string { return other.Address("shop", "env2", "a@shop.example", time.Now()) },
			func(l *listener) string {
				return "Authentication-Results: mx.dest.example; spf=pass smtp.mailfrom=" + l.returnPath("env1") + "\n"
			}},
	} {
		l := startListener(t, nil)
		l.addEnvelope("env2", "alice@dest.example")
		if err := l.send(t, []string{"fbl@rp.example.org"}, fblARF(tc.mailFrom(l), tc.fields(l))); err != nil {
			t.Fatalf("%s: answered %v", tc.name, err)
		}
		if evs := l.store.events(); len(evs) != 1 || evs[0].ID != "env1" {
			t.Errorf("%s: events %+v, want one complaint on env1", tc.name, evs)
		}
	}
}

// jmrpComplaint is a complaint as Microsoft's JMRP sends it in its older
// format (modelled on sisimai's set-of-emails arf-22.eml): no report, the
// message complained about attached as message/rfc822, the complainer in
// its X-HmXmrOriginalRecipient field (none when rcpt is "") and the
// return path only in its Authentication-Results.
func jmrpComplaint(rcpt, returnPath string) []byte {
	xhm := ""
	if rcpt != "" {
		xhm = "X-HmXmrOriginalRecipient: " + rcpt + "\n"
	}
	return []byte(`Received: from BAY004-MC1F22.hotmail.example ([203.0.113.25]) by mx.rp.example.org
    with ESMTPS; Thu, 3 Dec 2026 23:34:45 +0000 (UTC)
Date: Thu, 3 Dec 2026 23:34:45 +0000
From: staff@hotmail.example
Subject:  complaint about message from 192.0.2.10
To: fbl@rp.example.org
MIME-Version: 1.0 
Content-Type: multipart/mixed; boundary="F0000EEE2-0000-2111-AAB0-000000000000"
Message-ID: <BAY0-XMR-0022@BAY0-XMR.hotmail.example>
Return-Path: staff@hotmail.example

--F0000EEE2-0000-2111-AAB0-000000000000
Content-Type: message/rfc822
Content-Disposition: inline

` + xhm + `X-Reporter-IP: 192.0.2.22
Authentication-Results: hotmail.example; spf=pass (sender IP is 192.0.2.10; identity alignment result is pass and alignment mode is relaxed) smtp.mailfrom=` + returnPath + `; dkim=pass (identity alignment result is pass and alignment mode is relaxed) header.d=shop.example; x-hmca=pass header.id=app@shop.example
X-SID-PRA: app@shop.example
Received: from out.shop.example ([192.0.2.10]) by BAY004-MC1F22.hotmail.example over TLS
    secured channel with Microsoft SMTPSVC(7.5.7601.23008);
    Thu, 3 Dec 2026 23:30:00 +0000
Date: Thu, 3 Dec 2026 23:30:00 +0000
To: alice@dest.example
From: Shop <app@shop.example>
Subject: hi
MIME-Version: 1.0
Content-Type: text/plain; charset="utf-8"
Message-ID: <m1@shop.example>

hi

--F0000EEE2-0000-2111-AAB0-000000000000--
`)
}

// Microsoft's JMRP in its older format sends no ARF report, only the
// message complained about, attached. At the feedback-loop address, where
// the runbook has it registered, one whose original names a return path
// that verifies is an abuse complaint: by its X-HmXmrOriginalRecipient,
// else by the envelope's only recipient (as an ARF report without
// Original-Rcpt-To). At a return path itself, where auto-replies come with
// the original attached, and with a return path that does not verify, it
// is refused as before.
func TestOldJMRPComplaintAtTheFeedbackAddress(t *testing.T) {
	l := startListener(t, nil)
	l.addEnvelope("env2", "carol@dest.example")
	if err := l.send(t, []string{"fbl@rp.example.org"}, jmrpComplaint("alice@dest.example", l.returnPath("env1"))); err != nil {
		t.Fatalf("answered %v", err)
	}
	evs := l.store.events()
	if len(evs) != 1 || evs[0].Type != queue.EventComplained || !evs[0].Async || evs[0].ID != "env1" ||
		evs[0].Recipients[0] != "alice@dest.example" || evs[0].Reason != "abuse" {
		t.Fatalf("events %+v", evs)
	}
	if sup := l.sup.entries(); len(sup) != 1 || sup[0].Address != "alice@dest.example" || sup[0].Source != queue.SuppressComplaint {
		t.Fatalf("suppressions %+v", sup)
	}
	if n := l.count(ResultComplaint); n != 1 {
		t.Fatalf("complaint counted %v", n)
	}
	// Without X-HmXmrOriginalRecipient: the envelope's only recipient;
	// of an envelope delivered to two, nobody (taken, unmatched).
	if err := l.send(t, []string{"fbl@bounces.shop.example"}, jmrpComplaint("", l.returnPath("env2"))); err != nil {
		t.Fatalf("no complainer named: answered %v", err)
	}
	if evs := l.store.events(); len(evs) != 2 || evs[1].ID != "env2" || evs[1].Recipients[0] != "carol@dest.example" {
		t.Fatalf("no complainer named: events %+v", evs)
	}
	if err := l.send(t, []string{"fbl@rp.example.org"}, jmrpComplaint("", l.returnPath("env1"))); err != nil {
		t.Fatalf("no complainer named, two delivered: answered %v", err)
	}
	if n, u := len(l.store.events()), l.count(ResultUnmatched); n != 2 || u != 1 {
		t.Fatalf("no complainer named, two delivered: %d events, unmatched counted %v", n, u)
	}

	other := NewReturnPath([]byte("another key, another fleet......"), "rp.example.org", nil)
	for _, tc := range []struct {
		name string
		to   string
		msg  []byte
	}{
		{"at the return path itself", l.returnPath("env1"), jmrpComplaint("alice@dest.example", l.returnPath("env1"))},
		{"a forged return path", "fbl@rp.example.org", jmrpComplaint("alice@dest.example", other.Address("shop", "env1", "a@shop.example", time.Now()))},
		{"no return path", "fbl@rp.example.org", jmrpComplaint("alice@dest.example", "app@shop.example")},
	} {
		before := l.count(ResultUnparsed)
		err := l.send(t, []string{tc.to}, tc.msg)
		var se *smtp.SMTPError
		if !errors.As(err, &se) || se.Code != 550 || se.EnhancedCode != (smtp.EnhancedCode{5, 6, 0}) {
			t.Errorf("%s: answered %v, want 550 5.6.0", tc.name, err)
		}
		if n := l.count(ResultUnparsed); n != before+1 {
			t.Errorf("%s: unparsed counted %v, want %v", tc.name, n, before+1)
		}
	}
	if n := len(l.store.events()); n != 2 {
		t.Fatalf("%d events after the refusals, want 2", n)
	}
}

// TestForwardReceivedAddressLiteral: the Received field of a forward to
// the postmaster names the client as a submission's does, by an address
// literal without the port: ([127.0.0.1]), ([IPv6:::1]). It had
// RemoteAddr's "[::1]:32908", a port and no IPv6: tag.
func TestForwardReceivedAddressLiteral(t *testing.T) {
	for _, c := range []struct{ listen, want string }{{"127.0.0.1:0", "([127.0.0.1])"}, {"[::1]:0", "([IPv6:::1])"}} {
		t.Run(c.listen, func(t *testing.T) {
			if ln, err := net.Listen("tcp", c.listen); err != nil {
				t.Skipf("cannot listen on %s: %v", c.listen, err)
			} else {
				_ = ln.Close()
			}
			fwd := &fakeForwarder{}
			l := startListener(t, func(cfg *Config) { cfg.Addr, cfg.Postmaster, cfg.Forwarder = c.listen, "ops@operator.example", fwd })
			if err := l.send(t, []string{"postmaster@bounces.shop.example"}, []byte("From: someone@isp.example\r\nSubject: hi\r\n\r\nhi\r\n")); err != nil {
				t.Fatal(err)
			}
			subs := fwd.sent()
			if len(subs) != 1 {
				t.Fatalf("forwarded %d messages, want 1", len(subs))
			}
			first, _, _ := bytes.Cut(subs[0].Body, []byte("\r\n"))
			if !bytes.HasPrefix(first, []byte("Received: from ")) || !bytes.HasSuffix(first, []byte(" "+c.want)) {
				t.Errorf("first trace line %q, want the client as %s", first, c.want)
			}
			if !bytes.Contains(subs[0].Body, []byte(" "+c.want+" on ")) {
				t.Errorf("the note for a person does not name the client as %s:\n%s", c.want, subs[0].Body)
			}
		})
	}
	for a, want := range map[net.Addr]string{
		&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.1"), Port: 25}:      "[192.0.2.1]",
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 25, Zone: "eth0"}: "[IPv6:fe80::1]",
		&net.UnixAddr{Name: "@", Net: "unix"}:                            "unknown",
	} {
		if got := traceAddr(a); got != want {
			t.Errorf("traceAddr(%v) = %q, want %q", a, got, want)
		}
	}
	if got := traceAddr(nil); got != "unknown" {
		t.Errorf("traceAddr(nil) = %q, want unknown", got)
	}
}
