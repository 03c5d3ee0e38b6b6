package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// durable makes the acknowledged writes to streams durable, when this queue
// has a syncer (see Options.Syncer); the caller reports them done only
// after it returns nil.
func (q *Queue) durable(ctx context.Context, streams ...string) error {
	if q.syncer == nil {
		return nil
	}
	q.count(OpSync)
	if err := q.syncer.Sync(ctx, streams...); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	q.keepWorkBlock()
	return nil
}

// durableMeta makes the metadata of a stream (or of one consumer on it)
// created after setup durable, when this queue syncs the store in
// process. A failure is logged, not returned: the bucket or consumer
// works, and the server rewrites its metadata on the next update. A lost
// consumer costs no mail either way: adoptTenants recreates the consumer
// of every tenant with mail in the work stream, and lost ack state costs
// duplicates. The buckets (suppressions, keys, webhooks) are what this
// protects.
func (q *Queue) durableMeta(stream, consumer string) {
	ms, ok := q.syncer.(interface {
		SyncMeta(stream, consumer string) error
	})
	if !ok {
		return
	}
	// Concurrent first submissions of a new tenant each write the
	// consumer's metadata; they share syncs. A sync that starts after this
	// write covers it. The first round may join one that started before,
	// so the second is sure to start after.
	key := stream + "/" + consumer
	run := func() error { return ms.SyncMeta(stream, consumer) }
	err := q.metaSyncs.do(key, run)
	if err == nil {
		err = q.metaSyncs.do(key, run)
	}
	if err != nil {
		q.log.Warn().Err(err).Str("stream", stream).Str("consumer", consumer).Msg("sync the store's metadata")
	}
}

// serveSync answers RemoteSync requests with this queue's syncer.
func (q *Queue) serveSync() error {
	_, err := q.nc.Subscribe(subjSync, func(m *nats.Msg) {
		streams := strings.Split(string(m.Data), ",")
		// Each request syncs on its own goroutine: the handler must not
		// hold up the subscription while the batch window runs.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), durableStepWindow)
			defer cancel()
			var reply []byte
			if err := q.syncer.Sync(ctx, streams...); err != nil {
				reply = []byte(err.Error())
			}
			_ = m.Respond(reply)
		}()
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", subjSync, err)
	}
	return nil
}

// serveRoom answers, on subjRoom, whether the embedded store has room for
// new mail, for the processes that store through it (remoteRoom): its
// reserve holds for their new mail too.
func (q *Queue) serveRoom() error {
	room := q.storeRoom()
	if _, err := q.nc.Subscribe(subjRoom, func(m *nats.Msg) {
		var reply []byte
		if err := room.Err(); err != nil {
			reply = []byte(err.Error())
		}
		_ = m.Respond(reply)
	}); err != nil {
		return fmt.Errorf("serve %s: %w", subjRoom, err)
	}
	return nil
}

// watchFirings syncs a deferred lane's stream whenever the server stores a
// due message in it (a schedule fired), learned from the stream's
// republish on firedSubjects. Nobody waits on these syncs; they close the
// window in which a firing is only in the server's write buffer. Requests
// coalesce: while one sync runs, the firings that arrive meanwhile wait
// for one more, which starts after all of them.
func (q *Queue) watchFirings() error {
	var (
		mu      sync.Mutex
		pending = map[string]bool{}
		running bool
	)
	run := func() {
		for {
			mu.Lock()
			if len(pending) == 0 {
				running = false
				mu.Unlock()
				return
			}
			streams := make([]string, 0, len(pending))
			for s := range pending {
				streams = append(streams, s)
			}
			clear(pending)
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), durableStepWindow)
			err := q.syncer.Sync(ctx, streams...)
			cancel()
			if err != nil && !errors.Is(err, ErrSyncerStopped) {
				q.log.Warn().Err(err).Strs("streams", streams).Msg("sync fired schedules; the lanes' sweep retries")
			}
		}
	}
	for l, stream := range map[Lane]string{LaneRetry: StreamRetry, LaneRateLimit: StreamRateLimit} {
		_, err := q.nc.Subscribe(firedSubjects(l), func(*nats.Msg) {
			mu.Lock()
			defer mu.Unlock()
			pending[stream] = true
			if !running {
				running = true
				go run()
			}
		})
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", firedSubjects(l), err)
		}
	}
	return nil
}

// remoteSyncer asks the daemon's syncer over NATS. answered says a daemon
// has answered once.
type remoteSyncer struct {
	nc       *nats.Conn
	answered atomic.Bool
}

