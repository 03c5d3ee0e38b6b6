package submission

import (
	"bytes"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// bigBody is a message of n octets (n > 100) in lines of 80 octets,
// CRLF included; no line starts with a dot.
func bigBody(n int) []byte {
	b := make([]byte, 0, n)
	b = append(b, "Subject: big\r\n\r\n"...)
	line := strings.Repeat("0123456789", 8)[:78] + "\r\n"
	for len(b)+len(line) <= n-2 {
		b = append(b, line...)
	}
	b = append(b, bytes.Repeat([]byte("x"), n-2-len(b))...)
	return append(b, "\r\n"...)
}

// usersAppAndOther holds testUser and "other", both with testPassword.
func usersAppAndOther(t *testing.T) *Users {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUsers(strings.NewReader(testUser + ":" + string(h) + "\nother:" + string(h) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// openData starts a transaction as user on a new connection, up to the
// 354 after DATA.
func (ts *testServer) openData(t *testing.T, user string) *raw {
	t.Helper()
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", user, testPassword), 235)
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	return rc
}

// writeAsync writes b on rc's connection in a goroutine of its own and
// reports the write's error on the returned channel.
func (rc *raw) writeAsync(b []byte) <-chan error {
	done := make(chan error, 1)
	_ = rc.c.SetWriteDeadline(time.Now().Add(testWait))
	go func() {
		_, err := rc.c.Write(b)
		done <- err
	}()
	return done
}

// inUse is the bytes the server's transactions are charged now.
func (ts *testServer) inUse() int64 {
	used, _, _ := ts.srv.Inflight()
	return used
}

// liveHeap is the live heap after two collections (the second empties
// the pools the first only moved aside).
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestInflightBoundsParallelBodies: with one body holding most of a small
// budget, six more sent at once are each refused with 452 4.3.1 once they
// find no room, give back what they held at once, and are read to their
// end (their connections stay in step); neither the bytes charged nor the
// live heap pass the budget meanwhile (without the bound the seven bodies
// held 27 MB of heap); the one that had room is queued intact, and once it
// is, the budget is empty again and the same large body goes through on a
// connection that had been refused.
func TestInflightBoundsParallelBodies(t *testing.T) {
	const budget = 9 << 20
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), MaxInflightBytes: budget, TenantInflightBytes: budget,
		InflightWait: 50 * time.Millisecond}, q)
	body := bigBody(4<<20 - bodyChunk) // its chunks charged 8 MiB: room for one
	base := liveHeap()

	first := ts.openData(t, testUser)
	wrote := first.writeAsync(body)
	eventually(t, "the first body charged in full", func() bool { return ts.inUse() == 2*4<<20 })

	const others = 6
	var conns []*raw
	var writes []<-chan error
	for range others {
		rc := ts.openData(t, testUser)
		conns = append(conns, rc)
		writes = append(writes, rc.writeAsync(body))
	}
	eventually(t, "the other bodies refused", func() bool { _, full, _ := ts.srv.Inflight(); return full == others })
	// Refused, they hold nothing while the rest of them is read.
	eventually(t, "the refused bodies' charges given back", func() bool { return ts.inUse() == 2*4<<20 })
	for i, w := range append(writes, wrote) {
		select {
		case err := <-w:
			if err != nil {
				t.Fatalf("body %d: %v", i, err)
			}
		case <-time.After(testWait):
			t.Fatalf("body %d: the server stopped reading it", i)
		}
	}
	if grew := int64(liveHeap()) - int64(base); grew > budget {
		t.Errorf("the live heap grew by %d bytes with the bodies in flight, more than the budget of %d", grew, budget)
	} else {
		t.Logf("live heap grew by %d bytes with the bodies in flight (budget %d)", grew, budget)
	}
	if _, peak := ts.srv.inflight.InUse(); peak > budget {
		t.Errorf("charged %d bytes at the peak, more than the budget of %d", peak, budget)
	}

	first.write(".\r\n")
	first.expect(250)
	for _, rc := range conns {
		rc.write(".\r\n")
		if msg := rc.expect(452); !strings.HasPrefix(msg, "4.3.1 Insufficient system storage") {
			t.Errorf("refusal %q", msg)
		}
	}
	subs := q.got()
	if len(subs) != 1 || !bytes.HasSuffix(subs[0].Body, body) || !bytes.HasPrefix(subs[0].Body, []byte("Received: ")) {
		t.Fatalf("queued %d messages, want the first body intact", len(subs))
	}
	eventually(t, "the budget empty", func() bool { return ts.inUse() == 0 })

	// The process keeps serving, the refused connections too.
	rc := conns[0]
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(body) + ".\r\n")
	rc.expect(250)
	if subs := q.got(); len(subs) != 2 || !bytes.HasSuffix(subs[1].Body, body) {
		t.Fatal("the body sent again was not queued intact")
	}
	if got := ts.counter(t, "outflow_submission_inflight_refused_total", "reason", "budget"); got != others {
		t.Errorf("inflight_refused_total{budget} = %v, want %d", got, others)
	}
	if got := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonInsufficientStorage); got != others {
		t.Errorf("rejections_total{insufficient_storage} = %v, want %d", got, others)
	}
	if got := ts.counter(t, "outflow_submission_inflight_bytes"); got != 0 {
		t.Errorf("inflight_bytes = %v at rest", got)
	}
}

