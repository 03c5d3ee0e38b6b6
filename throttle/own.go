package throttle

import (
	"context"
	"time"
)

// A domain's own limits inside a provider group.
//
// A domain folded into a provider group (a.test, whose MX hosts are
// Google's, in the google group) is admitted in the group's budget and
// state: its throttles cut the group's rate, its attempts count against
// the group's connections. An operator may still set limits on the
// domain by itself, as on any destination: a suspension (`dest suspend
// a.test`), a rate pin (`dest rate a.test --max 1`), a connection limit
// (SetConns), of the domain as a whole or from one egress address
// (`dest suspend a.test@192.0.2.10`). Those hold for that domain's mail
// on top of the group's, as KumoMTA's per-domain queue limits do beside
// the shaping of the site (the MX group) the queue delivers to: an
// attempt takes a place among the domain's own connections and a token
// of its own pin first, then the group's token and connection, as any
// of the group's mail does. The rest of the group is not slowed. Before,
// they were stored, listed and printed as in force, and admission read
// the group's state alone: only a suspension of the whole domain held.
//
// Only what was set on the domain counts, never its configured limits
// (the defaults: a domain with a [destinations."…"] table of its own is
// never folded into a group) nor what it learned while it was its own
// destination (a failed MX lookup leaves it so for a minute): those are
// not about the group's servers.
//
// The domain's token is waited for on its own (up to MaxWait), before
// the group's is reserved: a group token reserved for a turn as far
// ahead as the domain's pin spaces them would hold every other domain's
// mail in the group behind it.

// ownLimits are the limits set on a domain by itself in its state s at
// now: the fleet rate of a pin (times its factor, 1 unless a rule or cut
// wrote one), msgs/s, and the fleet connection override; 0 = none.
func ownLimits(s DestState, now time.Time) (rate float64, conns int) {
	if ov, ok := s.rateOverride(now); ok {
		rate = ov * s.RateFactor()
	}
	conns, _ = s.connsOverride(now)
	return rate, conns
}

// ownHold is an admission's place under one domain's own limits: its
// place in flight, and the turn its token was taken for (zero: no pin)
// at the bucket generation gen.
type ownHold struct {
	d   *dest
	at  time.Time
	gen uint64
}

// lookDest is the dest of name on this worker if it has one (every
// destination with shared state has), without creating it.
func (t *Throttle) lookDest(name string) *dest {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.dests[name]
}

// admitOwn takes the places of an admission of tenant's mail under the
// limits set on its domain by itself (up.domain, and up.pair from a
// source), waiting for their tokens up to MaxWait. It returns the holds to
// give back when the attempt is done (or refused further on), or the
// refusal of the first limit that stops it: "conns", or "rate" with the
// tenant's place in that domain's virtual queue.
func (t *Throttle) admitOwn(ctx context.Context, up above, tenant string) ([]ownHold, Refusal, bool) {
	var holds []ownHold
	for _, name := range [...]string{up.domain, up.pair} {
		if name == "" {
			continue
		}
		d := t.lookDest(name)
		if d == nil {
			continue
		}
		h, r, ok := t.holdOwn(d, tenant)
		if !ok {
			t.releaseOwn(holds, true)
			return nil, r, false
		}
		if h.d != nil {
			holds = append(holds, h)
		}
	}
	for {
		var last time.Time
		for _, h := range holds {
			last = laterOf(last, h.at)
		}
		wait := last.Sub(t.now())
		if wait <= 0 {
			return holds, Refusal{}, true
		}
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			t.releaseOwn(holds, true)
			return nil, Refusal{Until: t.now(), Reason: "canceled"}, false
		}
		// A pin lowered while it waited: a new turn at the new spacing,
		// or a refusal when that is beyond MaxWait, as for the group's
		// rate (Throttle.admit).
		for i := range holds {
			if r, ok := t.rewaitOwn(&holds[i], tenant); !ok {
				t.releaseOwn(append(holds[:i:i], holds[i+1:]...), true)
				return nil, r, false
			}
		}
	}
}

