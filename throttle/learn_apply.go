package throttle

import (
	"math"
	"strconv"
	"time"

	"github.com/outflow/outflow/classify"
)

// This file applies the learning math of learn.go to a Throttle's
// destinations: the cuts and steps as shared-state transitions, the
// fleet's observed rate and concurrency, the per-tenant virtual queue,
// and pacing of throttled envelopes.

// weight is a tenant's weight in a destination's virtual queue.
func (t *Throttle) weight(tenant string) float64 {
	if w, ok := t.cfg.TenantWeights[tenant]; ok {
		return w
	}
	return 1
}

// slot gives one envelope of tenant its place in d's virtual queue and
// returns it: at the earliest at, after the tenant's envelopes already
// waiting. The tenant's end then moves on by one interval of its share of
// fleet: weight(tenant) over the weights of every tenant with envelopes
// waiting. Each tenant's queue therefore drains at its fair share, and a
// tenant that comes to a destination with a long backlog of another
// tenant's mail waits for its own few envelopes only. d.mu held.
func (d *dest) slot(tenant string, at, now time.Time, fleet float64, weight func(string) float64, horizon time.Duration) time.Time {
	return slotIn(&d.vq, &d.park, tenant, at, now, fleet, weight, horizon)
}

// slotIn is slot over one virtual queue: its tails by tenant and its
// parking. at is the earliest place (at least now).
func slotIn(tails *map[string]vqTail, park *parking, tenant string, at, now time.Time, fleet float64, weight func(string) float64, horizon time.Duration) time.Time {
	if *tails == nil {
		*tails = map[string]vqTail{}
	}
	vq := *tails
	own := weight(tenant)
	total := own
	for other, q := range vq {
		if !q.end.After(now) {
			delete(vq, other)
			continue
		}
		if other != tenant {
			total += weight(other)
		}
	}
	if at.Before(now) {
		at = now
	}
	q := vq[tenant]
	until := q.end
	if until.Before(at) {
		until = at
	}
	if horizon > 0 && until.Sub(at) > park.horizon(now, horizon) {
		return park.place(at)
	}
	q.every = time.Duration(float64(time.Second) * total / (own * fleet))
	q.end = until.Add(q.every)
	vq[tenant] = q
	return until
}

// parking holds what a virtual queue at a learned rate does not take.
//
// A place in the queue is a fixed time, computed at the rate of the
// moment. A learned rate climbs, so places far ahead would hold mail back
// long after the rate allows it. A destination whose rate is learned
// therefore queues only a horizon ahead; an envelope beyond it is parked:
// told to come back between one and two horizons from now, spread evenly,
// without taking a place, and asks again then. The horizon starts at
// parkHorizon and doubles while more than parkBudget envelopes a second
// are parked (a long backlog), so re-asking costs a bounded number of
// reschedules whatever the backlog; it halves again when parking is rare.
type parking struct {
	h     time.Duration // current horizon; 0 until first used
	since time.Time     // start of the current count
	n     int           // parked since then
	seq   uint64        // spreads the parked over the next horizon
}

const (
	parkHorizon    = 5 * time.Second
	parkMaxHorizon = 10 * time.Minute
	parkBudget     = 200 // parked envelopes per second before the horizon doubles
)

// horizon adapts and returns the current horizon (base at least).
func (p *parking) horizon(now time.Time, base time.Duration) time.Duration {
	if p.h < base {
		p.h, p.since, p.n = base, now, 0
	}
	if el := now.Sub(p.since); el >= p.h {
		perSec := float64(p.n) / el.Seconds()
		switch {
		case perSec > parkBudget && p.h < parkMaxHorizon:
			p.h *= 2
		case perSec < parkBudget/4 && p.h > base:
			p.h = max(base, p.h/2)
		}
		p.since, p.n = now, 0
	}
	return p.h
}

// place parks one envelope: between one and two horizons after from,
// spread by the golden ratio so consecutive envelopes do not return
// together.
func (p *parking) place(from time.Time) time.Time {
	p.n++
	p.seq++
	frac := float64(p.seq*11400714819323198485>>11) / (1 << 53)
	return from.Add(p.h + time.Duration(frac*float64(p.h)))
}

// tenantActive is how long after its last admission a tenant counts as
// sending to a destination, for the fair share.
const tenantActive = 2 * time.Second

// seen records that tenant asked for d now; d.mu held.
func (d *dest) seen(tenant string, now time.Time) {
	if d.tenants == nil {
		d.tenants = map[string]time.Time{}
	}
	d.tenants[tenant] = now
	if len(d.tenants) > 64 { // forget the quiet ones now and then
		for k, at := range d.tenants {
			if now.Sub(at) > tenantActive {
				delete(d.tenants, k)
			}
		}
	}
}

