package submission

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"golang.org/x/crypto/bcrypt"

	"github.com/outflow/outflow/queue"
)

// testMessage has every field the listener would otherwise add
// (CompleteHeaders), so the stored body is the sent one, byte for byte.
const testMessage = "Date: Tue, 01 Dec 2026 10:00:00 +0000\r\n" +
	"Message-ID: <test-1@example.com>\r\n" +
	"From: app@example.com\r\n" +
	"To: rcpt@example.org\r\n" +
	"Subject: hello\r\n" +
	"\r\n" +
	"body line\r\n" +
	".a line starting with a dot\r\n" +
	"last line\r\n"

// storedMessage splits a stored body into our Received header and the rest.
func storedMessage(t *testing.T, body []byte) (received, rest string) {
	t.Helper()
	s := string(body)
	if !strings.HasPrefix(s, "Received: from ") {
		t.Fatalf("body does not start with a Received header: %q", s)
	}
	// The header is three lines: from, by, date.
	idx := 0
	for i := 0; i < 3; i++ {
		n := strings.Index(s[idx:], "\r\n")
		if n < 0 {
			t.Fatalf("short Received header: %q", s)
		}
		idx += n + 2
	}
	return s[:idx], s[idx:]
}

func TestSubmitAuthenticated(t *testing.T) {
	for _, mech := range []string{"PLAIN", "LOGIN"} {
		t.Run(mech, func(t *testing.T) {
			q := &fakeQueue{}
			ts := startServer(t, Config{Users: testUsers(t)}, q)
			c := ts.dial(t)
			if ok, params := c.Extension("AUTH"); !ok || !strings.Contains(params, mech) {
				t.Fatalf("AUTH %s not advertised on loopback: %v %q", mech, ok, params)
			}
			var a sasl.Client
			if mech == "PLAIN" {
				a = sasl.NewPlainClient("", testUser, testPassword)
			} else {
				a = sasl.NewLoginClient(testUser, testPassword)
			}
			if err := c.Auth(a); err != nil {
				t.Fatalf("auth: %v", err)
			}
			if err := c.Mail("app@example.com", nil); err != nil {
				t.Fatal(err)
			}
			for _, r := range []string{"rcpt@example.org", "other@EXAMPLE.net", "other@example.net"} {
				if err := c.Rcpt(r, nil); err != nil {
					t.Fatal(err)
				}
			}
			w, err := c.Data()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Write([]byte(testMessage)); err != nil {
				t.Fatal(err)
			}
			resp, err := w.CloseWithResponse()
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(resp.StatusText, "queued as id1") {
				t.Errorf("250 text %q does not name the queue id", resp.StatusText)
			}

			subs := q.got()
			if len(subs) != 1 {
				t.Fatalf("got %d submissions, want 1", len(subs))
			}
			s := subs[0]
			if s.Tenant != testUser || s.From != "app@example.com" {
				t.Errorf("tenant %q from %q", s.Tenant, s.From)
			}
			if got := strings.Join(s.Rcpts, ","); got != "rcpt@example.org,other@EXAMPLE.net" {
				t.Errorf("rcpts %q (duplicates must be stored once)", got)
			}
			if !strings.HasPrefix(s.RemoteAddr, "127.0.0.1:") || s.ReceivedAt.IsZero() {
				t.Errorf("remote %q received %v", s.RemoteAddr, s.ReceivedAt)
			}
			hdr, rest := storedMessage(t, s.Body)
			if rest != testMessage {
				t.Errorf("stored body differs:\n got %q\nwant %q", rest, testMessage)
			}
			if !strings.Contains(hdr, "from client.test ([127.0.0.1])") || !strings.Contains(hdr, "by mx.test (outflow) with ESMTPA;") {
				t.Errorf("Received header %q", hdr)
			}
			if got := ts.counter(t, "outflow_submissions_total", "result", "accepted"); got != 1 {
				t.Errorf("accepted = %v", got)
			}
			if got := ts.counter(t, "outflow_submission_connections"); got != 1 {
				t.Errorf("connections gauge = %v", got)
			}
			if !strings.Contains(ts.logs.String(), `"message":"submission accepted"`) {
				t.Errorf("no accepted log line: %s", ts.logs)
			}
		})
	}
}

