package throttle

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// TestTurnOnEpochGrid: a worker's slots are the grid's slots of its rank, on the
// server's clock, at or after the time asked for.
func TestTurnOnEpochGrid(t *testing.T) {
	const rate = 10.0 // a slot every 100 ms
	base := time.Unix(1_800_000_000, 0)
	for _, tc := range []struct {
		at     time.Duration // after base
		n, r   int
		offset time.Duration
		want   time.Duration
	}{
		{at: 0, n: 1, r: 0, want: 0},                                         // one worker: no grid
		{at: 30 * time.Millisecond, n: 1, r: 0, want: 30 * time.Millisecond}, // nor delay
		{at: 0, n: 2, r: 0, want: 0},                                         // slot 18e9 is even
		{at: 0, n: 2, r: 1, want: 100 * time.Millisecond},
		{at: 1 * time.Millisecond, n: 2, r: 0, want: 200 * time.Millisecond},
		{at: 250 * time.Millisecond, n: 3, r: 2, want: 500 * time.Millisecond},          // 18e9+5 ≡ 2 mod 3
		{at: 0, n: 2, r: 1, offset: 30 * time.Millisecond, want: 70 * time.Millisecond}, // the server is 30 ms ahead
	} {
		got := turn{rate: rate, n: tc.n, r: tc.r, offset: tc.offset}.next(base.Add(tc.at)).Sub(base)
		if got != tc.want {
			t.Errorf("slotAt(+%v, n=%d, r=%d, offset %v) = +%v, want +%v", tc.at, tc.n, tc.r, tc.offset, got, tc.want)
		}
	}
	// Above 500/s the grid is finer than timers keep: left alone.
	if at := base.Add(time.Millisecond / 3); !(turn{rate: 1000, n: 2, r: 1}).next(at).Equal(at) {
		t.Error("a 1 ms grid was applied")
	}
}

// TestLearnedGridNumbersOn: a change of the learned rate starts a new
// segment of the grid where every turn reserved before the change is
// behind it, and numbers on from the old one, so that the worker whose
// turn comes next is the one that would have had it: no two workers'
// turns fall together across the change.
func TestLearnedGridNumbersOn(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 5, 0, 0, 0, time.UTC)
	const ahead = 3 * time.Second
	var s DestState
	s.regrid(t0, ahead, 4) // the seed: 250 ms slots from now
	s.LearnedRate = 4
	if len(s.Grid) != 1 || !s.Grid[0].From.Equal(t0) || s.Grid[0].Slot != 0 {
		t.Fatalf("seeded grid %+v", s.Grid)
	}
	w := func(r int) turn { return turn{segs: s.Grid, rate: s.LearnedRate, n: 2, r: r} }
	if got := w(1).next(t0.Add(10 * time.Millisecond)); !got.Equal(t0.Add(250 * time.Millisecond)) {
		t.Fatalf("first turn of worker 1: +%v", got.Sub(t0))
	}
	// The rate goes up to 5/s (200 ms) 1.1 s in. Turns up to 4.1 s may
	// have been reserved on the old grid: its last slot by then is number
	// 16 at 4 s, and the new segment goes on from there.
	before := s.Grid
	s.regrid(t0.Add(1100*time.Millisecond), ahead, 5)
	s.LearnedRate = 5
	if len(s.Grid) != 2 || !s.Grid[1].From.Equal(t0.Add(4*time.Second)) || s.Grid[1].Slot != 16 || s.Grid[1].Rate != 5 {
		t.Fatalf("regridded: %+v", s.Grid)
	}
	if len(before) != 1 {
		t.Fatal("regrid changed the slice another state holds")
	}
	// Before 4 s the old spacing holds: worker 1's turn after 2 s is slot 9 at 2.25 s.
	if got := w(1).next(t0.Add(2 * time.Second)); !got.Equal(t0.Add(2250 * time.Millisecond)) {
		t.Errorf("worker 1 before the new segment: +%v, want +2.25s", got.Sub(t0))
	}
	// Worker 0 has slot 16 at 4 s; worker 1 slot 17 one new period later,
	// worker 0 slot 18 after that.
	if got := w(0).next(t0.Add(3900 * time.Millisecond)); !got.Equal(t0.Add(4 * time.Second)) {
		t.Errorf("worker 0 at the change: +%v, want +4s", got.Sub(t0))
	}
	if got := w(1).next(t0.Add(3900 * time.Millisecond)); !got.Equal(t0.Add(4200 * time.Millisecond)) {
		t.Errorf("worker 1 after the change: +%v, want +4.2s", got.Sub(t0))
	}
	if got := w(0).next(t0.Add(4001 * time.Millisecond)); !got.Equal(t0.Add(4400 * time.Millisecond)) {
		t.Errorf("worker 0 after the change: +%v, want +4.4s", got.Sub(t0))
	}
	// Worker 1's last old turn before 4 s is 3.75 s; asked at 3.8 s it
	// goes on to its first turn of the new segment.
	if got := w(1).next(t0.Add(3800 * time.Millisecond)); !got.Equal(t0.Add(4200 * time.Millisecond)) {
		t.Errorf("worker 1 across the boundary: +%v, want +4.2s", got.Sub(t0))
	}
	// Much later, old segments are dropped.
	s.regrid(t0.Add(time.Minute), ahead, 6)
	if len(s.Grid) != 2 || s.Grid[0].Rate != 5 || s.Grid[1].Rate != 6 {
		t.Errorf("segments after a minute: %+v, want the 5/s one in force until the 6/s one", s.Grid)
	}
}

