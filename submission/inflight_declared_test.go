package submission

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// usersThree holds testUser, "other" and "third", all with testPassword.
func usersThree(t *testing.T) *Users {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, u := range []string{testUser, "other", "third"} {
		b.WriteString(u + ":" + string(h) + "\n")
	}
	u, err := ParseUsers(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// loginAs does EHLO and AUTH PLAIN as user on a new connection.
func (ts *testServer) loginAs(t *testing.T, user string) *raw {
	t.Helper()
	rc := ts.raw(t)
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", user, testPassword), 235)
	return rc
}

// TestInflightDeclaredSizeHoldsNothing: the lock-out the budget once
// allowed. Two accounts open sessions that declare the largest SIZE at
// MAIL FROM (which, charged, held the whole budget) and send nothing, or
// start DATA and send a few octets and stall: they hold only the chunk
// their body is read into, and a third account's message is accepted
// meanwhile at once. A body that sends real octets is charged for them,
// its client gone, the budget is empty again.
func TestInflightDeclaredSizeHoldsNothing(t *testing.T) {
	// Each account's three declared sizes were its whole share, the two
	// shares the whole budget.
	const maxMsg = 2 << 20
	const share = 3 * bodyFactor * maxMsg
	const budget = 2 * share
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: usersThree(t), MaxMessageBytes: maxMsg, MaxInflightBytes: budget,
		TenantInflightBytes: share, InflightWait: 50 * time.Millisecond}, q)
	declared := "MAIL FROM:<app@example.com> SIZE=" + strconv.Itoa(maxMsg)

	var idle []*raw
	for _, user := range []string{testUser, "other"} {
		for range 3 {
			rc := ts.loginAs(t, user)
			rc.cmd(declared, 250)
			rc.cmd("RCPT TO:<rcpt@example.org>", 250)
			idle = append(idle, rc)
		}
	}
	if got := ts.inUse(); got != 0 {
		t.Fatalf("six transactions that declared SIZE=%d and sent nothing hold %d bytes, want none", maxMsg, got)
	}
	// Into DATA, a few octets of the body, then nothing: one chunk each.
	for _, rc := range idle[:2] {
		rc.cmd("DATA", 354)
		rc.write("Subject: slow\r\n\r\n")
	}
	eventually(t, "the stalled bodies' first chunks charged", func() bool { return ts.inUse() == 2*bodyFactor*bodyChunk })
	if got := ts.counter(t, "outflow_submission_inflight_bytes"); got != 2*bodyFactor*bodyChunk {
		t.Errorf("outflow_submission_inflight_bytes = %v, want the two chunks", got)
	}

	// Another account's message goes through meanwhile, at once.
	third := ts.loginAs(t, "third")
	third.cmd("MAIL FROM:<app@example.com> SIZE=10000", 250)
	third.cmd("RCPT TO:<rcpt@example.org>", 250)
	third.cmd("DATA", 354)
	third.write(string(bigBody(10000)) + ".\r\n")
	third.expect(250)
	if n := len(q.got()); n != 1 {
		t.Fatalf("%d queued, want the third account's message", n)
	}
	if _, full, share := ts.srv.Inflight(); full != 0 || share != 0 {
		t.Errorf("refused %d for the budget and %d for a share, want none", full, share)
	}

	// Real octets are charged: 100 KiB sent, four chunks held.
	third.cmd("MAIL FROM:<app@example.com>", 250)
	third.cmd("RCPT TO:<rcpt@example.org>", 250)
	third.cmd("DATA", 354)
	third.write(string(bigBody(100 << 10)))
	eventually(t, "100 KiB charged", func() bool { return ts.srv.inflight.TenantInUse("third") == bodyFactor*4*bodyChunk })

	// Whatever ends them, nothing is left held.
	third.c.Close()
	idle[0].write(".\r\n")
	idle[0].expect(250)
	idle[1].c.Close()
	eventually(t, "the budget empty", func() bool { return ts.inUse() == 0 })
	if got := ts.counter(t, "outflow_submission_inflight_bytes"); got != 0 {
		t.Errorf("outflow_submission_inflight_bytes = %v at rest", got)
	}
}

// TestInflightDeclaredSizeChecked: the declared size is still looked at.
// With the budget held by real octets, a MAIL FROM whose SIZE could not
// be charged is refused with 452 4.3.1 after the wait, before its body is
// sent, and holds nothing; one with room is accepted. A body sent without
// SIZE into the full budget is refused with 452 4.3.1 once read to its
// end, and its connection stays usable.
func TestInflightDeclaredSizeChecked(t *testing.T) {
	const budget = 4 << 20
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: usersThree(t), MaxInflightBytes: budget, TenantInflightBytes: budget,
		InflightWait: 50 * time.Millisecond}, q)
	body := bigBody(budget/bodyFactor - bodyChunk) // its chunks charged: the whole budget

	held := ts.loginAs(t, testUser)
	held.cmd("MAIL FROM:<app@example.com>", 250)
	held.cmd("RCPT TO:<rcpt@example.org>", 250)
	held.cmd("DATA", 354)
	held.write(string(body))
	eventually(t, "the budget held by real octets", func() bool { return ts.inUse() == budget })

	rc := ts.loginAs(t, "other")
	start := time.Now()
	if msg := rc.cmd("MAIL FROM:<app@example.com> SIZE=100000", 452); !strings.HasPrefix(msg, "4.3.1 Insufficient system storage") {
		t.Errorf("MAIL with SIZE into a full budget: %q", msg)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("refused after %v, before the wait was over", waited)
	}
	if got := ts.inUse(); got != budget {
		t.Errorf("a refused MAIL left %d charged, want %d", got, budget)
	}
	rc.cmd("MAIL FROM:<app@example.com>", 250)
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(bigBody(1000)) + ".\r\n")
	if msg := rc.expect(452); !strings.HasPrefix(msg, "4.3.1 ") {
		t.Errorf("a body into a full budget: %q", msg)
	}

	held.write(".\r\n")
	held.expect(250)
	eventually(t, "the budget empty", func() bool { return ts.inUse() == 0 })
	rc.cmd("MAIL FROM:<app@example.com> SIZE=100000", 250)
	if got := ts.inUse(); got != 0 {
		t.Errorf("a MAIL with room was charged %d", got)
	}
	rc.cmd("RCPT TO:<rcpt@example.org>", 250)
	rc.cmd("DATA", 354)
	rc.write(string(bigBody(100000)) + ".\r\n")
	rc.expect(250)
	if n := len(q.got()); n != 2 {
		t.Fatalf("%d queued, want 2", n)
	}
	if _, full, _ := ts.srv.Inflight(); full != 2 {
		t.Errorf("refused %d for the budget, want the MAIL and the body", full)
	}
	eventually(t, "the budget empty", func() bool { return ts.inUse() == 0 })
}
