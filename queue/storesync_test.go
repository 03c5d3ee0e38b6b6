package queue

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// gateSyncer is a Syncer that records each request and holds it until the
// test releases it, so a test can see what a caller does before its write
// is durable.
type gateSyncer struct {
	mu    sync.Mutex
	calls [][]string
	seen  chan []string // each request, as it arrives
	open  chan struct{} // closed: every request returns
	err   error
}

func newGateSyncer() *gateSyncer {
	return &gateSyncer{seen: make(chan []string, 64), open: make(chan struct{})}
}

func (g *gateSyncer) Sync(ctx context.Context, streams ...string) error {
	g.mu.Lock()
	g.calls = append(g.calls, streams)
	open, err := g.open, g.err
	g.mu.Unlock()
	g.seen <- streams
	select {
	case <-open:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// set replaces the gate and the error later requests get.
func (g *gateSyncer) set(open chan struct{}, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.open, g.err = open, err
}

func waitSync(t *testing.T, g *gateSyncer) []string {
	t.Helper()
	select {
	case s := <-g.seen:
		return s
	case <-time.After(15 * time.Second):
		t.Fatal("no sync requested within 15s")
		return nil
	}
}

func TestStoreSyncerFindsStreams(t *testing.T) {
	_, emb := startQueue(t)
	acc := emb.Server().GlobalAccount()
	for _, name := range []string{StreamWork, StreamRetry, StreamRateLimit, StreamDead, bodyStreamName} {
		mset, err := natsLookupStream(acc, name)
		if err != nil || mset == nil {
			t.Fatalf("lookup %s: %v", name, err)
		}
		st := natsStreamStore(mset)
		if st == nil || st.Type() != server.FileStorage {
			t.Fatalf("%s: store %T", name, st)
		}
		var state server.StreamState
		st.FastState(&state)
		dir := filepath.Join(emb.Server().JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", name, "msgs")
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("%s: block dir: %v", name, err)
		}
	}
	if _, err := natsLookupStream(acc, "NO_SUCH_STREAM"); err == nil {
		t.Fatal("lookup of a missing stream succeeded")
	}
}

func TestEnqueueReturnsOnlyAfterSync(t *testing.T) {
	g := newGateSyncer()
	q, _ := startQueueWith(t, Options{Syncer: g})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type result struct {
		ids []string
		err error
	}
	done := make(chan result, 1)
	go func() {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
		done <- result{ids, err}
	}()
	streams := waitSync(t, g)
	if !slices.Equal(streams, []string{StreamWork}) {
		t.Fatalf("synced %v, want the work stream (inline body)", streams)
	}
	// The envelope is acknowledged by the stream when the sync is asked for.
	info, err := q.lanes[LaneWork].Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("work stream at sync time: %+v, %v", info, err)
	}
	select {
	case r := <-done:
		t.Fatalf("Enqueue returned %v, %v before the sync finished", r.ids, r.err)
	default:
	}
	close(g.open)
	if r := <-done; r.err != nil || len(r.ids) != 1 {
		t.Fatalf("Enqueue = %v, %v", r.ids, r.err)
	}
}

func TestEnqueueFailsWhenSyncFails(t *testing.T) {
	g := newGateSyncer()
	g.set(g.open, errors.New("fsync: input/output error"))
	close(g.open)
	q, _ := startQueueWith(t, Options{Syncer: g})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Two destinations: the body goes to the Object Store and is synced too.
	_, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example", "s@e.example"}, Body: []byte("x\r\n")})
	if err == nil || !strings.Contains(err.Error(), "input/output error") || !errors.Is(err, ErrMaybeStored) {
		t.Fatalf("Enqueue error = %v, want the sync's, marked ErrMaybeStored (the envelopes were stored)", err)
	}
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example"}); err == nil || errors.Is(err, ErrMaybeStored) {
		t.Fatalf("Enqueue of nothing: %v, want an error not marked ErrMaybeStored", err)
	}
	if s := waitSync(t, g); !slices.Equal(s, []string{StreamWork, bodyStreamName}) {
		t.Fatalf("synced %v, want work and bodies", s)
	}
}

