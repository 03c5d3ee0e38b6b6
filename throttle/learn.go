package throttle

import (
	"fmt"
	"math"
	"regexp"
	"time"
)

// Learned limits.
//
// A destination without a configured rate (and without an operator's pin)
// has nothing for the rate factor to slow down, so it learns a rate
// instead: the first throttled reply seeds LearnedRate from the fleet's
// delivered rate to the destination over the last LearnWindow, times
// DecreaseFactor. From then on the learned rate is the destination's
// fleet rate, shared through DestState like any other, split into
// per-worker shares, and refusals take their place in the virtual queue.
//
// AIMD, fleet-wide, on the shared state (revision CAS, so concurrent
// writers settle on one value):
//   - decrease: a throttled reply cuts the learned rate, at most once per
//     LearnHold fleet-wide (LearnedHold in the state is the first time the
//     next cut may happen, LearnHold after the cut's grid segment starts;
//     a step up does not delay it; a throttle of an attempt paced at the
//     cut's rate cuts within it). The cut is multiplicative, to rate ×
//     DecreaseFactor, but never below 90% of the rate the fleet was
//     delivered at over the window: a token bucket that throttles us
//     accepts exactly its rate, so what was delivered while throttled is
//     the best estimate of the limit, and halving below it would waste
//     half the destination's capacity until the climb back;
//   - increase: after the hold, while attempts are delivered without a
//     throttle and the rate is what holds the traffic back (this worker
//     was delivered at learnBinding of its share of the rate in force over
//     LearnEvery), the rate steps up every LearnEvery, counted from the
//     step's grid segment's start (slots.go), when the step is in force
//     for the whole fleet. From the seed to the first cut it
//     doubles (a seed taken from the first milliseconds of a burst
//     underestimates the limit); after a cut it grows by LearnedStep,
//     LearnStep times the rate the cut set: additive between cuts, and
//     the same number of steps back to the old rate at any scale;
//   - first contact's burst: from the seed until the first step, each
//     paced cut halves the rate (LearnedPaced) when the window read at
//     least the rate throttled: that floor is the burst the provider let
//     through, not its limit;
//   - between throttles: a cut goes no higher than 95 % of the rate the
//     fleet was delivered at between throttles (drainMarks), a floor under
//     a token bucket's limit whatever its burst, and its plateau no higher
//     than that rate;
//   - slow limits: holds, steps and plateau waits are judged over
//     learnSpanMsgs deliveries at least (at), not LearnEvery alone;
//   - plateau: a cut remembers the rate the throttle answered, and the
//     steps after it stop at LearnedPlateau, learnPlateauMargin under that
//     rate, until LearnedProbeAt: learnProbeWait steps' time after the step
//     that reached it, doubled for each probe over the plateau that met a
//     throttle in a row (up to learnProbeMax). A throttle at or under the
//     plateau lowers it and starts the waits afresh (the limit fell). The
//     first probe goes half a step over the plateau and is judged over
//     learnProbeWait steps' time; a probe that held becomes the plateau,
//     and the steps from there double while they hold (the limit rose:
//     BIC's "max probing"). Without the plateau, one daemon under a 2/s
//     limit climbed back over the limit every 8 to 10 s, a throttle for
//     one message in 14: an additive probe costs a throttle per cycle
//     whatever the rate, so at low rates the cycles must be longer (TCP
//     CUBIC's flat stretch around its last loss is the same idea).
//
// "Too many connections" replies teach a connection limit the same way
// (seeded from the fleet's deliveries in flight, cut by DecreaseFactor,
// stepped up by one connection per LearnEvery while the limit binds, with
// a plateau one under the limit the last cut answered; cutConns), and
// pause this worker's new connections to the destination for connsRetry
// (dest.connPaused).
//
// A configured rate or connection limit is a ceiling the learned one
// never exceeds. Both decay back to "unknown" when no throttle has cut
// them for LearnForget. `outflow dest rate` pins a rate (the override
// wins over what was learned), `outflow dest forget` clears the learned
// limits (Forget).

// Defaults of the learning knobs in Config.
const (
	DefaultLearnWindow = 2 * time.Second
	DefaultLearnHold   = 2 * time.Second
	DefaultLearnEvery  = 2 * time.Second
	DefaultLearnStep   = 0.1
	DefaultLearnForget = time.Hour
	DefaultLearnMin    = 0.1 // msgs/s
)

// learnMinStep is the smallest additive step, in msgs/s, so that a rate
// cut to the floor (LearnMin) still climbs; a probe that holds doubles
// the steps after it (the plateau), so a climb from the floor is not 99
// steps of it. It was 0.5: against a provider that takes 1 msg/s, each
// step went 50% over the limit after a cut to 90% of it, and 43% of the
// attempts met a throttle (a cut every 5 s); then 0.1, until steps at slow
// rates were judged over their own replies (at), where a step of 0.1/s is
// half of a 0.2/s limit: over half an hour 2.3 % of the attempts met a
// throttle at 0.2/s with a burst of one, 6.2 % with a burst of 10; 1.4 and
// 2.7 % at 0.01 (TestLearnedRateSlowAndBurstyLimits).
const learnMinStep = 0.01

// learnMinElapsed is the shortest time a delivered rate is measured over:
// a throttle that comes a few milliseconds into a burst would otherwise
// seed from a handful of deliveries divided by almost nothing.
const learnMinElapsed = 200 * time.Millisecond

