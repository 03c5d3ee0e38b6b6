package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ErrNoRoom is returned by Enqueue (and Embedded.Healthy) while the
// embedded store's use is within StoreReserve of its limit: new mail is
// refused, before anything is written, so that the room left is kept for
// the mail already accepted. The submission listener answers it 452 4.3.1
// (insufficient system storage), the API 503 store-unavailable with
// Retry-After; the client keeps the message and retries.
//
// nats-server refuses every write once its store is at its limit (503,
// err_code 10023, insufficient resources): without a reserve, a backlog
// that grows to the limit (a relay down for hours) stops the deferred
// lanes' schedules from firing, the SENT markers, the dead letters, the
// events and the admin commands (queue drop, fast-forward, apikey create)
// as well. A restart on a nearly full disk could even start the server
// under its store's use: see storeLimits, which keeps its limit above.
var ErrNoRoom = errors.New("insufficient system storage: the store is short of room for new mail")

// MinStoreReserve is the least StoreReserve keeps (unless the limit is
// under twice it). Between two looks at the store's use (every
// StoreRoomEvery) Enqueue counts the bodies it stores itself, but another
// process's submissions are seen only at the next look: the floor covers
// a second of them at some 60 MB/s.
const MinStoreReserve = 64 << 20

// StoreRoomEvery is how often the embedded store's use is read: the hot
// path (Enqueue) reads only what the last look found.
const StoreRoomEvery = time.Second

// StoreReserve is the part of a store limit that new mail may not take:
// a tenth of it, at least MinStoreReserve, at most half the limit. It is
// what the mail already accepted needs to move on while no more comes
// in: a deferral or a scheduled firing writes the envelope again (inline
// bodies up to 128 KiB) before the old copy goes, each attempt writes
// events, a delivery its SENT marker (kept 72 h), a failure its dead
// letter, and the operator's commands their records.
func StoreReserve(limit int64) int64 {
	if limit <= 0 {
		return 0
	}
	return min(max(limit/10, MinStoreReserve), limit/2)
}

// StoreRoom watches the embedded store's use against its limit and says,
// without a round trip, whether new mail may be stored. It is also a
// prometheus.Collector: outflow_store_bytes, outflow_store_limit_bytes,
// outflow_store_reserve_bytes and outflow_store_full.
//
// Two limits: the store's limit (Limit: --store-max, or computed from the
// free disk space), which new mail is held to, and nats-server's own
// (JetStreamMaxStore), past which the server refuses every write, a
// delivery's as much as new mail's. StartEmbedded keeps the second at
// least the store's use at start plus the reserve (storeLimits), so that
// the mail already queued moves on even when a restart finds the store
// over the first.
type StoreRoom struct {
	srv *server.Server

	used   atomic.Int64 // the last look's use, plus what Enqueue stored since
	limit  atomic.Int64 // the store's limit in bytes; 0: not known, nothing refused
	server atomic.Int64 // nats-server's own limit, as last seen
	short  atomic.Bool  // new mail is refused (ErrNoRoom)

	// freeSpace, set with --store-max 0, reads the free bytes of the
	// store's file system: the limit rises with them while running, so
	// that freeing disk space gives new mail room again without a restart.
	freeSpace func() (uint64, error)
	// raise makes nats-server's own limit n bytes (it only ever rises).
	raise func(n int64) error

	descs struct{ used, limit, reserve, full *prometheus.Desc }
}

// newStoreRoom watches srv's store against limit (the store's limit, not
// nats-server's). freeSpace and raise may be nil: the limit then stays.
func newStoreRoom(srv *server.Server, limit int64, freeSpace func() (uint64, error), raise func(int64) error) *StoreRoom {
	r := &StoreRoom{srv: srv, freeSpace: freeSpace, raise: raise}
	r.limit.Store(limit)
	r.descs.used = prometheus.NewDesc("outflow_store_bytes", "Bytes the embedded JetStream store holds, as the server counts them against its limit.", nil, nil)
	r.descs.limit = prometheus.NewDesc("outflow_store_limit_bytes", "The embedded JetStream store's limit (--store-max, or 75% of the free disk space plus 75% of the store's use, rising as disk space is freed).", nil, nil)
	r.descs.reserve = prometheus.NewDesc("outflow_store_reserve_bytes", "The part of the limit kept for the mail already accepted: new mail is refused once outflow_store_bytes reaches the limit less this.", nil, nil)
	r.descs.full = prometheus.NewDesc("outflow_store_full", "1 while new mail is refused for lack of room in the store (452 4.3.1, API 503), else 0.", nil, nil)
	r.poll()
	return r
}