// overShare reports whether tenant has had more than its share of d for
// the moment, and the next token should go to another tenant sending to
// d now. A tenant is sending while it asks for admission (within
// tenantActive) and while it has envelopes waiting for their places in
// the virtual queue: those may be further off than tenantActive, and the
// tokens must still be free when they come back. Against such another
// tenant of the same weight, it is over its share when its backlog in d's
// virtual queues, or its turns given to admissions waiting in process,
// reach further ahead (by more than a second) than the other's: a tenant
// with a few messages goes before a campaign. Against one of another
// weight, when
//
//   - the other has a backlog too, and the turns this one was given reach
//     further ahead at its weighted share (serve) by more than a second
//     than the other's: the weights' split between two backlogs; or
//   - its backlog reaches further ahead as above, each weighed by its
//     tenant's weight over the mean of the two (weighed: the envelopes,
//     not their spacing, are compared), and the other is not ahead of it
//     by the first test.
//
// The backlog alone takes no weight: the admissions of two tenants with
// backlogs went to whichever asked when a turn was within max-wait, and
// the work lane hands their envelopes out in equal turns, so a tenant
// weighing 3 had 45 to 50 % of them. Compared unweighed, a lighter
// tenant's places, spaced wider, reach further ahead: at a configured
// rate it yielded nearly every token (TestTenantWeightsShareABusyDestination).
// Tenants of one weight keep the backlog test, without the turns' test
// (it had two backlogs yield to a third tenant's message waiting for its
// turn, and leave turns untaken: a sixth of them with a message every
// 0.7 s), but only against another that was not given more turns: a
// tenant whose envelopes were parked in the virtual queue reaches further
// ahead than one whose backlog waits in the work lane (its 32 slots
// count, a period each), yielded each time its envelopes came back, and
// each yield parked them further ahead: one of two tenants with 1,500
// messages each had none of 395 deliveries in 20 s
// (TestEqualTenantsShareWhereverTheirBacklogsWait).
//
// A tenant that is only sending by its last admission (nothing of its
// own waiting, in process or in the virtual queue) takes no token due
// within yieldLead (tokenNear): its next message comes when it comes,
// and a yield gains it at most that period, while the token goes untaken
// unless another envelope asks before it is due. A yield then counts only
// when the destination is booked further ahead. With weights, the
// backlogs' mail goes to the virtual queue (the lighter tenant's
// refusals by the turns' test take its work lane there) and comes back
// at its places, spaced to add up to the rate: no envelope asks between
// them, and each place yielded was a token lost. The backlogs of 3:1
// with a third tenant's message every 0.7 s refused some 1,000
// admissions in 7.5 s for it while it had nothing waiting, and 12 to 15 %
// of the rate went untaken (TestTenantWeightsShareABusyDestination). d.mu held.
func (d *dest) overShare(tenant string, now time.Time, weight func(string) float64) bool {
	mine, myTurns, w := d.ahead(tenant, now), d.servedAhead(tenant, now), weight(tenant)
	for other, at := range d.tenants {
		if other == tenant {
			continue
		}
		theirs := d.ahead(other, now)
		if theirs <= 0 && (now.Sub(at) > tenantActive || d.tokenNear(now)) {
			continue // not sending, or nothing of theirs could take the token
		}
		ow := weight(other)
		theirTurns := d.servedAhead(other, now)
		if ow == w {
			// Equal weights: the backlogs, unless the other was given
			// more turns (see above).
			if mine > time.Second && theirs+time.Second < mine && theirTurns <= myTurns {
				return true
			}
			continue
		}
		if theirs > 0 && myTurns > theirTurns+time.Second {
			return true
		}
		m, o := weighed(mine, w, ow), weighed(theirs, ow, w)
		if m > time.Second && o+time.Second < m && theirTurns <= myTurns {
			return true
		}
	}
	return false
}

// tokenNear reports whether the token an admission asks overShare about
// is due within yieldLead of now (or one period of this worker's share,
// when that is longer): the bucket's latest reservation, which admit (and
// a waiting admission's new turn) reserves just before it asks. d.mu held.
//
// One period was the bound before: a token yielded is used only when
// another admission asks for it before it is due, and the refused mail
// comes back from the rate-limit lane in bunches (the lane's schedules
// fire about 250 ms apart), not one envelope a period. Whenever an
// admission waited in process for its turn the next token lay more than a
// period ahead, so every admission of a bunch but the first yielded it to
// a tenant with nothing waiting and was parked again: with a third
// tenant's message every second, the hunt's daemon delivered 8–9/s of a
// learned 20/s (TestTrickleKeepsALearnedRateBusy). The destination is now
// kept booked up to yieldLead ahead, longer than the lane's gaps, and the
// trickle's next message waits for those turns at most.
func (d *dest) tokenNear(now time.Time) bool {
	b := &d.bucket
	return b.rate > 0 && !b.last.IsZero() && b.last.Sub(now) <= max(b.period(), yieldLead)
}

