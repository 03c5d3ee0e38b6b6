package throttle

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// How soon a lost watch is tried again, and a gone bucket made again: at
// first reopenMin after, doubling to at most reopenMax.
const (
	reopenMin = 500 * time.Millisecond
	reopenMax = 30 * time.Second
)

// reopenBackoff is the wait after tries failed tries (1 or more).
func reopenBackoff(tries int) time.Duration {
	return min(reopenMin<<min(max(tries-1, 0), 10), reopenMax)
}

// keepWatching feeds w's entries to apply (watch) and, when the watcher
// ends before the Throttle does, watches kv again (watchAgain). A
// JetStream restarted in process (queue's Supervise, after the disk
// filled up) comes back without the registry, whose watcher then ends (as
// the state's does when JetStream stays down longer than a watcher waits
// for it): the watcher goroutine returned, and the worker saw no other
// worker come or go (or no change of a destination's state) until the
// process restarted. The loss is logged once, and so is the return.
//
// A watch again replays the bucket's entries as updates: a destination's
// state changed or deleted meanwhile is taken (and an operator's change
// logged), and a worker's record counts it as just seen. While the
// registry is not watched its workers are kept as they were
// (pruneWorkers), and when it is again they are all taken as just seen:
// those alive heartbeat within a Heartbeat, the others expire after a
// WorkerTTL. A worker gone meanwhile keeps its share a little longer,
// rather than a live one losing it and this one sending at its rate.
func (t *Throttle) keepWatching(kv jetstream.KeyValue, w jetstream.KeyWatcher, ready chan struct{}, name string, apply func(jetstream.KeyValueEntry, bool)) {
	registry := name == "registry-watch"
	t.watching.Store(name, w)
	t.watch(w, ready, apply)
	for t.ctx.Err() == nil {
		if registry {
			t.regLost.Store(true)
		}
		t.log.Warn().Str("bucket", kv.Bucket()).Msg("KV watcher closed; shared state is not followed until it is watched again")
		if w = t.watchAgain(kv); w == nil {
			return
		}
		if registry {
			now := t.now()
			t.wmu.Lock()
			for k := range t.workers {
				t.workers[k] = now
			}
			t.wmu.Unlock()
			t.regLost.Store(false)
		}
		t.log.Info().Str("bucket", kv.Bucket()).Msg("KV watched again; shared state is followed again")
		t.watching.Store(name, w)
		t.watch(w, make(chan struct{}), func(e jetstream.KeyValueEntry, _ bool) { apply(e, false) })
	}
}

// watchAgain watches kv again, trying after reopenBackoff; a bucket whose
// stream is gone is made again first, when kv can be (reopener). It
// returns nil when the Throttle is closed.
func (t *Throttle) watchAgain(kv jetstream.KeyValue) jetstream.KeyWatcher {
	timer := time.NewTimer(reopenMin)
	defer timer.Stop()
	for tries := 1; ; tries++ {
		select {
		case <-t.ctx.Done():
			return nil
		case <-timer.C:
		}
		w, err := kv.WatchAll(t.ctx)
		if err == nil {
			return w
		}
		if r, ok := kv.(reopener); ok && bucketGone(err) && t.ctx.Err() == nil {
			ctx, cancel := context.WithTimeout(t.ctx, opTimeout)
			if err = r.reopen(ctx); err == nil {
				w, err = kv.WatchAll(t.ctx)
			}
			cancel()
			if err == nil {
				return w
			}
		}
		t.log.Debug().Err(err).Msg("KV watch again failed")
		timer.Reset(reopenBackoff(tries))
	}
}

// rewatch ends the watchers, which keepWatching starts again, when this
// worker's heartbeat was written at revision rev, no later than its last
// one's, last: the registry's stream was made again (a JetStream
// restarted in process loses it). A watcher that outlived the restart
// follows the new stream from after the last revision it saw on the old
// one: it saw nothing more until the new stream got that far, and a
// worker kept seeing none of the others. The state's watcher starts again
// too: its stream came back from the store, and a watcher waits for its
// heartbeats to be missed before it follows it again.
func (t *Throttle) rewatch(last, rev uint64) {
	t.log.Info().Uint64("revision", rev).Uint64("last_revision", last).Msg("worker registry was made again; watching the buckets again")
	t.watching.Range(func(_, w any) bool {
		_ = w.(jetstream.KeyWatcher).Stop()
		return true
	})
}