// learnBinding is the share of the learned rate the fleet must be
// delivered at for the rate to count as binding (worth raising).
const learnBinding = 0.8

// learnAccepted is the share of the observed delivered rate a cut keeps
// at least (see the decrease above).
const learnAccepted = 0.9

// The plateau after a cut (see the increase above).
const (
	// learnPlateauMargin is how far under the throttled rate the plateau
	// lies: a token bucket's limit is under the rate that met it.
	learnPlateauMargin = 0.05
	// learnProbeWait is the first wait at the plateau, in LearnEvery
	// (4 s at the defaults); each probe above it that meets a throttle
	// doubles it, up to learnProbeMax (64 s).
	learnProbeWait = 2
	learnProbeMax  = 32
)

// learnSpanMsgs is the fewest deliveries a hold or a step is judged over
// (see at): 2 s at 2/s.
const learnSpanMsgs = 4

// learnFirstContact is the seed, in msgs/s, when the fleet had delivered
// nothing to the destination within the window before its first throttle.
const learnFirstContact = 1.0

// connSignal recognises a reply about concurrent connections rather than
// message rate: it teaches a connection limit and leaves the rate alone.
// Exchange's per-source limit says "The maximum number of concurrent
// server connections has exceeded a per-source limit".
var connSignal = regexp.MustCompile(`(?i)too many (concurrent |simultaneous |open |smtp |parallel )*(connections|sessions|conns)|connection (count |rate )?limit|concurrent (smtp |server |inbound )?connections|max(imum)? (number of )?(concurrent )?(smtp |server |inbound )?connections|concurrency limit`)

// First contact.
//
// A destination with no rate yet (none configured, pinned or learned) has
// nothing to pace it, and a worker with a lane full of mail for it would
// open every delivery slot at once: 32 attempts against a provider that
// takes four in a burst are 28 throttles before the first reply can seed
// a rate. So each worker starts such a destination at its share of
// LearnInitial attempts in flight (which may be none, see firstWindow),
// and widens by one for every attempt
// the server answered with other than a throttle (delivered, bounced,
// greylisted): the window doubles every round trip while the provider
// keeps up with all it is sent (TCP's slow start, Postfix's
// initial_destination_concurrency), and stops mattering once it is wider
// than the worker's delivery slots. (Widened by deliveries alone, a
// destination that answers without delivering, greylisting or bouncing
// most of a list, stayed at LearnInitial in flight fleet-wide for good.)
// A throttle does not widen it. An admission beyond it is refused
// ("window"), without an attempt, until the window's next answer is due,
// windowRetry at least, or held longer while that answer is overdue
// (windowRefusal). The first throttle seeds a
// rate, which paces from then on; a rate forgotten later starts the window
// afresh.

// DefaultLearnInitial is LearnInitial's default: attempts in flight, fleet-wide.
const DefaultLearnInitial = 2

// windowOpen is the width at which a first-contact window stops counting:
// no worker has that many delivery slots.
const windowOpen = 1 << 16

// firstWindow is this worker's limit on attempts in flight to d now
// (on false: none): the first-contact window while d has no rate and
// learning could give it one. fleet is d's fleet rate (0: unlimited);
// place gives this worker's place among live workers for d (Throttle.place:
// a hash of the name, found only when the window opens).
//
// LearnInitial is split between the workers by place as a connection
// limit is (shareConns), so that the fleet has LearnInitial attempts in
// flight at first contact, not one per worker at least: three workers
// sent three to a destination whose window was two. A worker whose share
// is none has a window of 0 until peerDelivered reports that another
// worker's attempts were delivered (their registry heartbeats carry
// it): the destination has answered, and its window opens at one, widened
// by its own answers as the others' are. d.mu held.
func (d *dest) firstWindow(cfg *Config, fleet float64, live int, place func() int, peerDelivered func() bool) (int, bool) {
	if fleet > 0 || cfg.NoLearn || cfg.LearnInitial <= 0 {
		d.window = 0 // a rate paces; without one later, the window starts afresh
		return 0, false
	}
	if d.window == 0 {
		share, _ := shareConns(cfg.LearnInitial, live, place())
		if share == 0 && !peerDelivered() {
			return 0, true
		}
		d.window = max(1, share)
	}
	if d.window >= windowOpen {
		return 0, false
	}
	return d.window, true
}

// widen is one answered attempt's growth of the first-contact window
// (attemptOutcome.answered: any answer but a throttle). d.mu held.
func (d *dest) widen() {
	if d.window > 0 && d.window < windowOpen {
		d.window++
	}
}

// learnConfig is the part of Config the learning math reads.
type learnConfig struct {
	decrease float64
	hold     time.Duration
	every    time.Duration
	step     float64
	min      float64
	ahead    time.Duration // how far ahead a step up starts its grid segment (slots.go)
	cutAhead time.Duration // how far ahead a cut or a seed starts its grid segment
}

func (c *Config) learn() learnConfig {
	return learnConfig{decrease: c.DecreaseFactor, hold: c.LearnHold, every: c.LearnEvery, step: c.LearnStep, min: c.LearnMin, ahead: c.MaxWait + gridReach, cutAhead: gridReach}
}

