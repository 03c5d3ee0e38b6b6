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
