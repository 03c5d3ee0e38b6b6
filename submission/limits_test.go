package submission

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"net/netip"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"golang.org/x/crypto/bcrypt"
)

func TestOversizeMessage(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), MaxMessageBytes: 1024}, q)
	c := ts.dialAuth(t)
	if size, ok := c.MaxMessageSize(); !ok || size != 1024 {
		t.Errorf("SIZE advertised %d %v", size, ok)
	}
	big := "Subject: big\r\n\r\n" + strings.Repeat(strings.Repeat("x", 98)+"\r\n", 40)
	wantCode(t, send(c, "app@example.com", []string{"rcpt@example.org"}, big), 552, smtp.EnhancedCode{5, 3, 4})
	// The connection is still in step: the next message goes through.
	if err := send(c, "app@example.com", []string{"rcpt@example.org"}, "Subject: small\r\n\r\nok\r\n"); err != nil {
		t.Fatal(err)
	}
	if n := len(q.got()); n != 1 {
		t.Fatalf("%d queued, want 1", n)
	}

	rc := ts.raw(t)
	rc.login()
	msg := rc.cmd("MAIL FROM:<app@example.com> SIZE=5000", 552)
	if !strings.HasPrefix(msg, "5.3.4 ") {
		t.Errorf("SIZE reply %q", msg)
	}
	if got := ts.counter(t, "outflow_submission_rejections_total", "reason", "too_big"); got != 1 {
		t.Errorf("too_big = %v", got)
	}

	// A body of exactly the limit is within it (RFC 1870), sent with
	// DATA as with BDAT; one octet more is not.
	atLimit := "Subject: at the limit\r\n\r\n" + strings.Repeat(strings.Repeat("x", 62)+"\r\n", 15)
	atLimit += strings.Repeat("y", 1024-len(atLimit)-2) + "\r\n"
	for _, tc := range []struct {
		body string
		code int
	}{{atLimit, 250}, {atLimit + "z\r\n", 552}} {
		rc.cmd("MAIL FROM:<app@example.com> SIZE=1024", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.cmd("DATA", 354)
		rc.write(tc.body + ".\r\n")
		rc.expect(tc.code)
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.write("BDAT " + strconv.Itoa(len(tc.body)) + " LAST\r\n" + tc.body)
		rc.expect(tc.code)
	}
	if n := len(q.got()); n != 3 {
		t.Fatalf("%d queued, want 3", n)
	}
	if got := q.got()[2].Body; !strings.HasSuffix(string(got), "\r\n"+atLimit) {
		t.Errorf("stored %q…, want the body at the limit", got[:40])
	}
}

func TestTooManyRecipients(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), MaxRecipients: 3}, q)
	c := ts.dialAuth(t)
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"a@example.org", "b@example.org", "c@example.org"} {
		if err := c.Rcpt(r, nil); err != nil {
			t.Fatal(err)
		}
	}
	wantCode(t, c.Rcpt("d@example.org", nil), 452, smtp.EnhancedCode{4, 5, 3})
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("Subject: x\r\n\r\nx\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if subs := q.got(); len(subs) != 1 || len(subs[0].Rcpts) != 3 {
		t.Fatalf("want one message to the first 3 recipients, got %+v", subs)
	}
}