// yieldLead: see tokenNear.
const yieldLead = time.Second

// weighed is a tenant's backlog reaching a ahead at weight w, against
// another's at weight o: a times w over the mean of the two. A tenant's
// places are spaced by its weight, so this compares the envelopes
// waiting; at equal weights it is a.
func weighed(a time.Duration, w, o float64) time.Duration {
	if w == o {
		return a
	}
	return time.Duration(float64(a) * 2 * w / (w + o))
}

// overShareWaiting is overShare asked for an admission of tenant's that
// is already waiting in process for its turn (counted in d.held, and in
// d.served by its turn's share, own): as a new admission would be asked,
// without counting itself. d.mu held.
func (d *dest) overShareWaiting(tenant string, now time.Time, own time.Duration, weight func(string) float64) bool {
	d.hold(tenant, -1)
	defer d.hold(tenant, 1)
	d.unserve(tenant, own)
	defer d.unserve(tenant, -own)
	return d.overShare(tenant, now, weight)
}

// serve counts one turn of d given to tenant at now: its served end
// moves on by one period of this worker's share of the rate over
// tenant's part of it, weight(tenant) over the weights of the tenants
// with a backlog in d (ahead; itself included). A tenant's served end is
// then as far ahead of now as the turns it was given would take at its
// weighted share; one that was given nothing for a while starts again
// from now, with no credit for the time it was quiet. It returns what
// the turn added, for unserve. d.mu held; the bucket has a rate.
func (d *dest) serve(tenant string, now time.Time, weight func(string) float64) time.Duration {
	own := weight(tenant)
	total := own
	for other := range d.tenants {
		if other != tenant && d.ahead(other, now) > 0 {
			total += weight(other)
		}
	}
	add := time.Duration(float64(d.bucket.period()) * total / own)
	if d.served == nil {
		d.served = map[string]time.Time{}
	}
	if len(d.served) > 64 { // forget the ones long past now and then
		for k, end := range d.served {
			if end.Before(now) {
				delete(d.served, k)
			}
		}
	}
	d.served[tenant] = laterOf(d.served[tenant], now).Add(add)
	return add
}

// unserve takes back what serve added for a turn of tenant's that was not
// used (a refused or cancelled admission). d.mu held.
func (d *dest) unserve(tenant string, add time.Duration) {
	if end, ok := d.served[tenant]; ok {
		d.served[tenant] = end.Add(-add)
	}
}

// servedAhead is how far ahead of now tenant's served end reaches (see
// serve); 0 when it does not. d.mu held.
func (d *dest) servedAhead(tenant string, now time.Time) time.Duration {
	return max(0, d.served[tenant].Sub(now))
}

// ahead is how far ahead tenant's part of d's virtual queues (refused and
// throttled mail) reaches, or its admissions waiting in process for their
// turns, one period of this worker's share each, whichever is further. The
// waiting count: a backlog need not be in the virtual queue. 32 delivery
// slots waiting for turns 1.6 s ahead at 20/s never reach max-wait, so a
// tenant whose mail fills every slot keeps the rest of its backlog on the
// work lane, and another tenant's mail got only every other token.
func (d *dest) ahead(tenant string, now time.Time) time.Duration {
	var a time.Duration
	if n := d.held[tenant]; n > 0 && d.bucket.rate > 0 {
		a = time.Duration(n) * d.bucket.period()
	}
	for _, vq := range []map[string]vqTail{d.vq, d.thr} {
		if q, ok := vq[tenant]; ok && q.end.Sub(now) > a {
			a = q.end.Sub(now)
		}
	}
	return a
}

// hold counts one more of tenant's admissions waiting in process for its
// turn, release one fewer. d.mu held for hold; release takes it.
func (d *dest) hold(tenant string, n int) {
	if d.held == nil {
		d.held = map[string]int{}
	}
	d.held[tenant] += n
	if d.held[tenant] <= 0 {
		delete(d.held, tenant)
	}
}

func (d *dest) release(tenant string) {
	d.mu.Lock()
	d.hold(tenant, -1)
	d.mu.Unlock()
}

