package throttle

import (
	"time"
)

// DestStatus is a destination as this worker applies it. As JSON it is
// what every worker answers to `outflow dest status` over NATS, and what
// that command prints with --json (plus "worker_id").
type DestStatus struct {
	Dest          string    `json:"dest"`                     // destination (domain or group)
	Limits        Limits    `json:"limits"`                   // configured limits
	Factor        float64   `json:"factor"`                   // adaptive rate factor in (0, 1]
	FleetRate     float64   `json:"fleet_rate"`               // effective fleet rate: configured (or override) × factor, msgs/s; 0 = unlimited
	WorkerRate    float64   `json:"worker_rate"`              // this worker's share of FleetRate, msgs/s; 0 = unlimited
	Share         float64   `json:"share"`                    // this worker's share: 1/LiveWorkers
	LiveWorkers   int       `json:"live_workers"`             // live workers, this one included
	FleetConns    int       `json:"fleet_conns"`              // effective fleet connection limit (override or configured); 0 = unlimited
	WorkerConns   int       `json:"worker_conns"`             // this worker's share of FleetConns; 0 = unlimited when FleetConns is 0, else none (its place is past the limit)
	InFlight      int       `json:"in_flight"`                // this worker's deliveries in progress
	FirstWindow   int       `json:"first_window,omitempty"`   // this worker's first-contact window, attempts in flight, while the rate is unknown; 0 = not in use
	Deferred      int       `json:"deferred"`                 // envelopes this worker deferred for the rate that are not yet due (estimated from its virtual queue)
	Breaker       string    `json:"breaker"`                  // closed, open or half-open
	BreakerUntil  time.Time `json:"breaker_until,omitzero"`   // end of the open breaker's cooling period
	RateSource    string    `json:"rate_source"`              // where FleetRate comes from: pinned, learned, configured or unlimited
	LearnedRate   float64   `json:"learned_rate"`             // fleet rate learned from throttles, msgs/s; 0 = unknown
	LearnedConns  int       `json:"learned_conns"`            // fleet connections learned from throttles; 0 = unknown
	LearnedSince  time.Time `json:"learned_since,omitzero"`   // when a limit was first learned
	LearnedReason string    `json:"learned_reason,omitempty"` // why the learned rate last changed
	Suspended     bool      `json:"suspended"`                // suspended now
	SuspendedTill time.Time `json:"suspended_till,omitzero"`  // end of the suspension
	State         DestState `json:"state"`                    // the shared state as last seen, normalized
}

// Snapshot reports a destination (a domain or group name, not resolved
// through Group) as this worker applies it now.
func (t *Throttle) Snapshot(name string) DestStatus {
	name = NormalizeDest(name)
	now := t.now()
	live := t.liveCount()
	t.mu.RLock()
	d := t.dests[name]
	t.mu.RUnlock()
	st := DestStatus{Dest: name, Limits: t.limitsOf(name), LiveWorkers: live, Share: 1 / float64(live)}
	s := DestState{Dest: name}
	if d != nil {
		d.mu.Lock()
		s = d.state
		st.InFlight = d.inflight
		if d.window < windowOpen {
			st.FirstWindow = d.window
		}
		st.Deferred = d.waiting(now)
		d.mu.Unlock()
	}
	st.RateSource = t.rateSource(st.Limits, s, now)
	st.LearnedRate, st.LearnedConns, st.LearnedSince = s.LearnedRate, s.LearnedConns, s.LearnedSince
	st.LearnedReason = s.LearnedReason
	st.Factor = s.RateFactor()
	st.FleetRate = t.fleetRate(st.Limits, s, now)
	st.WorkerRate = st.FleetRate / float64(live)
	st.FleetConns = fleetConns(st.Limits, s, now)
	st.WorkerConns, _ = shareConns(st.FleetConns, live, t.place(name, live))
	st.Breaker, st.BreakerUntil = s.BreakerAt(now), s.BreakerUntil
	st.Suspended, st.SuspendedTill = s.Suspended(now), s.SuspendedUntil
	st.State = s.normalized()
	return st
}

// LimitsOf returns a destination's configured limits (the override or the
// defaults), e.g. for the sender's MaxMsgsPerConn.
func (t *Throttle) LimitsOf(dest string) Limits { return t.limitsOf(NormalizeDest(dest)) }

// Live returns the number of live workers, this one included.
func (t *Throttle) Live() int { return t.liveCount() }

// LearnHold returns the least time between two cuts of a learned limit:
// throttles closer together than that answer one overshoot.
func (t *Throttle) LearnHold() time.Duration { return t.cfg.LearnHold }
