package e2e

import (
	"bufio"
	"encoding/base64"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// rawConn is a line-level SMTP client for sending what a well-behaved
// library refuses to send.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawConn{t: t, c: c, r: bufio.NewReader(c)}
	rc.expect("220")
	return rc
}

// reply reads one (possibly multi-line) reply and returns its last line.
func (rc *rawConn) reply() string {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			rc.t.Fatalf("read reply: %v", err)
		}
		if len(line) < 4 || line[3] != '-' {
			return strings.TrimRight(line, "\r\n")
		}
	}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := rc.c.Write([]byte(s)); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// cmd sends one command line and returns the reply.
func (rc *rawConn) cmd(line string) string {
	rc.t.Helper()
	rc.send(line + "\r\n")
	return rc.reply()
}

func (rc *rawConn) expect(code string) string {
	rc.t.Helper()
	r := rc.reply()
	if !strings.HasPrefix(r, code) {
		rc.t.Fatalf("got %q, want %s", r, code)
	}
	return r
}

func (rc *rawConn) auth() {
	rc.t.Helper()
	rc.cmd("EHLO client.test")
	tok := base64.StdEncoding.EncodeToString([]byte("\x00" + testUser + "\x00" + testPassword))
	if r := rc.cmd("AUTH PLAIN " + tok); !strings.HasPrefix(r, "235") {
		rc.t.Fatalf("AUTH: %q", r)
	}
}

// TestSubmissionRejectsBadInput drives the real binary with the classic
// bad inputs and checks each gets its specific reply, that nothing bad is
// delivered, and that good mail on the same daemon still flows.
func TestSubmissionRejectsBadInput(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--max-message-size", "4096")

	t.Run("no auth", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.cmd("EHLO client.test")
		if r := rc.cmd("MAIL FROM:<a@sender.test>"); !strings.HasPrefix(r, "530") {
			t.Fatalf("MAIL without AUTH: %q, want 530", r)
		}
	})
	t.Run("bad password", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.cmd("EHLO client.test")
		tok := base64.StdEncoding.EncodeToString([]byte("\x00" + testUser + "\x00wrong"))
		if r := rc.cmd("AUTH PLAIN " + tok); !strings.HasPrefix(r, "535") {
			t.Fatalf("bad password: %q, want 535", r)
		}
	})
	t.Run("AUTH not base64", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.cmd("EHLO client.test")
		// RFC 4954 section 4: 501, a syntax error, not a temporary 454.
		if r := rc.cmd("AUTH PLAIN %%%"); !strings.HasPrefix(r, "501 5.5.2") {
			t.Fatalf("AUTH with a response that is not base64: %q, want 501 5.5.2", r)
		}
		rc.auth() // the session goes on
	})
	t.Run("oversize", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.auth()
		rc.cmd("MAIL FROM:<a@sender.test>")
		rc.cmd("RCPT TO:<r@dest.test>")
		rc.expect2("DATA", "354")
		rc.send("Subject: big\r\n\r\n" + strings.Repeat(strings.Repeat("x", 70)+"\r\n", 100) + ".\r\n")
		if r := rc.reply(); !strings.HasPrefix(r, "552") {
			t.Fatalf("oversize: %q, want 552", r)
		}
	})
	t.Run("bad address", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.auth()
		rc.cmd("MAIL FROM:<a@sender.test>")
		if r := rc.cmd("RCPT TO:<not an address>"); !strings.HasPrefix(r, "5") {
			t.Fatalf("bad address: %q, want 5xx", r)
		}
	})
	t.Run("bare LF", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.auth()
		rc.cmd("MAIL FROM:<a@sender.test>")
		rc.cmd("RCPT TO:<r@dest.test>")
		rc.expect2("DATA", "354")
		rc.send("Subject: lf\r\n\r\nbare\nline feed\r\n.\r\n")
		if r := rc.reply(); !strings.HasPrefix(r, "5") {
			t.Fatalf("bare LF: %q, want 5xx", r)
		}
	})
	t.Run("NUL byte", func(t *testing.T) {
		rc := dialRaw(t, d.SMTPAddr)
		rc.auth()
		rc.cmd("MAIL FROM:<a@sender.test>")
		rc.cmd("RCPT TO:<r@dest.test>")
		rc.expect2("DATA", "354")
		rc.send("Subject: nul\r\n\r\nnul\x00byte\r\n.\r\n")
		if r := rc.reply(); !strings.HasPrefix(r, "5") {
			t.Fatalf("NUL: %q, want 5xx", r)
		}
	})
	// The daemon kept serving: good mail still goes through.
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "a@sender.test", []string{"r@dest.test"}, message("good", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	if err := mx.WaitForMessages(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if n := len(mx.Messages()); n != 1 {
		t.Fatalf("fake MX got %d messages, want only the good one", n)
	}
	d.Stop()
}

func (rc *rawConn) expect2(line, code string) {
	rc.t.Helper()
	if r := rc.cmd(line); !strings.HasPrefix(r, code) {
		rc.t.Fatalf("%s: %q, want %s", line, r, code)
	}
}