// vqTail is the end of one tenant's part of a virtual queue, and the
// interval its last place was given at.
type vqTail struct {
	end   time.Time
	every time.Duration
}

// waiting estimates the envelopes in d's virtual queue that are not yet
// due; d.mu held.
func (d *dest) waiting(now time.Time) int {
	n := 0.0
	for _, vq := range []map[string]vqTail{d.vq, d.thr} {
		for _, q := range vq {
			if ahead := q.end.Sub(now); ahead > 0 && q.every > 0 {
				n += float64(ahead) / float64(q.every)
			}
		}
	}
	return int(n + 0.5)
}

// Pace gives an envelope that a throttled reply deferred its place in the
// destination's queue of throttled mail, in its tenant's share, when the
// destination has a rate (configured, pinned or learned): throttled mail
// then comes back at the destination's current rate, oldest first, instead
// of in waves on individual backoff timers. With a source, the queue is
// the (destination, source) pair's. The queue starts no earlier than
// earliest (the rate-limit lane's minimum delay: throttled mail still
// waits on the slower lane) and is kept apart from the queue of envelopes
// refused for the rate, so that fresh mail does not wait behind it. ok is
// false for a destination without a rate; the caller then uses the lane's
// backoff. by describes the rate for the decision record ("10.00/s
// learned").
func (t *Throttle) Pace(domain, tenant, source string, earliest time.Time) (at time.Time, by string, ok bool) {
	return t.paceDest(t.getDest(PairName(t.Group(domain), source)), tenant, earliest)
}

// paceDest is Pace for the destination (or pair) d.
func (t *Throttle) paceDest(d *dest, tenant string, earliest time.Time) (at time.Time, by string, ok bool) {
	now := t.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	fleet, source := t.effectiveRate(d.limits, d.state, now)
	horizon := t.horizon(d, now)
	if fleet <= 0 {
		if !learnsRate(!t.cfg.NoLearn, d.limits, d.state, now) {
			return time.Time{}, "", false
		}
		if d.seedPending(now) {
			// First contact: the throttle is one whose seed waits for
			// the rest of the burst (cutLearnedRate), and the rate comes
			// within milliseconds. Without a place the envelope took the
			// rate-limit lane's draw, up to a minute: one such message,
			// the last of 600, made a 35 s drain 60 s. It comes back at
			// the first-contact rate instead, and is admitted at the
			// learned rate by then.
			fleet, source = learnFirstContact, "first-contact"
		} else {
			// No rate is coming: a connection throttle teaches
			// learned_conns, never a rate, and the connection limit
			// paces the attempts. Paced at first contact's 1/s, the
			// backlog of a provider that capped connections drained
			// at 1/s for good, its places reaching as far ahead as
			// it did, while the provider took 10/s. It comes back at
			// the rate the fleet is delivered at.
			observed, _ := t.observedRate(d, now)
			if observed <= 0 {
				return time.Time{}, "", false // nothing delivered: the lane's backoff
			}
			fleet, source = observed, "delivered"
		}
		// Either rate is of the moment: the queue reaches only a horizon
		// ahead.
		horizon = parkHorizon
	}
	first := now.Add(time.Duration(float64(time.Second) / fleet))
	if first.Before(earliest) {
		first = earliest
	}
	by = fmtPerSec(fleet) + " " + source
	return slotIn(&d.thr, &d.thrPark, tenant, first, now, fleet, t.weight, horizon), by, true
}

// seedPending reports whether a rate throttle at first contact waits for
// its seed at now (cutLearnedRate): held back for another worker's seed
// (deferred), or come within learnMinElapsed of the burst's start, while
// the rest of the burst was in flight, no longer than learnMinElapsed
// ago. A connection throttle seeds no rate, and never waits for one.
// d.mu held.
func (d *dest) seedPending(now time.Time) bool {
	if d.state.LearnedRate > 0 {
		return false
	}
	if d.deferred != nil {
		return true
	}
	return !d.lastThr.Before(d.burstFrom) && d.lastThr.Sub(d.burstFrom) < learnMinElapsed && now.Sub(d.lastThr) < learnMinElapsed
}

