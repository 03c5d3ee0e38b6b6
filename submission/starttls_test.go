package submission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startTLS says EHLO and STARTTLS on a new raw connection and completes
// the TLS handshake; it returns the dialogue inside TLS.
func (ts *testServer) startTLS(t *testing.T, pool *x509.CertPool) *raw {
	t.Helper()
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("STARTTLS", 220)
	tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	_ = tc.SetDeadline(time.Now().Add(testWait))
	if err := tc.Handshake(); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	return &raw{t: t, c: tc, r: bufioTextReader(tc)}
}

// wantTLSEnd reads the end of a connection inside TLS: a 421 reply with
// want in its text, and then the end of the TLS stream. Plaintext octets
// in the stream are a TLS error here (a record with a bad version), never
// a reply. With ok250, a 250 may come before the 421.
func wantTLSEnd(t *testing.T, rc *raw, want string, ok250 bool) {
	t.Helper()
	code, msg, err := rc.reply()
	if ok250 && err == nil && code == 250 {
		code, msg, err = rc.reply()
	}
	if err != nil || code != 421 || !strings.HasPrefix(msg, want) {
		t.Fatalf("got %d %q (%v); want 421 %s… inside TLS", code, msg, err, want)
	}
	if _, _, err := rc.reply(); !errors.Is(err, io.EOF) {
		t.Fatalf("after the 421: %v, want the end of the TLS stream", err)
	}
}

// A connection the server ends after STARTTLS is told why inside TLS
// (RFC 3207 section 4.2: every reply after the handshake is), also
// before the client's first greeting there: until then go-smtp had no
// session for it, and the 421 went out on the socket in plaintext, where
// the client, reading TLS records, found a broken record instead. While
// the handshake runs nothing can be written, and the connection is just
// closed. The idle timeout, the AuthTimeout limit and a shutdown all end
// such a connection.
func TestNoPlaintextAfterSTARTTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	tlsCfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	// greet says EHLO inside TLS first when set: a session exists then.
	for _, greet := range []bool{false, true} {
		name := func(s string) string {
			if greet {
				return s + " after EHLO"
			}
			return s + " before EHLO"
		}
		start := func(t *testing.T, ts *testServer) *raw {
			t.Helper()
			rc := ts.startTLS(t, pool)
			if greet {
				rc.cmd("EHLO client.test", 250)
			}
			return rc
		}

		t.Run(name("idle timeout"), func(t *testing.T) {
			// A second for the handshake too, which go-smtp reads under
			// the deadline of the STARTTLS command.
			ts := startServer(t, Config{Users: testUsers(t), TLSConfig: tlsCfg, ReadTimeout: time.Second}, &fakeQueue{})
			rc := start(t, ts)
			wantTLSEnd(t, rc, "4.4.2 Idle timeout", false)
			if got := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonTimeout); got != 1 {
				t.Errorf("timeouts counted: %v, want 1", got)
			}
		})

		t.Run(name("auth timeout"), func(t *testing.T) {
			ts := startServer(t, Config{Users: testUsers(t), TLSConfig: tlsCfg}, &fakeQueue{})
			rc := start(t, ts)
			rc.cmd("NOOP", 250) // the server is past its handshake, waiting for a command
			// The limit set at the EHLO before STARTTLS has passed.
			ts.srv.mu.Lock()
			for c := range ts.srv.conns {
				c.mu.Lock()
				c.authBy = pastDeadline
				c.mu.Unlock()
			}
			ts.srv.mu.Unlock()
			// The server finds out at its next command read: before this
			// NOOP if it had not begun it yet, else after the NOOP's 250.
			rc.write("NOOP\r\n")
			wantTLSEnd(t, rc, "4.7.0 Authentication required", true)
		})

		t.Run(name("shutdown"), func(t *testing.T) {
			told := make(chan struct{})
			ts := startServer(t, Config{Users: testUsers(t), TLSConfig: tlsCfg}, &fakeQueue{}, toldOnShutdown(told))
			rc := start(t, ts)
			rc.cmd("NOOP", 250) // the server is past its handshake, waiting for a command
			shut := shutdown(t, ts, told)
			wantTLSEnd(t, rc, "4.3.2 Service shutting down", false)
			if err := <-shut; err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
		})
	}

	t.Run("shutdown before the handshake", func(t *testing.T) {
		// The server has said 220 and waits for the client's handshake;
		// the client, slow to start it, finds only TLS records (here
		// none) on the connection, never a plaintext 421 or go-smtp's
		// "550 Handshake error".
		told := make(chan struct{})
		ts := startServer(t, Config{Users: testUsers(t), TLSConfig: tlsCfg}, &fakeQueue{}, toldOnShutdown(told))
		rc := ts.raw(t)
		rc.cmd("EHLO client.test", 250)
		rc.cmd("STARTTLS", 220)
		shut := shutdown(t, ts, told)
		_ = rc.c.SetReadDeadline(time.Now().Add(testWait))
		rest, err := io.ReadAll(rc.r.R)
		if len(rest) > 0 && rest[0] >= '0' && rest[0] <= '9' {
			t.Fatalf("after the 220: %q in plaintext", rest)
		}
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after the 220: %v, want the connection closed", err)
		}
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	})

	t.Run("STARTTLS before any greeting", func(t *testing.T) {
		// No session saw the connection before the handshake: the writer
		// inside TLS comes with the first greeting there, and the 421
		// with it.
		told := make(chan struct{})
		ts := startServer(t, Config{Users: testUsers(t), TLSConfig: tlsCfg}, &fakeQueue{}, toldOnShutdown(told))
		rc := ts.raw(t)
		rc.cmd("STARTTLS", 220)
		tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		rc = &raw{t: t, c: tc, r: bufioTextReader(tc)}
		rc.cmd("EHLO client.test", 250)
		shut := shutdown(t, ts, told)
		wantTLSEnd(t, rc, "4.3.2 Service shutting down", false)
		if err := <-shut; err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
	})
}

// toldOnShutdown makes Shutdown close told once it has told every
// connection (hangup), before it waits for them.
func toldOnShutdown(told chan struct{}) func(*Server) {
	return func(s *Server) { s.listenersClosed = func() { close(told) } }
}

// shutdown runs ts's Shutdown and returns once every connection has been
// told; Shutdown's result arrives on the channel.
func shutdown(t *testing.T, ts *testServer, told <-chan struct{}) <-chan error {
	t.Helper()
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		shut <- ts.srv.Shutdown(ctx)
	}()
	select {
	case <-told:
	case <-time.After(testWait):
		t.Fatal("Shutdown did not tell the connections")
	}
	return shut
}