func TestMultipleMessagesAndRset(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	c := ts.dialAuth(t)
	if err := send(c, "a@example.com", []string{"one@example.org"}, "Subject: 1\r\n\r\none\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.Mail("b@example.com", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("dropped@example.org", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if err := send(c, "", []string{"two@example.org"}, "Subject: 2\r\n\r\ntwo\r\n"); err != nil {
		t.Fatal(err)
	}
	subs := q.got()
	if len(subs) != 2 {
		t.Fatalf("got %d submissions, want 2", len(subs))
	}
	if subs[1].From != "" || len(subs[1].Rcpts) != 1 || subs[1].Rcpts[0] != "two@example.org" {
		t.Errorf("second message envelope: from %q rcpts %q", subs[1].From, subs[1].Rcpts)
	}
}

func TestNoAuthNoMail(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	msg := rc.cmd("MAIL FROM:<app@example.com>", 530)
	if !strings.HasPrefix(msg, "5.7.0 ") {
		t.Errorf("530 enhanced code: %q", msg)
	}
	// A relay attempt never gets further.
	rc.write("RCPT TO:<victim@elsewhere.example>\r\n")
	if code, _, _ := rc.reply(); code/100 != 5 {
		t.Errorf("RCPT without MAIL got %d", code)
	}
	rc.write("DATA\r\n")
	if code, _, _ := rc.reply(); code/100 != 5 {
		t.Errorf("DATA without MAIL got %d", code)
	}
	if n := len(q.got()); n != 0 {
		t.Fatalf("%d messages queued without AUTH", n)
	}
	if got := ts.counter(t, "outflow_submission_rejections_total", "reason", "auth_required"); got != 1 {
		t.Errorf("auth_required rejections = %v", got)
	}
}

func TestBadPassword(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	c := ts.dial(t)
	wantCode(t, c.Auth(sasl.NewPlainClient("", testUser, "wrong")), 535, smtp.EnhancedCode{5, 7, 8})
	wantCode(t, c.Auth(sasl.NewLoginClient(testUser, "wrong")), 535, smtp.EnhancedCode{5, 7, 8})
	wantCode(t, c.Auth(sasl.NewPlainClient("", "nobody", testPassword)), 535, smtp.EnhancedCode{5, 7, 8})
	// Acting as another identity is not supported.
	wantCode(t, c.Auth(sasl.NewPlainClient("boss", testUser, testPassword)), 535, smtp.EnhancedCode{5, 7, 8})

	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	msg := rc.cmd("AUTH PLAIN "+base64.StdEncoding.EncodeToString([]byte("no separators")), 501)
	if !strings.HasPrefix(msg, "5.5.2 ") {
		t.Errorf("malformed PLAIN: %q", msg)
	}
	if got := ts.counter(t, "outflow_submission_auth_failures_total"); got != 5 {
		t.Errorf("auth failures = %v, want 5", got)
	}
}

// A response that is not base64 is a syntax error, 501 (RFC 4954 section
// 4), not go-smtp's temporary 454, and counts as a failed AUTH: as an
// initial response, as the answer to a challenge, and under TLS.
func TestAuthNotBase64Is501(t *testing.T) {
	cert, pool := selfSigned(t)
	ts := startServer(t, Config{Users: testUsers(t), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}, &fakeQueue{})
	check := func(rc *raw, how string) {
		t.Helper()
		msg := rc.expect(501)
		if !strings.HasPrefix(msg, "5.5.2 ") || !strings.Contains(msg, "base64") {
			t.Errorf("%s: %q", how, msg)
		}
		// The session goes on: the next AUTH is answered.
		rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
	}

	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.write("AUTH PLAIN %%%not-base64\r\n")
	check(rc, "initial response")

	rc = ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH LOGIN", 334)
	rc.write("!!\r\n")
	check(rc, "answer to a challenge")

	rc = ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("STARTTLS", 220)
	tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	rc = &raw{t: t, c: tc, r: bufioTextReader(tc)}
	rc.cmd("EHLO client.test", 250)
	rc.write("AUTH PLAIN ====\r\n")
	check(rc, "under TLS")

	if got := ts.counter(t, "outflow_submission_auth_failures_total"); got != 3 {
		t.Errorf("auth failures = %v, want 3", got)
	}
}

