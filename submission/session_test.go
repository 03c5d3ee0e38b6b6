package submission

import (
	"encoding/json"
	"net"
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
			// Complete, so CompleteHeaders adds nothing.
			body = "Date: Tue, 01 Dec 2026 10:00:00 +0000\r\nMessage-ID: <n@example.com>\r\nSubject: n\r\n\r\n" + strings.Repeat(line, n-1)
		}
		bodies = append(bodies, body)
	}
	// And bodies around the read chunk's size, the last octet of a chunk
	// and the first of the next among them.
	for _, size := range []int{bodyChunk - 1, bodyChunk, bodyChunk + 1, 2 * bodyChunk, 3*bodyChunk + 7} {
		hdr := "Date: Tue, 01 Dec 2026 10:00:00 +0000\r\nMessage-ID: <s@example.com>\r\nSubject: s\r\n\r\n"
		body := hdr + strings.Repeat(line, (size-len(hdr))/len(line)-1)
		pad := size - len(body) // 72 to 143: one line
		body += strings.Repeat("p", pad-2) + "\r\n"
		if len(body) != size {
			t.Fatalf("built %d octets, want %d", len(body), size)
		}
		bodies = append(bodies, body)
	}
	for _, body := range bodies {
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

// TestRemoteAddr checks remoteAddr against what it replaces: the
// address's String, and the IP address parsed back from it and unmapped.
func TestRemoteAddr(t *testing.T) {
	for _, a := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2525}, // 16-octet form
		&net.TCPAddr{IP: net.IP{192, 0, 2, 7}, Port: 1},      // 4-octet form
		&net.TCPAddr{IP: net.ParseIP("::1"), Port: 65535},
		&net.TCPAddr{IP: net.ParseIP("2001:db8::1:0:0:1"), Port: 25},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 25, Zone: "eth0"},
		&net.TCPAddr{Port: 25}, // no IP
		&net.UnixAddr{Name: "/run/x.sock", Net: "unix"},
	} {
		wantStr := a.String()
		var wantIP netip.Addr
		if ap, err := netip.ParseAddrPort(wantStr); err == nil {
			wantIP = ap.Addr().Unmap()
		}
		if str, ip := remoteAddr(a); str != wantStr || ip != wantIP {
			t.Errorf("remoteAddr(%v) = %q, %v; want %q, %v", a, str, ip, wantStr, wantIP)
		}
	}
}

// TestSessionLogFields checks that every line of a session names the
// client's address and TLS, and the tenant once it is known: none before
// AUTH, the account after it.
func TestSessionLogFields(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t)}, q)
	c := ts.dial(t)
	if err := send(c, "a@example.com", []string{"b@example.org"}, "Subject: x\r\n\r\nx\r\n"); err == nil {
		t.Fatal("sent without AUTH")
	}
	rc := ts.raw(t)
	rc.login()
	rc.cmd("MAIL FROM:<a@example.com>", 250)
	rc.cmd("RCPT TO:<b@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write("Subject: x\r\n\r\nx\r\n.\r\n")
	rc.expect(250)

	lines := map[string]map[string]any{}
	for _, l := range strings.Split(strings.TrimSpace(ts.logs.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		lines[m["message"].(string)] = m
	}
	for msg, tenant := range map[string]any{
		"submission rejected": nil, "authenticated": testUser, "submission accepted": testUser,
	} {
		m, ok := lines[msg]
		if !ok {
			t.Fatalf("no %q line in %s", msg, ts.logs)
		}
		if r, _ := m["remote"].(string); !strings.HasPrefix(r, "127.0.0.1:") || m["tls"] != false ||
			m["tenant"] != tenant || m["component"] != "submission" {
			t.Errorf("%q line: %v", msg, m)
		}
	}
}

// TestStoredRcptDeduplicates compares storedRcpt, below and past
// rcptMapMin, with a map of local@lower(domain): the same mailbox is
// stored once, whatever the case of its domain; local parts differing in
// case are different mailboxes.
func TestStoredRcptDeduplicates(t *testing.T) {
	var in []string
	for i := range 3 * rcptMapMin {
		in = append(in, "u"+itoa(i%(rcptMapMin+5))+"@Example.ORG", "U"+itoa(i%7)+"@example.org",
			"u"+itoa(i)+"@EXAMPLE.org", "x@a.example")
	}
	s := &session{}
	ref := map[string]bool{}
	var want []string
	for _, to := range in {
		a, err := ParseAddress(to)
		if err != nil {
			t.Fatal(err)
		}
		if key := a.Local + "@" + strings.ToLower(a.Domain); !ref[key] {
			ref[key] = true
			want = append(want, to)
		}
		if !s.storedRcpt(a) {
			s.rcpts = append(s.rcpts, to)
		}
	}
	if strings.Join(s.rcpts, ",") != strings.Join(want, ",") {
		t.Errorf("stored %d recipients:\n%v\nwant %d:\n%v", len(s.rcpts), s.rcpts, len(want), want)
	}
	if len(want) <= rcptMapMin {
		t.Fatalf("only %d distinct recipients: the map is not exercised", len(want))
	}
}
