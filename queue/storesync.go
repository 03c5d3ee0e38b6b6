package queue

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
)

// Group commit on the embedded server.
//
// RFC 5321 §6.1: once a server has answered 250 it "MUST NOT lose the
// message for frivolous reasons, such as because the host later crashes".
// A JetStream publish acknowledgement from a single server (R1) means the
// message is in the file store's write buffer, not on disk: the server
// writes its buffers within a few milliseconds and fsyncs every two minutes
// (SyncInterval). SyncAlways closes that window at about 6.7 fsyncs per
// submitted message (every write of every stream and consumer, one at a
// time; docs/benchmarks.md), and nats-server offers no other flush point
// for an R1 stream: JetStreamSnapshotStream needs a cluster, syncBlocks is
// unexported, and FlushAllPending writes without an fsync unless the stream
// is replicated.
//
// StoreSyncer is the flush point. A caller that needs a write on disk
// (Enqueue before its 250, a schedule before the original's ack, a dead
// letter before the work message's ack) first waits for JetStream's ack,
// then calls Sync with the streams it wrote. One goroutine collects the
// requests of a batch (see DefaultSyncWindow), then, per stream involved
// (in parallel), has the store write out its buffer
// (StreamStore.FlushAllPending: the pending bytes reach the kernel, in
// order, under the block's lock) and fsyncs each block file that changed
// since the last sync, and the directory when a block file appeared or
// was replaced. Every waiter of the batch is released after that one
// sync. A request that arrives while a sync runs waits for the next one,
// so every acknowledged write of a waiter is in a sync that started after
// it.
//
// A schedule that fires is written by the server itself: the due message
// and the schedule's removal, both in the lane's stream, with no client
// waiting for a sync. Two things sync them. Every due message is
// republished (headers only) on outflow.ctl.fired.<lane>, and the queue
// asks for a sync of that lane on each (durable.go, watchFirings); the
// firing is on disk within the batch window plus an fsync. And the syncer
// sweeps the lanes every SweepEvery, fsyncing only the blocks that changed
// since the last sync, for a firing whose republish was lost or came
// before the queue subscribed (overdue schedules fire as the server
// starts).
//
// Only the message blocks are synced: they are what the server rebuilds a
// stream from after a crash. The stream's index (index.db) and the
// consumers' state are not: losing them costs redeliveries, which the SENT
// markers and the lanes' deduplication absorb (docs/reliability.md).

// Durability says what a write must reach before outflow reports it done
// (a 250, an `outflow submit` id, the ack of the message it replaces).
type Durability string

const (
	// DurabilityDisk: fsynced on this machine (group-committed). The
	// default on the embedded server.
	DurabilityDisk Durability = "disk"
	// DurabilityReplicas: stored by a majority of the stream's replicas,
	// which is what a clustered JetStream acknowledgement means. The
	// default with an external NATS.
	DurabilityReplicas Durability = "replicas"
	// DurabilityNone: acknowledged by the server, possibly still in its
	// write buffer; a power loss or kernel crash can lose the last two
	// minutes of accepted mail.
	DurabilityNone Durability = "none"
)

// ParseDurability checks a --durability value.
func ParseDurability(s string) (Durability, error) {
	switch d := Durability(s); d {
	case DurabilityDisk, DurabilityReplicas, DurabilityNone:
		return d, nil
	}
	return "", fmt.Errorf("durability %q: want disk, replicas or none", s)
}

// DefaultSyncWindow is how long StoreSyncer collects requests after the
// first of a batch before it syncs, when the store is busy: the previous
// batch had more than one request, or more are already waiting (the
// commit delay and commit siblings of databases). An isolated request is
// synced at once, so an idle daemon adds nothing to a submission but its
// fsync. Without a window a busy syncer batches only what came during
// the previous fsync: under 20 sessions about 3.5 submissions a batch,
// against 6.5 with 1 ms, which took about 40 % of the fsyncs and 7 to 18 %
// of the CPU per message off the pipeline (docs/benchmarks.md, "Changes
// kept").
const DefaultSyncWindow = time.Millisecond

// DefaultSweepEvery is how often StoreSyncer syncs the deferred lanes'
// streams on its own: the longest a schedule's firing can stay unsynced if
// its republish is lost.
const DefaultSweepEvery = time.Second