func TestRescheduleAndDeadSyncBeforeAck(t *testing.T) {
	g := newGateSyncer()
	q, _ := startQueueWith(t, Options{Syncer: g})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	close(g.open)
	for range 2 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
		waitSync(t, g)
	}
	g.set(make(chan struct{}), nil) // hold the next requests
	work, err := q.Messages(ctx, LaneWork, 2)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := q.js.Consumer(ctx, StreamWork, tenantConsumer("t"))
	if err != nil {
		t.Fatal(err)
	}
	pendingAcks := func() int {
		ci, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return ci.NumAckPending
	}
	steps := []struct {
		name   string
		stream string
		do     func(d *Delivery) error
	}{
		{"reschedule", StreamRateLimit, func(d *Delivery) error {
			return d.Reschedule(ctx, d.Env.Clone(), LaneRateLimit, time.Now().Add(time.Hour), true)
		}},
		{"dead", StreamDead, func(d *Delivery) error { return d.Dead(ctx, d.Env.Clone(), "max-attempts") }},
	}
	d0, d1 := next(t, work), next(t, work) // both in flight
	for i, st := range steps {
		d := []*Delivery{d0, d1}[i]
		errc := make(chan error, 1)
		go func() { errc <- st.do(d) }()
		if s := waitSync(t, g); !slices.Equal(s, []string{st.stream}) {
			t.Fatalf("%s synced %v, want %s", st.name, s, st.stream)
		}
		if n := pendingAcks(); n != 2-i {
			t.Fatalf("%s: %d acks pending while its write is not yet durable, want %d (the original still unacknowledged)", st.name, n, 2-i)
		}
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		open <- struct{}{} // release this one request
		if err := <-errc; err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
	}
}

// TestStoreSyncerGroupCommits submits concurrently through the real syncer,
// with a window and without one (the default): every submission is
// released by a sync, and far fewer syncs run than submissions.
func TestStoreSyncerGroupCommits(t *testing.T) {
	for _, tc := range []struct {
		name   string
		window time.Duration
	}{{"5ms window", 5 * time.Millisecond}, {"no window", -1}} {
		t.Run(tc.name, func(t *testing.T) { testGroupCommits(t, tc.window) })
	}
}

func testGroupCommits(t *testing.T, window time.Duration) {
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: -1, SyncWindow: window}) // only the submissions' syncs
	ss := emb.StoreSyncer()
	// Each fsync takes 300 ms, so that the submissions meet in the
	// batches however slowly a loaded machine schedules them: without
	// group commit each would still get a sync of its own.
	ss.fsyncDelay.Store(int64(300 * time.Millisecond))
	b0, w0, f0 := ss.Stats()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 64
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			_, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
				Body: []byte("Subject: " + itoa(i) + "\r\n\r\nx\r\n")})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	b, w, f := ss.Stats()
	batches, waiters, fsyncs := b-b0, w-w0, f-f0
	t.Logf("%d submissions: %d syncs, %d fsyncs", n, batches, fsyncs)
	if waiters != n {
		t.Fatalf("%d waiters released, want %d", waiters, n)
	}
	if batches == 0 || fsyncs == 0 {
		t.Fatal("no sync ran")
	}
	if batches > n/8 {
		t.Fatalf("%d syncs for %d concurrent submissions: not group-committed", batches, n)
	}
	// What the syncs made durable is in the block files.
	dir := filepath.Join(emb.Server().JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", StreamWork, "msgs")
	blks, _ := filepath.Glob(filepath.Join(dir, "*.blk"))
	var size int64
	for _, p := range blks {
		if fi, err := os.Stat(p); err == nil {
			size += fi.Size()
		}
	}
	if size < n*50 {
		t.Fatalf("work blocks hold %d bytes after %d synced submissions", size, n)
	}
}