func TestBadAddresses(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	rc := ts.raw(t)
	rc.login()
	for _, tc := range []struct {
		line string
		code int
		ec   string
	}{
		{"MAIL FROM:<no-at-sign>", 501, "5.5.2"}, // go-smtp's own parser
		{"MAIL FROM:<a..b@example.com>", 553, "5.1.7"},
		{"MAIL FROM:<app@[127.0.0.1]>", 553, "5.1.7"},
		{"MAIL FROM:<jos\xc3\xa9@example.com>", 553, "5.6.7"},
		{"MAIL FROM:<app@example.com> SMTPUTF8", 504, "5.5.4"},
	} {
		got := rc.cmd(tc.line, tc.code)
		if !strings.HasPrefix(got, tc.ec+" ") {
			t.Errorf("%q: got %q, want %s", tc.line, got, tc.ec)
		}
	}
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	for _, tc := range []struct {
		line string
		code int
		ec   string
	}{
		{"RCPT TO:<>", 501, "5.5.2"},
		{"RCPT TO:<.lead@example.org>", 553, "5.1.3"},
		{"RCPT TO:<user@-bad.example>", 553, "5.1.3"},
		{"RCPT TO:<user@[192.0.2.1]>", 553, "5.1.3"},
		{"RCPT TO:<user@192.0.2.1>", 553, "5.1.3"},
		{"RCPT TO:<user@exa_mple.org>", 553, "5.1.3"},
		{"RCPT TO:<" + strings.Repeat("l", 65) + "@example.org>", 553, "5.1.3"},
		{"RCPT TO:<\xff\xfe@example.org>", 553, "5.6.7"},
		{"RCPT TO:<us\x01er@example.org>", 553, "5.1.3"},
	} {
		got := rc.cmd(tc.line, tc.code)
		if !strings.HasPrefix(got, tc.ec+" ") {
			t.Errorf("%q: got %q, want %s", tc.line, got, tc.ec)
		}
	}
	rc.cmd("RCPT TO:<good@example.org>", 250)
}

// dataDialogue sends one message with the raw body (which must end with
// CRLF) and returns the reply to the final dot.
func dataDialogue(t *testing.T, rc *raw, body string) (int, string) {
	t.Helper()
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(body + ".\r\n")
	code, msg, _ := rc.reply()
	return code, msg
}

func TestBodyFaults(t *testing.T) {
	ml := strings.Repeat("x", 998) // 1000 with CRLF: the longest allowed line
	for _, tc := range []struct {
		name, body string
		code       int
		ec, reason string
	}{
		{"bare LF", "Subject: x\r\n\r\nline one\nline two\r\n", 550, "5.6.0", "bare_lf"},
		{"bare CR", "Subject: x\r\n\r\nline one\rline two\r\n", 550, "5.6.0", "bare_cr"},
		{"smuggling", "Subject: x\r\n\r\nhello\n.\r\nMAIL FROM:<x@example.com>\r\n", 550, "5.6.0", "bare_lf"},
		{"NUL", "Subject: x\r\n\r\nnul\x00byte\r\n", 550, "5.6.0", "nul"},
		{"line too long", "Subject: x\r\n\r\n" + ml + "y\r\n", 500, "5.5.2", "line_too_long"},
		{"longest line ok", "Subject: x\r\n\r\n" + ml + "\r\n", 250, "2.0.0", ""},
		{"stuffed dot not counted", "Subject: x\r\n\r\n." + ml + "\r\n", 250, "2.0.0", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fakeQueue{}
			ts := startServer(t, Config{Users: testUsers(t)}, q)
			rc := ts.raw(t)
			rc.login()
			code, msg := dataDialogue(t, rc, tc.body)
			if code != tc.code || !strings.HasPrefix(msg, tc.ec+" ") {
				t.Fatalf("got %d %q, want %d %s", code, msg, tc.code, tc.ec)
			}
			if tc.code == 250 {
				if len(q.got()) != 1 {
					t.Fatal("not queued")
				}
			} else {
				if len(q.got()) != 0 {
					t.Fatal("a rejected message was queued")
				}
				if got := ts.counter(t, "outflow_submission_rejections_total", "reason", tc.reason); got != 1 {
					t.Errorf("reason %s = %v", tc.reason, got)
				}
			}
			// Still in step after the fault.
			rc.cmd("NOOP", 250)
		})
	}
}

func TestLineBeyondHardLimitCloses(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	rc := ts.raw(t)
	rc.login()
	code, _ := dataDialogue(t, rc, "Subject: x\r\n\r\n"+strings.Repeat("y", 5000)+"\r\n")
	if code != 500 {
		t.Fatalf("got %d, want 500", code)
	}
	// go-smtp gives up on the stream past twice the limit.
	for {
		_ = rc.c.SetReadDeadline(time.Now().Add(testWait))
		if _, err := rc.r.ReadLine(); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("connection still open")
			}
			break
		}
	}

	rc2 := ts.raw(t)
	rc2.write("EHLO " + strings.Repeat("h", 3000) + "\r\n")
	if code, msg, _ := rc2.reply(); code != 500 {
		t.Fatalf("long command: %d %q", code, msg)
	}
	rc2.expectClosed()
}

