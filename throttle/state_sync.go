package throttle

import (
	"context"
	"hash/fnv"
	"math/bits"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/kvpurge"
)

// getDest returns the live dest for a destination, creating it.
func (t *Throttle) getDest(name string) *dest {
	t.mu.RLock()
	d := t.dests[name]
	t.mu.RUnlock()
	if d != nil {
		return d
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if d = t.dests[name]; d != nil {
		return d
	}
	d = &dest{name: name, limits: t.limitsOf(name), state: DestState{Dest: name}, lastUsed: t.now()}
	if len(t.rules) > 0 {
		d.auto = make([]window, len(t.rules))
	}
	t.dests[name] = d
	return d
}

// limitsOf is a destination's configured limits; a (destination, source)
// pair has its destination's.
func (t *Throttle) limitsOf(name string) Limits {
	if l, ok := t.cfg.Overrides[baseDest(name)]; ok {
		return l
	}
	return t.cfg.Defaults
}

// marker is the marker of a deleted state: its sequence, and when it was
// written.
type marker struct {
	seq uint64
	at  time.Time
}

// noteMarker keeps a marker for dropMarkers; a later write to its key
// replaces it or, being a value, makes applyState forget it.
func (t *Throttle) noteMarker(key string, seq uint64, at time.Time) {
	if t.cfg.StateStream == nil {
		return
	}
	t.mmu.Lock()
	defer t.mmu.Unlock()
	if t.markers == nil {
		t.markers = map[string]marker{}
	}
	t.markers[key] = marker{seq: seq, at: at}
}

// forgetMarker drops key's marker from the list: the key has a value again.
func (t *Throttle) forgetMarker(key string) {
	t.mmu.Lock()
	delete(t.markers, key)
	t.mmu.Unlock()
}

// dropBudget bounds one sweep of dropMarkers: it runs beside the
// maintenance loop, and stops at its first failure (a stream without a
// leader fails every request after a timeout), the rest waiting for the
// next sweep.
const dropBudget = 30 * time.Second

// dropMarkers removes from the state bucket's stream the markers whose
// time has come, in its own goroutine (one sweep at a time): by then
// every worker has applied them, and a worker that starts later finds no
// state, which is the same. Each is removed only up to its own sequence,
// so a state written since stays. One worker drops a given marker (the
// one whose place among the live workers its key hashes to) markerTTL
// after it was written; the others only at twice that, if it is still
// there (that worker gone, or failing), so that a fleet makes one request
// per marker, not one per worker.
func (t *Throttle) dropMarkers(now time.Time) {
	if !t.dropping.CompareAndSwap(false, true) {
		return
	}
	live := int64(t.liveCount())
	rank := t.rank.Load() % live
	t.mmu.Lock()
	var due []string
	for key, m := range t.markers {
		if t.markerDue(key, m, now, live, rank) {
			due = append(due, key)
		}
	}
	t.mmu.Unlock()
	if len(due) == 0 {
		t.dropping.Store(false)
		return
	}
	t.goSafe("drop-markers", func() {
		defer t.dropping.Store(false)
		ctx, cancel := context.WithTimeout(t.ctx, dropBudget)
		defer cancel()
		dropped := 0
		for _, key := range due {
			t.mmu.Lock()
			m, ok := t.markers[key]
			if ok && !t.markerDue(key, m, t.now(), live, rank) {
				ok = false // written again since, and deleted again: a new marker
			}
			if ok {
				delete(t.markers, key)
			}
			t.mmu.Unlock()
			if !ok {
				continue
			}
			if err := kvpurge.DropThrough(ctx, t.cfg.StateStream, BucketState, key, m.seq); err != nil {
				t.mmu.Lock()
				if _, again := t.markers[key]; !again {
					t.markers[key] = m // for the next sweep
				}
				t.mmu.Unlock()
				if t.ctx.Err() == nil {
					t.log.Debug().Err(err).Int("dropped", dropped).Int("left", len(due)-dropped).
						Msg("could not drop the markers of deleted destination states; again at the next sweep")
				}
				return
			}
			dropped++
		}
		t.log.Debug().Int("markers", dropped).Msg("markers of deleted destination states dropped")
	})
}

// markerDue says whether this worker, of place rank among live, drops m
// now: markerTTL after it was written when its key is this worker's to
// drop, twice that otherwise.
func (t *Throttle) markerDue(key string, m marker, now time.Time, live, rank int64) bool {
	wait := 2 * t.cfg.markerTTL
	h := fnv.New32a()
	_, _ = h.Write([]byte(key))
	if int64(h.Sum32()%uint32(live)) == rank {
		wait = t.cfg.markerTTL
	}
	return now.Sub(m.at) >= wait
}

// applyState follows one entry of the state bucket.
func (t *Throttle) applyState(e jetstream.KeyValueEntry, initial bool) {
	name := DestFromKey(e.Key())
	deleted := e.Operation() == jetstream.KeyValueDelete || e.Operation() == jetstream.KeyValuePurge
	if deleted {
		// The marker's time is the server's; markerTTL is far longer than
		// any offset between the clocks.
		t.noteMarker(e.Key(), e.Revision(), e.Created())
		t.mu.RLock()
		_, known := t.dests[name]
		t.mu.RUnlock()
		if initial || !known {
			// A state deleted before this worker started, or of a
			// destination it holds nothing of: nothing to undo, and no
			// destination to make for it.
			return
		}
	} else {
		t.forgetMarker(e.Key())
	}
	d := t.getDest(name)
	var s DestState
	if !deleted {
		var err error
		if s, err = decodeState(e.Key(), e.Value()); err != nil {
			t.log.Warn().Err(err).Str("dest", name).Msg("ignoring unreadable dest state")
			return
		}
		s.Dest = name
		s = t.frame().toLocal(s, e.Created())
	}
	d.mu.Lock()
	if e.Revision() <= d.rev {
		d.mu.Unlock()
		return // already applied (this worker wrote it)
	}
	prev := d.state
	d.rev = e.Revision()
	if deleted {
		d.state, d.hasState = DestState{Dest: name}, false
	} else {
		d.state, d.hasState = s, true
	}
	d.mu.Unlock()

	t.mu.Lock()
	if deleted {
		delete(t.stateful, name)
	} else {
		t.stateful[name] = d
	}
	t.mu.Unlock()
	if deleted {
		t.m.drop(name)
	}
	if !initial && s.UpdatedBy != t.cfg.WorkerID {
		now := t.now()
		// An operator's change (a suspension, a pin, a resume, from
		// `outflow dest` or the console) is logged at Info, so that the
		// daemon's log says when it took effect and who made it; the
		// workers' own transitions are logged at Info by their writer
		// (transition), and seen here again by the others at Debug.
		ev := t.log.Debug()
		if operatorChange(s.UpdatedBy) {
			ev = t.log.Info()
		}
		ev = ev.Str("dest", name).Str("by", s.UpdatedBy).
			Str("breaker", prev.BreakerAt(now)+"->"+s.BreakerAt(now)).
			Float64("factor_from", prev.RateFactor()).Float64("factor_to", s.RateFactor()).
			Bool("suspended", s.Suspended(now))
		if s.Suspended(now) {
			ev = ev.Time("suspended_until", s.SuspendedUntil).Str("reason", s.Reason)
		}
		if rate, ok := s.rateOverride(now); ok {
			ev = ev.Float64("rate_override", rate)
		}
		if conns, ok := s.connsOverride(now); ok {
			ev = ev.Int("conns_override", conns)
		}
		ev.Msg("observed destination state change")
	}
}

// operatorChange reports whether a state written by by (UpdatedBy) is an
// operator's: `outflow dest` writes "admin:USER@HOST", the console
// "console:SESSION(TENANT)".
func operatorChange(by string) bool {
	return strings.HasPrefix(by, "admin:") || strings.HasPrefix(by, "console:")
}

// applyWritten installs a state this worker just wrote, ahead of the
// watcher's echo.
func (t *Throttle) applyWritten(d *dest, s DestState, rev uint64) {
	d.mu.Lock()
	if rev > d.rev {
		d.state, d.rev, d.hasState = s, rev, true
	}
	d.mu.Unlock()
	t.mu.Lock()
	t.stateful[d.name] = d
	t.mu.Unlock()
}

func (t *Throttle) statefulCount() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(t.stateful)
}