// dynamicStoreLimit is nats-server's own limit for a JetStreamMaxStore of
// 0 (server/jetstream.go, dynJetStreamConfig and finalizeDynamicMaxStore,
// v2.15): 75% of the file system's free space at start plus 75% of what
// the store holds, each rounded down as there.
func dynamicStoreLimit(free uint64, used int64) int64 {
	f := int64(min(free, math.MaxInt64/2) / 4 * 3)
	return f + max(used, 0)/4*3
}

// storeLimits is the store's limit and nats-server's own, for a store that
// holds used bytes at start: the store's limit is maxStore (--store-max),
// or with 0 dynamicStoreLimit of the free space; nats-server's is that,
// or the use plus the reserve if more.
//
// nats-server refuses every write while its store's use is over its limit,
// and its own default for 0 is under the use whenever the free space is
// under a third of it (a restart with a backlog on a nearly full disk):
// the mail already queued then could not move on at all, not a SENT
// marker, a deferral, an event written, until another restart found room.
// Raised to the use plus the reserve, the server keeps for that mail the
// room the reserve keeps for it while running; new mail is still held to
// the store's limit (StoreRoom), so it stays refused until deliveries bring
// the use under that limit less the reserve. A --store-max under the use
// is kept for new mail the same way: the operator's bound on what the
// store may take in is honoured, only the mail already in it gets to go.
func storeLimits(maxStore int64, free uint64, used int64) (limit, natsLimit int64) {
	limit = maxStore
	if limit == 0 {
		// At least a byte: 0 would be no limit at all (StoreRoom), where a
		// full disk with an empty store needs new mail refused.
		limit = max(dynamicStoreLimit(free, used), 1)
	}
	return limit, max(limit, used+StoreReserve(limit))
}

// poll reads the server's use and limit. While JetStream is down (the
// supervisor restarts it) the last look stands.
func (r *StoreRoom) poll() {
	jsz, err := r.srv.Jsz(&server.JSzOptions{})
	if err != nil || jsz == nil || jsz.Disabled {
		return
	}
	used, natsLimit, limit := int64(jsz.Store), jsz.Config.MaxStore, r.limit.Load()
	if r.freeSpace != nil {
		// With --store-max 0 the limit follows the disk up: space freed
		// (an operator removing other files) is room for new mail at once.
		// Not down: the store's own deletions show in its use before the
		// file system gets the space back, and would move it for nothing.
		// An eighth of the reserve at least, so that nats-server is not
		// reconfigured for every block written elsewhere on the disk.
		// Only if nats-server's own limit is at least as high, or can be
		// raised to it: new mail let in past that would be refused by
		// the server, and take the room kept for the mail queued.
		if free, err := r.freeSpace(); err == nil {
			l := dynamicStoreLimit(free, used)
			if l-limit > StoreReserve(limit)/8 && (l <= natsLimit || r.raise != nil && r.raise(l) == nil) {
				limit, natsLimit = l, max(natsLimit, l)
			}
		}
	}
	r.server.Store(natsLimit)
	r.set(used, limit)
}

// set records a look at the store: used of limit bytes. Short from used
// at limit less the reserve; room again only once used is an eighth of
// the reserve under that, so that a store at the mark does not flap
// (/readyz, the alert) with each delivery and each submission.
func (r *StoreRoom) set(used, limit int64) {
	r.used.Store(used)
	r.limit.Store(limit)
	r.short.Store(r.isShort(used, limit, r.short.Load()))
}

func (r *StoreRoom) isShort(used, limit int64, was bool) bool {
	if limit <= 0 {
		return false
	}
	reserve := StoreReserve(limit)
	mark := limit - reserve
	if was {
		mark -= reserve / 8
	}
	return used >= mark
}

// run polls every until ctx ends.
func (r *StoreRoom) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.poll()
		}
	}
}

// Err is nil while new mail may be stored, else an error wrapping
// ErrNoRoom that says how full the store is and what gives it room. No
// round trip: it reads the last look (StoreRoomEvery).
func (r *StoreRoom) Err() error {
	if r == nil || !r.short.Load() {
		return nil
	}
	used, limit, natsLimit := r.used.Load(), r.limit.Load(), r.server.Load()
	if natsLimit > 0 && used >= natsLimit {
		// Not reached while StartEmbedded's raise holds (storeLimits):
		// said as it is, since then no delivery frees anything.
		return fmt.Errorf("%w (%d bytes used, at nats-server's own limit of %d: it refuses every write, the mail already queued's too; "+
			"free disk space or raise --store-max, and restart; docs/runbook.md, \"The store is full\")", ErrNoRoom, used, natsLimit)
	}
	more := "or raise --store-max (a restart)"
	if r.freeSpace != nil {
		more = "or free disk space: with --store-max 0 the limit rises with it"
	}
	return fmt.Errorf("%w (%d of its limit of %d bytes used; the last %d are kept for the mail already queued, which still moves on: "+
		"its deliveries free room, %s; docs/runbook.md, \"The store is full\")",
		ErrNoRoom, used, limit, StoreReserve(limit), more)
}