// learnsRate reports whether throttles teach dest a rate: learning is on,
// no rate is configured and none is pinned. With a configured rate the
// rate factor moves below it instead (see cutFactor).
func learnsRate(on bool, l Limits, s DestState, now time.Time) bool {
	_, pinned := s.rateOverride(now)
	return on && l.Rate <= 0 && !pinned
}

// at is lc for a learned rate of rate msgs/s: a hold or a step is judged
// over learnSpanMsgs deliveries at least, so that under a slow limit it
// rests on as many replies as at 2/s, not on none.
func (lc learnConfig) at(rate float64) learnConfig {
	if rate > 0 {
		span := time.Duration(learnSpanMsgs / rate * float64(time.Second))
		lc.every, lc.hold = max(lc.every, span), max(lc.hold, span)
	}
	return lc
}

// reasonSpan is d as a reason gives it: a span stretched to a slow rate
// (at) is 8.510638297s, which says no more than 8.5s.
func reasonSpan(d time.Duration) string { return d.Round(100 * time.Millisecond).String() }

// stepOf is the additive step for a rate just set by a cut or a seed.
func (lc learnConfig) stepOf(rate float64) float64 {
	return math.Max(learnMinStep, lc.step*rate)
}

// cutRate is the multiplicative decrease of the learned rate on a
// throttle at now, with observed the fleet's delivered rate (msgs/s) over
// the learning window. It seeds an unknown rate. It returns false, and
// leaves s alone, within the hold of the previous cut: one cut per hold,
// fleet-wide, however many workers saw throttles, since the attempts in
// flight when a cut comes were sent at the rate before it. paced says the
// throttled attempt was admitted after the last cut, at the rate that cut
// set: then the rate is still too high, and it is cut again at once (a
// seed at twice a provider's limit was otherwise sent at for the whole
// hold, a throttle every few sends).
func (lc learnConfig) cutRate(s *DestState, now time.Time, observed, drained, ceiling float64, why string, paced bool) bool {
	if s.LearnedRate > 0 && now.Before(s.LearnedHold) && !paced {
		return false
	}
	var next, from float64
	var reason string
	again := false // a halving of first contact's chain
	if s.LearnedRate <= 0 {
		if observed > 0 {
			next = observed * lc.decrease
			reason = fmt.Sprintf("seeded: fleet delivered %s just before a throttle (%s), times %.2f", fmtPerSec(observed), why, lc.decrease)
		} else {
			next = learnFirstContact
			reason = fmt.Sprintf("seeded: throttled (%s) before any delivery in the window", why)
		}
		s.LearnedSince = now.UTC()
		s.LearnedSlowStart = true
	} else {
		// From the rate in force: a step up whose grid segment has not
		// started yet was never sent at, and is not what the throttle
		// answered.
		from = s.inForce(now)
		next = from * lc.decrease
		reason = fmt.Sprintf("cut: throttled (%s) at %s, times %.2f", why, fmtPerSec(from), lc.decrease)
		// A paced throttle of the rate the seed or a paced cut after it
		// set, with no step since, while the window says the fleet got
		// through at least that rate: the floor under the cut, what the
		// window saw delivered, is first contact's burst, not the limit
		// (a provider's bucket of 20 at 0.5/s read 50/s), and cutting
		// about 5 % at a time took 30 throttles to come down to 9/s. The
		// first cut after the seed is no exception: the seed halved that
		// same reading, so its floor kept the seed's rate whole until the
		// hold ran out (two daemons: 60 throttles in 3 s). A reading
		// under the rate throttled stands (under a 2/s limit with a burst
		// of one, 90 % of it cut 2.24/s to 1.4/s; halving to 1.12/s
		// drained 60 messages in 1.33 to 1.39 times the ideal against
		// 1.19 to 1.25, outflow-bench -learn-limit 2). After a step the
		// floor stands too: a second throttle right after a cut is the
		// bucket the probe emptied, and halving for it cost 13 % of a
		// 200/s limit in TestLearnedRateSteadyState.
		again = paced && s.LearnedPaced && observed >= from
		if again {
			reason = fmt.Sprintf("cut: throttled (%s) again at %s since the seed, times %.2f", why, fmtPerSec(from), lc.decrease)
		}
		if kept := observed * learnAccepted; kept > next && !again {
			next = math.Min(kept, from)
			if !now.Before(s.LearnedHold) {
				// Past the hold a throttle at from says from is too high
				// whatever the reading: a delivered rate at or above it
				// is a stale report (a peer's heartbeat from a faster
				// moment), and a cut that kept the rate left two daemons
				// at 2.15/s under a 2/s limit for three more throttles.
				next = math.Min(next, from*learnAccepted)
			}
			reason = fmt.Sprintf("cut: throttled (%s) at %s, to %.0f%% of the %s the fleet was delivered at", why, fmtPerSec(from), learnAccepted*100, fmtPerSec(observed))
		}
		if d := drained * (1 - learnPlateauMargin); drained > 0 && d < next {
			next = math.Max(d, from*lc.decrease)
			reason = fmt.Sprintf("cut: throttled (%s) at %s, to %.0f%% of the %s the fleet was delivered at between throttles", why, fmtPerSec(from), (1-learnPlateauMargin)*100, fmtPerSec(drained))
		}
		s.LearnedSlowStart = false
	}
	if ceiling > 0 && next > ceiling {
		next = ceiling
		reason += fmt.Sprintf("; at most the configured %s", fmtPerSec(ceiling))
	}
	if next < lc.min {
		next = lc.min
		reason += fmt.Sprintf("; at least learn-min's %s", fmtPerSec(lc.min))
	}
	if s.LearnedRate > 0 && now.Before(s.LearnedHold) && next >= s.LearnedRate {
		return false // a paced attempt's throttle, but what was delivered keeps the rate
	}
	// A halving of first contact's chain starts its grid segment at once,
	// as a worker alone does: the rate is still far over the limit, where
	// a pair of turns one old slot apart changes nothing, and the chain
	// halves again on the first throttle of an attempt sent on the new
	// segment by a worker that knew of the cut (pacedAt), not a second
	// later (two daemons under a bucket of 20 at 0.5/s: seven halvings
	// from 40/s, each a second of throttles).
	ahead := lc.cutAhead
	if again {
		ahead = 0
	}
	s.regrid(now, ahead, next)
	s.LearnedRate = next
	s.LearnedStep = lc.stepOf(next)
	lc = lc.at(next)
	// The hold runs from the cut's grid segment's start: until then the
	// workers send at the new rate on the old grid's slots, where two
	// workers' turns can fall one old slot apart, and a throttle of such a
	// pair says nothing of the new rate. (Alone, the segment starts now.)
	// An attempt paced on the new segment still cuts at once.
	s.LearnedHold = laterOf(now, s.Grid[len(s.Grid)-1].From).Add(lc.hold).UTC()
	s.LearnedNext = s.LearnedHold
	s.LearnedCutAt = now.UTC()
	s.LearnedReason = reason
	s.LearnedPaced = from <= 0 || s.LearnedPaced && paced
	if from > 0 {
		if s.LearnedRunFrom <= 0 {
			s.LearnedRunFrom = from
		}
		lc.plateau(s, from, drained)
	}
	return true
}