// holdOwn is admitOwn's place under d's own limits; a zero hold when d
// has none in force.
func (t *Throttle) holdOwn(d *dest, tenant string) (ownHold, Refusal, bool) {
	now := t.now()
	live := t.liveCount()
	d.mu.Lock()
	defer d.mu.Unlock()
	rate, conns := ownLimits(d.state, now)
	if rate <= 0 && d.bucket.rate > 0 {
		d.bucket = bucket{gen: d.bucket.gen + 1} // the pin is gone: a later one starts afresh
	}
	if rate <= 0 && conns <= 0 {
		return ownHold{}, Refusal{}, true
	}
	d.lastUsed = now
	if c := shareConns(conns, live); c > 0 && d.ownFlight >= c {
		return ownHold{}, Refusal{Until: now.Add(connsRetry), Reason: "conns"}, false
	}
	var at time.Time
	if rate > 0 {
		var r Refusal
		var ok bool
		if at, r, ok = t.ownTurn(d, tenant, rate, live, now); !ok {
			return ownHold{}, r, false
		}
	}
	d.ownFlight++
	d.lastSent = laterOf(d.lastSent, laterOf(now, at))
	return ownHold{d: d, at: at, gen: d.bucket.gen}, Refusal{}, true
}

// ownTurn reserves this worker's next token of d's own pin (rate, fleet
// msgs/s) on the pin's epoch grid, as for a configured rate (slots.go), or
// refuses "rate" with tenant's place in d's virtual queue when the turn
// lies beyond MaxWait. The queue reaches a horizon ahead at most
// (parking): a pin is the operator's for a while, and places far ahead
// at its spacing would hold the mail back once it is cleared. d.mu held.
func (t *Throttle) ownTurn(d *dest, tenant string, rate float64, live int, now time.Time) (time.Time, Refusal, bool) {
	d.setShare(now, rate/float64(live))
	due := d.bucket.reserve(now)
	off, _ := t.ClockOffset()
	k := turn{rate: rate, n: live, r: int(t.rank.Load()) % live, offset: off}
	at := k.next(laterOf(due, d.lastTurn.Add(time.Nanosecond)))
	if at.Sub(now) > t.cfg.MaxWait {
		d.bucket.refund(due)
		return time.Time{}, Refusal{Until: d.slot(tenant, at, now, rate, t.weight, parkHorizon), Reason: "rate"}, false
	}
	if at.After(d.lastTurn) {
		d.lastTurn = at
		d.bucket.spend(at)
	}
	return at, Refusal{}, true
}

// rewaitOwn asks a hold whose turn has come again: when d's pin went down
// meanwhile (its bucket's generation moved), the turn was given at the
// old spacing, and it takes a new one at the new, or is refused when that
// lies beyond MaxWait (its place in flight given back); a pin cleared
// meanwhile waits no more.
func (t *Throttle) rewaitOwn(h *ownHold, tenant string) (Refusal, bool) {
	now := t.now()
	live := t.liveCount()
	d := h.d
	d.mu.Lock()
	defer d.mu.Unlock()
	rate, _ := ownLimits(d.state, now)
	if rate <= 0 {
		h.at = time.Time{}
		return Refusal{}, true
	}
	d.setShare(now, rate/float64(live))
	if h.at.IsZero() || d.bucket.gen == h.gen {
		return Refusal{}, true
	}
	at, r, ok := t.ownTurn(d, tenant, rate, live, now)
	if !ok {
		d.ownFlight--
		return r, false
	}
	h.at, h.gen = at, d.bucket.gen
	d.lastSent = laterOf(d.lastSent, at)
	return Refusal{}, true
}

// releaseOwn gives back the places of holds: when the attempt is done,
// or, with unused, when it was refused before it went out, and then the
// tokens too.
func (t *Throttle) releaseOwn(holds []ownHold, unused bool) {
	for _, h := range holds {
		h.d.mu.Lock()
		h.d.ownFlight--
		if unused && !h.at.IsZero() {
			h.d.bucket.refund(h.at)
		}
		h.d.mu.Unlock()
	}
}