// Syncer makes acknowledged writes to streams durable before the caller
// reports them done. Queue calls it when Options.Syncer is set.
type Syncer interface {
	// Sync returns once every write to the named streams that JetStream
	// acknowledged before the call is on disk, or with an error (then
	// nothing may be reported as accepted).
	Sync(ctx context.Context, streams ...string) error
}

// ErrSyncerStopped is returned by Sync after the syncer's context ended.
var ErrSyncerStopped = errors.New("store syncer stopped")

// StoreSyncer is the group-commit syncer of an embedded server's streams.
type StoreSyncer struct {
	srv    *server.Server
	window time.Duration
	reqs   chan *syncReq
	done   chan struct{} // closed when run returns

	mu    sync.Mutex             // guards known; held by one batch at a time
	known map[string]blockStates // stream name -> its block files at the last sync

	batches atomic.Uint64 // syncs run
	waiters atomic.Uint64 // requests released
	fsyncs  atomic.Uint64 // fsync calls made

	// workBlocks counts the block files of the work stream that a sync
	// found under a new name; the queue keeps its keeper in the newest
	// (keeper.go).
	workBlocks atomic.Uint64

	// sweep are the streams synced every sweepEvery whether asked or
	// not (the deferred lanes, where the server writes firings).
	sweep      []string
	sweepEvery time.Duration

	batchSize prometheus.Histogram // requests released per sync
	wait      prometheus.Histogram // request to release, seconds
	descs     storeSyncDescs

	// fsyncDelay is a fault hook for tests (nanoseconds): each fsync
	// takes this much longer, as on a slow or overloaded disk. Zero in
	// production; only tests in this package set it.
	fsyncDelay atomic.Int64
	// fsyncFail is a fault hook for tests: the next fsync fails with it.
	fsyncFail atomic.Pointer[error]
	// openFail is a fault hook for tests: the next openFail opens for an
	// fsync fail with EMFILE, as when the process is out of descriptors.
	openFail atomic.Int32

	// failed is the first fsync failure (Failed). The kernel reports a
	// writeback error once, to the file descriptor open at the time, and
	// may drop the pages it could not write: a later fsync, through a new
	// descriptor, succeeds without them. So after one, no write is
	// accepted as on disk again until the daemon restarts and the store
	// is read back from disk.
	failed atomic.Pointer[error]
}

type syncReq struct {
	streams []string
	at      time.Time
	err     chan error // buffered, 1
}

type storeSyncDescs struct{ syncs, waiters, fsyncs *prometheus.Desc }

// blockStates are a stream's block files as last synced, by file name.
type blockStates map[string]blockState

type blockState struct {
	size  int64
	mtime time.Time
	ino   uint64
}

// NewStoreSyncer returns a syncer for srv's streams in the global account.
// window is how long a batch collects requests after its first while the
// store is busy (DefaultSyncWindow); 0 or negative: no window, a batch is
// whatever arrived while the previous sync ran. Run must be started.
func NewStoreSyncer(srv *server.Server, window time.Duration) *StoreSyncer {
	batchSize := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outflow_store_sync_batch_requests",
		Help:    "Requests (submissions, deferrals, dead letters, firings, sweeps) released by one group commit.",
		Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}})
	wait := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "outflow_store_sync_wait_seconds",
		Help:    "Time from a sync request to its release: the batch window, the wait for a sync already running, and the fsyncs.",
		Buckets: []float64{.001, .002, .004, .008, .016, .032, .064, .128, .256, .512, 1.024}})
	return &StoreSyncer{srv: srv, window: max(window, 0), reqs: make(chan *syncReq, 1024), done: make(chan struct{}),
		known: map[string]blockStates{}, sweep: []string{StreamRetry, StreamRateLimit}, sweepEvery: DefaultSweepEvery,
		batchSize: batchSize, wait: wait,
		descs: storeSyncDescs{
			syncs:   prometheus.NewDesc("outflow_store_syncs_total", "Group commits run (each fsyncs what its batch of requests wrote).", nil, nil),
			waiters: prometheus.NewDesc("outflow_store_sync_requests_total", "Sync requests released (each a write reported done only after it).", nil, nil),
			fsyncs:  prometheus.NewDesc("outflow_store_fsyncs_total", "fsync calls the store syncer made (block files, directories, metadata).", nil, nil),
		}}
}