// horizon is how far ahead d's virtual queue gives places: parkHorizon
// and up (see parking) while the rate in force is one that climbs back by
// itself: a learned rate, any rate cut by a factor (it ramps back), and a
// pin with an end. Unbounded for a configured rate at its full factor and
// a pin until changed: they stay. (Places given at a factor's cut kept
// its spacing after the ramp: 10,000 envelopes refused at 10/s cut to
// 0.5/s, the factor's floor, had places 2 s apart reaching 5.5 hours
// ahead, and came back at 0.5/s for hours after the factor was 1 again,
// less than three minutes later.) d.mu held.
func (t *Throttle) horizon(d *dest, now time.Time) time.Duration {
	s := &d.state
	switch t.rateSource(d.limits, *s, now) {
	case "learned":
		return parkHorizon
	case "pinned":
		if !s.RateUntil.IsZero() {
			return parkHorizon
		}
	}
	if s.RateFactor() < 1 {
		return parkHorizon
	}
	return 0
}

// learnedLimit is one of a destination's learned limits (the rate or the
// connection limit) as the cuts and steps that change it name it.
type learnedLimit struct {
	name string                              // "learned-rate": the change's name in logs and metrics
	flag uint8                               // its pending bit
	show func(DestState) (value, why string) // the limit as logged, and why it last changed
}

var (
	learnedRate = learnedLimit{"learned-rate", pendLearn, func(s DestState) (string, string) {
		return fmtLearned(s.LearnedRate), s.LearnedReason
	}}
	learnedConns = learnedLimit{"learned-conns", pendLearnConn, func(s DestState) (string, string) {
		return strconv.Itoa(s.LearnedConns), s.LearnedConnsReason
	}}
)

// changeLearned queues fn, a "cut" or a "step" of l, for the shared state
// and reports the change once it is written. d.mu held.
func (t *Throttle) changeLearned(d *dest, l learnedLimit, kind string, fn func(*DestState, time.Time) bool) {
	d.pending |= l.flag
	t.enqueue(op{d: d, change: l.name + "-" + kind, flag: l.flag, fn: fn, after: func(b, a DestState) {
		before, _ := l.show(b)
		after, why := l.show(a)
		t.learnedChanged(d, l.name, before, after, why, a)
	}})
}

// learning is the learning math's configuration for this worker now. A
// worker alone in the fleet follows no grid (slots.go), so a change of the
// learned rate starts its segment at once rather than a MaxWait ahead.
func (t *Throttle) learning() learnConfig {
	lc := t.cfg.learn()
	if t.liveCount() <= 1 {
		lc.ahead, lc.cutAhead = 0, 0
	}
	return lc
}

// cutLearnedRate seeds or cuts d's learned rate after a throttled reply to
// the attempt of p (its turn, and the last cut its worker knew of when
// it reserved it), with drained the fleet's delivered rate between
// throttles (drainedRate). d.mu held.
func (t *Throttle) cutLearnedRate(d *dest, now time.Time, why classify.Result, p *permit, drained float64) {
	observed, thin := t.observedRate(d, now)
	if observed > 0 {
		d.quietSince = time.Time{}
	} else if d.quietSince.IsZero() && d.state.LearnedRate > 0 {
		d.quietSince, d.quietTotal = now, d.delivered.total
	}
	if d.state.LearnedRate <= 0 && now.Sub(d.burstFrom) < learnMinElapsed && (observed == 0 || thin) {
		// The first reply of a burst is a throttle while the rest of the
		// burst is still in flight: their replies say what the provider
		// took, so the seed waits for them (at most learnMinElapsed into
		// the burst) rather than falling to learnFirstContact.
		if d.inflight > 0 {
			return
		}
		// With several workers the rest of the burst is the others'
		// (each starts with one attempt in flight, and widens by one per
		// delivery): a worker with more deliveries seeds from them at its
		// own throttle, a few milliseconds on. This one sends nothing for
		// windowRetry and then seeds from what it has, unless a seed came
		// meanwhile (deferredSeed, applied by seedDeferred). Two daemons
		// seeded from one worker's first delivery or none (1/s, or 2.5/s
		// under a 20/s limit whose burst took four at once), doubled for
		// 15 to 20 s, one doubling every 5 s, and drained in 1.4 times
		// the ideal where the other runs took 1.05 to 1.14. (Probing
		// again after the wait instead cost two daemons under a 2/s limit
		// an extra round of throttles: 11.7 % of replies against 6.7.)
		if t.liveCount() > 1 {
			d.deferred = &deferredSeed{until: now.Add(windowRetry), observed: observed, why: why}
			return
		}
	}
	t.seedOrCut(d, now, observed, drained, why, p)
}

// deferredSeed is a seed a worker holds back until until, while another
// worker's could come (cutLearnedRate); the first-contact window takes no
// attempt meanwhile.
type deferredSeed struct {
	until    time.Time
	observed float64
	why      classify.Result
}