// resumeRate takes the learned rate back up at now after a block: the
// first delivery after a stretch of throttles with nothing delivered
// (raiseLearned judges that, resumeQuiet). The rate resumes at a quarter
// of the one in force before the throttles began (LearnedRunFrom), at
// most ceiling, with its plateau 5 % under that old rate and steps of a
// quarter of it, so that, step by step while nothing is throttled, it is
// back under the old rate in three steps; a throttle cuts at once. It
// returns false when that quarter is under twice the rate in force (a
// run of cuts that did not take the rate far down, or no run).
//
// A block is a provider refusing everything for a while (a reputation
// hold, "try again later" to every attempt), whatever the rate: its cuts
// take the rate to learn-min, and the plateau down with it, and from there
// the climb is a slow limit's (each step judged over four deliveries). A
// minute's block of a 20/s destination left it under half its limit for
// 5 min 27 s after the block ended; resumed, for 8 s
// (TestLearnedRateResumesAfterABlock). A quarter, not the whole: a
// provider that lifts a block may take less than before it, and the steps
// find out.
func (lc learnConfig) resumeRate(s *DestState, now time.Time, ceiling float64) bool {
	if s.LearnedRunFrom <= 0 || s.LearnedRate <= 0 {
		return false
	}
	next := s.LearnedRunFrom / 4
	if ceiling > 0 && next > ceiling {
		next = ceiling
	}
	from := s.inForce(now)
	if next < 2*from {
		return false
	}
	s.LearnedReason = fmt.Sprintf("resumed: delivered again after a block that cut %s to %s; a quarter of the rate before it", fmtPerSec(s.LearnedRunFrom), fmtPerSec(from))
	s.regrid(now, lc.ahead, next)
	s.LearnedRate, s.LearnedStep = next, next
	s.LearnedPlateau, s.LearnedProbes, s.LearnedProbeAt = s.LearnedRunFrom*(1-learnPlateauMargin), 0, time.Time{}
	s.LearnedRunFrom, s.LearnedPaced, s.LearnedSlowStart = 0, false, false
	// A throttle from now on cuts at once: the block's last cut set a hold
	// of four deliveries at its rate (40 s at learn-min's 0.1/s), and the
	// resumed rate is a guess.
	s.LearnedHold = now.UTC()
	inForce := laterOf(now, s.Grid[len(s.Grid)-1].From)
	s.LearnedNext = inForce.Add(lc.at(next).every).UTC()
	return true
}

// resumeQuiet is how long a worker must have had nothing delivered, with
// the fleet's window empty at a cut, for its next delivery to resume the
// rate (resumeRate): a limit that fell still lets mail through every few
// seconds, a block does not.
const resumeQuiet = 10 * time.Second

// plateau sets where the steps after a cut at from stop, and until when
// (see the increase above). A cut above the plateau is a probe that met
// a throttle: the plateau held, and stays, and the next probe waits twice
// as long. A cut at or under it says the limit is lower than it was:
// the plateau moves under from and the waits start afresh. Called after
// the cut has set LearnedRate and LearnedHold.
func (lc learnConfig) plateau(s *DestState, from, drained float64) {
	if s.LearnedPlateau > 0 && from > s.LearnedPlateau {
		s.LearnedProbes++
	} else {
		s.LearnedPlateau = from * (1 - learnPlateauMargin)
		if drained > 0 {
			s.LearnedPlateau = math.Min(s.LearnedPlateau, drained)
		}
		s.LearnedProbes = 0
	}
	s.LearnedProbeAt = time.Time{} // set when the steps reach the plateau
	if s.LearnedRate >= s.LearnedPlateau {
		// A cut of a probe that kept the rate over the plateau (what was
		// delivered says so): the rate waits where it is, and a step from
		// it is a probe again, not one that held.
		s.LearnedPlateau = s.LearnedRate
		s.LearnedProbeAt = s.LearnedHold.Add(lc.probeWait(s.LearnedProbes)).UTC()
	}
}

