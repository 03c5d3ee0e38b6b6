package submission

import (
	"net/netip"
	"strings"
	"testing"
)

// TestStoredBodyIsExact sends bodies of several sizes on one connection, an
// empty one and ones read in several chunks among them, and checks that each
// is stored as the Received header followed by exactly what was sent, also
// after the later messages reused the read buffers.
func TestStoredBodyIsExact(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, q)
	rc := ts.raw(t)
	rc.cmd("HELO client.test", 250)
	line := strings.Repeat("0123456789", 7) + "\r\n"
	var bodies []string
	for _, n := range []int{0, 1, 30, 1000, 3500, 5000} { // lines
		body := ""
		if n > 0 {
			body = "Subject: n\r\n\r\n" + strings.Repeat(line, n-1)
		}
		bodies = append(bodies, body)
		rc.cmd("MAIL FROM:<a@example.com>", 250)
		rc.cmd("RCPT TO:<b@example.org>", 250)
		rc.cmd("DATA", 354)
		rc.write(body + ".\r\n")
		rc.expect(250)
	}
	subs := q.got()
	if len(subs) != len(bodies) {
		t.Fatalf("%d submissions, want %d", len(subs), len(bodies))
	}
	for i, s := range subs {
		hdr, rest := storedMessage(t, s.Body)
		if rest != bodies[i] {
			t.Errorf("message %d: stored %d octets, want %d", i, len(rest), len(bodies[i]))
		}
		if !strings.Contains(hdr, "from client.test ([127.0.0.1])") {
			t.Errorf("message %d: Received header %q", i, hdr)
		}
	}
}