// seedDeferred settles d's deferred seed, if any, for an admission at now
// with fleet the destination's rate: dropped when a seed came meanwhile,
// applied once its wait is over. It returns the rate then, and whether the
// seed still waits. d.mu held.
func (t *Throttle) seedDeferred(d *dest, now time.Time, fleet float64) (float64, bool) {
	s := d.deferred
	switch {
	case s == nil:
		return fleet, false
	case fleet > 0:
		d.deferred = nil
		return fleet, false
	case now.Before(s.until):
		return fleet, true
	}
	d.deferred = nil
	t.seedOrCut(d, now, s.observed, 0, s.why, nil)
	return t.fleetRate(d.limits, d.state, now), false
}

// seedOrCut seeds or cuts d's learned rate on a throttle (cutLearnedRate)
// of p's attempt (nil: a deferred seed's), with observed the fleet's
// delivered rate over the learning window and drained between throttles.
// d.mu held.
func (t *Throttle) seedOrCut(d *dest, now time.Time, observed, drained float64, why classify.Result, p *permit) {
	lc, ceiling, reply := t.learning(), d.limits.Rate, learnedWhy(why)
	var sent, cutSeen time.Time
	if p != nil {
		sent, cutSeen = p.sent, p.cutSeen
	}
	t.cutLearned(d, now, learnedRate, func(s *DestState, now time.Time) bool {
		// Applied again to the shared state, where another worker's cut
		// may have come since.
		return lc.cutRate(s, now, observed, drained, ceiling, reply, s.pacedAt(sent, cutSeen))
	})
}

// pacedAt reports whether a throttled attempt, which reserved its turn
// when cutSeen was the last cut its worker knew of and went out at sent,
// was paced at the learned rate in s: that cut is the last one (a worker
// that had not seen another's seed yet sent at no rate at all), and the
// attempt went out on the cut's grid segment. With several workers the
// segment starts gridReach after the cut, and until then each worker
// takes its fewer turns on the old, finer grid, where two workers' turns
// can fall one old slot apart: a throttle of such a pair says nothing of
// the new rate, and cutting for it ratcheted two daemons under a 6/s
// limit from 8/s down to 2.5/s in three seconds.
//
// It is the turn that must fall on the segment, not the reservation,
// which comes up to max-wait before it. Judged by the reservation, no
// throttle after a cut counted as paced until the hold ran out, 3 s in a
// fleet: two daemons under a bucket of 20 at 0.5/s sent at each rate of
// first contact's halvings, the seed's 40/s first, for 3 s after they had
// cut it (85 throttle replies for 60 messages; 47 judged by the turn).
func (s DestState) pacedAt(sent, cutSeen time.Time) bool {
	if s.LearnedRate <= 0 || cutSeen.IsZero() || !cutSeen.Equal(s.LearnedCutAt) {
		return false
	}
	return len(s.Grid) == 0 || !sent.Before(s.Grid[len(s.Grid)-1].From)
}

// cutLearnedConns seeds or cuts d's learned connection limit after a "too
// many connections" reply to the attempt of p, admitted when its worker
// knew the cut whose hold is p.connsHold (cutConns' paced). d.mu held.
func (t *Throttle) cutLearnedConns(d *dest, now time.Time, why classify.Result, p *permit) {
	lc, inflight, ceiling, reply := t.learning(), t.fleetInflight(d, now), d.limits.Conns, learnedWhy(why)
	seen := p.connsHold
	t.cutLearned(d, now, learnedConns, func(s *DestState, now time.Time) bool {
		return lc.cutConns(s, now, inflight, ceiling, reply, !seen.IsZero() && seen.Equal(s.LearnedConnsHold))
	})
}

// cutLearned applies the cut fn of l first locally, then in the shared
// state (where the hold makes it one cut fleet-wide). Both at now, the
// throttle's time, not the write's a few milliseconds later: the cut's
// time (LearnedCutAt) is what tells the attempts paced at its rate from
// those admitted before it (cutRate). d.mu held.
func (t *Throttle) cutLearned(d *dest, now time.Time, l learnedLimit, fn func(*DestState, time.Time) bool) {
	if !fn(&d.state, now) {
		return // within the hold of a cut this worker has seen
	}
	t.changeLearned(d, l, "cut", func(s *DestState, _ time.Time) bool { return fn(s, now) })
}

