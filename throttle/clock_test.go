package throttle

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// skewedBy is a wall clock off by d from this machine's.
func skewedBy(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// waitWriter returns once th's KV writer has run everything queued
// before the call: the writer runs ops one at a time, in order.
func waitWriter(t *testing.T, th *Throttle, d *dest) {
	t.Helper()
	ran := make(chan struct{})
	th.ops <- op{d: d, change: "test-marker", fn: func(*DestState, time.Time) bool { close(ran); return false }}
	select {
	case <-ran:
	case <-time.After(20 * time.Second):
		t.Fatal("the KV writer did not reach the marker")
	}
}

// TestSkewedClocksKeepSharedEnds: a suspension and an open breaker written
// by one worker end, on workers whose clocks are two hours ahead or
// behind, when their writer meant: the one ahead neither admits early nor
// ends the suspension for everyone, the one behind does not hold the
// destination two hours longer.
func TestSkewedClocksKeepSharedEnds(t *testing.T) {
	env := startKV(t)
	const cooldown = 10 * time.Minute
	mod := func(skew time.Duration) func(*Config) {
		return func(c *Config) {
			c.Now = skewedBy(skew)
			c.BreakerFailures = 1
			c.BreakerCooldown = cooldown
		}
	}
	w := newThrottle(t, env, "writer", mod(0))
	ahead := newThrottle(t, env, "ahead", mod(2*time.Hour))
	behind := newThrottle(t, env, "behind", mod(-2*time.Hour))
	for _, th := range []*Throttle{ahead, behind} {
		if off, known := th.ClockOffset(); !known || (off+time.Until(th.now())).Abs() > time.Second {
			t.Fatalf("%s: measured offset %v (known %v), want about %v", th.cfg.WorkerID, off, known, time.Since(th.now()))
		}
	}

	// An operator suspends one destination for 10 minutes; the writer's
	// breaker opens for another.
	ctx := ctxT(t)
	if err := Suspend(ctx, env.state, "susp.test", time.Now().Add(10*time.Minute), "maintenance", "ops"); err != nil {
		t.Fatal(err)
	}
	attempt(t, w, "down.test", resConnFail)
	waitWriter(t, w, w.getDest("down.test"))

	for _, c := range []struct {
		dest, reason string
		within       time.Duration // from the reader's now
	}{{"susp.test", "suspended", 10 * time.Minute}, {"down.test", "breaker-open", cooldown}} {
		for _, th := range []*Throttle{w, ahead, behind} {
			var r Refusal
			eventually(t, 5*time.Second, th.cfg.WorkerID+" refuses "+c.dest+" ("+c.reason+")", func() bool {
				var p Permit
				p, r = th.Admit(ctx, c.dest, "", "")
				if p != nil {
					p.Done(nil)
				}
				return p == nil && r.Reason == c.reason
			})
			if left := r.Until.Sub(th.now()); (left - c.within).Abs() > 5*time.Second {
				t.Errorf("%s: %s %s for %v more on its clock, want about %v", th.cfg.WorkerID, c.dest, c.reason, left.Round(time.Second), c.within)
			}
		}
	}

	// The worker ahead's maintenance does not end the suspension for
	// everyone: it queues no write, and the stored state keeps it.
	ahead.tickStates(ahead.now())
	waitWriter(t, ahead, ahead.getDest("susp.test"))
	e, err := env.state.Get(context.Background(), StateKey("susp.test"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := decodeState(e.Key(), e.Value())
	if err != nil {
		t.Fatal(err)
	}
	if s.SuspendedUntil.IsZero() {
		t.Fatalf("the worker two hours ahead ended the suspension in the shared state (last written by %s)", s.UpdatedBy)
	}
	if p, r := w.Admit(ctx, "susp.test", "", ""); p != nil || r.Reason != "suspended" {
		t.Fatalf("writer: %v %+v after the worker ahead's tick, want suspended", p, r)
	}
}

// TestToLocalMovesEveryEnd: a state written by a clock an hour ahead of
// the server is moved onto a reader's clock ten minutes behind it; an
// unending suspension and small differences are left alone.
func TestToLocalMovesEveryEnd(t *testing.T) {
	server := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	writer := server.Add(time.Hour)
	s := DestState{UpdatedAt: writer, SuspendedUntil: writer.Add(5 * time.Minute), BreakerUntil: writer.Add(time.Minute)}
	got := frame{offset: 10 * time.Minute}.toLocal(s, server)
	local := server.Add(-10 * time.Minute)
	if !got.SuspendedUntil.Equal(local.Add(5*time.Minute)) || !got.BreakerUntil.Equal(local.Add(time.Minute)) || !got.UpdatedAt.Equal(local) {
		t.Fatalf("moved to %+v, want ends 5 min and 1 min after %v", got, local)
	}
	s.SuspendedUntil = SuspendForever
	if got := (frame{}).toLocal(s, server); !got.SuspendedUntil.Equal(SuspendForever) {
		t.Fatalf("an unending suspension moved to %v", got.SuspendedUntil)
	}
	s.UpdatedAt = server.Add(300 * time.Millisecond)
	if got := (frame{}).toLocal(s, server); !reflect.DeepEqual(got, s) {
		t.Fatalf("a 300 ms difference moved the state: %+v", got)
	}
}

// TestToLocalMovesEveryTimeField: every time in DestState is moved onto
// the reader's clock, so that a field added later cannot be left on the
// writer's (a probe's time left an hour ahead would hold a plateau for an
// hour).
func TestToLocalMovesEveryTimeField(t *testing.T) {
	server := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	writer := server.Add(time.Hour)
	var s DestState
	v := reflect.ValueOf(&s).Elem()
	var names []string
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Type() == reflect.TypeOf(time.Time{}) {
			f.Set(reflect.ValueOf(writer.Add(time.Duration(i) * time.Minute)))
			names = append(names, v.Type().Field(i).Name)
		}
	}
	s.UpdatedAt = writer
	got := reflect.ValueOf(frame{offset: 10 * time.Minute}.toLocal(s, server))
	shift := -time.Hour - 10*time.Minute
	for _, name := range names {
		was, now := v.FieldByName(name).Interface().(time.Time), got.FieldByName(name).Interface().(time.Time)
		if !now.Equal(was.Add(shift)) {
			t.Errorf("%s: %v, want %v (moved onto the reader's clock)", name, now, was.Add(shift))
		}
	}
	if len(names) < 10 {
		t.Fatalf("only %d time fields found: %v", len(names), names)
	}
	// The times inside the state's collections too: the grid's segments,
	// the automation rules' ends; and the writer's map is not changed.
	s.Grid = []GridSegment{{From: writer, Rate: 1}}
	s.Rules = map[string]time.Time{"r": writer.Add(time.Hour)}
	moved := frame{offset: 10 * time.Minute}.toLocal(s, server)
	if !moved.Grid[0].From.Equal(writer.Add(shift)) || !moved.Rules["r"].Equal(writer.Add(time.Hour+shift)) {
		t.Errorf("grid %v, rules %v: not moved onto the reader's clock", moved.Grid, moved.Rules)
	}
	if !s.Rules["r"].Equal(writer.Add(time.Hour)) {
		t.Error("the writer's rules map was changed in place")
	}
}

// TestToLocalMovesTheGridExactly: a learned rate's grid of send slots is
// moved onto the reader's clock by any difference, one under
// shiftTolerance too (the rest of the state is not), except in a state
// the reader wrote itself, which is on its own clock already.
func TestToLocalMovesTheGridExactly(t *testing.T) {
	server := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	writer := server.Add(-250 * time.Millisecond) // the writer's clock, 250 ms behind the server
	s := DestState{UpdatedBy: "a", UpdatedAt: writer, LearnedHold: writer.Add(time.Second),
		Grid: []GridSegment{{From: writer, Rate: 4}, {From: writer.Add(time.Second), Slot: 4, Rate: 8}}}
	reader := frame{offset: -100 * time.Millisecond, self: "b"} // 100 ms ahead of the server
	got := reader.toLocal(s, server)
	shift := 350 * time.Millisecond
	for i := range s.Grid {
		if want := s.Grid[i].From.Add(shift); !got.Grid[i].From.Equal(want) {
			t.Errorf("segment %d from %v, want %v (moved by %v)", i, got.Grid[i].From, want, shift)
		}
	}
	if !got.LearnedHold.Equal(s.LearnedHold) || !got.UpdatedAt.Equal(s.UpdatedAt) {
		t.Errorf("a %v difference moved the rest of the state: %+v", shift, got)
	}
	if !s.Grid[0].From.Equal(writer) {
		t.Error("the writer's grid was changed in place")
	}
	// Its own write: the difference is the measurement's noise.
	own := frame{offset: -100 * time.Millisecond, self: "a"}
	if got := own.toLocal(s, server); !reflect.DeepEqual(got, s) {
		t.Errorf("the writer's own state moved: %+v", got)
	}
	// A large difference moves its own write too (its clock was stepped).
	s.UpdatedAt, s.Grid = server.Add(-time.Hour), []GridSegment{{From: server.Add(-time.Hour), Rate: 4}}
	if got := own.toLocal(s, server); !got.Grid[0].From.Equal(server.Add(100 * time.Millisecond)) {
		t.Errorf("own grid an hour off left at %v", got.Grid[0].From)
	}
}

// TestSubSecondSkewKeepsTheLearnedGrid: two workers whose clocks are
// 250 ms apart, under shiftTolerance, take turns on a learned rate's grid
// one slot apart in real time, as on the configured rate's epoch grid.
// Before, the one ahead read the grid's start as written, on its own
// clock, and at 4/s fleet-wide (a slot of 250 ms) its turns fell on the
// other's.
func TestSubSecondSkewKeepsTheLearnedGrid(t *testing.T) {
	env := startKV(t)
	const skew = 250 * time.Millisecond
	a := newThrottle(t, env, "a", nil)
	b := newThrottle(t, env, "b", func(c *Config) { c.Now = skewedBy(skew) })
	waitLive(t, 2, a, b)
	if off, known := b.ClockOffset(); !known || (off+skew).Abs() > 100*time.Millisecond {
		t.Fatalf("b's measured offset %v (known %v), want about %v", off, known, -skew)
	}
	// a writes a learned rate and its grid, as its seed would.
	if _, _, _, _, err := updateStateIn(ctxT(t), env.state, "skew.test", "a", a.frame(), func(s *DestState, now time.Time) bool {
		s.LearnedRate, s.LearnedHold, s.LearnedNext, s.LearnedCutAt = 4, now.Add(time.Hour), now.Add(time.Hour), now
		s.regrid(now, 0, 4)
		return true
	}); err != nil {
		t.Fatal(err)
	}
	for _, th := range []*Throttle{a, b} {
		d := th.getDest("skew.test")
		eventually(t, 5*time.Second, th.cfg.WorkerID+" has the learned rate", func() bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			return d.state.LearnedRate == 4
		})
	}
	// Each worker's next turns, in real time.
	from := time.Now().Add(time.Second)
	turns := func(th *Throttle, skew time.Duration) []time.Time {
		d := th.getDest("skew.test")
		d.mu.Lock()
		defer d.mu.Unlock()
		k := th.turnOf(d, 4, 2, th.now())
		if k.segs == nil {
			t.Fatalf("%s: not on the learned grid", th.cfg.WorkerID)
		}
		var out []time.Time
		for at := from.Add(skew); len(out) < 4; {
			x := k.next(at)
			out = append(out, x.Add(-skew))
			at = x.Add(time.Nanosecond)
		}
		return out
	}
	ta, tb := turns(a, 0), turns(b, skew)
	for _, x := range ta {
		for _, y := range tb {
			if gap := x.Sub(y).Abs(); gap < 200*time.Millisecond {
				t.Fatalf("a's turn at +%v and b's at +%v, %v apart: want a slot (250 ms)", x.Sub(from).Round(time.Millisecond), y.Sub(from).Round(time.Millisecond), gap.Round(time.Millisecond))
			}
		}
	}
}

// TestStatesReadAtStartAreOnTheWorkersClock: a worker that starts after a
// learned grid and a suspension were written reads them onto its own
// clock at once, not only after their destinations' next write: the grid
// moved by its 250 ms, the suspension by its two hours. Before, the
// states were loaded before the worker had measured its offset from the
// server, and were moved by zero: its turns fell 250 ms off the grid, and
// the worker two hours ahead took the suspension as over and sent.
func TestStatesReadAtStartAreOnTheWorkersClock(t *testing.T) {
	env := startKV(t)
	a := newThrottle(t, env, "a", nil)
	var written time.Time
	if _, after, _, _, err := updateStateIn(ctxT(t), env.state, "start.test", "a", a.frame(), func(s *DestState, now time.Time) bool {
		s.LearnedRate, s.LearnedHold, s.LearnedNext, s.LearnedCutAt = 4, now.Add(time.Hour), now.Add(time.Hour), now
		s.regrid(now, 0, 4)
		return true
	}); err != nil {
		t.Fatal(err)
	} else {
		written = after.Grid[0].From
	}
	if err := Suspend(ctxT(t), env.state, "held.test", time.Now().Add(10*time.Minute), "maintenance", "ops"); err != nil {
		t.Fatal(err)
	}

	const skew = 250 * time.Millisecond
	b := newThrottle(t, env, "b", func(c *Config) { c.Now = skewedBy(skew) })
	d := b.lookDest("start.test")
	if d == nil {
		t.Fatal("b has no state for start.test after its start")
	}
	d.mu.Lock()
	from := d.state.Grid[0].From
	d.mu.Unlock()
	if off := from.Sub(written.Add(skew)); off.Abs() > 100*time.Millisecond {
		t.Errorf("b's grid starts %v off its clock's reading of it (written %v, read %v, b %v ahead)", off, written, from, skew)
	}

	ahead := newThrottle(t, env, "ahead", func(c *Config) { c.Now = skewedBy(2 * time.Hour) })
	p, r := ahead.Admit(ctxT(t), "held.test", "", "")
	if p != nil {
		p.Done(nil)
		t.Fatal("a worker two hours ahead, started after the suspension, sent to the suspended destination")
	}
	if left := r.Until.Sub(ahead.now()); r.Reason != "suspended" || (left-10*time.Minute).Abs() > 5*time.Second {
		t.Errorf("refused %q for %v more on its clock, want suspended for about 10m", r.Reason, left.Round(time.Second))
	}
}