// probeWait is how long the rate waits at its plateau before the next
// probe over it, after probes probes in a row that met a throttle:
// learnProbeWait steps' time, doubled for each, at most learnProbeMax.
func (lc learnConfig) probeWait(probes int) time.Duration {
	return lc.every * time.Duration(min(learnProbeMax, learnProbeWait<<min(probes, 8)))
}

// atPlateau reports whether the learned rate waits at its plateau at now:
// no step up is due before LearnedProbeAt.
func (s DestState) atPlateau(now time.Time) bool {
	return s.LearnedPlateau > 0 && s.LearnedRate >= s.LearnedPlateau && now.Before(s.LearnedProbeAt)
}

// raiseRate is one additive step up at now. It returns false when there
// is nothing learned, the hold or the previous step is too recent, or the
// ceiling is reached.
func (lc learnConfig) raiseRate(s *DestState, now time.Time, ceiling float64) bool {
	if s.LearnedRate <= 0 || now.Before(s.LearnedHold) || now.Before(s.LearnedNext) {
		return false
	}
	if ceiling > 0 && s.LearnedRate >= ceiling || s.atPlateau(now) {
		return false
	}
	step := s.LearnedStep
	if step <= 0 {
		step = lc.stepOf(s.LearnedRate)
	}
	how := "+" + fmtPerSec(step)
	if s.LearnedSlowStart {
		step, how = s.LearnedRate, "doubled (no cut since the seed)"
	}
	next := s.LearnedRate + step
	lc = lc.at(next)
	reaches, firstProbe := false, false
	switch p := s.LearnedPlateau; {
	case p <= 0:
	case s.LearnedRate < p && next >= p-1e-9:
		next, reaches = p, true
		// The probes over the plateau are a step's of the plateau at
		// most: a resume's quarter-rate steps (resumeRate) would probe
		// 12 % over it.
		s.LearnedStep = min(step, lc.stepOf(p))
		how = "to the plateau " + fmtPerSec(p) + " (under the last throttle's rate), waits " + reasonSpan(lc.probeWait(s.LearnedProbes))
	case s.LearnedRate > p+1e-9:
		// A probe over the plateau held: the limit rose at
		// least that far. It is the plateau now, and the steps double
		// from here while they hold (at most half the rate at once), so
		// that a limit that came back after a fall is found in a few
		// steps rather than after one wait at each.
		step = min(2*step, s.LearnedRate/2)
		s.LearnedPlateau, s.LearnedProbes, s.LearnedStep = s.LearnedRate, 0, step
		next = s.LearnedRate + step
		how = "+" + fmtPerSec(step) + " (doubled: the last probe over the plateau held, and is the plateau now)"
	case s.LearnedRate >= p-1e-9:
		// The first probe over it is half a step: the plateau is already
		// close to the limit, and a smaller overshoot that holds moves
		// it up by what held (a whole step, 9 % over a 200/s limit,
		// failed nearly every time and kept the rate 3 % under it).
		firstProbe = true
		next = s.LearnedRate + step/2
		how = "+" + fmtPerSec(step/2) + " over the plateau"
	}
	if ceiling > 0 && next > ceiling {
		next = ceiling
	}
	s.LearnedReason = fmt.Sprintf("probe up: %s after %s without a throttle while the rate was binding", how, reasonSpan(lc.every))
	s.regrid(now, lc.ahead, next)
	s.LearnedRate = next
	s.LearnedPaced = false
	s.LearnedRunFrom = 0 // a step ends the run of cuts
	// Only the next step waits: a throttle right after a step up cuts at
	// once, so an overshoot costs milliseconds of throttles, not a hold.
	// It waits for LearnEvery of the new rate in force: from its grid
	// segment's start, which lies ahead when several workers share the
	// grid. A step judged before that would judge the old rate, and the
	// steps would pile up unsent until the grid caught up with them all at
	// once.
	inForce, judged := laterOf(now, s.Grid[len(s.Grid)-1].From), lc.every
	if firstProbe {
		// The first probe over the plateau is the smallest overshoot, and
		// a provider's burst hides it longest: it is judged over the
		// first plateau wait, not one step. (Judged over 2 s, a probe 9 %
		// over a 20/s limit with a burst of 4 held, became the plateau,
		// and the doubled step after it met the throttle.)
		judged = lc.probeWait(0)
	}
	s.LearnedNext = inForce.Add(judged).UTC()
	if reaches {
		// The wait counts from the plateau in force, as the next step's.
		s.LearnedProbeAt = inForce.Add(lc.probeWait(s.LearnedProbes)).UTC()
	}
	return true
}