// charge counts n bytes Enqueue stored, until the next look reads the
// store's own count: a burst between two looks cannot take the reserve.
func (r *StoreRoom) charge(n int) {
	if r == nil {
		return
	}
	used := r.used.Add(int64(n))
	if limit := r.limit.Load(); !r.short.Load() && r.isShort(used, limit, false) {
		r.short.Store(true)
	}
}

// Used is the store's use in bytes, as last seen (plus what Enqueue
// stored since).
func (r *StoreRoom) Used() int64 { return r.used.Load() }

// Limit is the store's limit in bytes, which new mail is held to; 0
// while not known.
func (r *StoreRoom) Limit() int64 { return r.limit.Load() }

// ServerLimit is nats-server's own limit in bytes, past which it refuses
// every write: at least Limit, and at start at least the store's use plus
// the reserve (storeLimits).
func (r *StoreRoom) ServerLimit() int64 { return r.server.Load() }

// Reserve is StoreReserve of Limit.
func (r *StoreRoom) Reserve() int64 { return StoreReserve(r.limit.Load()) }

// Describe implements prometheus.Collector.
func (r *StoreRoom) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.descs.used
	ch <- r.descs.limit
	ch <- r.descs.reserve
	ch <- r.descs.full
}

// Collect implements prometheus.Collector.
func (r *StoreRoom) Collect(ch chan<- prometheus.Metric) {
	full := 0.0
	if r.short.Load() {
		full = 1
	}
	ch <- prometheus.MustNewConstMetric(r.descs.used, prometheus.GaugeValue, float64(r.Used()))
	ch <- prometheus.MustNewConstMetric(r.descs.limit, prometheus.GaugeValue, float64(r.Limit()))
	ch <- prometheus.MustNewConstMetric(r.descs.reserve, prometheus.GaugeValue, float64(r.Reserve()))
	ch <- prometheus.MustNewConstMetric(r.descs.full, prometheus.GaugeValue, full)
}

// storeRooms holds the StoreRoom of each embedded server running in this
// process, for Enqueue on an in-process connection (Options.InProcess).
var storeRooms sync.Map // *server.Server → *StoreRoom

// storeRoom returns the StoreRoom of the embedded server q is connected
// to in process, or nil (a socket: another process's server, a cluster).
func (q *Queue) storeRoom() *StoreRoom {
	if q.opts.InProcess == nil {
		return nil
	}
	r, _ := storeRooms.Load(q.opts.InProcess)
	rr, _ := r.(*StoreRoom)
	return rr
}

// roomFor is the check Enqueue makes before it writes anything: nil, or
// ErrNoRoom. Delivery status notifications the workers write pass: they
// report on mail already accepted, and are few and small. A process that
// stores through another daemon's embedded server (`outflow submit`, a
// fleet worker with --nats-url) asks that daemon (remoteRoom): its new
// mail took the reserve kept for the mail already queued.
func (q *Queue) roomFor(ctx context.Context, s *Submission) error {
	if s.Source == SourceDSN {
		return nil
	}
	if r := q.storeRoom(); r != nil {
		return r.Err()
	}
	return q.remote.err(ctx, q.nc)
}

// remoteRoomEvery is how long a daemon's answer about its store's room is
// used: as long as the daemon's own look (StoreRoomEvery).
const remoteRoomEvery = StoreRoomEvery

// remoteRoomWait bounds the question; a daemon that does not answer in it
// (or none listening: a cluster's servers, an older release) is taken as
// room: the server still refuses at its limit.
const remoteRoomWait = 2 * time.Second

// remoteRoom is the last answer of the daemon whose embedded server this
// process stores through, about its store's room.
type remoteRoom struct {
	mu     sync.Mutex
	at     time.Time
	answer error
}

func (r *remoteRoom) err(ctx context.Context, nc *nats.Conn) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.at.IsZero() && time.Since(r.at) < remoteRoomEvery {
		return r.answer
	}
	ctx, cancel := context.WithTimeout(ctx, remoteRoomWait)
	defer cancel()
	r.at, r.answer = time.Now(), nil
	m, err := nc.RequestWithContext(ctx, subjRoom, nil)
	if err == nil && len(m.Data) > 0 {
		r.answer = fmt.Errorf("%w, at the daemon this process stores through %s", ErrNoRoom,
			strings.TrimPrefix(string(m.Data), ErrNoRoom.Error()+" "))
	}
	return r.answer
}