// enqueue queues a KV transition for the writer; the caller holds d.mu and
// has set op.flag in d.pending. A full queue drops it (logged).
func (t *Throttle) enqueue(o op) {
	if o.flag != 0 {
		i := bits.TrailingZeros8(o.flag)
		o.d.gens[i]++
		o.gen = o.d.gens[i]
	}
	select {
	case t.ops <- o:
	default:
		o.d.pending &^= o.flag
		t.log.Warn().Str("dest", o.d.name).Str("change", o.change).Msg("transition queue full; change kept locally only")
	}
}

// writer runs the queued KV transitions one at a time, and tries again
// those whose write failed (later).
func (t *Throttle) writer() {
	// later holds the failed writes waiting for their next try, each
	// with its own time; they are few (one per pending bit of a
	// destination), so a slice does.
	var later []op
	tm := time.NewTimer(time.Hour)
	tm.Stop()
	defer tm.Stop()
	for {
		if len(later) > 0 {
			next := later[0].retryAt
			for _, o := range later[1:] {
				if o.retryAt.Before(next) {
					next = o.retryAt
				}
			}
			tm.Reset(max(time.Until(next), 0))
		}
		select {
		case <-t.ctx.Done():
			return
		case o := <-t.ops:
			if t.run(&o) {
				later = append(later, o)
			}
		case <-tm.C:
			due := later
			later = nil
			now := time.Now()
			for _, o := range due {
				if now.Before(o.retryAt) || t.ctx.Err() != nil {
					later = append(later, o)
					continue
				}
				if !o.current() {
					// A later transition of the same kind was queued
					// (and has run, or will): this one is out of date.
					// A breaker-open retried after the probe's close
					// would reopen a healthy destination for the fleet.
					continue
				}
				if t.run(&o) {
					later = append(later, o)
				}
			}
		}
		tm.Stop()
	}
}