// cutConns is the decrease of the learned connection limit on a "too
// many connections" reply at now, seeded from inflight (the fleet's
// deliveries in progress to the destination when the reply came). At most
// one cut per hold fleet-wide (LearnedConnsHold): the attempts in flight
// at a cut were admitted under the limit before it. paced says the
// throttled attempt was admitted under the limit this cut set (its worker
// knew the hold): the limit is still too high, and is cut again at once,
// hold or not (a seed at twice the cap was otherwise kept for the whole
// hold, a refused connection per attempt). A step up does not
// hold a cut back (its wait is LearnedConnsNext): the throttle right after
// a probe is the probe's answer, and it cuts at once. (A step used to set
// the hold, and for the 2 s after each probe no throttle could cut: under
// a cap of 2 the limit climbed back over it every 2 s, and the provider
// refused more connections than it took messages.)
//
// The plateau, as the rate's: a throttle of a probe over
// LearnedConnsPlateau takes the limit back to the plateau, which held,
// and doubles the wait before the next probe (learnProbeWait steps' time,
// then 2, 4 … times that, at most learnProbeMax); a throttle at or under
// it says the limit fell: it is cut by DecreaseFactor (at least to one),
// and the plateau moves one under the limit throttled, with the waits
// afresh. The seed's plateau is one under the connections in flight at
// its throttle. A throttle at one connection cuts nothing, and writes
// nothing (it had logged a cut "from 1 to 1").
func (lc learnConfig) cutConns(s *DestState, now time.Time, inflight, ceiling int, why string, paced bool) bool {
	from := s.LearnedConns
	if from > 0 && now.Before(s.LearnedConnsHold) && !paced {
		return false
	}
	next, plateau, probes := 0, s.LearnedConnsPlateau, s.LearnedConnsProbes
	var reason string
	switch {
	case from <= 0:
		next, plateau, probes = int(math.Floor(float64(inflight)*lc.decrease)), max(1, inflight-1), 0
		reason = fmt.Sprintf("seeded: %d connections in flight fleet-wide at a connection throttle (%s), times %.2f", inflight, why, lc.decrease)
	case plateau > 0 && from > plateau:
		next, probes = plateau, probes+1
		reason = fmt.Sprintf("cut: connection throttle (%s) at %d connections, a probe over the plateau: back to %d, next probe in %s", why, from, plateau, reasonSpan(lc.hold+lc.probeWait(probes)))
	default:
		next, plateau, probes = int(math.Floor(float64(from)*lc.decrease)), max(1, from-1), 0
		reason = fmt.Sprintf("cut: connection throttle (%s) at %d connections, times %.2f", why, from, lc.decrease)
	}
	if ceiling > 0 && next > ceiling {
		next = ceiling
	}
	next = max(1, next)
	if from > 0 && next >= from {
		return false // at one already: nothing to cut
	}
	if from <= 0 && s.LearnedSince.IsZero() {
		s.LearnedSince = now.UTC()
	}
	s.LearnedConns, s.LearnedConnsPlateau, s.LearnedConnsProbes = next, plateau, probes
	s.LearnedConnsHold = now.Add(lc.hold).UTC()
	s.LearnedConnsNext = s.LearnedConnsHold
	s.LearnedConnsProbeAt = time.Time{} // set when the steps reach the plateau
	if next >= plateau {
		s.LearnedConnsProbeAt = s.LearnedConnsHold.Add(lc.probeWait(probes)).UTC()
	}
	s.LearnedCutAt = now.UTC()
	s.LearnedConnsReason = reason
	return true
}

// connsStepDue reports whether the learned connection limit may step up
// at now: past the hold of its last cut and the wait of its last step,
// under the ceiling, and not waiting at its plateau.
func (s DestState) connsStepDue(now time.Time, ceiling int) bool {
	if s.LearnedConns <= 0 || now.Before(s.LearnedConnsHold) || now.Before(s.LearnedConnsNext) || ceiling > 0 && s.LearnedConns >= ceiling {
		return false
	}
	return s.LearnedConnsPlateau <= 0 || s.LearnedConns < s.LearnedConnsPlateau || !now.Before(s.LearnedConnsProbeAt)
}

// raiseConns is one step of one more connection. Up to the plateau each
// step is judged over LearnEvery; the first probe over it over
// learnProbeWait steps' time (a connection that opens while the others
// are busy is all it tests); a probe that held is the plateau now, and
// the steps go on from it.
func (lc learnConfig) raiseConns(s *DestState, now time.Time, ceiling int) bool {
	if !s.connsStepDue(now, ceiling) {
		return false
	}
	from, p := s.LearnedConns, s.LearnedConnsPlateau
	judged, how := lc.every, "+1 connection"
	switch {
	case p <= 0:
	case from < p:
		if from+1 >= p {
			s.LearnedConnsProbeAt = now.Add(lc.probeWait(s.LearnedConnsProbes)).UTC()
			how = fmt.Sprintf("+1 connection, to the plateau %d (under the last connection throttle), waits %s", p, reasonSpan(lc.probeWait(s.LearnedConnsProbes)))
		}
	case from > p:
		// A probe over the plateau held: the limit rose at least that far.
		s.LearnedConnsPlateau, s.LearnedConnsProbes = from, 0
		how = "+1 connection (the last probe over the plateau held, and is the plateau now)"
	default:
		judged, how = lc.probeWait(0), "+1 connection over the plateau"
	}
	s.LearnedConns++
	s.LearnedConnsNext = now.Add(judged).UTC()
	s.LearnedConnsReason = fmt.Sprintf("probe up: %s after %s without a connection throttle while the limit was binding", how, reasonSpan(lc.every))
	return true
}

