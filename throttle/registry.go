package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultWorkerID returns the id a process goes by when none is configured:
// hostname-pid, stable enough for logs ("outflow-pid" when the hostname is
// unavailable). The id names UpdatedBy in the shared state, the process's
// per-worker backoff offset and its log lines, so serve, the delivery loop
// and Config all take it from here. It need not be unique: two containers
// on a host network both run as PID 1, and a config file copied with its
// worker-id gives two processes one id. The registry tells processes apart
// by their instance (registryKey), not by the id.
func DefaultWorkerID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "outflow"
	}
	return h + "-" + strconv.Itoa(os.Getpid())
}

// registryKey is the registry key of a process with the worker id id:
// the id's key, a dot, and instance, random per process (newInstance).
// Keyed by the id alone, two processes with one id wrote one record, each
// counted one live worker, and each sent at the whole fleet's rate with
// every connection; one also measured its clock offset from the other's
// heartbeat. The key is never read back for the id: the record carries
// it.
func registryKey(id, instance string) string {
	return StateKey(id) + "." + instance
}

// newInstance is a random instance name for this process's registry key:
// 64 bits, hex.
func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	return hex.EncodeToString(b[:])
}

// workerRecord is the value of a registry key.
type workerRecord struct {
	Worker string `json:"worker"`
	// Instance tells apart processes with one worker id (registryKey).
	Instance string    `json:"instance,omitempty"`
	Started  time.Time `json:"started"`
	At       time.Time `json:"at"`
	// Load is the worker's traffic per destination with any (delivered
	// rate over the learning window, deliveries in flight), so that a
	// learned limit is seeded from the whole fleet's traffic.
	Load map[string]destLoad `json:"load,omitempty"`
}

// destLoad is one worker's traffic to one destination.
type destLoad struct {
	Rate     float64 `json:"rate"`      // delivered msgs/s over the learning window
	InFlight int     `json:"in_flight"` // deliveries in progress
}

// load is this worker's destLoad for every destination with traffic.
func (t *Throttle) load(now time.Time) map[string]destLoad {
	t.mu.RLock()
	ds := make([]*dest, 0, len(t.dests))
	for _, d := range t.dests {
		ds = append(ds, d)
	}
	t.mu.RUnlock()
	var m map[string]destLoad
	for _, d := range ds {
		d.mu.Lock()
		l := destLoad{Rate: d.delivered.spanRate(now, t.cfg.LearnWindow), InFlight: d.inflight}
		d.mu.Unlock()
		if l.Rate > 0 || l.InFlight > 0 {
			if m == nil {
				m = map[string]destLoad{}
			}
			m[d.name] = l
		}
	}
	return m
}

// peerLoad sums what the other live workers last reported for dest, and
// how many of them reported it.
func (t *Throttle) peerLoad(dest string, now time.Time) (destLoad, int) {
	sum, n, _ := t.peerLoadSince(dest, now, now)
	return sum, n
}

// peerLoadSince is peerLoad, and counts in unheard the live workers that
// reported no traffic to dest in a heartbeat sent less than LearnEvery
// after from (the start of this worker's burst to dest): a report that may
// predate the peer's first envelope of the burst, as idlePeer reads it.
// Such a peer is sending its share, most likely, and will say so in its
// next heartbeat.
func (t *Throttle) peerLoadSince(dest string, now, from time.Time) (sum destLoad, n, unheard int) {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	for k, rec := range t.peers {
		seen := t.workers[k]
		if k == t.regKey || now.Sub(seen) > t.workerTTL {
			continue
		}
		if l, ok := rec.Load[dest]; ok {
			sum.Rate += l.Rate
			sum.InFlight += l.InFlight
			n++
		} else if seen.Sub(from) < t.cfg.LearnEvery {
			unheard++
		}
	}
	return sum, n, unheard
}

// heartbeat refreshes this worker's registry key. A revision no later
// than its last one's says the registry's stream was made again (by this
// worker or another): the watchers are watching again (rewatch).
func (t *Throttle) heartbeat(ctx context.Context) error {
	now := t.now()
	b, _ := json.Marshal(workerRecord{Worker: t.cfg.WorkerID, Instance: t.instance, Started: t.started, At: now.UTC(), Load: t.load(now)})
	rev, err := t.cfg.Registry.Put(ctx, t.regKey, b)
	if err != nil {
		return fmt.Errorf("throttle: register worker %q: %w", t.cfg.WorkerID, err)
	}
	if last := t.regRev.Swap(rev); rev <= last {
		t.rewatch(last, rev)
	}
	return nil
}