func TestConnectionLimit(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), MaxConnections: 2}, &fakeQueue{})
	a := ts.raw(t)
	_ = ts.raw(t)
	eventually(t, "2 connections", func() bool { return ts.counter(t, "outflow_submission_connections") == 2 })

	c, err := net.DialTimeout("tcp", ts.addr, testWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	third := &raw{t: t, c: c, r: bufioTextReader(c)}
	msg := third.expect(421)
	if !strings.HasPrefix(msg, "4.7.0 ") {
		t.Errorf("reply %q", msg)
	}
	third.expectClosed()
	if got := ts.counter(t, "outflow_submission_connections_refused_total"); got != 1 {
		t.Errorf("refused = %v", got)
	}

	a.cmd("QUIT", 221)
	eventually(t, "slot freed", func() bool { return ts.counter(t, "outflow_submission_connections") == 1 })
	ts.raw(t).cmd("EHLO client.test", 250)
}

// TestClientConnectionLimit: one client address gets at most
// MaxClientConnections at once (the next is told 421 and closed, and
// gets in again when one closes); a trusted network's client is not
// limited.
func TestClientConnectionLimit(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), MaxClientConnections: 2}, &fakeQueue{})
	a := ts.raw(t)
	_ = ts.raw(t)
	eventually(t, "2 connections", func() bool { return ts.counter(t, "outflow_submission_connections") == 2 })
	c, err := net.DialTimeout("tcp", ts.addr, testWait)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	third := &raw{t: t, c: c, r: bufioTextReader(c)}
	if msg := third.expect(421); !strings.Contains(msg, "from your address") {
		t.Errorf("reply %q", msg)
	}
	third.expectClosed()
	a.cmd("QUIT", 221)
	eventually(t, "slot freed", func() bool { return ts.counter(t, "outflow_submission_connections") == 1 })
	ts.raw(t).cmd("EHLO client.test", 250)

	trusted := startServer(t, Config{Users: testUsers(t), MaxClientConnections: 1,
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, &fakeQueue{})
	for range 3 {
		trusted.raw(t).cmd("EHLO client.test", 250)
	}
}

// TestNoClientConnectionLimit: a negative MaxClientConnections is no
// limit, as documented: more than DefaultMaxClientConnections connections
// from one address are all greeted. Before, it was taken for unset and
// the 251st was told 421.
func TestNoClientConnectionLimit(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), MaxClientConnections: -1}, &fakeQueue{})
	n := DefaultMaxClientConnections + 10
	for range n {
		_ = ts.raw(t) // greeted 220, or the test fails
	}
	eventually(t, strconv.Itoa(n)+" connections", func() bool { return ts.counter(t, "outflow_submission_connections") == float64(n) })
	if got := ts.counter(t, "outflow_submission_connections_refused_total"); got != 0 {
		t.Errorf("refused = %v", got)
	}
}