// forgetLearned clears what was learned; it returns false when nothing was.
func forgetLearned(s *DestState) bool {
	if !s.learned() {
		return false
	}
	s.LearnedRate, s.LearnedStep, s.LearnedHold, s.LearnedNext, s.LearnedReason, s.LearnedSlowStart = 0, 0, time.Time{}, time.Time{}, "", false
	s.LearnedPlateau, s.LearnedProbeAt, s.LearnedProbes, s.LearnedPaced = 0, time.Time{}, 0, false
	s.LearnedRunFrom = 0
	s.LearnedConns, s.LearnedConnsHold, s.LearnedConnsNext, s.LearnedConnsReason = 0, time.Time{}, time.Time{}, ""
	s.LearnedConnsPlateau, s.LearnedConnsProbeAt, s.LearnedConnsProbes = 0, time.Time{}, 0
	s.LearnedSince, s.LearnedCutAt = time.Time{}, time.Time{}
	s.Grid = nil
	return true
}

// decayed reports whether learned limits have gone quiet for forget: no
// throttle has cut them since.
func (s DestState) decayed(now time.Time, forget time.Duration) bool {
	return s.learned() && !s.LearnedCutAt.IsZero() && now.Sub(s.LearnedCutAt) >= forget
}

// learned reports whether s holds a learned rate or connection limit.
func (s DestState) learned() bool { return s.LearnedRate > 0 || s.LearnedConns > 0 }

// rateWindow counts deliveries to one destination in one-second slots, for
// the learning seed (the fleet's delivered rate just before a throttle).
type rateWindow struct {
	slots [16]struct {
		sec int64
		n   int
	}
	first time.Time // first delivery counted since the window was last empty
	total uint64    // every delivery counted (drainMarks)
}

// add counts n deliveries at now. span is the window the rate is read
// over: a delivery after span of silence starts a new burst.
func (w *rateWindow) add(now time.Time, n int, span time.Duration) {
	if w.count(now, span) == 0 {
		w.first = now
	}
	sec := now.Unix()
	s := &w.slots[sec%int64(len(w.slots))]
	if s.sec != sec {
		s.sec, s.n = sec, 0
	}
	s.n += n
	w.total += uint64(n)
}

// count is the deliveries within span before now.
func (w *rateWindow) count(now time.Time, span time.Duration) int {
	sec := now.Unix()
	return w.sum(sec-int64(math.Ceil(span.Seconds()))+1, sec)
}

// sum is the deliveries in the one-second slots from through to.
func (w *rateWindow) sum(from, to int64) int {
	total := 0
	for i := range w.slots {
		if s := w.slots[i]; s.sec >= from && s.sec <= to {
			total += s.n
		}
	}
	return total
}

// per is the n deliveries counted from the slot of second from as a
// rate over el, or over the time since traffic began when that is shorter
// (at least learnMinElapsed), so a burst's first throttle sees the burst's
// rate rather than that rate diluted by idle seconds. Only when every
// delivery counted is the burst's: mail that trickles in more than the
// learning window apart starts a "burst" at every delivery (add), and its
// count over a longer span, divided by the time since the last one, read
// one delivery every 2 s as 10/s, which passed the learned rate's binding
// test: the rate climbed to what the mail never came near. minBurst is
// the fewest deliveries read as a burst: 1 for a seed (the first
// delivery's time is all a first contact has), 2 where a lone delivery
// must not count as a rate.
func (w *rateWindow) per(n, minBurst int, from int64, el time.Duration, now time.Time) float64 {
	if n == 0 {
		return 0
	}
	if !w.first.IsZero() && n >= minBurst && w.sum(from, w.first.Unix()-1) == 0 {
		if since := now.Sub(w.first); since < el {
			el = max(since, learnMinElapsed)
		}
	}
	return float64(n) / el.Seconds()
}

// spanRate is the delivered rate over the last span (msgs/s), read over
// the time the counted slots cover: from the start of the slot that holds
// now-span to now (see per for a younger burst). Dividing the count by
// span alone read a steady rate as anything from half of it to all of it,
// and a cut's floor, 90 % of that reading, cut a learned rate at a 20/s
// limit from 24 to 12 (docs/benchmarks.md, scenario 6).
func (w *rateWindow) spanRate(now time.Time, span time.Duration) float64 {
	return w.rate(now, span, 1)
}

// sustainedRate is spanRate without reading a lone delivery as a burst
// (one delivery 300 ms ago is not 3.3/s): what a learned rate's binding
// test asks of the mail.
func (w *rateWindow) sustainedRate(now time.Time, span time.Duration) float64 {
	return w.rate(now, span, 2)
}

func (w *rateWindow) rate(now time.Time, span time.Duration, minBurst int) float64 {
	from := max(now.Add(-span).Unix(), now.Unix()-int64(len(w.slots))+1)
	return w.per(w.sum(from, now.Unix()), minBurst, from, now.Sub(time.Unix(from, 0)), now)
}