// ErrSyncUnanswered is a remote sync that nobody answered after a daemon
// had: the write is not known to be on disk.
var ErrSyncUnanswered = errors.New("sync at the daemon: the daemon that fsyncs this server's store no longer answers (restarting?); the write is not known to be on disk")

// ServerSyncs reports whether a daemon answers sync requests at the
// server this queue is connected to (a daemon running the embedded server
// with --durability disk): then RemoteSync makes every write wait for that
// daemon's fsync. False when nobody answers.
func (q *Queue) ServerSyncs(ctx context.Context) (bool, error) {
	answered, err := askSync(ctx, q.nc, StreamWork)
	return answered && err == nil, err
}

// askSync asks the daemon that answers on subjSync to sync streams, and
// reports whether one answered; err is its failure to sync, or the
// request's.
func askSync(ctx context.Context, nc *nats.Conn, streams ...string) (answered bool, err error) {
	m, err := nc.RequestWithContext(ctx, subjSync, []byte(strings.Join(streams, ",")))
	if errors.Is(err, nats.ErrNoResponders) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sync at the daemon: %w", err)
	}
	if len(m.Data) > 0 {
		return true, fmt.Errorf("sync at the daemon: %s", m.Data)
	}
	return true, nil
}

// Sync implements Syncer. No responder, when none ever answered, means no
// daemon syncs for this server (it runs with --durability replicas or
// none): the server's acknowledgement is all there is to wait for. No
// responder after one had answered is ErrSyncUnanswered: the daemon that
// fsyncs is between its server's start and its own (a restart), and a
// write its server took meanwhile may be only in the page cache; taken for
// synced, it got a 250.
func (r *remoteSyncer) Sync(ctx context.Context, streams ...string) error {
	answered, err := askSync(ctx, r.nc, streams...)
	switch {
	case answered:
		r.answered.Store(true)
	case err == nil && r.answered.Load():
		return ErrSyncUnanswered
	}
	return err
}

// storedAcrossRestart is Enqueue's answer to ErrSyncUnanswered: the
// daemon that fsyncs the server's store stopped answering after the server
// had acknowledged the envelopes, so it is restarting, and it stops (or
// crashes) with its server. Answered at once, the client was told 451 for
// a message its server had taken and then delivered, and sent it again: a
// duplicate for each submission caught in a restart of the fleet's
// embedded server. So Enqueue waits, within its deadline, for a daemon to
// answer again (nats.go reconnects to the restarted server meanwhile),
// has it sync the streams, and then looks for each envelope: stored
// (waiting in a lane, or delivered or bounced already, which leaves its
// SENT marker), the message was on disk when the sync returned and is
// accepted; one missing, lost with the old server's page cache, or no
// daemon back in time, and the caller answers as before (ErrMaybeStored).
func (q *Queue) storedAcrossRestart(ctx context.Context, streams []string, ids []string) bool {
	started := time.Now()
	// Asked again, as an admin client's look-ups are (lookUp), while
	// nobody answers; a daemon that answers with a failed sync ends it.
	if _, err := lookUp(ctx, func(ctx context.Context) (struct{}, error) {
		q.count(OpSync)
		answered, err := askSync(ctx, q.nc, streams...)
		if !answered && err == nil {
			err = nats.ErrNoResponders
		}
		return struct{}{}, err
	}); err != nil {
		return false
	}
	for _, id := range ids {
		if _, err := q.Find(ctx, id); err == nil {
			continue
		} else if !errors.Is(err, ErrNotFound) {
			return false
		}
		if _, found, err := q.lastMatching(ctx, OpSentGet, sentStreamName, sentSubject(id)+".*"); err != nil || !found {
			return false
		}
	}
	q.log.Info().Strs("ids", ids).Dur("waited", time.Since(started)).
		Msg("the daemon that syncs the store answered again after its restart, and the message is stored: accepted")
	return true
}

// flights runs one call per key at a time; callers that arrive while one
// runs wait for it and share its result.
type flights struct {
	mu sync.Mutex
	m  map[string]*flight
}

type flight struct {
	done chan struct{}
	err  error
}

func (f *flights) do(key string, fn func() error) error {
	f.mu.Lock()
	if c, ok := f.m[key]; ok {
		f.mu.Unlock()
		<-c.done
		return c.err
	}
	if f.m == nil {
		f.m = map[string]*flight{}
	}
	c := &flight{done: make(chan struct{})}
	f.m[key] = c
	f.mu.Unlock()
	c.err = fn()
	f.mu.Lock()
	delete(f.m, key)
	f.mu.Unlock()
	close(c.done)
	return c.err
}
