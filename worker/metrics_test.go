package worker

import (
	"testing"

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
