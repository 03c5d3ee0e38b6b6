// nats-server's EnableJetStream, which an in-process JetStream restart
// calls (queue's Embedded.Supervise), writes its API export state while
// the API goroutines of the JetStream it restarts still read it: a data
// race inside the server, which the race detector reports whatever the
// caller does. This test therefore runs without -race: `make test` runs it
// on its own after the race-detecting run.

//go:build !race

package throttle

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// TestFollowsBucketsAfterJetStreamRestart: the embedded JetStream
// restarted in process (queue's Supervise, after the disk filled up)
// comes back without the registry, which is kept in memory. Nothing made
// it again: every heartbeat failed with "no response from stream" until
// the process restarted, and the registry's watcher ended, so the worker
// saw no other worker come or go. Made again, the registry's old watcher
// followed it from the revision it had reached on the old stream, and saw
// nothing until the new one got as far.
func TestFollowsBucketsAfterJetStreamRestart(t *testing.T) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q := testqueue.Connect(t, emb, queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	start := time.Now()
	phase := func(what string) { t.Logf("%5.1fs %s", time.Since(start).Seconds(), what) }
	state, err := OpenState(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	reg, err := OpenRegistry(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("throttle log:\n%s", logs.String())
		}
	})
	newWorker := func(id string) *Throttle {
		cfg := Config{WorkerID: id, State: state, Registry: reg, Heartbeat: 100 * time.Millisecond, WorkerTTL: 2 * time.Second,
			Defaults: Limits{Rate: 100}, Logger: zerolog.New(&logs)}
		th, err := New(context.Background(), cfg)
		if err != nil {
			t.Fatalf("New(%s): %v", id, err)
		}
		t.Cleanup(func() { _ = th.Close() })
		return th
	}
	a := newWorker("a")

	sctx, stop := context.WithCancel(context.Background())
	supervised := make(chan struct{})
	go func() { defer close(supervised); emb.Supervise(sctx, zerolog.Nop(), 20*time.Millisecond) }()
	t.Cleanup(func() { stop(); <-supervised })
	if err := emb.Server().ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "JetStream restarted by Supervise", func() bool { return emb.Healthy() == nil })
	phase("JetStream restarted")

	// A's heartbeat makes the registry again and writes its key.
	eventually(t, 15*time.Second, "a heartbeat after the restart", func() bool {
		_, err := reg.Get(ctx, a.regKey)
		return err == nil
	})
	// A worker that registers after the restart is seen by A, and A's
	// share is halved.
	phase("A's heartbeat written")
	b := newWorker("b")
	eventually(t, 10*time.Second, "A sees B, registered after the restart", func() bool { return a.Live() == 2 })
	if s := a.Snapshot("x.test"); s.WorkerRate != 50 {
		t.Fatalf("A's rate with B: %v, want 50", s.WorkerRate)
	}
	phase("A sees B")
	// A state written after the restart reaches A.
	until := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if err := Suspend(ctx, state, "x.test", until, "maintenance", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A sees the suspension written after the restart", func() bool {
		return a.Snapshot("x.test").State.Suspended(time.Now())
	})
	phase("A sees the suspension")
	// B's leaving is seen too.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "A sees B leave", func() bool { return a.Live() == 1 })
	phase("A sees B leave")
	if n := strings.Count(logs.String(), "worker heartbeat failed"); n > 1 {
		t.Errorf("heartbeat failure logged %d times, want once", n)
	}
}