// TestInflightTenantShare: a tenant holding most of its share has its
// next large body refused (at MAIL FROM when it declares SIZE, else as
// the body arrives), never holding more than the share, while another
// tenant's large body still goes through; a declared size is checked,
// never charged.
func TestInflightTenantShare(t *testing.T) {
	const budget, share = 20 << 20, 10 << 20
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: usersAppAndOther(t), MaxInflightBytes: budget, TenantInflightBytes: share,
		InflightWait: 50 * time.Millisecond}, q)
	body := bigBody(4<<20 - bodyChunk)

	held := ts.openData(t, testUser)
	held.write(string(body))
	eventually(t, "the first body charged", func() bool { return ts.srv.inflight.TenantInUse(testUser) == 2*4<<20 })

	// Declared: refused before the body is sent (RFC 1870 section 6.1).
	sized := ts.raw(t)
	sized.login()
	if msg := sized.cmd("MAIL FROM:<app@example.com> SIZE="+strconv.Itoa(len(body)), 452); !strings.HasPrefix(msg, "4.3.1 ") ||
		!strings.Contains(msg, "account") {
		t.Errorf("MAIL with SIZE: %q", msg)
	}
	// A size with room is accepted, and charged nothing.
	sized.cmd("MAIL FROM:<app@example.com> SIZE=500000", 250)
	if got := ts.srv.inflight.TenantInUse(testUser); got != 2*4<<20 {
		t.Errorf("after MAIL SIZE=500000 the tenant holds %d", got)
	}
	sized.cmd("RSET", 250)
	if got := ts.srv.inflight.TenantInUse(testUser); got != 2*4<<20 {
		t.Errorf("after RSET the tenant holds %d", got)
	}

	// Not declared: refused as it arrives, and read to its end.
	second := ts.openData(t, testUser)
	second.write(string(body) + ".\r\n")
	if msg := second.expect(452); !strings.HasPrefix(msg, "4.3.1 ") || !strings.Contains(msg, "account") {
		t.Errorf("second body: %q", msg)
	}
	if got := ts.srv.inflight.TenantInUse(testUser); got > share {
		t.Errorf("the tenant holds %d, over its share of %d", got, share)
	}

	// Another tenant has its own share.
	other := ts.openData(t, "other")
	other.write(string(body) + ".\r\n")
	other.expect(250)

	held.write(".\r\n")
	held.expect(250)
	subs := q.got()
	if len(subs) != 2 || subs[0].Tenant != "other" || subs[1].Tenant != testUser ||
		!bytes.HasSuffix(subs[0].Body, body) || !bytes.HasSuffix(subs[1].Body, body) {
		t.Fatalf("queued %d, want other's then app's body, intact", len(subs))
	}
	if _, full, share := ts.srv.Inflight(); full != 0 || share != 2 {
		t.Errorf("refused %d for the budget and %d for the share, want 0 and 2", full, share)
	}
	if got := ts.counter(t, "outflow_submission_inflight_refused_total", "reason", "tenant-share"); got != 2 {
		t.Errorf("inflight_refused_total{tenant-share} = %v", got)
	}
	eventually(t, "the budget empty", func() bool { return ts.inUse() == 0 })
}