// current reports whether o is the latest transition queued for its
// pending bit (always, for one without a bit).
func (o *op) current() bool {
	if o.flag == 0 {
		return true
	}
	o.d.mu.Lock()
	defer o.d.mu.Unlock()
	return o.d.gens[bits.TrailingZeros8(o.flag)] == o.gen
}

// Retries of a transition whose write failed for another reason than a
// conflict (a KV whose stream leader is being elected answers "no
// responders" or times out for a few seconds): the first after
// opRetryMin, each next after twice as long, at most opRetryMax apart,
// for opRetryFor in all.
const (
	opRetryMin = 100 * time.Millisecond
	opRetryMax = 5 * time.Second
	opRetryFor = 10 * time.Minute
	opRetryLog = time.Minute // between two lines about one write still failing
)

// run runs one transition; it reports whether its write failed and is
// to be tried again at o.retryAt (its pending bit stays set meanwhile, so
// the same transition is not queued twice). Before, a failed write was
// logged and dropped: a throttle cut made while the KV had no leader was
// never shared, and the worker that made it, having cut, did not cut
// again for DecreaseFor while the next state it watched overwrote its
// own cut. A try runs o.fn again on the state stored then, so a write
// that another worker's made needless writes nothing (fn reports false)
// and is done.
func (t *Throttle) run(o *op) (retry bool) {
	defer func() {
		if o.flag != 0 && !retry {
			o.d.mu.Lock()
			if o.d.gens[bits.TrailingZeros8(o.flag)] == o.gen {
				o.d.pending &^= o.flag // not a later one's to clear
			}
			o.d.mu.Unlock()
		}
	}()
	ctx, cancel := context.WithTimeout(t.ctx, opTimeout)
	defer cancel()
	if o.forget != 0 {
		// Only if nobody wrote since: a revision mismatch means it is in use.
		// A purge: the revisions go with it, and the marker that tells
		// the other workers is dropped later (dropMarkers). A failure is
		// not tried again here: the idle state is found again at the next
		// tick (tickStates).
		if err := kvpurge.Purge(ctx, t.cfg.State, StateKey(o.d.name), o.forget); err == nil {
			t.log.Debug().Str("dest", o.d.name).Msg("idle destination state deleted")
		}
		return false
	}
	before, after, rev, wrote, err := updateStateIn(ctx, t.cfg.State, o.d.name, t.cfg.WorkerID, t.frame(), o.fn)
	if err != nil {
		return t.failed(o, err)
	}
	if o.tries > 0 {
		t.log.Info().Str("dest", o.d.name).Str("change", o.change).Int("tries", o.tries+1).
			Dur("after", time.Since(o.failedAt)).Bool("wrote", wrote).Msg("destination state written after failed tries")
	}
	if !wrote {
		// The stored state already says what the change would (another
		// worker's write, an operator's): nothing to write or log at Info.
		t.log.Debug().Str("dest", o.d.name).Str("change", o.change).Msg("destination state already as the change would make it; nothing written")
		return false
	}
	t.applyWritten(o.d, after, rev)
	t.m.transitions.WithLabelValues(o.change).Inc()
	if o.after != nil {
		o.after(before, after)
	}
	return false
}