// The window applies only while the store is busy: a submission after a
// batch that had company waits for it, an isolated one is synced at once.
func TestSyncWindowOnlyWhenBusy(t *testing.T) {
	const window = 3 * time.Second
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: -1, SyncWindow: window})
	ss := emb.StoreSyncer()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	enqueue := func(i int) error {
		_, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
			Body: []byte("Subject: " + itoa(i) + "\r\n\r\nx\r\n")})
		return err
	}
	timed := func(i int) time.Duration {
		t.Helper()
		start := time.Now()
		if err := enqueue(i); err != nil {
			t.Fatal(err)
		}
		return time.Since(start)
	}
	// Isolated: no window.
	if d := timed(0); d >= window {
		t.Fatalf("an isolated submission took %v: it waited for the %v window", d, window)
	}
	// Busy: slow fsyncs make the next submissions queue behind a sync, so
	// the last batch of these has more than one.
	ss.fsyncDelay.Store(int64(500 * time.Millisecond))
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Go(func() {
			if err := enqueue(1 + i); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	ss.fsyncDelay.Store(0)
	// The last of those batches had company; the next one collects for the
	// window.
	if d := timed(10); d < window {
		t.Fatalf("a submission after a busy batch took %v, less than the %v window", d, window)
	}
	// That batch had only itself: idle again.
	if d := timed(11); d >= window {
		t.Fatalf("a submission after a batch of one took %v: it waited for the %v window", d, window)
	}
}

func TestUseWindow(t *testing.T) {
	for _, c := range []struct {
		window  time.Duration
		busy    bool
		waiting int
		want    bool
	}{
		{time.Millisecond, false, 0, false}, // isolated
		{time.Millisecond, true, 0, true},   // the previous batch had company
		{time.Millisecond, false, 3, true},  // others already waiting
		{0, true, 3, false},                 // no window configured
		{-1, true, 3, false},
	} {
		if got := useWindow(c.window, c.busy, c.waiting); got != c.want {
			t.Errorf("useWindow(%v, %v, %d) = %v, want %v", c.window, c.busy, c.waiting, got, c.want)
		}
	}
}

// TestStoreSyncerMetrics: the counters and histograms on /metrics are the
// syncer's own counts.
func TestStoreSyncerMetrics(t *testing.T) {
	q, emb := syncedQueue(t)
	ss := emb.StoreSyncer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 3 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ss)
	// The sweep may add a sync between the reads: read the stats on both
	// sides and accept what lies between.
	b0, w0, f0 := ss.Stats()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	b1, w1, f1 := ss.Stats()
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		switch {
		case m.GetCounter() != nil:
			got[mf.GetName()] = m.GetCounter().GetValue()
		case m.GetHistogram() != nil:
			got[mf.GetName()] = float64(m.GetHistogram().GetSampleCount())
		}
	}
	within := func(name string, lo, hi uint64) {
		if v := got[name]; v < float64(lo) || v > float64(hi) {
			t.Errorf("%s = %v, want %d..%d", name, v, lo, hi)
		}
	}
	within("outflow_store_syncs_total", b0, b1)
	within("outflow_store_sync_requests_total", w0, w1)
	within("outflow_store_fsyncs_total", f0, f1)
	within("outflow_store_sync_batch_requests", b0, b1) // one observation per sync
	within("outflow_store_sync_wait_seconds", w0, w1)   // one per request
	if w0 < 3 || f0 == 0 {
		t.Fatalf("3 submissions: %d requests, %d fsyncs", w0, f0)
	}
}