// TestInflightReleasedAtEveryEnd: whatever ends a transaction that holds
// part of the budget (the message stored, refused as malformed, too big
// or by the queue, a BDAT transfer reset, the client gone in the middle
// of DATA or of a BDAT chunk, a timeout), what it held is given back; a
// MAIL FROM with SIZE holds nothing, before RSET, a new EHLO or the
// client's going as before its body.
func TestInflightReleasedAtEveryEnd(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), MaxMessageBytes: 2 << 20, MaxInflightBytes: 64 << 20}, q)
	body := bigBody(1 << 20)
	empty := func(what string) {
		t.Helper()
		eventually(t, what+": the budget empty", func() bool { return ts.inUse() == 0 })
	}
	// charged waits until the transaction holds more than over.
	charged := func(what string, over int64) {
		t.Helper()
		eventually(t, what+": charged", func() bool { return ts.inUse() > over })
	}
	// none checks that nothing is charged now.
	none := func(what string) {
		t.Helper()
		if got := ts.inUse(); got != 0 {
			t.Fatalf("%s: %d charged, want none", what, got)
		}
	}
	start := func() *raw {
		t.Helper()
		rc := ts.raw(t)
		rc.login()
		rc.cmd("MAIL FROM:<app@example.com> SIZE=100", 250)
		none("MAIL with SIZE")
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		return rc
	}

	rc := start()
	rc.cmd("DATA", 354)
	rc.write(string(body) + ".\r\n")
	rc.expect(250)
	empty("stored after DATA")

	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.write("BDAT " + strconv.Itoa(len(body)) + " LAST\r\n" + string(body))
	rc.expect(250)
	empty("stored after BDAT")
	if subs := q.got(); len(subs) != 2 || !bytes.HasSuffix(subs[0].Body, body) || !bytes.HasSuffix(subs[1].Body, body) {
		t.Fatal("the stored bodies are not intact")
	}

	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write("Subject: x\r\n\r\nbare\nLF\r\n" + string(body) + ".\r\n")
	rc.expect(550)
	empty("bare LF")

	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(body) + string(body) + string(body) + ".\r\n")
	rc.expect(552)
	empty("too big")

	q.mu.Lock()
	q.err = errors.New("queue down")
	q.mu.Unlock()
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(body) + ".\r\n")
	rc.expect(451)
	empty("queue error")
	q.mu.Lock()
	q.err = nil
	q.mu.Unlock()

	rc.cmd("MAIL FROM:<app@example.com> SIZE=100", 250)
	none("MAIL with SIZE")
	rc.cmd("RSET", 250)
	empty("RSET")

	rc.cmd("MAIL FROM:<app@example.com> SIZE=100", 250)
	none("MAIL with SIZE")
	rc.cmd("EHLO client.test", 250)
	empty("a new EHLO")

	rc = start()
	rc.write("BDAT 100000\r\n" + string(body[:100000]))
	rc.expect(250)
	rc.cmd("RSET", 250)
	empty("BDAT then RSET")

	rc = start()
	rc.c.Close()
	empty("connection closed after MAIL")

	rc = start()
	rc.cmd("DATA", 354)
	rc.write(string(body[:len(body)/2]))
	charged("half a DATA body", 128<<10)
	rc.c.Close()
	empty("connection cut in DATA")

	rc = start()
	rc.write("BDAT " + strconv.Itoa(len(body)) + " LAST\r\n" + string(body[:len(body)/2]))
	charged("half a BDAT chunk", 128<<10)
	rc.c.Close()
	empty("connection cut in a BDAT chunk")

	if n := len(q.got()); n != 2 {
		t.Fatalf("%d queued, want the 2 stored above", n)
	}

	// A body that stalls: 421 and the connection closed.
	ts2 := startServer(t, Config{Users: testUsers(t), ReadTimeout: 300 * time.Millisecond, MaxInflightBytes: 64 << 20}, q)
	rc = ts2.raw(t)
	rc.login()
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(body[:len(body)/2]))
	rc.expect(421)
	eventually(t, "timeout: the budget empty", func() bool { return ts2.inUse() == 0 })
}

// TestInflightChargeSteps: a body's charge covers exactly the chunks
// readBody asks it to, twice the octets they hold, one chunk at a time,
// and stops at the tenant's share.
func TestInflightChargeSteps(t *testing.T) {
	srv, err := New(Config{Users: testUsers(t), MaxInflightBytes: 100 << 20, TenantInflightBytes: 9 << 20}, &fakeQueue{})
	if err != nil {
		t.Fatal(err)
	}
	c := srv.emptyCharge("a")
	ch, ctx := &c, srv.baseCtx
	for _, n := range []int64{bodyChunk, bodyChunk, 2 * bodyChunk, 3 * bodyChunk, 100 * bodyChunk, 4<<20 + 1} {
		if err := ch.cover(ctx, n); err != nil {
			t.Fatal(err)
		}
		if ch.room != n || ch.held != bodyFactor*n {
			t.Fatalf("cover(%d): room %d, held %d; want room %d", n, ch.room, ch.held, n)
		}
		if used, _, _ := srv.Inflight(); used != ch.held {
			t.Fatalf("cover(%d): the budget has %d charged, the charge %d", n, used, ch.held)
		}
	}
	if err := ch.cover(ctx, 5<<20); err != nil || ch.held != 9<<20 || ch.room != 1<<63-1 {
		t.Fatalf("past the share: %v, held %d, room %d", err, ch.held, ch.room)
	}
	if err := ch.cover(ctx, 1<<40); err != nil || ch.held != 9<<20 {
		t.Fatalf("once at the share: %v, held %d", err, ch.held)
	}
	ch.release()
	if used, _, _ := srv.Inflight(); used != 0 {
		t.Fatalf("%d charged after release", used)
	}
	none, err := New(Config{Users: testUsers(t), MaxInflightBytes: -1}, &fakeQueue{})
	if err != nil || none.inflight != nil {
		t.Fatal("a negative MaxInflightBytes bounds something")
	}
	zero := none.emptyCharge("a")
	var nilCharge *bodyCharge
	for _, c := range []*bodyCharge{nilCharge, &zero} {
		if err := c.cover(ctx, 1<<40); err != nil {
			t.Fatal(err)
		}
		c.release()
	}
}
