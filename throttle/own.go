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
//
// The same holds for a destination sending from egress addresses. Its
// admissions are for (destination, source) pairs, each with its own state
// and the destination's configured limits, since providers limit per
// sending address; but a pin or a connection limit set on the whole
// destination (`dest rate gmail.com --max 5`, SetConns on gmail.com) is
// an operator's cap on what the destination gets, whatever address the
// mail leaves from, as Postfix's per-destination concurrency is per
// transport destination and KumoMTA's admin limit on a domain holds over
// its per-source queues. So the whole destination is one more level above
// the pair, held on the total from every source. Before, it was stored
// and printed as in force, and only a suspension of the whole destination
// held. Only what was set on it counts here too (ownLimits: a factor in
// its state multiplies its pin, as any pin's): its configured limits are
// each pair's, and a rate it learned and its breaker are those of mail
// sent without a source, not about the pairs.
//
// The levels, in the order an admission takes them (each one's place in
// flight first, then its token; Throttle.Admit):
//
//  1. the domain by itself, when it is one of a provider group's (a.test),
//     and that domain from the source (a.test@SOURCE): their tokens are
//     reserved together and waited for, since both hold back a.test's
//     mail only;
//  2. the whole destination, for an admission from a source: the group
//     (google) or the domain (gmail.com), its token reserved only once
//     the domain's has come, for the reason above: it is shared by every
//     domain and every source of the destination;
//  3. the destination's own state, the pair (google@SOURCE), with its own
//     limits, learned rate, breaker and virtual queue (Throttle.admit).
//
// Each level locks its own mutex alone, never two at once, and a
// connection limit refuses at once instead of waiting for a place, so
// admissions waiting at different levels cannot wait for each other: a
// wait is for a token's time only, at most MaxWait a level. An admission
// refused at a level gives back the places and the tokens it took at the
// levels before (releaseOwn), and those tokens go to the next admission
// as if they had not been taken: a pair suspended, or with its own
// connections full, does not spend the whole destination's pin on mail it
// does not send.

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

// OwnLimits are the limits set on the destination by an operator or a
// rule in its state s at now (see ownLimits): what holds, above its own
// state, for one domain of a provider group and for the total of a
// destination's (destination, source) pairs. `dest status` prints them.
func (s DestState) OwnLimits(now time.Time) (rate float64, conns int) {
	return ownLimits(s, now)
}

// ownHold is an admission's place under one level's own limits: its
// place in flight, and the turn its token was taken for (zero: no pin)
// at the bucket generation gen. prevTurn and prevSent are the dest's
// lastTurn and lastSent before the hold moved them (to at, and sent), so
// that a hold given back unused puts them back while they are still its
// own: the next admission may then take the same turn.
type ownHold struct {
	d                  *dest
	at                 time.Time
	gen                uint64
	sent               time.Time
	prevTurn, prevSent time.Time
}

// lookDest is the dest of name on this worker if it has one (every
// destination with shared state has), without creating it.
func (t *Throttle) lookDest(name string) *dest {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.dests[name]
}

// admitAbove takes the places of an admission of tenant's mail at the
// levels above its destination's own state (up), in the order the file's
// comment gives: the domain by itself and from the source, then the whole
// destination. It returns the holds to give back when the attempt is done
// (or refused further on), or the refusal of the first level that stops
// it, with what the levels before it took given back.
func (t *Throttle) admitAbove(ctx context.Context, up above, tenant string) ([]ownHold, Refusal, bool) {
	holds, r, ok := t.admitOwn(ctx, tenant, up.domain, up.pair)
	if !ok {
		return nil, r, false
	}
	whole, r, ok := t.admitOwn(ctx, tenant, up.dest)
	if !ok {
		t.releaseOwn(holds, true)
		return nil, r, false
	}
	return append(holds, whole...), Refusal{}, true
}

// admitOwn takes the places of an admission of tenant's mail under the
// limits set on each of names by itself ("" skipped), waiting for their
// tokens together, up to MaxWait. It returns the holds to give back when
// the attempt is done (or refused further on), or the refusal of the
// first limit that stops it: "conns", or "rate" with the tenant's place
// in that level's virtual queue; the holds taken before it are given
// back.
func (t *Throttle) admitOwn(ctx context.Context, tenant string, names ...string) ([]ownHold, Refusal, bool) {
	var holds []ownHold
	for _, name := range names {
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
	if c, limited := shareConns(conns, live, t.place(d.name, live)); limited && d.ownFlight >= c {
		return ownHold{}, Refusal{Until: now.Add(connsRetry), Reason: "conns"}, false
	}
	var at time.Time
	prevTurn := d.lastTurn
	if rate > 0 {
		var r Refusal
		var ok bool
		if at, r, ok = t.ownTurn(d, tenant, rate, live, now); !ok {
			return ownHold{}, r, false
		}
	}
	d.ownFlight++
	h := ownHold{d: d, at: at, gen: d.bucket.gen, prevTurn: prevTurn, prevSent: d.lastSent}
	d.lastSent = laterOf(d.lastSent, laterOf(now, at))
	h.sent = d.lastSent
	return h, Refusal{}, true
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
	// The old turn went with the cut (the bucket restarted its chain);
	// what a refund would put back is the new one's.
	prevTurn, prevSent := d.lastTurn, d.lastSent
	at, r, ok := t.ownTurn(d, tenant, rate, live, now)
	if !ok {
		d.ownFlight--
		return r, false
	}
	h.at, h.gen, h.prevTurn, h.prevSent = at, d.bucket.gen, prevTurn, prevSent
	d.lastSent = laterOf(d.lastSent, at)
	h.sent = d.lastSent
	return Refusal{}, true
}

// releaseOwn gives back the places of holds: when the attempt is done,
// or, with unused, when it was refused before it went out, and then the
// tokens too. A token is given back whole while it is still the latest
// taken at its level: the bucket's reservation, the turn on the grid
// (lastTurn: the next admission takes this worker's first turn after it,
// n slots on with n live workers) and the send it counted as (lastSent:
// a chain the refund emptied starts again one period after it,
// bucket.startAfter). Refunding the bucket alone left both: the next
// admission, from another address at the same moment, waited a period of
// the pin for mail that was never sent, or was refused "rate" when that
// was beyond MaxWait. When a later admission has moved them on, they
// stay; that errs on the slow side, as bucket.refund does.
func (t *Throttle) releaseOwn(holds []ownHold, unused bool) {
	for _, h := range holds {
		d := h.d
		d.mu.Lock()
		d.ownFlight--
		if unused {
			if !h.at.IsZero() {
				d.bucket.refund(h.at)
				if d.lastTurn.Equal(h.at) {
					d.lastTurn = h.prevTurn
				}
			}
			if d.lastSent.Equal(h.sent) {
				d.lastSent = h.prevSent
			}
		}
		d.mu.Unlock()
	}
}
