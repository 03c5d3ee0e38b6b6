package e2e

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestCrashKill9UnderLoad kills the daemon with SIGKILL at random points
// while submitters keep sending, restarts it on the same data dir each
// time, and then checks at the sink, by Message-ID, that every message
// answered with 250 was delivered, and that duplicates stay within what can
// have been in flight at the kills (at most --workers envelopes per kill:
// sent to the MX, SENT marker not yet written).
//
// Default: 2 kills; OUTFLOW_LONG=1: 6 kills and more submitters.
func TestCrashKill9UnderLoad(t *testing.T) {
	t.Parallel()
	kills, conns := 2, 2
	if longMode() {
		kills, conns = 6, 4
	}
	const workers = 4
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	data := dir + "/data"
	args := append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--workers", "4"}, fastRetry...)
	args = append(args, optionalFlag("ack-wait", "5s")...)
	d := startDaemon(t, data, args...)
	l := startLoad(t, "crash", d.SMTPAddr, conns, 0)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 10))
	var inFlightBound int
	for k := range kills {
		// Let some mail be accepted and some delivered, then kill at a
		// random moment within the next two seconds.
		before := l.NumAccepted()
		waitFor(t, 60*time.Second, "submissions to flow", func() bool { return l.NumAccepted() >= before+20 })
		deadline := time.Now().Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		waitFor(t, 5*time.Second, "the random kill point", func() bool { return time.Now().After(deadline) })
		t.Logf("kill %d: SIGKILL with %d accepted, %d at the sink", k+1, l.NumAccepted(), len(mx.Messages()))
		d.Kill()
		inFlightBound += workers
		d = startDaemon(t, data, args...)
		l.SetAddr(d.SMTPAddr)
	}
	// Keep loading the last incarnation a little, then stop and drain.
	before := l.NumAccepted()
	waitFor(t, 60*time.Second, "submissions after the last restart", func() bool { return l.NumAccepted() >= before+20 })
	l.Stop()
	accepted := l.Accepted()
	// Envelopes in flight at a kill come back after the consumer's ack wait
	// (60 s unless --ack-wait is shorter).
	waitAllDelivered(t, accepted, mx, 180*time.Second, d.Logs)
	r := compare(accepted, sinkCounts(mx))
	t.Logf("FIGURES crash: kills=%d submissions=%d %s codes=%v", kills, l.attempts.Load(), r, l.Codes())
	if r.missing != 0 {
		t.Errorf("lost %d accepted messages: %v", r.missing, r.missingIDs)
	}
	if r.dups > inFlightBound {
		t.Errorf("%d duplicates, more than the %d envelopes that can have been in flight at %d kills", r.dups, inFlightBound, kills)
	}
	requireNoPanic(t, d.Logs())
	d.Stop()
}