func TestAuthRateLimit(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), AuthFailLimit: 3, AuthFailWindow: time.Hour}, &fakeQueue{})
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	for i := 0; i < 3; i++ {
		rc.cmd("AUTH PLAIN "+plainIR("", testUser, "guess"), 535)
	}
	msg := rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 421)
	if !strings.HasPrefix(msg, "4.7.0 ") {
		t.Errorf("rate limit reply %q", msg)
	}
	rc.expectClosed()

	// The address stays blocked, right password or not, on a new
	// connection too.
	c := ts.dial(t)
	wantCode(t, c.Auth(sasl.NewPlainClient("", testUser, testPassword)), 421, smtp.EnhancedCode{4, 7, 0})
	if got := ts.counter(t, "outflow_submission_auth_blocked_total"); got != 2 {
		t.Errorf("blocked = %v", got)
	}
}

// TestAuthRateLimitTrustedNetworks: a trusted network's client is not
// exempt from the limit of failed AUTH, as it was (Postfix exempts
// $mynetworks): one host of a shared network could guess every tenant's
// password. Its failures count per account tried: at the limit an AUTH as
// that account, the right password included, gets 421, while another
// account from the same address still authenticates, so one application
// retrying a wrong password does not lock out the others on its address.
func TestAuthRateLimitTrustedNetworks(t *testing.T) {
	h, err := bcrypt.GenerateFromPassword([]byte("other-pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	users := testUsers(t)
	if users, err = ParseUsers(strings.NewReader(testUser + ":" + string(users.hash(testUser)) + "\nother:" + string(h) + "\n")); err != nil {
		t.Fatal(err)
	}
	ts := startServer(t, Config{Users: users, AuthFailLimit: 2, AuthFailWindow: time.Hour,
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, &fakeQueue{})
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, "guess"), 535)
	rc.cmd("AUTH PLAIN "+plainIR("", "nobody", "guess"), 535) // another account's count
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, "guess"), 535)
	if msg := rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 421); !strings.HasPrefix(msg, "4.7.0 ") {
		t.Errorf("rate limit reply %q", msg)
	}
	rc.expectClosed()
	if got := ts.counter(t, "outflow_submission_auth_blocked_total"); got != 1 {
		t.Errorf("blocked = %v, want 1", got)
	}
	if !strings.Contains(ts.logs.String(), `"limit":2,"trusted":true`) {
		t.Errorf("the refusal's log line does not say the client is trusted:\n%s", ts.logs.String())
	}
	// Another application on the same address, with its own account.
	rc = ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", "other", "other-pw"), 235)
}

func TestAuthLimiterWindowAndKeys(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := newAuthLimiter(2, time.Minute)
	l.f.Now = func() time.Time { return now }
	a := clientKey(netip.MustParseAddr("192.0.2.1"))
	b := clientKey(netip.MustParseAddr("192.0.2.2"))
	if l.fail(a) || !l.fail(a) {
		t.Fatal("second failure should block at limit 2")
	}
	if !l.blocked(a) || l.blocked(b) {
		t.Fatal("limits must be per address")
	}
	if l.blocked(authKey{client: a.client, account: "bob"}) {
		t.Error("an account's key shares the client's count")
	}
	if !l.blocked(clientKey(netip.MustParseAddr("::ffff:192.0.2.1"))) {
		t.Error("IPv4-mapped address must share the IPv4 bucket")
	}
	now = now.Add(time.Minute)
	if l.blocked(a) {
		t.Error("still blocked after the window")
	}
	// One IPv6 /64 is one client.
	l.fail(clientKey(netip.MustParseAddr("2001:db8::1")))
	l.fail(clientKey(netip.MustParseAddr("2001:db8::2")))
	if !l.blocked(clientKey(netip.MustParseAddr("2001:db8::ffff"))) || l.blocked(clientKey(netip.MustParseAddr("2001:db8:0:1::1"))) {
		t.Error("IPv6 failures must be counted per /64")
	}
}