// Describe implements prometheus.Collector.
func (s *StoreSyncer) Describe(ch chan<- *prometheus.Desc) {
	ch <- s.descs.syncs
	ch <- s.descs.waiters
	ch <- s.descs.fsyncs
	s.batchSize.Describe(ch)
	s.wait.Describe(ch)
}

// Collect implements prometheus.Collector.
func (s *StoreSyncer) Collect(ch chan<- prometheus.Metric) {
	b, w, f := s.Stats()
	ch <- prometheus.MustNewConstMetric(s.descs.syncs, prometheus.CounterValue, float64(b))
	ch <- prometheus.MustNewConstMetric(s.descs.waiters, prometheus.CounterValue, float64(w))
	ch <- prometheus.MustNewConstMetric(s.descs.fsyncs, prometheus.CounterValue, float64(f))
	s.batchSize.Collect(ch)
	s.wait.Collect(ch)
}

// Sync implements Syncer.
func (s *StoreSyncer) Sync(ctx context.Context, streams ...string) error {
	if len(streams) == 0 {
		return nil
	}
	if err := s.Failed(); err != nil {
		return err
	}
	r := &syncReq{streams: streams, at: time.Now(), err: make(chan error, 1)}
	select {
	case s.reqs <- r:
	case <-s.done:
		return ErrSyncerStopped
	case <-ctx.Done():
		return fmt.Errorf("sync %s: %w", strings.Join(streams, ","), ctx.Err())
	}
	select {
	case err := <-r.err:
		return err
	case <-s.done:
		return ErrSyncerStopped
	case <-ctx.Done():
		return fmt.Errorf("sync %s: %w", strings.Join(streams, ","), ctx.Err())
	}
}

// Failed is the fsync failure after which every Sync fails, or nil.
func (s *StoreSyncer) Failed() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

// Stopped reports whether Run has returned (its context ended, or it
// panicked): every Sync fails from then on.
func (s *StoreSyncer) Stopped() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// Stats returns the syncs run, the requests they released and the fsync
// calls they made, since start.
func (s *StoreSyncer) Stats() (batches, waiters, fsyncs uint64) {
	return s.batches.Load(), s.waiters.Load(), s.fsyncs.Load()
}

// Run serves Sync until ctx ends. Embedded runs it, recovering and
// logging a panic; every waiter then fails with ErrSyncerStopped.
func (s *StoreSyncer) Run(ctx context.Context) {
	defer close(s.done)
	if s.sweepEvery > 0 && len(s.sweep) > 0 {
		go s.sweepLanes(ctx)
	}
	var timer *time.Timer
	busy := false // the previous batch had more than one request
	for {
		var first *syncReq
		select {
		case <-ctx.Done():
			return
		case first = <-s.reqs:
		}
		batch := []*syncReq{first}
		if useWindow(s.window, busy, len(s.reqs)) {
			if timer == nil {
				timer = time.NewTimer(s.window)
			} else {
				timer.Reset(s.window)
			}
		collect:
			for {
				select {
				case r := <-s.reqs:
					batch = append(batch, r)
				case <-timer.C:
					break collect
				case <-ctx.Done():
					return
				}
			}
		} else {
		drain:
			for {
				select {
				case r := <-s.reqs:
					batch = append(batch, r)
				default:
					break drain
				}
			}
		}
		busy = len(batch) > 1
		s.syncBatch(batch)
	}
}

// useWindow reports whether a batch collects requests for window before
// its sync: only when the store is busy, which the previous batch (it had
// company) or the requests already waiting behind the first show.
func useWindow(window time.Duration, busy bool, waiting int) bool {
	return window > 0 && (busy || waiting > 0)
}

// sweepLanes syncs s.sweep every s.sweepEvery until ctx ends. A stream
// whose blocks did not change since its last sync costs a directory read,
// no fsync. Errors are left to the next sweep: a lane that does not exist
// yet (before setup) is not one.
func (s *StoreSyncer) sweepLanes(ctx context.Context) {
	t := time.NewTicker(s.sweepEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_ = s.Sync(ctx, s.sweep...)
	}
}

