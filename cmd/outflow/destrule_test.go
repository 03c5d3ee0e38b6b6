package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// TestDestShowsCapsInForceAndWhichRuleSetThem: `dest list` and `dest
// status` show a rate or connection cap only while it is in force (one
// whose end has passed was listed as if it held, and `dest rate --clear`
// said it cleared it), and say which automation rule set a cap, a factor
// or a tenant's suspension ("automation: NAME"), in the REASON column, the
// status lines and the FROM column (a rule's pin was "pinned" like an
// operator's).
func TestDestShowsCapsInForceAndWhichRuleSetThem(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := throttle.OpenState(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	put := func(s throttle.DestState) {
		t.Helper()
		b, _ := json.Marshal(s)
		if _, err := kv.Put(ctx, throttle.StateKey(s.Dest), b); err != nil {
			t.Fatal(err)
		}
	}
	put(throttle.DestState{Dest: "ended.example", RateOverride: 5, RateUntil: now.Add(-time.Hour),
		ConnsOverride: 2, ConnsUntil: now.Add(-time.Hour), Factor: 0.5, FactorUntil: now.Add(time.Hour)})
	ruled := throttle.DestState{Dest: "ruled.example", RateOverride: 0.5, RateUntil: now.Add(time.Hour), RateBy: "automation: slow",
		ConnsOverride: 1, ConnsUntil: now.Add(time.Hour), ConnsBy: "automation: one",
		Factor: 0.5, FactorUntil: now.Add(time.Hour), FactorBy: "automation: busy",
		Tenants: map[string]throttle.TenantHold{"t1": {Until: now.Add(time.Hour), Reason: "automation: auth"}}}
	put(ruled)
	stop, err := q.ServeDestStatus(func(dest string) []byte {
		name, _ := throttle.SplitPair(strings.TrimSpace(dest))
		ws := throttle.WorkerStatus{Worker: "w/0"}
		ws.Dest, ws.Breaker, ws.RateSource, ws.FleetRate = name, "closed", "pinned", 0.25
		if name == "ruled.example" {
			ws.State = ruled
			ws.Sources = []throttle.DestStatus{{Dest: name + "@192.0.2.10", Breaker: "closed", RateSource: "pinned", FleetRate: 0.25, State: ruled}}
		}
		b, _ := json.Marshal(ws)
		return b
	})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	run := func(args ...string) string { t.Helper(); return runAdmin(t, ctx, dir, false, args...) }

	list := run("dest", "list")
	for _, line := range strings.Split(list, "\n") {
		switch {
		case strings.HasPrefix(line, "ended.example"):
			if strings.Contains(line, "5/s") {
				t.Errorf("dest list shows an ended cap: %q", line)
			}
		case strings.HasPrefix(line, "ruled.example"):
			for _, w := range []string{"0.5/s", "automation: slow", "automation: one", "automation: busy", "tenant t1 suspended (automation: auth)"} {
				if !strings.Contains(line, w) {
					t.Errorf("dest list line lacks %q: %q", w, line)
				}
			}
		}
	}

	out := run("dest", "status", "ended.example")
	for _, l := range []string{"\nrate override:", "\nconns:"} {
		if strings.Contains(out, l) {
			t.Errorf("dest status shows an ended cap (%q):\n%s", l, out)
		}
	}
	if out := run("dest", "rate", "ended.example", "--clear"); !strings.Contains(out, "had no rate cap in force") {
		t.Errorf("clearing an ended cap: %q", out)
	}

	out = run("dest", "status", "ruled.example")
	for _, w := range []string{
		"\nrate override: 0.5/s until " + ruled.RateUntil.Format(time.RFC3339) + " (automation: slow)\n",
		"\nconns:         1 (override) until " + ruled.ConnsUntil.Format(time.RFC3339) + " (automation: one)\n",
		"\nrate factor:   0.50 (automation: busy)",
		"\n  tenant t1:  suspended until " + ruled.Tenants["t1"].Until.Format(time.RFC3339) + " (automation: auth)",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("dest status lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "pinned") || strings.Count(out, "automation: slow") < 3 {
		t.Errorf("dest status: the FROM columns should say automation: slow, not pinned:\n%s", out)
	}
}

// TestUnansweredWorkers: `dest status` says how many of the live workers
// did not answer. A worker killed with -9 stays live in the registry until
// its record expires, its share of the rate unused, and its row was
// simply missing: FLEET RATE read as twice what went out.
func TestUnansweredWorkers(t *testing.T) {
	view := func(id string, live int) throttle.WorkerStatus {
		return throttle.WorkerStatus{Worker: id, DestStatus: throttle.DestStatus{LiveWorkers: live}}
	}
	for _, c := range []struct {
		views []throttle.WorkerStatus
		want  int
	}{
		{nil, 0},
		{[]throttle.WorkerStatus{view("d1", 2)}, 1},
		{[]throttle.WorkerStatus{view("d1", 2), view("d2", 2)}, 0},
		{[]throttle.WorkerStatus{view("d1", 3), view("d2", 2)}, 1},
	} {
		if got := unanswered(c.views); got != c.want {
			t.Errorf("%+v: %d unanswered, want %d", c.views, got, c.want)
		}
	}
}