// failed handles a failed write of o: it sets o's next try and reports
// true, or gives up (false) when the Throttle is closing or o has failed
// for opRetryFor, by when what it meant is long out of date; the next
// transition of the destination is written afresh. It logs the first
// failure, then at most every opRetryLog while failures go on, and giving
// up.
func (t *Throttle) failed(o *op, err error) bool {
	if t.ctx.Err() != nil {
		return false
	}
	now := time.Now()
	if o.tries == 0 {
		o.failedAt = now
	}
	o.tries++
	log := o.tries == 1 || now.Sub(o.loggedAt) >= opRetryLog
	if now.Sub(o.failedAt) >= opRetryFor {
		t.log.Error().Err(err).Str("dest", o.d.name).Str("change", o.change).Int("tries", o.tries).
			Dur("failing_for", now.Sub(o.failedAt)).Msg("could not write destination state; gave up, change kept locally only")
		return false
	}
	wait := opRetryMax
	if o.tries < 16 {
		wait = min(opRetryMin<<(o.tries-1), opRetryMax)
	}
	o.retryAt = now.Add(wait)
	if log {
		o.loggedAt = now
		t.log.Warn().Err(err).Str("dest", o.d.name).Str("change", o.change).Int("tries", o.tries).
			Dur("failing_for", now.Sub(o.failedAt)).Dur("retry_in", wait).
			Msg("could not write destination state; trying again")
	}
	return true
}

// transition logs one state change: one line per transition.
func (t *Throttle) transition(dest, change, from, to, reason string) {
	t.log.Info().Str("dest", dest).Str("change", change).Str("from", from).Str("to", to).
		Str("reason", reason).Str("by", t.cfg.WorkerID).Msg("destination state changed")
}

// recovered calls OnRecover for dest on its own goroutine (finding the
// rate may look up the domain's group).
func (t *Throttle) recovered(d *dest, s DestState, why string) {
	t.goSafe("on-recover", func() {
		rate := t.recoverRate(d, s)
		t.log.Info().Str("dest", d.name).Str("reason", why).Float64("rate", rate).Str("by", t.cfg.WorkerID).
			Msg("destination recovered; releasing deferred envelopes")
		if t.cfg.OnRecover != nil {
			t.cfg.OnRecover(d.name, rate)
		}
	})
}

// recoverRate is the fleet rate at which d's deferred mail is released
// when it recovers with the state s: its own, or for one domain of a
// provider group suspended by itself, the group's, or the domain's own pin
// when that is slower (own.go). That domain's mail is admitted in the
// group's budget, and its configured limits are only the defaults: with
// google configured at 50/s and no --dest-rate, the release of a.test's
// mail was not paced at all.
//
// For a (destination, source) pair, a pin set on the whole destination
// (the domain, and the group it is in) is slower still when it is under
// the pair's rate: the released mail is admitted under it (own.go), and
// released faster, most of it would only be refused "rate" again.
func (t *Throttle) recoverRate(d *dest, s DestState) float64 {
	rate := t.groupRecoverRate(d, s)
	now := t.now()
	if own, _ := ownLimits(s, now); own > 0 && (rate <= 0 || own < rate) {
		rate = own
	}
	if pin := t.pinAbovePair(d.name, now); pin > 0 && (rate <= 0 || pin < rate) {
		rate = pin
	}
	return rate
}

// pinAbovePair is the slowest pin set on the whole destination of the
// pair name (its domain, and that domain's group), fleet msgs/s; 0 when
// name is no pair or none is set. No dest's mutex held.
func (t *Throttle) pinAbovePair(name string, now time.Time) float64 {
	base, source := SplitPair(name)
	if source == "" {
		return 0
	}
	whole := []string{base}
	if !t.groups.isGroup(base) {
		if g := t.Group(base); g != base {
			whole = append(whole, g)
		}
	}
	var slowest float64
	for _, n := range whole {
		w := t.lookDest(n)
		if w == nil {
			continue
		}
		w.mu.Lock()
		pin, _ := ownLimits(w.state, now)
		w.mu.Unlock()
		if pin > 0 && (slowest <= 0 || pin < slowest) {
			slowest = pin
		}
	}
	return slowest
}

