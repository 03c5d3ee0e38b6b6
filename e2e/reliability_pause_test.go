package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestPausedWorkerUnderLoad runs two outflow processes on one NATS (B
// joins A's embedded server) and stops B with SIGSTOP under load for
// longer than the ack wait, then lets it go on with SIGCONT: a stalled VM,
// a long GC pause, a process stopped in a debugger. NATS hands the
// envelopes B held to A after the ack wait, so A delivers them while B
// stands still; when B resumes, the envelopes it still holds have been
// finished by A, and it must look before sending again (the SENT re-check).
//
// Pass means nothing accepted with 250 is lost, A keeps delivering during
// each pause, and the duplicates stay within what B can have held at the
// pauses: its deliveries in progress plus the envelopes it had pulled and
// not started (--workers per lane, three lanes), per pause. The count is
// reported.
//
// Default: one pause of 2.5 × the ack wait; OUTFLOW_LONG=1: three pauses
// of 5 × the ack wait, with more (paced) submitters.
func TestPausedWorkerUnderLoad(t *testing.T) {
	const sinkLatency = 30 * time.Millisecond
	if !serveHasFlag("ack-wait") {
		t.Skip("serve has no --ack-wait")
	}
	t.Parallel()
	const workers = 4
	ackWait := 4 * time.Second
	pauses, pauseFor, conns, pace, drain := 1, ackWait*5/2, 2, time.Duration(0), 120*time.Second
	if longMode() {
		// Paced so that the backlog stays bounded over the longer run.
		pauses, pauseFor, conns, pace, drain = 3, 5*ackWait, 4, 40*time.Millisecond, 300*time.Second
	}
	// The sink takes its time over each message, as a real MX does, so
	// that B's workers are in the middle of deliveries when it stops and a
	// backlog keeps both processes busy.
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage == fakemx.StageDot {
			time.Sleep(sinkLatency) // the peer's latency, not a wait in the test
		}
		return nil
	}})
	dir := t.TempDir()
	common := append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--workers", fmt.Sprint(workers),
		"--ack-wait", ackWait.String()}, fastRetry...)
	a := startDaemon(t, dir+"/a", append(common, "--worker-id", "A")...)
	url := natsURLOf(t, dir+"/a")
	b := startDaemon(t, dir+"/b", append(common, "--worker-id", "B", "--nats-url", url)...)
	// B must never stay stopped, whatever the test does.
	t.Cleanup(func() { _ = syscall.Kill(b.pid(), syscall.SIGCONT) })

	// The load goes to A only: B's SMTP listener stops with B.
	l := startLoad(t, "pause", a.SMTPAddr, conns, pace)
	delivered := func(d *daemon) int { return d.countLog(`"outcome":"delivered"`) }
	for p := range pauses {
		before := delivered(b)
		waitFor(t, 60*time.Second, "B to deliver its share", func() bool { return delivered(b) >= before+20 })
		atSink := len(mx.Messages())
		t.Logf("pause %d: SIGSTOP B for %v with %d accepted, %d at the sink", p+1, pauseFor, l.NumAccepted(), atSink)
		if err := syscall.Kill(b.pid(), syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		// The pause is the fault itself: hold it for its length, and
		// meanwhile see A go on delivering, the envelopes B held included.
		end := time.Now().Add(pauseFor)
		waitFor(t, pauseFor+10*time.Second, "the end of the pause", func() bool { return time.Now().After(end) })
		if err := syscall.Kill(b.pid(), syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		if n := len(mx.Messages()); n <= atSink {
			t.Fatalf("no delivery during B's pause (%d at the sink before, %d after)", atSink, n)
		}
		t.Logf("pause %d: SIGCONT B; %d delivered during the pause", p+1, len(mx.Messages())-atSink)
	}
	// B takes part again after the last pause.
	before := delivered(b)
	waitFor(t, 60*time.Second, "B to deliver after it resumed", func() bool { return delivered(b) >= before+20 })
	l.Stop()
	accepted := l.Accepted()
	waitAllDelivered(t, accepted, mx, drain, func() string { return a.Logs() + b.Logs() })

	r := compare(accepted, sinkCounts(mx))
	held := workers * (1 + 3) * pauses
	// Envelopes B had pulled but not started are recognised by the first
	// check once B runs again; those it had admitted and not yet sent, by
	// the re-check before sending.
	skipped := b.countLog("redelivered envelope was already handled") + b.countLog("another worker finished the envelope")
	t.Logf("FIGURES pause: pauses=%d pause=%v ack_wait=%v submissions=%d %s skipped_after_resume=%d bound=%d delivered_by_A=%d delivered_by_B=%d codes=%v",
		pauses, pauseFor, ackWait, l.attempts.Load(), r, skipped, held, delivered(a), delivered(b), l.Codes())
	if r.missing != 0 {
		t.Errorf("lost %d accepted messages: %v", r.missing, r.missingIDs)
	}
	if r.dups > held {
		t.Errorf("%d duplicates, more than the %d envelopes B can have held at %d pauses", r.dups, held, pauses)
	}
	requireNoPanic(t, a.Logs())
	requireNoPanic(t, b.Logs())
	b.Stop()
	a.Stop()
}