// raiseLearned probes d's learned limits upward after a delivered attempt:
// one step per LearnEvery fleet-wide (the shared hold), only while the
// limit is what holds traffic back and no throttle came within LearnEvery.
// Not applied locally first: the watcher brings it back at once. The
// delivery of an attempt sent after the last cut of a block (sent) resumes
// the rate instead (resumeRate). d.mu held.
func (t *Throttle) raiseLearned(d *dest, now, sent time.Time) {
	s := &d.state
	quiet := d.quietSince
	d.quietSince = time.Time{}
	if !quiet.IsZero() && d.delivered.total == d.quietTotal+1 && now.Sub(quiet) >= resumeQuiet &&
		s.LearnedRunFrom > 0 && d.pending&pendLearn == 0 && !sent.Before(s.LearnedCutAt) {
		lc, ceiling := t.learning(), d.limits.Rate
		t.changeLearned(d, learnedRate, "resume", func(s *DestState, now time.Time) bool { return lc.resumeRate(s, now, ceiling) })
		// The spans between the block's throttles held no delivery: read
		// as a rate between throttles, they would cut the next probe's
		// throttle to what got through during the block.
		d.drains = drainMarks{}
		return
	}
	lc := t.learning().at(s.inForce(now))
	// The rate binds when this worker delivers at (nearly) its share of
	// the rate in force: a step is a test of that rate, and a rate the
	// traffic has not reached has not been tested, however the provider
	// answered. Neither an attempt that waited for its token (mail that
	// comes back in bunches waits, at any average) nor the peers' reports
	// (a heartbeat old) say so; paced mail, which returns on time and so
	// never waits, binds by its delivered rate like the rest.
	//
	// Nor does it bind while a live peer's share goes unused (idlePeer):
	// each worker paces its share, rate over live workers, so a worker
	// killed without a goodbye left a third of a 3-worker fleet's rate
	// untaken for the 15 s its record counted; the survivors' shares
	// looked binding, and the rate stepped from 11 to 14/s while the
	// fleet delivered 8/s, then met the provider's limit at 14/s when
	// the record expired.
	binding := func() bool {
		return d.delivered.sustainedRate(now, lc.every) >= learnBinding*s.inForce(now)/float64(t.liveCount()) &&
			!t.idlePeer(d, now, lc.every)
	}
	if s.LearnedRate > 0 && d.pending&pendLearn == 0 && !now.Before(s.LearnedHold) && !now.Before(s.LearnedNext) &&
		!s.atPlateau(now) && now.Sub(d.lastThr) >= lc.every && binding() {
		ceiling := d.limits.Rate
		t.changeLearned(d, learnedRate, "step", func(s *DestState, now time.Time) bool { return lc.raiseRate(s, now, ceiling) })
	}
	if ceiling := d.limits.Conns; d.pending&pendLearnConn == 0 && s.connsStepDue(now, ceiling) &&
		now.Sub(d.lastConnThr) >= lc.every && now.Sub(d.lastConnLim) <= lc.every {
		t.changeLearned(d, learnedConns, "step", func(s *DestState, now time.Time) bool { return lc.raiseConns(s, now, ceiling) })
	}
}

// idlePeer reports whether a live peer is taking no share of d's rate
// that the fleet's rate in force counts on: its heartbeat is overdue
// (half a heartbeat late: a worker gone without a goodbye, whose record
// counts until the registry's TTL ends it), or it reported no traffic to
// d in a heartbeat sent every or more after this worker's burst to d
// began (a report from before it may just predate the peer's first
// envelope). Its share then goes unused, and this worker's own share
// binding says nothing of the fleet's rate. d.mu held.
func (t *Throttle) idlePeer(d *dest, now time.Time, every time.Duration) bool {
	if t.cfg.Registry == nil {
		return false
	}
	overdue := t.cfg.Heartbeat + t.cfg.Heartbeat/2
	t.wmu.Lock()
	defer t.wmu.Unlock()
	for k, seen := range t.workers {
		if k == t.regKey || now.Sub(seen) > t.workerTTL {
			continue
		}
		if now.Sub(seen) > overdue {
			return true
		}
		if rec, ok := t.peers[k]; ok && seen.Sub(d.burstFrom) >= every {
			if _, sends := rec.Load[d.name]; !sends {
				return true
			}
		}
	}
	return false
}

// decayLearned forgets d's learned limits once no throttle has cut them
// for LearnForget. d.mu held.
func (t *Throttle) decayLearned(d *dest, now time.Time) {
	forget := t.cfg.LearnForget
	if !d.state.decayed(now, forget) || d.pending&pendLearn != 0 {
		return
	}
	d.pending |= pendLearn
	t.enqueue(op{d: d, change: "learned-forget", flag: pendLearn,
		fn: func(s *DestState, now time.Time) bool { return s.decayed(now, forget) && forgetLearned(s) },
		after: func(b, a DestState) {
			t.learnedChanged(d, "learned-rate", fmtLearned(b.LearnedRate), "unknown",
				"forgotten: no throttle for "+forget.String(), a)
		}})
}

