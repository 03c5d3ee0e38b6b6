package worker

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered returns reg's series of the family name as "l1=v1,l2=v2" -> value.
func gathered(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			k := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					k += ","
				}
				k += l.GetName() + "=" + l.GetValue()
			}
			out[k] = m.GetCounter().GetValue()
		}
	}
	return out
}

// TestMetricsSeriesForAlerts: the series docs/alerts.yaml compares exist,
// at 0, before anything happened to them. PromQL drops a comparison with a
// series that does not exist, so OutflowRetryStorm (failures against
// deliveries) would not fire on a process that has delivered nothing since
// it started, and OutflowBounceStorm (a destination's permanent share
// against the day before) would miss the start of a destination's first
// storm.
func TestMetricsSeriesForAlerts(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	attempts := gathered(t, reg, "outflow_attempts_total")
	for _, lane := range []string{"work", "retry", "ratelimit"} {
		for _, class := range []string{"delivered", "transient", "throttled", "permanent", "unknown"} {
			if v, ok := attempts["class="+class+",lane="+lane]; !ok || v != 0 {
				t.Errorf("outflow_attempts_total{class=%q,lane=%q} = %v (present %v) before any attempt, want 0", class, lane, v, ok)
			}
		}
	}
	if len(attempts) != 15 {
		t.Errorf("outflow_attempts_total has %d series before any attempt, want 15 (5 classes × 3 lanes): %v", len(attempts), attempts)
	}

	m.attempt("transient", "work", "a.example")
	dest := gathered(t, reg, "outflow_dest_attempts_total")
	want := map[string]float64{"class=permanent,dest=a.example": 0, "class=transient,dest=a.example": 1}
	if len(dest) != len(want) {
		t.Errorf("outflow_dest_attempts_total = %v, want %v", dest, want)
	}
	for k, v := range want {
		if got, ok := dest[k]; !ok || got != v {
			t.Errorf("outflow_dest_attempts_total{%s} = %v (present %v), want %v", k, got, ok, v)
		}
	}
}

// TestDestSeriesBounded: a destination's series go after an hour without
// an attempt, and past the limit new destinations are counted under
// dest="other", so that a sender reaching a hundred thousand domains a day
// does not grow the process and every scrape by their series for good.
func TestDestSeriesBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	m.dests.now = func() time.Time { return now }
	m.dests.max = 2

	m.attempt("delivered", "work", "a.example")
	m.throttled("a.example")
	m.attempt("delivered", "work", "b.example")
	m.attempt("transient", "work", "c.example") // past the limit
	dest := gathered(t, reg, "outflow_dest_attempts_total")
	if dest["class=transient,dest=other"] != 1 || dest["class=delivered,dest=a.example"] != 1 {
		t.Errorf("past the limit: %v, want c.example counted under other", dest)
	}
	if _, ok := dest["class=transient,dest=c.example"]; ok {
		t.Errorf("c.example has a series past the limit: %v", dest)
	}

	now = now.Add(40 * time.Minute)
	m.attempt("delivered", "work", "b.example") // b stays busy
	now = now.Add(30 * time.Minute)             // a idle 70 minutes
	m.attempt("delivered", "work", "c.example") // a's place is free again
	dest = gathered(t, reg, "outflow_dest_attempts_total")
	for k := range dest {
		if strings.Contains(k, "dest=a.example") {
			t.Errorf("a.example's series %s kept after an hour idle", k)
		}
	}
	if dest["class=delivered,dest=b.example"] != 2 || dest["class=delivered,dest=c.example"] != 1 {
		t.Errorf("after the sweep: %v, want b.example kept and c.example with a series of its own", dest)
	}
	if th := gathered(t, reg, "outflow_throttle_events_total"); len(th) != 0 {
		t.Errorf("throttle series kept after an hour idle: %v", th)
	}
}

// TestDeferredMessageAge: outflow_deferred_message_age_seconds is the
// largest age since it was ready to go that a message had when it was
// deferred to the lane, in the current half hour and the one before, per
// lane: a message still retrying six hours after submission shows as six
// hours, however recently it was last rewritten (OutflowLongLivedRetries
// read the lane's oldest write, which each deferral renews). A message
// delivered after its last deferral does not age in it (the alert fired
// for mail delivered at 5 h 50 min), and it falls to 0 two half hours
// after the last deferral.
func TestDeferredMessageAge(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	m.deferred.now = func() time.Time { return now }
	m.deferred.start = now
	ages := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() == "outflow_deferred_message_age_seconds" {
				for _, s := range mf.GetMetric() {
					out[s.GetLabel()[0].GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
		return out
	}
	if got := ages(); len(got) != 2 || got["retry"] != 0 || got["ratelimit"] != 0 {
		t.Fatalf("before any deferral: %v, want 0 for retry and ratelimit", got)
	}
	m.deferredTo("retry", now.Add(-6*time.Hour))
	m.deferredTo("retry", now.Add(-time.Minute))
	m.deferredTo("ratelimit", now.Add(-2*time.Hour))
	if got := ages(); got["retry"] != 6*3600 || got["ratelimit"] != 2*3600 {
		t.Fatalf("after deferrals: %v, want retry 6h and ratelimit 2h", got)
	}
	now = now.Add(40 * time.Minute) // the next span: the last one still counts, at its age then
	if got := ages()["retry"]; got != 6*3600 {
		t.Errorf("40 minutes on: retry %v, want the 6h message as it was deferred", got)
	}
	m.deferredTo("retry", now.Add(-3*time.Hour))
	now = now.Add(30 * time.Minute) // 70 minutes on: only the 3h message's span is left
	if got := ages(); got["retry"] != 3*3600 || got["ratelimit"] != 0 {
		t.Errorf("70 minutes on: %v, want retry the 3h message, ratelimit 0", got)
	}
	now = now.Add(2 * time.Hour)
	if got := ages(); got["retry"] != 0 {
		t.Errorf("two hours without a deferral: %v, want 0", got)
	}
}
