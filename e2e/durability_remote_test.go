package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestRemoteWorkerWaitsForTheDaemonsFsync: a worker on another machine,
// started with --nats-url at a daemon's embedded server (streams of one
// replica), answers 250 only after that daemon's group commit, as the
// daemon's own submissions do: every submission through it is a sync
// request the daemon releases. It once answered on the server's
// acknowledgement alone, the write in the page cache. Against a NATS
// server that no daemon syncs, --durability disk is refused at start.
func TestRemoteWorkerWaitsForTheDaemonsFsync(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	users := writeUsers(t, dir)
	common := []string{"--users", users, "--relay", mx.Addr(), "--relay-tls", "none"}
	a := startDaemon(t, dir+"/a", append(common, "--worker-id", "A")...)
	url := natsURLOf(t, dir+"/a")
	b := startDaemon(t, dir+"/b", append(common, "--worker-id", "B", "--nats-url", url)...)
	if n := b.countLog("every write waits for that daemon's fsync"); n != 1 {
		t.Fatalf("B does not say it syncs through A:\n%s", b.Logs())
	}
	before := a.scrape(t)["outflow_store_sync_requests_total"]
	const n = 5
	cl := dialAuth(t, b.SMTPAddr, testUser, testPassword)
	for i := range n {
		if err := submit(cl, "app@sender.test", []string{"r@dest.test"}, message(fmt.Sprintf("remote-%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	_ = cl.Quit()
	if got := a.scrape(t)["outflow_store_sync_requests_total"] - before; got < n {
		t.Fatalf("A released %v sync requests for %d submissions through B, want one each", got, n)
	}
	waitFor(t, 30*time.Second, "the mail delivered", func() bool { return len(mx.Messages()) >= n })

	// A NATS server that no daemon syncs: disk is refused, with why.
	plain := startNATSServer(t, "outflow", "remote-durability-pw")
	sctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(sctx, binary, "serve", "--data", dir+"/c", "--smtp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--users", users, "--relay", mx.Addr(), "--nats-url", plain, "--durability", "disk").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "no outflow daemon fsyncs that server's store") {
		t.Fatalf("--durability disk against a server no daemon syncs: %v\n%s", err, tail(string(out), 10))
	}
}