// heartbeatLoop refreshes this worker's registry key every Heartbeat. A
// registry whose stream is gone (a JetStream restarted in process comes
// back without it, being kept in memory) is made again, after
// reopenBackoff(tries) since the last try, and the heartbeat written at
// once: nothing made it again before, and every heartbeat failed with "no
// response from stream" until the process restarted, every other worker
// counting this one gone. A failing heartbeat is logged when it starts
// failing and when it succeeds again.
func (t *Throttle) heartbeatLoop() {
	tk := time.NewTicker(t.cfg.Heartbeat)
	defer tk.Stop()
	var failing error // the first failure since the last success
	var tries int     // failed tries to make the registry again
	var nextTry time.Time
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
		}
		ctx, cancel := context.WithTimeout(t.ctx, opTimeout)
		err := t.heartbeat(ctx)
		if r, ok := t.cfg.Registry.(reopener); ok && bucketGone(err) && !time.Now().Before(nextTry) {
			if rerr := r.reopen(ctx); rerr != nil {
				tries++
				nextTry = time.Now().Add(reopenBackoff(tries))
				err = fmt.Errorf("%w (making the registry again: %v)", err, rerr)
			} else {
				tries, nextTry = 0, time.Time{}
				t.log.Info().Str("bucket", BucketRegistry).Msg("worker registry was gone; made it again")
				err = t.heartbeat(ctx)
			}
		}
		cancel()
		switch {
		case t.ctx.Err() != nil:
		case err != nil && failing == nil:
			failing = err
			t.log.Warn().Err(err).Msg("worker heartbeat failed; trying again every heartbeat")
		case err != nil:
			t.log.Debug().Err(err).Msg("worker heartbeat failed")
		case failing != nil:
			failing = nil
			t.log.Info().Msg("worker heartbeat succeeds again")
		}
	}
}

// applyWorker follows one entry of the registry.
func (t *Throttle) applyWorker(e jetstream.KeyValueEntry, initial bool) {
	now := t.now()
	t.wmu.Lock()
	switch e.Operation() {
	case jetstream.KeyValueDelete, jetstream.KeyValuePurge:
		delete(t.workers, e.Key())
		delete(t.peers, e.Key())
	default:
		var rec workerRecord
		if json.Unmarshal(e.Value(), &rec) == nil {
			t.peers[e.Key()] = rec
			if e.Key() == t.regKey {
				t.measureOffset(rec.At, e.Created())
			}
		}
		seen := now
		if initial {
			// An old entry is as old as the server says, but never so old
			// that clock skew drops it before its next heartbeat.
			age := min(max(now.Sub(e.Created()), 0), max(t.workerTTL-t.cfg.Heartbeat, 0))
			seen = now.Add(-age)
		}
		t.workers[e.Key()] = seen
	}
	t.recountLocked(now)
	t.wmu.Unlock()
}

// pruneWorkers forgets workers whose heartbeat is older than the TTL
// (their key expired without a delete marker).
//
// Not while the registry's watch is lost (keepWatching): no heartbeat is
// seen then, and dropping the workers would give this one their shares.
func (t *Throttle) pruneWorkers(now time.Time) {
	if t.cfg.Registry == nil || t.regLost.Load() {
		return
	}
	t.wmu.Lock()
	for k, seen := range t.workers {
		if k != t.regKey && now.Sub(seen) > t.workerTTL {
			delete(t.workers, k)
			delete(t.peers, k)
		}
	}
	t.recountLocked(now)
	t.wmu.Unlock()
}

// recountLocked updates the live count; t.wmu held.
func (t *Throttle) recountLocked(now time.Time) {
	n := len(t.workers)
	if _, ok := t.workers[t.regKey]; !ok {
		n++ // this worker is live even if its key is not (yet) seen
	}
	keys := make([]string, 0, n)
	for k := range t.workers {
		keys = append(keys, k)
	}
	if _, ok := t.workers[t.regKey]; !ok {
		keys = append(keys, t.regKey)
	}
	sort.Strings(keys)
	t.rank.Store(int64(sort.SearchStrings(keys, t.regKey)))
	if old := t.live.Swap(int64(n)); old != int64(n) {
		ids := make([]string, 0, len(t.workers))
		for k := range t.workers {
			id := k // an unreadable record: its key
			if rec, ok := t.peers[k]; ok {
				id = rec.Worker
				if rec.Instance != "" {
					id += "/" + rec.Instance
				}
			}
			ids = append(ids, id)
		}
		sort.Strings(ids)
		t.log.Info().Int64("live_before", old).Int("live", n).Strs("worker_ids", ids).Msg("live workers changed; rate shares recomputed")
	}
}