func TestSlowLoris(t *testing.T) {
	t.Run("command", func(t *testing.T) {
		ts := startServer(t, Config{Users: testUsers(t), ReadTimeout: time.Second}, &fakeQueue{})
		rc := ts.raw(t)
		rc.write("EHLO cli") // never finished
		code, msg, _ := rc.reply()
		if code != 421 {
			t.Fatalf("got %d %q, want 421", code, msg)
		}
		rc.expectClosed()
	})
	t.Run("data", func(t *testing.T) {
		q := &fakeQueue{}
		ts := startServer(t, Config{Users: testUsers(t), ReadTimeout: time.Second}, q)
		rc := ts.raw(t)
		rc.login()
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.cmd("DATA", 354)
		rc.write("Subject: slow\r\n\r\nand then noth")
		msg := rc.expect(421)
		if !strings.HasPrefix(msg, "4.4.2 ") {
			t.Errorf("reply %q", msg)
		}
		rc.expectClosed()
		if len(q.got()) != 0 {
			t.Fatal("a partial message was queued")
		}
	})
	t.Run("data each read", func(t *testing.T) {
		// A body that keeps coming, each octet well within ReadTimeout of
		// the last, is not cut off however long it takes short of
		// DataTimeout, also when it fills no read buffer; under TLS too.
		cert, pool := selfSigned(t)
		for _, useTLS := range []bool{false, true} {
			q := &fakeQueue{}
			// Gaps of a tenth of ReadTimeout: a second leaves room for a
			// loaded machine's scheduling under -race.
			cfg := Config{Users: testUsers(t), ReadTimeout: time.Second, DataTimeout: time.Minute,
				TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
			rc := startServer(t, cfg, q).raw(t)
			if useTLS {
				rc.cmd("EHLO client.test", 250)
				rc.cmd("STARTTLS", 220)
				tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
				rc.c, rc.r = tc, bufioTextReader(tc)
			}
			rc.login()
			rc.cmd("MAIL FROM:<app@example.com>", 250)
			rc.cmd("RCPT TO:<rcpt@example.org>", 250)
			rc.cmd("DATA", 354)
			rc.write("Subject: slow\r\n\r\n")
			tick := time.NewTicker(cfg.ReadTimeout / 10)
			for end := time.Now().Add(5 * cfg.ReadTimeout / 2); time.Now().Before(end); {
				<-tick.C
				rc.write("x")
			}
			tick.Stop()
			rc.write("\r\n.\r\n")
			if code, msg, err := rc.reply(); code != 250 {
				t.Fatalf("TLS %v: got %d %q (%v), want 250", useTLS, code, msg, err)
			}
			if n := len(q.got()); n != 1 {
				t.Fatalf("TLS %v: %d queued, want 1", useTLS, n)
			}
		}
	})
	t.Run("data total", func(t *testing.T) {
		// Each read comes in time, but the body as a whole does not.
		ts := startServer(t, Config{Users: testUsers(t), ReadTimeout: time.Minute, DataTimeout: 500 * time.Millisecond}, &fakeQueue{})
		rc := ts.raw(t)
		rc.login()
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.cmd("DATA", 354)
		stop, stopped := make(chan struct{}), make(chan struct{})
		go func() { // trickles one byte per tick until told to stop
			defer close(stopped)
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				if _, err := rc.c.Write([]byte("x")); err != nil {
					return
				}
			}
		}()
		msg := rc.expect(421)
		close(stop)
		<-stopped
		if !strings.HasPrefix(msg, "4.4.2 ") {
			t.Errorf("reply %q", msg)
		}
		rc.expectClosed()
	})
}

func TestPipelinedGarbage(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	rc := ts.raw(t)
	rc.write("EHLO client.test\r\nFOOO\r\nBARX BAZ\r\nNOOP\r\n")
	rc.expect(250)
	rc.expect(500)
	rc.expect(500)
	rc.expect(250)
	// Keep going and go-smtp hangs up on this client...
	rc.write("X\r\nYYYYYYY\r\n\x01\x02\x03\x04\x05\r\nZZZZ\r\n")
	for {
		code, _, err := rc.reply()
		if err != nil && code == 0 {
			break
		}
		if code != 500 && code != 501 {
			t.Fatalf("garbage got %d", code)
		}
	}
	// ...and keeps serving everybody else.
	c := ts.dialAuth(t)
	if err := send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage); err != nil {
		t.Fatal(err)
	}
	if len(q.got()) != 1 {
		t.Fatal("not queued")
	}
}

func TestNestedMailAndAuthInTransaction(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	rc := ts.raw(t)
	rc.login()
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("MAIL FROM:<other@example.com>", 503)
	rc.cmd("RSET", 250)
	rc.cmd("MAIL FROM:<other@example.com>", 250)
}