func TestRemoteSyncAsksTheDaemon(t *testing.T) {
	g := newGateSyncer()
	close(g.open)
	_, emb := startQueueWith(t, Options{Syncer: g})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := connectTo(emb, Options{NoSetup: true, RemoteSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	if s := waitSync(t, g); !slices.Equal(s, []string{StreamWork}) {
		t.Fatalf("daemon synced %v", s)
	}
	g.set(g.open, errors.New("disk gone"))
	if _, err := c.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err == nil || !strings.Contains(err.Error(), "disk gone") {
		t.Fatalf("Enqueue after a failed remote sync: %v", err)
	}
}

func TestParseDurability(t *testing.T) {
	for _, s := range []string{"disk", "replicas", "none"} {
		if d, err := ParseDurability(s); err != nil || string(d) != s {
			t.Errorf("ParseDurability(%q) = %q, %v", s, d, err)
		}
	}
	if _, err := ParseDurability("always"); err == nil {
		t.Error("ParseDurability accepted always")
	}
	if _, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Durability: DurabilityReplicas}); err == nil {
		t.Error("embedded server accepted durability replicas")
	}
}

// TestMetadataCreatedAfterSetupIsSynced: a KV bucket and a tenant's
// consumer made after setup get their metadata fsynced, which the server
// itself does not do.
func TestMetadataCreatedAfterSetupIsSynced(t *testing.T) {
	q, emb := syncedQueue(t)
	ss := emb.StoreSyncer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	_, _, f0 := ss.Stats()
	if _, err := q.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: "meta_test"}); err != nil {
		t.Fatal(err)
	}
	_, _, f1 := ss.Stats()
	// At least the bucket's directory, its meta.inf and the two parents.
	if f1-f0 < 4 {
		t.Fatalf("creating a bucket made %d fsyncs, want its metadata synced", f1-f0)
	}
	if _, err := q.ensureTenant(ctx, "meta-tenant"); err != nil {
		t.Fatal(err)
	}
	_, _, f2 := ss.Stats()
	if f2-f1 < 4 {
		t.Fatalf("creating a tenant's consumer made %d fsyncs, want its metadata synced", f2-f1)
	}
}

// TestFiredScheduleIsSynced: a schedule that fires is written by the
// server, with no client waiting for a sync. With the lanes' sweep off,
// the republish of the due message alone must get the retry lane's blocks
// fsynced as they are after the firing.
func TestFiredScheduleIsSynced(t *testing.T) {
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: -1})
	d := deferOne(t, q, LaneRetry, time.Now().Add(300*time.Millisecond))
	waitDue(t, q, d)
	waitLaneSynced(t, emb, StreamRetry)
}

