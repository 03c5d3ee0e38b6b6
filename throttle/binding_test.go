package throttle

import (
	"math"
	"testing"
	"time"
)

// TestLearnedStepWaitsForAnIdlePeer: a learned rate is split between the
// live workers, so a step up needs every share taken: with a live peer
// that reports no traffic to the destination, or whose heartbeat is
// overdue (killed without a goodbye, its record counting until the
// registry's TTL ends it), this worker's own share binding does not
// raise the rate. Before, a fleet of three that lost a worker to kill -9
// stepped its learned rate from 11 to 14/s over the 15 s the record
// counted, delivering 8/s, and met the provider's limit at 14/s when the
// record expired.
func TestLearnedStepWaitsForAnIdlePeer(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	const dom = "b.test"
	d := th.getDest(dom)
	now := th.now()
	peers := func(idleSeen time.Time, idleLoad bool) {
		th.wmu.Lock()
		defer th.wmu.Unlock()
		th.workers["busy"] = now
		th.peers["busy"] = workerRecord{Worker: "busy", Load: map[string]destLoad{dom: {Rate: 10.0 / 3}}}
		th.workers["idle"] = idleSeen
		rec := workerRecord{Worker: "idle"}
		if idleLoad {
			rec.Load = map[string]destLoad{dom: {Rate: 10.0 / 3}}
		}
		th.peers["idle"] = rec
		th.recountLocked(now)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.state.LearnedRate, d.state.Grid = 10, []GridSegment{{From: now.Add(-time.Minute), Rate: 10}}
	d.burstFrom = now.Add(-10 * time.Second)
	// This worker delivers its share, 10/s over three: binding by itself.
	for at := now.Add(-3 * time.Second); !at.After(now); at = at.Add(300 * time.Millisecond) {
		d.delivered.add(at, 1, th.cfg.LearnWindow)
	}
	for _, c := range []struct {
		what     string
		seen     time.Time
		load     bool
		stepping bool
	}{
		{"a live peer reporting no traffic to the destination", now.Add(-time.Second), false, false},
		{"a peer whose heartbeat is overdue (its last report with traffic)", now.Add(-8 * time.Second), true, false},
		{"every peer sending, heartbeats on time", now.Add(-time.Second), true, true},
	} {
		peers(c.seen, c.load)
		if n := th.liveCount(); n != 3 {
			t.Fatalf("%d live workers, want 3", n)
		}
		th.raiseLearned(d, now, time.Time{})
		if stepped := d.pending&pendLearn != 0; stepped != c.stepping {
			t.Fatalf("%s: stepped up %v, want %v", c.what, stepped, c.stepping)
		}
	}
}

// TestObservedRateCountsAPeerNotYetHeard: the fleet's delivered rate that
// a cut reads counts, for a live peer whose last heartbeat may predate its
// first envelope of the burst, this worker's own rate (the work lanes
// spread mail evenly), and nothing for a peer that reported no traffic in
// a heartbeat well into the burst. Before, the first peer counted as
// nothing: three daemons under a 20/s limit read 14.7/s a few seconds
// into a burst while the provider took 20 to 22/s, and cut 30 % deeper.
func TestObservedRateCountsAPeerNotYetHeard(t *testing.T) {
	env := startKV(t)
	th := newThrottle(t, env, "a", nil)
	const dom = "b.test"
	d := th.getDest(dom)
	now := th.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.burstFrom = now.Add(-4 * time.Second)
	// This worker delivers 7/s over the window; so does the peer that
	// reported the destination.
	for at := now.Add(-3 * time.Second); !at.After(now); at = at.Add(time.Second / 7) {
		d.delivered.add(at, 1, th.cfg.LearnWindow)
	}
	local := d.delivered.spanRate(now, th.cfg.LearnWindow)
	for _, c := range []struct {
		what string
		seen time.Time // the third worker's last heartbeat, with no traffic to dom
		want float64   // in this worker's rates
	}{
		{"a peer whose heartbeat came before the burst", d.burstFrom.Add(-time.Second), 3},
		{"a peer whose heartbeat came as the burst began", d.burstFrom.Add(time.Second), 3},
		{"a peer that reported no traffic well into the burst", d.burstFrom.Add(3 * time.Second), 2},
	} {
		th.wmu.Lock()
		th.workers["busy"] = now.Add(-time.Second)
		th.peers["busy"] = workerRecord{Worker: "busy", Load: map[string]destLoad{dom: {Rate: local, InFlight: 2}}}
		th.workers["other"] = c.seen
		th.peers["other"] = workerRecord{Worker: "other"}
		th.recountLocked(now)
		th.wmu.Unlock()
		got, thin := th.observedRate(d, now)
		if thin || math.Abs(got-c.want*local) > 0.01 {
			t.Errorf("%s: observed %.2f/s (thin %v), want %.2f/s (%v times this worker's %.2f/s)", c.what, got, thin, c.want*local, c.want, local)
		}
		if in, want := th.fleetInflight(d, now), int(c.want)+2-1; in != want {
			t.Errorf("%s: fleet in flight %d, want %d", c.what, in, want)
		}
	}
}