func TestShutdownLetsDataFinish(t *testing.T) {
	q := &fakeQueue{block: make(chan struct{}), entered: make(chan struct{}, 1)}
	ts := startServer(t, Config{Users: testUsers(t)}, q)

	idle := ts.raw(t)
	idle.cmd("EHLO idle.test", 250)

	c := ts.dialAuth(t)
	sent := make(chan error, 1)
	go func() { sent <- send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage) }()
	select {
	case <-q.entered:
	case <-time.After(testWait):
		t.Fatal("Enqueue not reached")
	}

	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		shut <- ts.srv.Shutdown(ctx)
	}()

	// The idle client is told and let go.
	msg := idle.expect(421)
	if !strings.HasPrefix(msg, "4.3.2 ") {
		t.Errorf("idle client got %q", msg)
	}
	idle.expectClosed()
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a message in flight", err)
	default:
	}

	close(q.block)
	select {
	case err := <-sent:
		if err != nil {
			t.Fatalf("in-flight message: %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("in-flight message got no reply")
	}
	select {
	case err := <-shut:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	case <-time.After(testWait):
		t.Fatal("Shutdown did not return")
	}
	if len(q.got()) != 1 {
		t.Fatal("in-flight message lost")
	}
	if _, err := net.DialTimeout("tcp", ts.addr, testWait); err == nil {
		// Accepting after Shutdown would be a bug; a refused dial is right.
		t.Error("still accepting connections after Shutdown")
	}
}

// selfSigned returns a server certificate for 127.0.0.1 and a pool
// trusting it.
func selfSigned(t testing.TB) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "mx.test"},
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

func TestSTARTTLSThenAuth(t *testing.T) {
	cert, pool := selfSigned(t)
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}, q, notLoopback)

	rc := ts.raw(t)
	ehlo := rc.cmd("EHLO client.test", 250)
	if !strings.Contains(ehlo, "STARTTLS") || strings.Contains(ehlo, "AUTH") {
		t.Errorf("before STARTTLS: %q", ehlo)
	}
	msg := rc.cmd("MAIL FROM:<app@example.com>", 530)
	if !strings.Contains(msg, "STARTTLS") {
		t.Errorf("530 text %q", msg)
	}

	c, err := smtp.DialStartTLS(ts.addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if ok, params := c.Extension("AUTH"); !ok || !strings.Contains(params, "PLAIN") {
		t.Fatalf("AUTH not offered after STARTTLS: %v %q", ok, params)
	}
	if err := c.Auth(sasl.NewPlainClient("", testUser, testPassword)); err != nil {
		t.Fatal(err)
	}
	if err := send(c, "app@example.com", []string{"rcpt@example.org"}, testMessage); err != nil {
		t.Fatal(err)
	}
	subs := q.got()
	if len(subs) != 1 {
		t.Fatal("not queued")
	}
	if hdr, _ := storedMessage(t, subs[0].Body); !strings.Contains(hdr, "with ESMTPSA;") {
		t.Errorf("Received header %q", hdr)
	}
}

