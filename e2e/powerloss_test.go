package e2e

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/faultfs"
)

// TestPowerLossKeepsEvery250 cuts the power under load (issue 24): the
// daemon's data dir is on faultfs in power-loss mode; while SMTP sessions
// submit without pause, the daemon is killed with SIGKILL at a random
// moment and the filesystem then drops every write that was not fsynced
// (faultfs.Crash), as a disk would at a power loss. Then the filesystem is
// unmounted, mounted again over the same backing dir, and the daemon
// restarted on it. Every message answered 250 must be delivered in the
// end, from whatever survived on disk.
//
// The sink takes 100 ms per message and the daemon has 2 delivery
// workers, slower than the sessions submit, so there is a backlog at each cut:
// mail still queued has to come back from the disk, not only mail already
// delivered. A power loss also drops acknowledgements and SENT markers,
// which are not synced (docs/reliability.md, Durability), so duplicates
// are expected and counted, not bounded.
//
// Default: one cut; OUTFLOW_LONG=1: five cuts and more sessions. By hand,
// OUTFLOW_POWERLOSS_DURABILITY=none runs the daemon with --durability
// none to show that the test fails when 250 does not wait for the disk.
func TestPowerLossKeepsEvery250(t *testing.T) {
	t.Parallel()
	cuts, conns := 1, 4
	if longMode() {
		cuts, conns = 5, 8
	}
	durability := "disk"
	if v := os.Getenv("OUTFLOW_POWERLOSS_DURABILITY"); v != "" {
		durability = v
	}
	dir := t.TempDir()
	backing, mnt := filepath.Join(dir, "backing"), filepath.Join(dir, "mnt")
	ffs := mountFaultFS(t, backing, mnt, faultfs.Options{PowerLoss: true})
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageDot {
			time.Sleep(100 * time.Millisecond) // a slow receiver: a backlog builds up
		}
		return nil
	}})
	args := append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--workers", "2"}, fastRetry...)
	args = append(args, optionalFlag("ack-wait", "5s")...)
	args = append(args, optionalFlag("durability", durability)...)
	data := filepath.Join(mnt, "data")
	d, restarts := startDaemonPatiently(t, data, args)
	l := startLoad(t, "powerloss", d.SMTPAddr, conns, 0)

	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 24))
	var rolledBack int
	for k := range cuts {
		before := l.NumAccepted()
		waitFor(t, 60*time.Second, "submissions to flow", func() bool { return l.NumAccepted() >= before+50 })
		at := time.Now().Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
		waitFor(t, 5*time.Second, "the random cut point", func() bool { return time.Now().After(at) })
		d.Kill()
		st := ffs.Stats()
		files, err := ffs.Crash()
		if err != nil {
			t.Fatalf("cut %d: crash: %v", k+1, err)
		}
		rolledBack += files
		t.Logf("cut %d: SIGKILL and power loss with %d accepted, %d at the sink; %d files rolled back (%d bytes of overwritten pages), %d fsyncs so far",
			k+1, l.NumAccepted(), len(mx.Messages()), files, st.UndoBytes, st.Fsyncs)
		if err := ffs.Unmount(); err != nil {
			t.Fatalf("cut %d: unmount: %v", k+1, err)
		}
		ffs = mountFaultFS(t, backing, mnt, faultfs.Options{PowerLoss: true})
		restart := time.Now()
		var retries int
		d, retries = startDaemonPatiently(t, data, args)
		restarts += retries
		l.SetAddr(d.SMTPAddr)
		logs := d.Logs()
		lostMeta := strings.Count(logs, "checksums do not match") + strings.Count(logs, "Error unmarshalling consumer metafile")
		t.Logf("cut %d: serving again in %v (%d starts timed out); the server found %d stream or consumer metadata files damaged",
			k+1, time.Since(restart).Round(time.Millisecond), retries, lostMeta)
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "checksums do not match") || strings.Contains(line, "Error unmarshalling consumer metafile") {
				t.Logf("cut %d: %s", k+1, line)
			}
		}
	}
	if rolledBack == 0 {
		t.Errorf("no file had unsynced changes at %d cuts: the power loss tested nothing", cuts)
	}
	before := l.NumAccepted()
	waitFor(t, 60*time.Second, "submissions after the last restart", func() bool { return l.NumAccepted() >= before+20 })
	l.Stop()
	accepted := l.Accepted()
	// Envelopes in flight at a cut come back after the ack wait. The
	// figures are printed whatever the outcome, losses included.
	deadline := time.Now().Add(180 * time.Second)
	for !allDelivered(accepted, mx) && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond) // polling the sink with a deadline
	}
	r := compare(accepted, sinkCounts(mx))
	t.Logf("FIGURES powerloss: durability=%s cuts=%d submissions=%d files_rolled_back=%d starts_timed_out=%d %s codes=%v",
		durability, cuts, l.attempts.Load(), rolledBack, restarts, r, l.Codes())
	if r.missing != 0 {
		t.Fatalf("lost %d messages answered 250 (first %v)\n--- daemon log tail ---\n%s", r.missing, r.missingIDs, tail(d.Logs(), 40))
	}
	requireNoPanic(t, d.Logs())
	d.Stop()
}