// TestLaneSweepSyncsUnaskedWrites: a write to a lane that no caller syncs
// (as a firing whose republish was lost) is fsynced by the sweep.
func TestLaneSweepSyncsUnaskedWrites(t *testing.T) {
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A held envelope's subject: not a due one, so nothing republishes it.
	if _, err := q.js.Publish(ctx, heldSubject("d.example", "sweep-1"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	waitLaneSynced(t, emb, StreamRetry)
}

// plainSyncer hides StoreSyncer's other methods, and with them what
// Connect does only for the in-process syncer: the watch of firings.
type plainSyncer struct{ s *StoreSyncer }

func (p plainSyncer) Sync(ctx context.Context, streams ...string) error {
	return p.s.Sync(ctx, streams...)
}

// waitDue waits until e's schedule has fired into the retry lane's due
// subject.
func waitDue(t *testing.T, q *Queue, e *Envelope) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		if m, err := q.lanes[LaneRetry].GetLastMsgForSubject(ctx, dueSubject(LaneRetry, e.Dest, e.ID)); err == nil && m != nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal("the schedule did not fire within 15s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitLaneSynced waits until laneSynced holds.
func waitLaneSynced(t *testing.T, emb *Embedded, stream string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !laneSynced(emb, stream) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the blocks written since the last sync were not fsynced within 5s", stream)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// laneSynced writes out the stream's buffer (no fsync) and reports
// whether every block file, as it now is on disk, is as the syncer last
// fsynced it: then every write stored so far is in an fsync.
func laneSynced(emb *Embedded, stream string) bool {
	ss := emb.StoreSyncer()
	mset, err := natsLookupStream(emb.Server().GlobalAccount(), stream)
	if err != nil || mset == nil {
		return false
	}
	if err := natsStreamStore(mset).FlushAllPending(); err != nil {
		return false
	}
	dir := filepath.Join(emb.Server().JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", stream, "msgs")
	blks, _ := filepath.Glob(filepath.Join(dir, "*.blk"))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	known := ss.known[stream]
	for _, p := range blks {
		fi, err := os.Stat(p)
		if err != nil {
			return false
		}
		k, ok := known[filepath.Base(p)]
		if !ok || k.size != fi.Size() || !k.mtime.Equal(fi.ModTime()) {
			return false
		}
	}
	return len(blks) > 0
}

// syncedQueue starts an embedded server with the store syncer (5 ms
// window) and connects a queue that syncs through it.
func syncedQueue(t *testing.T) (*Queue, *Embedded) {
	t.Helper()
	return syncedQueueWith(t, EmbeddedConfig{})
}

// syncedQueueWith is syncedQueue with cfg's settings (its data dir is
// filled in, and its window when unset).
func syncedQueueWith(t *testing.T, cfg EmbeddedConfig) (*Queue, *Embedded) {
	t.Helper()
	cfg.DataDir = t.TempDir()
	if cfg.SyncWindow == 0 {
		cfg.SyncWindow = 5 * time.Millisecond // negative: none, the default
	}
	emb, err := StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q, err := connectTo(emb, Options{Syncer: emb.Syncer()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q, emb
}

// BenchmarkFiringSyncs measures what syncing fired schedules costs:
// b.N envelopes deferred on the retry lane to fire together or spread
// evenly over 2 s, then the fsyncs the syncer makes while they fire and
// until the lane is synced, per firing. Sub-benchmarks: the default
// (republish watch and the 1 s sweep) and the sweep alone.
//
//	go test -run '^$' -bench FiringSyncs -benchtime 2000x ./queue
func BenchmarkFiringSyncs(b *testing.B) {
	for _, bc := range []struct {
		name   string
		watch  bool
		spread time.Duration
	}{{"together/watch+sweep", true, 0}, {"together/sweep", false, 0},
		{"spread2s/watch+sweep", true, 2 * time.Second}, {"spread2s/sweep", false, 2 * time.Second}} {
		b.Run(bc.name, func(b *testing.B) {
			emb, err := StartEmbedded(EmbeddedConfig{DataDir: b.TempDir()})
			if err != nil {
				b.Fatal(err)
			}
			defer emb.Shutdown()
			var sy Syncer = emb.StoreSyncer()
			if !bc.watch {
				sy = plainSyncer{emb.StoreSyncer()}
			}
			q, err := connectTo(emb, Options{Syncer: sy})
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			for i := range b.N {
				if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r" + itoa(i) + "@d.example"},
					Body: []byte("x\r\n")}); err != nil {
					b.Fatal(err)
				}
			}
			work, err := q.Messages(ctx, LaneWork, 64)
			if err != nil {
				b.Fatal(err)
			}
			at := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			for i := range b.N {
				d := <-work
				fire := at.Add(bc.spread * time.Duration(i) / time.Duration(b.N))
				wg.Go(func() {
					if err := d.Reschedule(ctx, d.Env.Clone(), LaneRetry, fire, true); err != nil {
						b.Error(err)
					}
				})
			}
			wg.Wait()
			time.Sleep(time.Until(at) - 200*time.Millisecond)
			ss := emb.StoreSyncer()
			_, _, f0 := ss.Stats()
			b.ResetTimer()
			deadline := time.Now().Add(time.Minute)
			for {
				due := uint64(0)
				if c, err := q.lanes[LaneRetry].Consumer(ctx, consumerRetry); err == nil {
					if ci, err := c.Info(ctx); err == nil {
						due = ci.NumPending
					}
				}
				if due >= uint64(b.N) && laneSynced(emb, StreamRetry) {
					break
				}
				if time.Now().After(deadline) {
					b.Fatal("the firings were not synced within a minute")
				}
				time.Sleep(10 * time.Millisecond)
			}
			_, _, f1 := ss.Stats()
			b.ReportMetric(float64(f1-f0)/float64(b.N), "fsyncs/firing")
		})
	}
}

// TestFsyncFailureIsFinal: after an fsync fails, every later sync fails
// too, though the fsyncs that follow succeed (the kernel reports a
// writeback error once and may drop the pages): no write is accepted as
// on disk again, and the embedded server reports itself unhealthy, until
// the daemon restarts and reads the store back.
func TestFsyncFailureIsFinal(t *testing.T) {
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: -1})
	ss := emb.StoreSyncer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nx\r\n")}
	if _, err := q.Enqueue(ctx, sub); err != nil || emb.Healthy() != nil {
		t.Fatalf("before: %v, healthy %v", err, emb.Healthy())
	}
	eio := error(syscall.EIO)
	ss.fsyncFail.Store(&eio)
	if _, err := q.Enqueue(ctx, sub); err == nil {
		t.Fatal("accepted through a failed fsync")
	}
	for range 3 { // the fsyncs themselves would succeed now
		if _, err := q.Enqueue(ctx, sub); err == nil || !strings.Contains(err.Error(), "until the daemon is restarted") {
			t.Fatalf("accepted after a failed fsync: %v", err)
		}
	}
	if err := emb.Healthy(); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("healthy after a failed fsync: %v", err)
	}
}

// TestEnqueueRefusedIsNotMaybeStored: a publish the server refused (no
// stream takes the subject) stored nothing, and says so: not
// ErrMaybeStored, so the sender's limit gets the recipients back.
func TestEnqueueRefusedIsNotMaybeStored(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}
	if _, err := q.Enqueue(ctx, sub); err != nil { // the tenant's consumer made, and remembered
		t.Fatal(err)
	}
	if err := q.js.DeleteStream(ctx, StreamWork); err != nil {
		t.Fatal(err)
	}
	_, err := q.Enqueue(ctx, sub)
	if err == nil || errors.Is(err, ErrMaybeStored) {
		t.Fatalf("Enqueue with no work stream: %v, want an error not marked ErrMaybeStored", err)
	}
}

// TestRemoteSyncUnansweredAfterAnswers: with no daemon answering sync
// requests from the start (its server runs without fsyncs), the server's
// acknowledgement is all there is; once one has answered, silence is an
// error (the daemon restarts, and its server took the write before the
// daemon could fsync it): the write is not reported synced, and the
// client is not told 250.
func TestRemoteSyncUnansweredAfterAnswers(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := &remoteSyncer{nc: q.nc}
	if err := r.Sync(ctx, StreamWork); err != nil {
		t.Fatalf("no daemon ever: %v, want nil", err)
	}
	sub, err := q.nc.Subscribe(subjSync, func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		t.Fatal(err)
	}
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(ctx, StreamWork); err != nil {
		t.Fatalf("a daemon answering: %v", err)
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if err := q.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := r.Sync(ctx, StreamWork); !errors.Is(err, ErrSyncUnanswered) {
		t.Fatalf("the daemon gone after answering: %v, want ErrSyncUnanswered", err)
	}
}

// TestEnqueueWaitsOutTheSyncingDaemonsRestart: a worker of a fleet
// stores through another daemon's embedded server, which that daemon
// fsyncs. When the daemon restarts, its sync responder goes before its
// server stops taking writes: a submission the server acknowledged in that
// window was answered 451 "not accepted", and then delivered, and its
// client sent it again. Now Enqueue waits for a daemon to answer again and
// accepts the message when it is still stored; one lost with the server,
// or no daemon back within the deadline, is answered as before.
func TestEnqueueWaitsOutTheSyncingDaemonsRestart(t *testing.T) {
	q, _ := startQueueWith(t, Options{RemoteSync: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	respond := func() *nats.Subscription {
		sub, err := q.nc.Subscribe(subjSync, func(m *nats.Msg) { _ = m.Respond(nil) })
		if err != nil {
			t.Fatal(err)
		}
		if err := q.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	gone := func(sub *nats.Subscription) {
		if err := sub.Unsubscribe(); err != nil {
			t.Fatal(err)
		}
		if err := q.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	sub := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nx\r\n")}
	daemon := respond()
	if _, err := q.Enqueue(ctx, sub); err != nil {
		t.Fatal(err)
	}
	type result struct {
		ids []string
		err error
	}
	// enqueueWhileRestarting starts an Enqueue with the daemon gone and
	// returns once Enqueue has asked again at least twice.
	enqueueWhileRestarting := func(ctx context.Context) <-chan result {
		before := q.Ops()["sync"]
		done := make(chan result, 1)
		go func() {
			ids, err := q.Enqueue(ctx, sub)
			done <- result{ids, err}
		}()
		deadline := time.Now().Add(10 * time.Second)
		for q.Ops()["sync"] < before+3 {
			if time.Now().After(deadline) {
				t.Fatal("Enqueue did not ask again for a sync")
			}
			select {
			case r := <-done:
				t.Fatalf("Enqueue returned while no daemon syncs: %v, %v", r.ids, r.err)
			case <-time.After(10 * time.Millisecond):
			}
		}
		return done
	}

	t.Run("back and stored", func(t *testing.T) {
		gone(daemon)
		done := enqueueWhileRestarting(ctx)
		daemon = respond()
		r := <-done
		if r.err != nil {
			t.Fatalf("the daemon back, the envelope stored: %v, want accepted", r.err)
		}
		if _, err := q.Find(ctx, r.ids[0]); err != nil {
			t.Fatalf("the accepted envelope: %v", err)
		}
	})
	t.Run("back and lost", func(t *testing.T) {
		gone(daemon)
		done := enqueueWhileRestarting(ctx)
		if err := q.lanes[LaneWork].Purge(ctx); err != nil { // lost with the old server's page cache
			t.Fatal(err)
		}
		daemon = respond()
		if r := <-done; !errors.Is(r.err, ErrMaybeStored) {
			t.Fatalf("the envelope lost: %v, %v, want ErrMaybeStored", r.ids, r.err)
		}
	})
	t.Run("not back in time", func(t *testing.T) {
		gone(daemon)
		short, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if r := <-enqueueWhileRestarting(short); !errors.Is(r.err, ErrSyncUnanswered) || !errors.Is(r.err, ErrMaybeStored) {
			t.Fatalf("no daemon within the deadline: %v, %v, want ErrSyncUnanswered and ErrMaybeStored", r.ids, r.err)
		}
	})
}

// The process out of file descriptors for a moment (the SMTP listener's
// sessions hold them) does not fail the group commit after the server has
// the writes: the opens for the fsyncs are tried again, and the
// submission is answered stored. Failed, it was answered 451 and sent by
// its client again: a duplicate of every message.
func TestSyncRidesOutFileDescriptorShortage(t *testing.T) {
	q, emb := syncedQueueWith(t, EmbeddedConfig{SweepEvery: -1})
	ss := emb.StoreSyncer()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nx\r\n")}
	if _, err := q.Enqueue(ctx, sub); err != nil {
		t.Fatal(err)
	}
	ss.openFail.Store(4)
	if _, err := q.Enqueue(ctx, sub); err != nil {
		t.Fatalf("refused through a shortage of descriptors: %v", err)
	}
	if n := ss.openFail.Load(); n > 0 {
		t.Fatalf("%d injected failures left: the sync did not open anything", n)
	}
	if err := emb.Healthy(); err != nil {
		t.Fatalf("unhealthy after the shortage: %v", err)
	}
}