// learnedChanged logs, counts and announces one change of learned limits.
func (t *Throttle) learnedChanged(d *dest, change, from, to, reason string, a DestState) {
	t.transition(d.name, change, from, to, reason)
	t.m.setLearned(d.name, a)
	if t.cfg.OnLearned != nil {
		t.cfg.OnLearned(d.name, change, a)
	}
}

// observedRate is the fleet's delivered rate to d over the learning window:
// this worker's, plus what the other live workers last reported in their
// registry heartbeat. For a peer whose last heartbeat may predate its
// first envelope of the burst (peerLoadSince's unheard), this worker's
// rate stands in: the work lanes spread mail evenly over workers. (Read
// as nothing, three daemons under a 20/s limit read 14.7/s a few seconds
// into a burst, while the provider took 20 to 22/s, and cut 30 % deeper
// than the fleet's delivered rate allowed.) When none of them has
// reported the destination yet (a burst younger than a heartbeat), this
// worker's rate times the live workers stands in. Not
// for a single delivery, though: a provider that took one message of a
// burst took it from one worker, and two daemons learning a 2/s limit
// seeded 5/s from one delivery counted twice. thin reports that case, or
// none delivered, with other workers live: the rate rests on this worker
// alone while the provider took the rest of the fleet's burst from them.
func (t *Throttle) observedRate(d *dest, now time.Time) (rate float64, thin bool) {
	local := d.delivered.spanRate(now, t.cfg.LearnWindow)
	peers, n, unheard := t.peerLoadSince(d.name, now, d.burstFrom)
	if n == 0 {
		live := t.liveCount()
		if d.delivered.count(now, t.cfg.LearnWindow) <= 1 {
			return local, live > 1
		}
		return local * float64(live), false
	}
	return local*float64(1+unheard) + peers.Rate, false
}

// drainedRate is the fleet's delivered rate to d between throttles
// (drainMarks.drained) before the throttle at now: this worker's, scaled
// to the fleet by the live workers (each paces its share of the rate), or
// by this worker's share of what the fleet delivered over the learning
// window when that scales it higher. The reading only ever lowers a
// cut, so the scale errs high: at slow rates a peer's last 2 s often
// hold none of its deliveries, and that share alone would take this
// worker's rate for the fleet's.
//
// Only spans this worker kept busy count, the rate in force in them no
// lower than a cut from the rate now may set (drainMarks): a span that
// held the sender's own slowness read it as the provider's limit.
func (t *Throttle) drainedRate(d *dest, now time.Time) float64 {
	floor := t.cfg.learn().decrease * t.fleetRate(d.limits, d.state, now)
	local := d.drains.drainedAbove(now, d.delivered.total, floor)
	live := t.liveCount()
	if local <= 0 || live <= 1 {
		return local
	}
	scale := float64(live)
	if mine := d.delivered.spanRate(now, t.cfg.LearnWindow); mine > 0 {
		if peers, n := t.peerLoad(d.name, now); n > 0 {
			scale = max(scale, (mine+peers.Rate)/mine)
		}
	}
	return local * scale
}

// fleetInflight is the fleet's deliveries in progress to d, counting the
// one whose reply is being handled (done has already taken it off), this
// worker's standing in for a peer not heard from yet (as in observedRate).
func (t *Throttle) fleetInflight(d *dest, now time.Time) int {
	local := d.inflight + 1
	peers, n, unheard := t.peerLoadSince(d.name, now, d.burstFrom)
	if n == 0 {
		return local * t.liveCount()
	}
	return local*(1+unheard) + peers.InFlight
}

// fmtLearned prints a learned rate for a transition line.
func fmtLearned(r float64) string {
	if r <= 0 {
		return "unknown"
	}
	return fmtPerSec(r)
}

// fmtPerSec prints a rate in messages a second for a log line or a reason,
// with two decimals and at least three significant digits: a learned rate
// of 0.125/s printed as 0.12/s made a cut to 0.1/s read "0.12/s to
// 0.12/s".
func fmtPerSec(r float64) string {
	prec := 2
	if r > 0 && r < 1 {
		prec = max(prec, 2-int(math.Floor(math.Log10(r))))
	}
	return strconv.FormatFloat(r, 'f', prec, 64) + "/s"
}

// learnedWhy is the throttled reply behind a change, for its reason: the
// rule and the reply line, cut to a readable length.
func learnedWhy(r classify.Result) string {
	s := r.Rule + ": " + replyText(r)
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