func TestBDAT(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), MaxLineLength: 100}, q)
	rc := ts.raw(t)
	rc.login()
	body := "Date: Tue, 01 Dec 2026 10:00:00 +0000\r\nMessage-ID: <chunked@example.com>\r\nSubject: chunked\r\n\r\nhello\r\n"
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.write("BDAT 10\r\n" + body[:10])
	rc.expect(250)
	rc.write("BDAT " + itoa(len(body)-10) + " LAST\r\n" + body[10:])
	rc.expect(250)
	subs := q.got()
	if len(subs) != 1 {
		t.Fatal("not queued")
	}
	if _, rest := storedMessage(t, subs[0].Body); rest != body {
		t.Errorf("stored %q", rest)
	}

	// The body rules hold for BDAT too, where go-smtp checks no lines.
	for _, tc := range []struct {
		body string
		code int
	}{
		{"Subject: x\r\n\r\nbare\nlf\r\n", 550},
		// Between MaxLineLength and go-smtp's hard limit (twice that),
		// which go-smtp also applies to chunk bytes it happens to buffer
		// while reading the BDAT command.
		{"Subject: x\r\n\r\n" + strings.Repeat("z", 150) + "\r\n", 500},
	} {
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.write("BDAT " + itoa(len(tc.body)) + " LAST\r\n" + tc.body)
		rc.expect(tc.code)
	}
	rc.cmd("NOOP", 250)
	if len(q.got()) != 1 {
		t.Fatal("a rejected BDAT message was queued")
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestBDATCutShort: a BDAT chunk the client cuts short (its side of the
// connection ends inside the chunk) is no message: 451, nothing queued.
// go-smtp took the end of the socket for the end of the chunk, and the
// first part of the message was stored, answered 250 and sent, and the
// client, seeing no reply it trusted, sent the whole message again.
func TestBDATCutShort(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	for _, first := range []string{"", "Subject: important\r\n"} {
		rc := ts.raw(t)
		rc.login()
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rest := "Subject: important\r\n\r\nPay invoice 1234 to account 99"
		if first != "" {
			rc.write("BDAT " + itoa(len(first)) + "\r\n" + first)
			rc.expect(250)
			rest = "\r\nPay invoice 1234 to account 99"
		}
		rc.write("BDAT 1000 LAST\r\n" + rest)
		if err := rc.c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		if code, msg, err := rc.reply(); code != 451 {
			t.Fatalf("chunk cut short (after a first chunk: %v): %d %q %v, want 451", first != "", code, msg, err)
		}
	}
	if subs := q.got(); len(subs) != 0 {
		t.Fatalf("%d messages queued from chunks cut short: %q", len(subs), subs[0].Body)
	}
}

// TestBDATSlowLink: a BDAT chunk that arrives steadily, each read well
// within ReadTimeout, is taken however long the whole chunk takes (within
// DataTimeout), as a DATA body is; a chunk that stalls gets the timeout's
// 421 and the connection ends. Before, a chunk had to arrive whole within
// one ReadTimeout of its command, and a stall was a permanent 554 naming
// the server's and the client's addresses: the client bounced the mail.
func TestBDATSlowLink(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), ReadTimeout: 300 * time.Millisecond}, q)
	rc := ts.raw(t)
	rc.login()
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	body := "Subject: x\r\n\r\n" + strings.Repeat("0123456789abcdefghijklmnopqrstuvwxyz\r\n", 30)
	rc.write("BDAT " + itoa(len(body)) + " LAST\r\n")
	for i := 0; i < len(body); i += 100 {
		rc.write(body[i:min(i+100, len(body))])
		time.Sleep(100 * time.Millisecond) // a slow link: 1 KB/s, over 1 s in all
	}
	rc.expect(250)
	if len(q.got()) != 1 {
		t.Fatal("the slow chunk was not queued")
	}

	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.write("BDAT 1000 LAST\r\nSubject: stalled\r\n")
	code, msg, _ := rc.reply()
	if code != 421 || strings.Contains(msg, "127.0.0.1") {
		t.Fatalf("a stalled chunk: %d %q, want the timeout's 421 without addresses", code, msg)
	}
	if _, _, err := rc.reply(); err == nil {
		t.Fatal("the connection stayed open after the timeout")
	}
	if len(q.got()) != 1 {
		t.Fatal("the stalled chunk was queued")
	}
}

