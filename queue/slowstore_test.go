package queue

import (
	"context"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil"
)

// submissionTimeout is what the submission server gives one Enqueue
// (submission.DefaultEnqueueTimeout; that package imports this one).
const submissionTimeout = 30 * time.Second

// TestSlowStoreSubmissionsStayBounded is the slow-store fault of the
// reliability matrix, in process: every fsync of the group-commit syncer
// takes 200 ms longer. Concurrent submissions must all be answered within
// the submission timeout, none before a sync that started after it was
// written (a 250 still means stored), and neither goroutines nor heap may
// grow beyond what the callers themselves hold.
func TestSlowStoreSubmissionsStayBounded(t *testing.T) {
	const (
		delay   = 200 * time.Millisecond
		callers = 100 // concurrent SMTP sessions, say
		each    = 5   // submissions per caller, one after another
	)
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	// The in-process handshake has 2 s; a loaded machine may need more.
	q, err := connectTo(emb, Options{Syncer: emb.Syncer()})
	for try := 0; err != nil && strings.Contains(err.Error(), "i/o timeout") && try < 5; try++ {
		q, err = connectTo(emb, Options{Syncer: emb.Syncer()})
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	ss := emb.StoreSyncer()
	ss.fsyncDelay.Store(int64(delay))

	// Baselines after a first submission has set everything up.
	if _, err := q.Enqueue(context.Background(), &Submission{Tenant: "t", From: "a@b.example",
		Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	g0 := runtime.NumGoroutine()
	b0, _, f0 := ss.Stats()

	// Sample the goroutine count while the submissions run.
	stopSampling := testutil.Peak(20*time.Millisecond, func() int64 { return int64(runtime.NumGoroutine()) })

	var (
		mu        sync.Mutex
		latencies []time.Duration
		failures  []error
		early     int // answered without a sync having finished since the call
	)
	start := time.Now()
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range each {
				ctx, cancel := context.WithTimeout(context.Background(), submissionTimeout)
				before, _, _ := ss.Stats()
				t0 := time.Now()
				_, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
					Body: []byte("Subject: " + strconv.Itoa(c) + "." + strconv.Itoa(i) + "\r\n\r\nx\r\n")})
				lat := time.Since(t0)
				after, _, _ := ss.Stats()
				cancel()
				mu.Lock()
				latencies = append(latencies, lat)
				if err != nil {
					failures = append(failures, err)
				} else if after <= before || lat < delay {
					early++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	maxG := stopSampling()
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	b1, _, f1 := ss.Stats()

	if len(failures) > 0 {
		t.Fatalf("%d of %d submissions failed with a slow store, the first: %v", len(failures), callers*each, failures[0])
	}
	slices.Sort(latencies)
	p50, p99, worst := latencies[len(latencies)/2], latencies[len(latencies)*99/100], latencies[len(latencies)-1]
	growth := int64(m1.HeapInuse) - int64(m0.HeapInuse)
	t.Logf("%d submissions by %d callers, fsync +%v: %v in all; latency p50 %v, p99 %v, max %v; %d syncs, %d fsyncs; goroutines %d before, %d at most, %d after; heap in use %+.1f MiB",
		callers*each, callers, delay, elapsed.Round(time.Millisecond), p50.Round(time.Millisecond), p99.Round(time.Millisecond),
		worst.Round(time.Millisecond), b1-b0, f1-f0, g0, maxG, runtime.NumGoroutine(), float64(growth)/(1<<20))

	if early > 0 {
		t.Fatalf("%d submissions were answered before a sync finished after their call", early)
	}
	if worst >= submissionTimeout {
		t.Fatalf("slowest submission took %v, over the %v submission timeout", worst, submissionTimeout)
	}
	// Group commit keeps the number of syncs far below the submissions,
	// which is what keeps the latency near a few fsyncs, not a queue of them.
	if syncs := b1 - b0; syncs >= uint64(callers*each/4) {
		t.Fatalf("%d syncs for %d submissions: the slow store is not group-committed", syncs, callers*each)
	}
	// Each caller holds one goroutine; the queue may add a few per caller
	// waiting (a publish, a sync request), never one per sync or per
	// submission made.
	if extra := maxG - int64(g0); extra > 3*callers+50 {
		t.Fatalf("goroutines grew by %d for %d callers", extra, callers)
	}
	if after := runtime.NumGoroutine(); after > g0+20 {
		t.Fatalf("%d goroutines after the submissions, %d before", after, g0)
	}
	if growth > 64<<20 {
		t.Fatalf("heap in use grew by %d MiB", growth>>20)
	}
	// Everything answered is in the work stream's block files.
	got, err := q.Depth(context.Background(), LaneWork)
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(callers*each + 1); got != want {
		t.Fatalf("work stream holds %d envelopes, want %d", got, want)
	}
	if _, err := os.Stat(emb.Server().JetStreamConfig().StoreDir); err != nil {
		t.Fatal(err)
	}
}