// syncBatch syncs every stream the batch names, once, and answers each
// request with the first error among its own streams. After an fsync
// failure (Failed) every request fails, also those that were waiting when
// it came: their writes may be among what the kernel dropped.
func (s *StoreSyncer) syncBatch(batch []*syncReq) {
	if err := s.Failed(); err != nil {
		for _, r := range batch {
			r.err <- err
			s.waiters.Add(1)
		}
		return
	}
	var list []string
	for _, r := range batch {
		for _, n := range r.streams {
			if !slices.Contains(list, n) {
				list = append(list, n)
			}
		}
	}
	names := make(map[string]error, len(list))
	var wg sync.WaitGroup
	var mu sync.Mutex
	s.mu.Lock()
	// Read every stream's last known state before the first sync starts:
	// the syncs write s.known as they finish.
	prevs := make([]blockStates, len(list))
	for i, n := range list {
		prevs[i] = s.known[n]
	}
	for i, n := range list {
		prev := prevs[i]
		wg.Go(func() {
			next, err := s.syncStream(n, prev)
			mu.Lock()
			defer mu.Unlock()
			names[n] = err
			if err == nil {
				s.known[n] = next
			} else {
				delete(s.known, n) // sync everything again next time
			}
		})
	}
	wg.Wait()
	s.mu.Unlock()
	s.batches.Add(1)
	s.batchSize.Observe(float64(len(batch)))
	now := time.Now()
	for _, r := range batch {
		s.wait.Observe(now.Sub(r.at).Seconds())
		var err error
		for _, n := range r.streams {
			if err = names[n]; err != nil {
				break
			}
		}
		r.err <- err
		s.waiters.Add(1)
	}
}

// syncStream writes out the stream's buffered messages and fsyncs the
// block files that changed since prev, returning the files as now synced.
func (s *StoreSyncer) syncStream(name string, prev blockStates) (blockStates, error) {
	store, err := streamStore(s.srv, name)
	if err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	if store.Type() != server.FileStorage {
		return prev, nil // a memory stream has nothing to sync
	}
	if err := store.FlushAllPending(); err != nil {
		return nil, fmt.Errorf("sync %s: flush: %w", name, err)
	}
	jsc := s.srv.JetStreamConfig()
	if jsc == nil {
		return nil, fmt.Errorf("sync %s: %w", name, ErrUnavailable)
	}
	dir := filepath.Join(jsc.StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", name, "msgs")
	next, newBlock, err := s.syncBlocks(dir, prev)
	if newBlock && name == StreamWork {
		s.workBlocks.Add(1)
	}
	return next, err
}

// WorkBlocks counts the work stream's block files that syncs found under a
// new name (a block started; the first sync after start finds them all),
// since start. A block rewritten in place by a compaction is not counted.
func (s *StoreSyncer) WorkBlocks() uint64 { return s.workBlocks.Load() }

// syncBlocks fsyncs each *.blk file of dir that is new or differs (size,
// modification time, inode) from prev, and dir itself when a file is new or
// replaced: a block created or rewritten by rename is only durable once its
// directory entry is. It reports whether a block file had a name prev does
// not know.
func (s *StoreSyncer) syncBlocks(dir string, prev blockStates) (blockStates, bool, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, false, fmt.Errorf("sync %s: %w", dir, err)
	}
	next := make(blockStates, len(ents))
	syncDir, newName := false, false
	for _, de := range ents {
		if !strings.HasSuffix(de.Name(), ".blk") {
			continue
		}
		fi, err := de.Info()
		if errors.Is(err, os.ErrNotExist) {
			continue // removed meanwhile (compacted away, purged)
		}
		if err != nil {
			return nil, false, fmt.Errorf("sync %s: %w", dir, err)
		}
		st := blockState{size: fi.Size(), mtime: fi.ModTime()}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.ino = sys.Ino
		}
		old, seen := prev[de.Name()]
		if seen && old == st {
			next[de.Name()] = st
			continue
		}
		if !seen || old.ino != st.ino {
			syncDir = true
		}
		newName = newName || !seen
		path := filepath.Join(dir, de.Name())
		if err := s.fsyncPath(path); errors.Is(err, os.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, false, fmt.Errorf("sync %s: %w", path, err)
		}
		next[de.Name()] = st
	}
	if syncDir {
		if err := s.fsyncPath(dir); err != nil {
			return nil, false, fmt.Errorf("sync %s: %w", dir, err)
		}
	}
	return next, newName, nil
}