// TestFleetSendsInterleave: two workers sharing a destination's rate send
// in turn, one slot apart, instead of each on its own phase. Before the
// grid both sent at once as they started (each bucket holds a token), and
// then on every turn, their phases being the same; a provider with a
// one-message burst throttles each such pair.
func TestFleetSendsInterleave(t *testing.T) {
	env := startKV(t)
	const rate = 10.0 // fleet-wide: a slot every 100 ms
	mod := func(c *Config) { c.Defaults.Rate = rate; c.MaxWait = 10 * time.Second }
	a := newThrottle(t, env, "a", mod)
	b := newThrottle(t, env, "b", mod)
	waitLive(t, 2, a, b)

	type send struct {
		at     time.Time
		worker int
	}
	var mu sync.Mutex
	var sends []send
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	admitUntilDone(ctx, "grid.test", 3, []*Throttle{a, b}, func(i int, at time.Time) {
		mu.Lock()
		sends = append(sends, send{at, i})
		mu.Unlock()
	})
	slices.SortFunc(sends, func(x, y send) int { return x.at.Compare(y.at) })
	if len(sends) < 15 {
		t.Fatalf("%d sends in 2 s at %v/s", len(sends), rate)
	}
	period := time.Duration(float64(time.Second) / rate)
	close, alternating := 0, 0
	for i := 1; i < len(sends); i++ {
		if sends[i].at.Sub(sends[i-1].at) < period/2 {
			close++
			t.Logf("%v after the first: worker %d %v after worker %d", sends[i].at.Sub(sends[0].at), sends[i].worker, sends[i].at.Sub(sends[i-1].at), sends[i-1].worker)
		}
		if sends[i].worker != sends[i-1].worker {
			alternating++
		}
	}
	t.Logf("%d sends, %d pairs closer than half a slot, %d of %d neighbours from different workers", len(sends), close, alternating, len(sends)-1)
	// One late timer on a busy machine may bring a pair together; the
	// workers' own phases bring every pair together.
	if close > 1 {
		t.Errorf("%d pairs of sends closer than %v; the grid spaces the fleet's sends %v apart", close, period/2, period)
	}
	if alternating < (len(sends)-1)*9/10 {
		t.Errorf("only %d of %d neighbouring sends came from different workers", alternating, len(sends)-1)
	}
}

// TestAnEnvelopeBackLateGetsTheNextTurn: with two workers on a learned
// rate whose turns per worker lie further apart than MaxWait, an envelope
// refused with its place comes back a little after it and waits for the
// next turn instead of being refused again. Before, each return found the
// turn just gone and the next one beyond MaxWait, for ever: two daemons
// sharing a learned 0.4/s held their last four envelopes for five
// minutes.
func TestAnEnvelopeBackLateGetsTheNextTurn(t *testing.T) {
	env := startKV(t)
	quick := func(c *Config) { c.MaxWait = 100 * time.Millisecond }
	a, b := newThrottle(t, env, "a", quick), newThrottle(t, env, "b", quick)
	waitLive(t, 2, a, b)
	d := a.getDest("g.test")
	d.mu.Lock()
	now := a.now()
	d.state.LearnedRate, d.state.LearnedHold = 5, now.Add(time.Hour) // a's turns 400 ms apart
	d.state.Grid = []GridSegment{{From: now.UTC(), Rate: 5}}
	d.mu.Unlock()
	first := mustAdmit(t, a, "g.test") // waits for a turn of its own
	waiting := make(chan Permit)
	go func() {
		p, _ := a.Admit(ctxT(t), "g.test", "", "") // the next turn, within one
		waiting <- p
	}()
	eventually(t, 2*time.Second, "the second admission waits", func() bool {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.inflight == 2
	})
	_, r := a.Admit(ctxT(t), "g.test", "", "") // two turns ahead: refused with a place
	if r.Reason != "rate" {
		t.Fatalf("third admission: %+v, want a refusal for the rate", r)
	}
	first.Done([]classify.Result{resDelivered})
	if p := <-waiting; p == nil {
		t.Fatal("the second admission was refused")
	} else {
		p.Done([]classify.Result{resDelivered})
	}
	<-time.After(time.Until(r.Until) + 30*time.Millisecond) // back a little after its place
	p, r := a.Admit(ctxT(t), "g.test", "", "")
	if p == nil {
		t.Fatalf("back after its place: refused again until %v", time.Until(r.Until))
	}
	p.Done([]classify.Result{resDelivered})
}

// TestAPermitIsSentAtItsTurn: an admission that waits for its turn counts
// as sent at the turn, not at its reservation. Whether a throttle was
// paced at a cut's rate asks whether the attempt went out on the cut's
// grid segment (DestState.pacedAt), which with several workers starts a
// second after the cut, and a turn can be reserved up to max-wait before
// it: judged by the reservation, no throttle after a cut counted as paced
// until the hold ran out, and two daemons under a bucket of 20 at 0.5/s
// sent at each rate they had just cut from for its 3 s (85 throttles for
// 60 messages against 47).
func TestAPermitIsSentAtItsTurn(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", func(c *Config) { c.Defaults.Rate = 10 })
	for i := 0; i < 20; i++ {
		before := time.Now()
		p := mustAdmit(t, a, "turn.test")
		waited := time.Since(before)
		sent := p.(*permit).sent
		p.Done([]classify.Result{resDelivered})
		if waited < 50*time.Millisecond {
			continue // a token in the bucket: no turn to wait for
		}
		if sent.Before(before.Add(waited / 2)) {
			t.Fatalf("an admission that waited %v counts as sent %v after it asked, want its turn", waited, sent.Sub(before))
		}
		return
	}
	t.Fatal("no admission waited for its turn at 10/s")
}