func TestPlaintextAuthRule(t *testing.T) {
	loop := func(a netip.Addr) bool { return a.IsLoopback() }
	for _, tc := range []struct {
		tls    bool
		remote string
		want   bool
	}{
		{false, "127.0.0.1", true},
		{false, "::1", true},
		{false, "192.0.2.7", false},
		{true, "192.0.2.7", true},
		{false, "", false},
	} {
		var a netip.Addr
		if tc.remote != "" {
			a = netip.MustParseAddr(tc.remote)
		}
		if got := plaintextAuthAllowed(tc.tls, a, loop); got != tc.want {
			t.Errorf("tls=%v remote=%q: got %v", tc.tls, tc.remote, got)
		}
	}
}

// notLoopback makes 127.0.0.1 look like a remote network client.
func notLoopback(s *Server) { s.isLoopback = func(netip.Addr) bool { return false } }

func TestPlaintextAuthRefusedOffLoopback(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q, notLoopback)
	rc := ts.raw(t)
	ehlo := rc.cmd("EHLO client.test", 250)
	if strings.Contains(ehlo, "AUTH") {
		t.Errorf("AUTH advertised to a non-loopback client without TLS: %q", ehlo)
	}
	msg := rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 538)
	if !strings.HasPrefix(msg, "5.7.11 ") {
		t.Errorf("reply %q", msg)
	}
	rc.cmd("MAIL FROM:<app@example.com>", 530)
	if len(q.got()) != 0 {
		t.Fatal("queued")
	}
}

func TestTrustedNetwork(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, q)
	c := ts.dial(t)
	if ok, _ := c.Extension("AUTH"); ok {
		t.Error("AUTH advertised without Users")
	}
	if err := send(c, "app@example.com", []string{"rcpt@example.org"}, "Subject: t\r\n\r\nx\r\n"); err != nil {
		t.Fatal(err)
	}
	subs := q.got()
	if len(subs) != 1 || subs[0].Tenant != TrustedTenant {
		t.Fatalf("submissions %+v", subs)
	}
	if hdr, _ := storedMessage(t, subs[0].Body); !strings.Contains(hdr, "with ESMTP;") {
		t.Errorf("Received header %q", hdr)
	}

	// Another network is not trusted.
	ts2 := startServer(t, Config{Users: testUsers(t), TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}, q)
	c2 := ts2.dial(t)
	wantCode(t, c2.Mail("app@example.com", nil), 530, smtp.EnhancedCode{5, 7, 0})
}

func TestNewRefusesUselessConfig(t *testing.T) {
	if _, err := New(Config{}, &fakeQueue{}); err == nil {
		t.Error("New accepted a config where nobody could submit")
	}
	if _, err := New(Config{Users: testUsers(t)}, nil); err == nil {
		t.Error("New accepted a nil Enqueuer")
	}
}

func TestEnqueueErrorIs451(t *testing.T) {
	q := &fakeQueue{err: errors.New("jetstream: no responders")}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	c := ts.dialAuth(t)
	err := send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage)
	se := wantCode(t, err, 451, smtp.EnhancedCode{4, 3, 0})
	if strings.Contains(se.Message, "no responders") {
		t.Errorf("internal error leaked to the client: %q", se.Message)
	}
	if got := ts.counter(t, "outflow_submissions_total", "result", "accepted"); got != 0 {
		t.Errorf("accepted = %v", got)
	}
	if got := ts.counter(t, "outflow_submissions_total", "result", "tempfail"); got != 1 {
		t.Errorf("tempfail = %v", got)
	}
	if strings.Contains(ts.logs.String(), "submission accepted") {
		t.Error("logged as accepted")
	}
	// The connection stays usable.
	if err := c.Noop(); err != nil {
		t.Fatal(err)
	}
}

func TestEnqueueTimeoutIs451(t *testing.T) {
	q := &fakeQueue{block: make(chan struct{})} // never released
	ts := startServer(t, Config{Users: testUsers(t), EnqueueTimeout: 50 * time.Millisecond}, q)
	c := ts.dialAuth(t)
	err := send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage)
	wantCode(t, err, 451, smtp.EnhancedCode{4, 3, 0})
}