// groupRecoverRate is recoverRate without the domain's own pin.
func (t *Throttle) groupRecoverRate(d *dest, s DestState) float64 {
	now := t.now()
	name, source := SplitPair(d.name)
	group := name
	if !t.groups.isGroup(name) {
		group = t.Group(name)
	}
	if group == name {
		return t.fleetRate(d.limits, s, now)
	}
	group = PairName(group, source)
	t.mu.RLock()
	g := t.dests[group]
	t.mu.RUnlock()
	if g == nil {
		return t.fleetRate(t.limitsOf(group), DestState{Dest: group}, now)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return t.fleetRate(g.limits, g.state, now)
}

// Recovers reports whether the recovery of dest (OnRecover) releases the
// deferred mail to the recipient domain: dest is the domain's destination
// (its group, with GroupByMX), or the domain itself, suspended by itself
// inside its group. (Matched by group alone, a domain's own recovery
// released none of its mail.)
func (t *Throttle) Recovers(dest, domain string) bool {
	dest, _ = SplitPair(dest)
	domain = NormalizeDest(domain)
	return domain == dest || t.Group(domain) == dest
}

// fleetRate is the destination's effective fleet rate: configured (or
// overridden, or learned) times the factor; 0 = unlimited.
//
// In order: an operator's pin (override) times the factor; a learned rate,
// capped by the configured one, times the factor; the configured rate times
// the factor. A throttle never moves the factor of a destination that
// learns (it cuts the learned rate instead), but an automation rule's
// `factor` does, and it slows a learned rate as it slows a configured one,
// until it ramps back (rampFactor). Before, a learned rate ignored it: the
// rule was logged as applied and changed nothing.
func (t *Throttle) fleetRate(l Limits, s DestState, now time.Time) float64 {
	r, _ := t.effectiveRate(l, s, now)
	return r
}

// rateSource names where fleetRate's answer comes from, for dest status
// and decision records: pinned, learned, configured or unlimited.
func (t *Throttle) rateSource(l Limits, s DestState, now time.Time) string {
	_, src := t.effectiveRate(l, s, now)
	return src
}

// effectiveRate is fleetRate with the name of its source.
func (t *Throttle) effectiveRate(l Limits, s DestState, now time.Time) (float64, string) {
	if ov, ok := s.rateOverride(now); ok {
		return ov * s.RateFactor(), "pinned"
	}
	ceil := l.Rate * s.RateFactor()
	if s.LearnedRate > 0 && !t.cfg.NoLearn {
		learned := s.LearnedRate * s.RateFactor()
		if l.Rate > 0 && ceil < learned {
			return ceil, "configured"
		}
		return learned, "learned"
	}
	if l.Rate <= 0 {
		return 0, "unlimited"
	}
	return ceil, "configured"
}

// fleetConns is the destination's effective fleet connection limit: an
// operator's override, else the learned limit capped by the configured
// one; 0 = unlimited.
func fleetConns(l Limits, s DestState, now time.Time) int {
	if ov, ok := s.connsOverride(now); ok {
		return ov
	}
	if s.LearnedConns > 0 && (l.Conns <= 0 || s.LearnedConns < l.Conns) {
		return s.LearnedConns
	}
	return l.Conns
}

// shareConns is one worker's share of a fleet connection limit conns,
// by its place among the live workers (0 to live-1): conns/live each, and
// one more for the first conns%live places, so that the shares add up to
// conns exactly. A share may be 0: with one connection and three workers,
// two of them hold none, and refuse "conns" while the third sends. Each
// worker took at least one before, rounded up, which multiplied a limit
// below the fleet's size by it (a provider that allows one connection got
// three from three workers, and a learned limit could never go below the
// number of workers). limited is false for conns 0, unlimited.
func shareConns(conns, live, place int) (share int, limited bool) {
	if conns <= 0 {
		return 0, false
	}
	live = max(1, live)
	share = conns / live
	if int(mod(int64(place), int64(live))) < conns%live {
		share++
	}
	return share, true
}

// place is this worker's place among live workers for the limit of the
// destination name: its rank, turned by a hash of name, so that the
// connections a limit does not divide evenly (and a first-contact
// window's attempts) go to different workers for different destinations,
// rather than all to the worker ranked first.
func (t *Throttle) place(name string, live int) int {
	return int(mod(t.rank.Load()+int64(fnv32a(name)), int64(max(1, live))))
}

// fnv32a is FNV-1a of s, as hash/fnv's New32a gives, without the
// hash.Hash around it: place finds it at every admission to a limited
// destination.
func fnv32a(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// connShare is this worker's share of d's fleet connection limit at now
// among live workers, as shareConns. d.mu held.
func (t *Throttle) connShare(d *dest, live int, now time.Time) (int, bool) {
	conns := fleetConns(d.limits, d.state, now)
	if conns <= 0 {
		return 0, false // unlimited: no place to find (a hash of the name)
	}
	return shareConns(conns, live, t.place(d.name, live))
}

// liveCount is the number of live workers, this one included.
func (t *Throttle) liveCount() int {
	return max(1, int(t.live.Load()))
}

// maintain ends suspensions, fires pending recoveries, forgets dead
// workers and idle destinations, and exports metrics.
func (t *Throttle) maintain() {
	tk := time.NewTicker(tickEvery)
	defer tk.Stop()
	lastSweep, lastDrop := t.now(), t.now()
	for {
		select {
		case <-t.ctx.Done():
			return
		case <-tk.C:
			now := t.now()
			t.pruneWorkers(now)
			t.tickStates(now)
			if now.Sub(lastDrop) >= t.cfg.markerSweep {
				lastDrop = now
				t.dropMarkers(now)
			}
			if now.Sub(lastSweep) >= time.Minute {
				lastSweep = now
				t.groups.prune(now)
				t.evictIdle(now)
			}
		}
	}
}

// tickStates handles time-driven transitions of destinations with state.
func (t *Throttle) tickStates(now time.Time) {
	t.mu.RLock()
	ds := make([]*dest, 0, len(t.stateful))
	for _, d := range t.stateful {
		ds = append(ds, d)
	}
	t.mu.RUnlock()
	for _, d := range ds {
		d.mu.Lock()
		s := d.state
		if !s.SuspendedUntil.IsZero() && !now.Before(s.SuspendedUntil) && d.pending&pendExpire == 0 {
			d.pending |= pendExpire
			t.enqueue(op{d: d, change: "suspension-end", flag: pendExpire,
				fn: func(s *DestState, now time.Time) bool {
					if s.SuspendedUntil.IsZero() || now.Before(s.SuspendedUntil) {
						return false
					}
					s.SuspendedUntil, s.Reason = time.Time{}, ""
					return true
				},
				after: func(b, a DestState) {
					t.transition(d.name, "suspension", "suspended until "+b.SuspendedUntil.Format(time.RFC3339), "active", "suspension ended")
					if a.BreakerAt(a.UpdatedAt) == BreakerClosed {
						t.recovered(d, a, "suspension ended")
					}
				}})
		}
		if s.Recover && d.pending&pendRecover == 0 {
			d.pending |= pendRecover
			t.enqueue(op{d: d, change: "resume", flag: pendRecover,
				fn: func(s *DestState, _ time.Time) bool {
					if !s.Recover {
						return false
					}
					s.Recover = false
					return true
				},
				after: func(b, a DestState) {
					if !a.Suspended(a.UpdatedAt) && a.BreakerAt(a.UpdatedAt) == BreakerClosed {
						t.recovered(d, a, "resumed by "+b.UpdatedBy)
					}
				}})
		}
		if d.hasState && d.rev != 0 && s.idle(now) && now.Sub(s.UpdatedAt) > t.cfg.stateIdleTTL && d.pending&pendForget == 0 {
			d.pending |= pendForget
			t.enqueue(op{d: d, change: "forget", flag: pendForget, forget: d.rev})
		}
		if !t.cfg.NoLearn {
			t.decayLearned(d, now)
		}
		has := d.hasState
		d.mu.Unlock()
		if has {
			t.m.set(d.name, s, s.BreakerAt(now), s.Suspended(now))
		}
	}
	t.m.live.Set(float64(t.liveCount()))
}

// evictIdle forgets destinations with no state and no recent use.
func (t *Throttle) evictIdle(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, d := range t.dests {
		d.mu.Lock()
		if !d.hasState && d.inflight == 0 && d.ownFlight == 0 && d.waiting(now) == 0 && d.pending == 0 && now.Sub(d.lastUsed) > idleEvict {
			d.evicted = true
			delete(t.dests, name)
		}
		d.mu.Unlock()
	}
}
