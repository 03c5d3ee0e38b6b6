package submission

import (
	"crypto/tls"
	"net/netip"
	"strings"
	"testing"
)

// A command out of sequence is answered 503 (RFC 5321 section 4.3.2), not
// go-smtp's 502 "not implemented"; an unknown MAIL or RCPT parameter 555
// (section 4.1.1.11), not its 500; AUTH without a mechanism 501; a line
// that is no command 500, not 501; on a
// plaintext connection and under TLS. The session stays in step after
// each, a refused BDAT's chunk included.
func TestSequenceAndParameterReplies(t *testing.T) {
	cert, pool := selfSigned(t)
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}, q)
	want := func(rc *raw, line string, code int, text string) {
		t.Helper()
		if msg := rc.cmd(line, code); !strings.Contains(msg, text) {
			t.Errorf("%q: %d %q, want %q in it", line, code, msg, text)
		}
	}

	rc := ts.raw(t)
	want(rc, "MAIL FROM:<app@example.com>", 503, "5.5.1 Bad sequence of commands: send EHLO first")
	want(rc, "AUTH PLAIN", 503, "5.5.1 Bad sequence of commands: send EHLO first")
	rc.cmd("EHLO client.test", 250)
	want(rc, "AUTH", 501, "5.5.4 ")
	// A line that is no command is unrecognized (500, section 4.2.4),
	// as an unknown four-letter verb is; it was 501 "Bad command".
	want(rc, "FOO", 500, "5.5.2 Syntax error, command unrecognized")
	want(rc, "HELLOTHERE", 500, "5.5.2 Syntax error, command unrecognized")
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
	want(rc, "RCPT TO:<rcpt@example.org>", 503, "5.5.1 Bad sequence of commands: send MAIL FROM first")
	want(rc, "DATA", 503, "5.5.1 Bad sequence of commands: send RCPT TO first")
	rc.write("BDAT 5 LAST\r\nHello")
	if msg := rc.expect(503); !strings.HasPrefix(msg, "5.5.1 Bad sequence") {
		t.Errorf("BDAT before RCPT: %q", msg)
	}
	rc.cmd("NOOP", 250) // the chunk was read and dropped
	want(rc, "MAIL FROM:<app@example.com> FOO=1", 555, "5.5.4 MAIL FROM parameter not recognized")
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	want(rc, "RCPT TO:<rcpt@example.org> FOO=1", 555, "5.5.4 RCPT TO parameter not recognized")
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.write("BDAT 3\r\nabc")
	rc.expect(250)
	want(rc, "MAIL FROM:<app@example.com>", 503, "MAIL not allowed during a BDAT transfer")
	want(rc, "RCPT TO:<rcpt@example.org>", 503, "RCPT not allowed during a BDAT transfer")
	want(rc, "DATA", 503, "DATA not allowed during a BDAT transfer")
	rc.write("BDAT 14 LAST\r\nSubject: x\r\n\r\n")
	rc.expect(250)
	if n := len(q.got()); n != 1 {
		t.Fatalf("%d queued, want the BDAT message", n)
	}

	// Under TLS the amended replies come from the writer under go-smtp's.
	rc = ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("STARTTLS", 220)
	tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	rc = &raw{t: t, c: tc, r: bufioTextReader(tc)}
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
	want(rc, "DATA", 503, "5.5.1 Bad sequence of commands: send RCPT TO first")
	want(rc, "MAIL FROM:<app@example.com> FOO=1", 555, "5.5.4 ")
}

// A client that greets with HELO speaks SMTP without extensions, and its
// messages' Received field says so ("with SMTP", RFC 5321 section 4.4);
// EHLO gives ESMTP with RFC 3848's S and A. The greeting in force counts:
// a later EHLO on the same connection, and the greeting after STARTTLS.
func TestReceivedProtocolFollowsGreeting(t *testing.T) {
	cert, pool := selfSigned(t)
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}, q)
	sendOne := func(rc *raw) {
		t.Helper()
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.cmd("DATA", 354)
		rc.write("Subject: x\r\n\r\nx\r\n.\r\n")
		rc.expect(250)
	}
	rc := ts.raw(t)
	rc.cmd("HELO client.test", 250)
	sendOne(rc)
	rc.cmd("EHLO client.test", 250)
	sendOne(rc)
	rc.cmd("HELO client.test", 250)
	sendOne(rc)

	rc = ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("STARTTLS", 220)
	tc := tls.Client(rc.c, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	rc = &raw{t: t, c: tc, r: bufioTextReader(tc)}
	rc.cmd("HELO client.test", 250)
	sendOne(rc)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
	sendOne(rc)

	subs := q.got()
	want := []string{"with SMTP;", "with ESMTP;", "with SMTP;", "with SMTP;", "with ESMTPSA;"}
	if len(subs) != len(want) {
		t.Fatalf("%d queued, want %d", len(subs), len(want))
	}
	for i, w := range want {
		if hdr, _ := storedMessage(t, subs[i].Body); !strings.Contains(hdr, w) {
			t.Errorf("message %d: Received %q, want %q", i, hdr, w)
		}
	}
}

// Under TLS the replies are amended from the handshake on, before the
// client's first greeting inside TLS too (RFC 3207 section 4.2: the
// client must greet again, and a command before that is out of
// sequence). A reply held there while a pipelined greeting is buffered
// still goes out when the greeting makes the session.
func TestAmendedRepliesBeforeGreetingUnderTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}, q)
	rc := ts.startTLS(t, pool)
	for _, c := range []struct{ line, text string }{
		{"MAIL FROM:<app@example.com>", "5.5.1 Bad sequence of commands: send EHLO first"},
		{"AUTH PLAIN", "5.5.1 Bad sequence of commands: send EHLO first"},
		{"RCPT TO:<rcpt@example.org>", "5.5.1 Bad sequence of commands: send MAIL FROM first"},
		{"DATA", "5.5.1 Bad sequence of commands: send RCPT TO first"},
	} {
		if msg := rc.cmd(c.line, 503); msg != c.text {
			t.Errorf("%q before EHLO under TLS: %q, want %q", c.line, msg, c.text)
		}
	}
	rc.write("NOOP\r\nEHLO client.test\r\n")
	rc.expect(250)
	if msg := rc.expect(250); !strings.Contains(msg, "AUTH PLAIN") {
		t.Errorf("EHLO under TLS: %q", msg)
	}
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	if msg := rc.cmd("RCPT TO:<rcpt@example.org> FOO=1", 555); !strings.HasPrefix(msg, "5.5.4 RCPT TO parameter") {
		t.Errorf("unknown RCPT parameter: %q", msg)
	}
}