// TestAuthLimitHoldsForParallelGuesses: the failure limit holds for
// attempts from one address made at once on many connections: past the
// limit's worth of failures (and the checks already running then, one per
// core) the rest are refused before their check. Each attempt was tested
// against the limit at AUTH and counted only after its bcrypt, so 40
// parallel guesses were all checked where 5 were allowed. Parallel right
// passwords are never held back.
func TestAuthLimitHoldsForParallelGuesses(t *testing.T) {
	q := &fakeQueue{}
	h, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.DefaultCost)
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUsers(strings.NewReader(testUser + ":" + string(h) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	const limit, n = 5, 24
	ts := startServer(t, Config{Users: u, AuthFailLimit: limit}, q)
	conns := make([]*raw, n)
	for i := range conns {
		conns[i] = ts.raw(t)
		conns[i].cmd("EHLO x", 250)
	}
	var checked, refused atomic.Int32
	var wg sync.WaitGroup
	start := make(chan struct{})
	for _, rc := range conns {
		wg.Go(func() {
			<-start
			rc.write("AUTH PLAIN " + plainIR("", testUser, "wrong") + "\r\n")
			switch code, _, _ := rc.reply(); code {
			case 535:
				checked.Add(1)
			case 421:
				refused.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if most := int32(limit + runtime.GOMAXPROCS(0) - 1); checked.Load() > most || checked.Load()+refused.Load() != n {
		t.Fatalf("%d passwords checked (535) and %d refused (421) of %d parallel guesses; want at most %d checked", checked.Load(), refused.Load(), n, most)
	}

	// The right password on as many connections at once, from an address
	// without failures: every one signs in (at bcrypt's least cost, so
	// that a loaded machine answers within testWait).
	cheap, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	if u, err = ParseUsers(strings.NewReader(testUser + ":" + string(cheap) + "\n")); err != nil {
		t.Fatal(err)
	}
	ts = startServer(t, Config{Users: u, AuthFailLimit: limit}, q)
	var in atomic.Int32
	start = make(chan struct{})
	for range n {
		rc := ts.raw(t)
		rc.cmd("EHLO x", 250)
		wg.Go(func() {
			<-start
			rc.write("AUTH PLAIN " + plainIR("", testUser, testPassword) + "\r\n")
			if code, _, _ := rc.reply(); code == 235 {
				in.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if in.Load() != n {
		t.Fatalf("%d of %d parallel sign-ins with the right password succeeded", in.Load(), n)
	}
}

// TestAuthRequiredInTime: a client that must authenticate and does not
// is let go at its first command past AuthTimeout, however busy it keeps
// the connection with NOOPs (each within ReadTimeout); one that
// authenticated is not.
func TestAuthRequiredInTime(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), AuthTimeout: 300 * time.Millisecond}, q)
	idle, authed := ts.raw(t), ts.raw(t)
	idle.cmd("EHLO client.test", 250)
	authed.login()
	deadline := time.Now().Add(10 * time.Second)
	for {
		idle.write("NOOP\r\n")
		code, msg, _ := idle.reply()
		if code == 421 {
			if !strings.Contains(msg, "Authentication required") {
				t.Fatalf("421 %q", msg)
			}
			break
		}
		if code != 250 || time.Now().After(deadline) {
			t.Fatalf("NOOP: %d %q; want 250 until the limit, then 421", code, msg)
		}
		time.Sleep(50 * time.Millisecond) // a client keeping its slot
	}
	if _, _, err := idle.reply(); err == nil {
		t.Fatal("the connection stayed open")
	}
	authed.cmd("NOOP", 250)
}

// TestAuthRequiredOfASilentClient: a client that must authenticate and
// sends nothing at all is ended at AuthTimeout with the same 421, not
// after ReadTimeout: the limit was checked only at a command, so a few
// addresses holding silent connections kept every slot for 5 minutes.
// A trusted client, which need not authenticate, waits ReadTimeout.
func TestAuthRequiredOfASilentClient(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), AuthTimeout: 300 * time.Millisecond, ReadTimeout: time.Minute}, &fakeQueue{})
	silent := ts.raw(t) // past the greeting
	start := time.Now()
	code, msg, err := silent.reply()
	if code != 421 || !strings.Contains(msg, "Authentication required") {
		t.Fatalf("a silent client got %d %q (%v) after %v; want the 421 at AuthTimeout", code, msg, err, time.Since(start))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("ended after %v, want about AuthTimeout (300ms), well under ReadTimeout", took)
	}
	if _, _, err := silent.reply(); err == nil {
		t.Fatal("the connection stayed open")
	}
	if got := ts.counter(t, "outflow_submission_rejections_total", "reason", "auth_required"); got != 1 {
		t.Errorf("auth_required rejections %v, want 1", got)
	}
}

// TestAuthTimeoutUnderStress: with most of MaxConnections in use, a new
// connection that must authenticate gets the short stress limit to do so
// (Postfix's smtpd under stress), not AuthTimeout: silent connections
// from a few addresses, renewed every AuthTimeout, kept every slot.
// Below the mark, the full AuthTimeout holds.
func TestAuthTimeoutUnderStress(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t), MaxConnections: 5, AuthTimeout: time.Hour}, &fakeQueue{})
	ts.srv.mu.Lock()
	ts.srv.stressAuth = 300 * time.Millisecond
	ts.srv.mu.Unlock()
	var held []*raw
	for range 4 { // 80 % of 5
		held = append(held, ts.raw(t))
	}
	late := ts.raw(t)
	start := time.Now()
	if code, msg, _ := late.reply(); code != 421 || !strings.Contains(msg, "Authentication required") {
		t.Fatalf("a silent client under stress got %d %q after %v, want the 421 at the stress limit", code, msg, time.Since(start))
	}
	// The first four came in below the mark: still connected, and one
	// can authenticate long after the stress limit.
	held[0].login()
	held[1].cmd("NOOP", 250)
}