// Between throttles.
//
// A provider's token bucket is empty whenever it throttles, so between
// two throttles it took exactly what it refilled (give or take one
// message), unless it sat full for a while and wasted some: the fleet's
// deliveries between two throttles, over the time between them, are at
// most the limit, whatever the burst. The learning window's delivered
// rate is not: over a bucket of 100 at 0.5/s, 2 s of delivered mail read
// 0.9/s, and the cuts kept the learned rate over the limit for good
// (16 % of the attempts throttled). drainMarks keeps the moments of the
// last throttles with the delivery count then, and drained reads the
// rate since the oldest of them within drainHorizon.

// drainHorizon is how far back drained looks for a throttle; drainMin
// is the deliveries since it that make a reading (one in ten off at
// most).
const (
	drainHorizon = 2 * time.Minute
	drainMin     = 10
)

// drainMarks are throttle moments with the deliveries and throttles
// counted then, at most one per drainHorizon/len, newest last.
//
// The reading is a floor under the limit only while the provider, not the
// sender, set the pace: a bucket that the sender let fill wastes what it
// refills, and the deliveries over the time read the sender's own
// slowness. One daemon at a 30/s demand, under a limit of 20/s that fell
// to 5/s and rose to 40/s, climbed back from 5/s without a throttle; the
// first throttles after the rise read the span since a throttle of the
// 5/s phase (10 to 18.7/s while the provider took 35 to 43/s) and cut
// 54/s to the halving floor four times in two minutes. Two tenants whose
// admissions left a learned 20/s half unused (a third tenant's trickle,
// overShare) read the same way. So a mark is read only when the sender
// kept its rate busy all through its span (press):
//
//   - this worker's tokens went unused for at most pressSlack of the span:
//     an admission that finds its bucket's next token due some time ago
//     counts that time as idle (a burst of one keeps nothing), less
//     pressLate or half a period, whichever is less, so the sender used
//     the tokens as they came, its demand at or above its supply (a
//     backlog waiting, refusals for the rate). The allowance is for mail
//     the rate-limit lane brings back in its bunches, up to 250 ms after
//     its place, at slow rates; half a period, so that a sender using
//     every other token (one period late each time) is not forgiven; and
//   - the rate in force did not go under what a cut from now may set
//     (decrease times the rate now, drainedAbove's floor) since the mark:
//     a span that holds such a rate holds a climb the sender made by
//     itself, below the provider's limit and without a throttle, and the
//     reading is the climb's, not the limit's.
//
// A mark that fails either is skipped for a newer one; without one the
// cut rests on the window's reading alone, as before the first cut.
type drainMarks struct {
	marks [8]struct {
		at     time.Time
		n, thr uint64        // deliveries and throttles counted at
		idle   time.Duration // idle counted at (press)
		low    float64       // the lowest rate in force an admission met since (press); 0: none yet
	}
	throttles uint64        // throttles counted so far
	idle      time.Duration // this worker's tokens unused so far (press)
}

// pressSlack is the part of a span between throttles that this worker's
// tokens may have gone unused for the reading to stand, and pressLate
// how late a send may be without counting as unused (drainMarks).
const (
	pressSlack = 0.1
	pressLate  = 300 * time.Millisecond
)

// press notes an admission at now, asking for a token of this worker's
// bucket whose next token was due at next (zero: none yet), one period
// after the one before, while the fleet's rate in force is rate. See
// drainMarks.
func (m *drainMarks) press(now, next time.Time, period time.Duration, rate float64) {
	if late := now.Sub(next) - min(pressLate, period/2); !next.IsZero() && late > 0 {
		m.idle += late
	}
	for i := range m.marks {
		if k := &m.marks[i]; !k.at.IsZero() && (k.low == 0 || rate < k.low) {
			k.low = rate
		}
	}
}

// mark counts a throttle at now after total deliveries.
func (m *drainMarks) mark(now time.Time, total uint64) {
	m.throttles++
	last := &m.marks[len(m.marks)-1]
	if !last.at.IsZero() && now.Sub(last.at) < drainHorizon/time.Duration(len(m.marks)) {
		return
	}
	copy(m.marks[:], m.marks[1:])
	last.at, last.n, last.thr, last.idle, last.low = now, total, m.throttles, m.idle, 0
}

// drained is the delivered rate since the oldest throttle within
// drainHorizon with another throttle after it, a floor under the limit:
// (deliveries - 1) over the time. A throttle between says the fleet sent
// faster than the provider refilled; without one the reading is only
// what the fleet sent, under a limit it never reached. 0 without
// drainMin deliveries since. Called before mark counts the throttle at
// now.
func (m *drainMarks) drained(now time.Time, total uint64) float64 {
	return m.drainedAbove(now, total, 0)
}

// drainedAbove is drained over the marks whose spans the sender kept
// busy (drainMarks), the rate in force no lower than floor in them.
func (m *drainMarks) drainedAbove(now time.Time, total uint64, floor float64) float64 {
	for _, k := range m.marks {
		if k.at.IsZero() || now.Sub(k.at) > drainHorizon || m.throttles == k.thr {
			continue
		}
		if span := now.Sub(k.at); m.idle-k.idle > time.Duration(pressSlack*float64(span)) || k.low > 0 && k.low < floor {
			continue
		}
		d := total - k.n
		if d < drainMin {
			return 0
		}
		return float64(d-1) / now.Sub(k.at).Seconds()
	}
	return 0
}