func (s *StoreSyncer) fsyncPath(path string) error {
	f, err := s.openForSync(path)
	if err != nil {
		return err
	}
	s.fsyncs.Add(1)
	if d := s.fsyncDelay.Load(); d > 0 {
		time.Sleep(time.Duration(d)) // the injected fault: a slow fsync
	}
	err = f.Sync()
	if p := s.fsyncFail.Swap(nil); p != nil {
		err = *p // the injected fault
	}
	if err != nil {
		f.Close()
		failure := fmt.Errorf("an fsync of %s failed (%w): writes the kernel had not yet written may be lost, so nothing more is accepted as on disk until the daemon is restarted", path, err)
		s.failed.CompareAndSwap(nil, &failure)
		return err
	}
	return f.Close()
}

// openForSync opens path for an fsync. The process out of file
// descriptors (EMFILE, or the system's ENFILE) is a moment, as sessions
// end and give theirs back: the open is tried again for up to
// openRetryFor rather than failing the group commit. Failed, the commit
// answered its writes "not stored" (451) after the server had them, and
// the clients sent the messages again: each went out twice.
func (s *StoreSyncer) openForSync(path string) (*os.File, error) {
	wait, deadline := 5*time.Millisecond, time.Now().Add(openRetryFor)
	for {
		var f *os.File
		var err error
		if s.openFail.Load() > 0 && s.openFail.Add(-1) >= 0 {
			err = &os.PathError{Op: "open", Path: path, Err: syscall.EMFILE}
		} else {
			f, err = os.Open(path)
		}
		if err == nil || !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) || time.Now().Add(wait).After(deadline) {
			return f, err
		}
		time.Sleep(wait)
		wait = min(wait*2, 200*time.Millisecond)
	}
}

// openRetryFor is how long openForSync tries again an open that found the
// process or the system out of file descriptors.
const openRetryFor = 3 * time.Second

// SyncMeta fsyncs a directory tree of one stream's store, the whole
// stream's (consumer "") or one consumer's, and the directories above it.
// A KV bucket or a consumer created after setup calls it: the server
// writes their metadata without an fsync, and a power loss would leave
// the files empty.
func (s *StoreSyncer) SyncMeta(stream, consumer string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	root, err := s.accountDir()
	if err != nil {
		return err
	}
	dir := filepath.Join(root, "streams", stream)
	parents := []string{filepath.Join(root, "streams"), root}
	if consumer != "" {
		parents = append([]string{filepath.Join(dir, "obs"), dir}, parents...)
		dir = filepath.Join(dir, "obs", consumer)
	}
	if err := s.fsyncTree(dir); err != nil {
		return err
	}
	// The new directory's entry lives in its parents.
	for _, p := range parents {
		if err := s.fsyncPath(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sync %s: %w", p, err)
		}
	}
	return nil
}

// SyncAll fsyncs every file and directory under the streams' store (stream
// and consumer metadata included). Setup calls it once after creating or
// updating streams and consumers, whose metadata the server writes without
// an fsync.
func (s *StoreSyncer) SyncAll() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	root, err := s.accountDir()
	if err != nil {
		return err
	}
	return s.fsyncTree(root)
}

// accountDir is the store directory of the account outflow's streams live in.
func (s *StoreSyncer) accountDir() (string, error) {
	jsc := s.srv.JetStreamConfig()
	if jsc == nil {
		return "", ErrUnavailable
	}
	return filepath.Join(jsc.StoreDir, server.DEFAULT_GLOBAL_ACCOUNT), nil
}

// fsyncTree fsyncs every file and directory under dir; what vanishes
// meanwhile is skipped.
func (s *StoreSyncer) fsyncTree(dir string) error {
	return filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.fsyncPath(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("sync %s: %w", path, err)
		}
		return nil
	})
}