func TestEnqueuePanicIs451(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, panicQueue{})
	c := ts.dialAuth(t)
	err := send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage)
	wantCode(t, err, 451, smtp.EnhancedCode{4, 3, 0})
}

type panicQueue struct{}

func (panicQueue) Enqueue(context.Context, *queue.Submission) ([]string, error) { panic("boom") }

func TestNoCredentialsInLogs(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	c := ts.dial(t)
	_ = c.Auth(sasl.NewPlainClient("", testPassword, testPassword)) // password typed as user name
	_ = c.Auth(sasl.NewLoginClient(testUser, "wrong-"+testPassword))
	if err := c.Auth(sasl.NewPlainClient("", testUser, testPassword)); err != nil {
		t.Fatal(err)
	}
	logs := ts.logs.String()
	for _, secret := range []string{testPassword, plainIR("", testUser, testPassword), "horse"} {
		if strings.Contains(logs, secret) {
			t.Errorf("log contains %q:\n%s", secret, logs)
		}
	}
	if !strings.Contains(logs, `"message":"authentication failed"`) || !strings.Contains(logs, `"message":"authenticated"`) {
		t.Errorf("auth outcomes not logged:\n%s", logs)
	}
}

func TestListenAddrAndServeAfterShutdown(t *testing.T) {
	srv, err := New(Config{Addr: "127.0.0.1:0", Users: testUsers(t)}, &fakeQueue{})
	if err != nil {
		t.Fatal(err)
	}
	if srv.Addr() != nil {
		t.Fatal("Addr before Listen")
	}
	l, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	if srv.Addr() == nil || srv.Addr().String() != l.Addr().String() {
		t.Fatalf("Addr %v, listener %v", srv.Addr(), l.Addr())
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	c, err := smtp.Dial(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("Serve did not return")
	}
	if err := srv.Shutdown(ctx); !errors.Is(err, ErrServerClosed) {
		t.Errorf("second Shutdown: %v", err)
	}
	l2, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(l2); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve after Shutdown: %v", err)
	}
}

// A Serve whose listener Shutdown closed before go-smtp's own Shutdown began
// sees the listener fail with net.ErrClosed while go-smtp is not yet shut
// down: that is the end Shutdown asked for, so Serve returns nil, not the
// error.
func TestServeOnAListenerClosedByShutdown(t *testing.T) {
	srv, done, release := serveHeld(t)
	srv.listenersClosed = func() {
		close(release)
		select {
		case err := <-done:
			done <- err
		case <-time.After(testWait):
			t.Error("Serve did not end on its closed listener")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("Serve: %v, want nil after Shutdown", err)
	}
}

// serveHeld starts a server's Serve on a new listener and holds it between
// taking the listener on and handing it to go-smtp, until release is
// closed; Serve's result comes on done.
func serveHeld(t *testing.T) (srv *Server, done chan error, release chan struct{}) {
	t.Helper()
	srv, err := New(Config{Users: testUsers(t)}, &fakeQueue{})
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	release = make(chan struct{})
	srv.serving = func() {
		close(held)
		<-release
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	done = make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case <-held:
	case <-time.After(testWait):
		t.Fatal("Serve never reached go-smtp")
	}
	return srv, done, release
}

// A Serve that began before Shutdown but handed its listener to go-smtp
// only after go-smtp's Shutdown had run still returns: go-smtp closes only
// the listeners it had by then, and this one was accepted on for ever.
func TestServeRacingShutdownReturns(t *testing.T) {
	srv, done, release := serveHeld(t)
	ctx, cancel := context.WithTimeout(context.Background(), testWait)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	close(release)
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v, want nil after Shutdown", err)
		}
	case <-time.After(testWait):
		t.Fatal("Serve still accepting after Shutdown")
	}
	if c, err := net.DialTimeout("tcp", srv.Addr().String(), testWait); err == nil {
		c.Close()
		t.Error("the listener still takes connections after Shutdown")
	}
}
