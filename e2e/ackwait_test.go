package e2e

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestRaisedAckWaitAfterRestart: mail queued by a daemon with --ack-wait
// 10s and delivered after a restart with --ack-wait 2m, by sends of 15 s,
// goes out once. Before, the tenant's work consumer kept the 10 s ack wait
// of the daemon that made it (only the lanes' consumers were updated at
// start) while the restarted workers reported progress every 30 s (a
// quarter of their own 2 m): the server handed each message out again
// after 10 s to an idle worker, and both sent it. Either half of the fix
// prevents it (the start updates the tenants' consumers; the keep-alive
// follows the consumer's ack wait).
func TestRaisedAckWaitAfterRestart(t *testing.T) {
	t.Parallel()
	const msgs, send = 2, 15 * time.Second
	var restarted atomic.Bool
	var mails atomic.Int32
	stopped := make(chan struct{})
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage != fakemx.StageMail {
			return nil
		}
		mails.Add(1)
		if !restarted.Load() {
			// Before the restart nothing is delivered: the first send
			// waits here until the daemon has stopped.
			<-stopped
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "later"}
		}
		time.Sleep(send)
		return nil
	}})
	dir := t.TempDir()
	data := dir + "/data"
	common := append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--shutdown-grace", "1s"}, fastRetry...)

	d := startDaemon(t, data, append(common, "--ack-wait", "10s", "--workers", "1")...)
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	want := map[string]bool{}
	for i := range msgs {
		id := fmt.Sprintf("ackwait-%d", i)
		if err := submit(cl, "app@sender.test", []string{"rcpt@dest.test"}, message(id, "")); err != nil {
			t.Fatal(err)
		}
		want["<"+id+"@e2e.test>"] = true
	}
	_ = cl.Quit()
	waitFor(t, 60*time.Second, "the first send to start", func() bool { return mails.Load() > 0 })
	// Stopped with its one worker in the first send: it is cut before its
	// final dot and given back, and the rest never left the queue.
	d.Stop()
	restarted.Store(true)
	close(stopped)

	d = startDaemon(t, data, append(common, "--ack-wait", "2m", "--workers", "4")...)
	start := time.Now()
	waitAllDelivered(t, want, mx, 90*time.Second, d.Logs)
	// A copy handed out again after the old 10 s ack wait would reach the
	// MX one send later.
	time.Sleep(time.Until(start.Add(10*time.Second + 2*send)))
	for id, n := range sinkCounts(mx) {
		if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
}
