package worker

import (
	"testing"
	"time"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// paceGate is a Gate whose Pace records the earliest it was asked for and
// gives the place 100 ms after it (or after now).
type paceGate struct {
	throttle.OpenGate
	now      time.Time
	earliest time.Time
}

func (g *paceGate) Pace(_, _, _ string, earliest time.Time) (time.Time, string, bool) {
	g.earliest = earliest
	from := g.now
	if earliest.After(from) {
		from = earliest
	}
	return from.Add(100 * time.Millisecond), "10.00/s learned", true
}

// TestPaceRepeatedThrottle: a message's first throttle, and a second that
// answers the same overshoot (within the hold of the first), come back at
// their place; a second one later than that, and any third, wait the
// rate-limit lane's minimum first.
func TestPaceRepeatedThrottle(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	g := &paceGate{now: now}
	w := &deliverer{Pool: &Pool{cfg: Config{Gate: g, ThrottleHold: 2 * time.Second}}, id: "w/0"}
	const minDelay = 15 * time.Second
	throttledAt := func(ago time.Duration) queue.Attempt {
		return queue.Attempt{At: now.Add(-ago), Class: "throttled"}
	}
	for _, tc := range []struct {
		name      string
		throttles int
		history   []queue.Attempt
		floor     bool
	}{
		{"first throttle", 0, nil, false},
		{"second, 400ms after the first", 1, []queue.Attempt{throttledAt(400 * time.Millisecond)}, false},
		{"second, 30s after the first", 1, []queue.Attempt{throttledAt(30 * time.Second)}, true},
		{"second, after a transient failure", 1, []queue.Attempt{throttledAt(time.Second), {At: now.Add(-500 * time.Millisecond), Class: "transient"}}, true},
		{"third, quickly", 2, []queue.Attempt{throttledAt(time.Second), throttledAt(400 * time.Millisecond)}, true},
	} {
		e := &queue.Envelope{Dest: "d.test", ThrottleCount: tc.throttles, History: tc.history}
		dec := backoff.Decision{MinMs: minDelay.Milliseconds()}
		at, by, ok := w.pace(e, "", now, &dec)
		if !ok || by == "" {
			t.Fatalf("%s: not paced", tc.name)
		}
		wantAt := now.Add(100 * time.Millisecond)
		if tc.floor {
			wantAt = now.Add(minDelay + 100*time.Millisecond)
			if !g.earliest.Equal(now.Add(minDelay)) {
				t.Errorf("%s: asked for a place from %v, want the lane's minimum %v", tc.name, g.earliest.Sub(now), minDelay)
			}
		} else if !g.earliest.IsZero() {
			t.Errorf("%s: asked for a place from %v, want its place now", tc.name, g.earliest.Sub(now))
		}
		if !at.Equal(wantAt) || dec.Delay != wantAt.Sub(now) {
			t.Errorf("%s: paced %v ahead (delay %v), want %v", tc.name, at.Sub(now), dec.Delay, wantAt.Sub(now))
		}
	}
}
