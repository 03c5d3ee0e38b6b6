package throttle

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"
)

// DestStatus travels between workers and `outflow dest status --json` as
// JSON; its keys are snake_case like every other JSON outflow writes
// (DestState, decision records, events).
func TestDestStatusJSONKeys(t *testing.T) {
	st := DestStatus{Dest: "example.test", Limits: Limits{Rate: 5, Conns: 2, MaxMsgsPerConn: 10}, Factor: 0.5,
		LiveWorkers: 2, Breaker: "open", BreakerUntil: time.Now()}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k, v := range m {
		keys = append(keys, k)
		if sub, ok := v.(map[string]any); ok {
			for k2 := range sub {
				keys = append(keys, k+"."+k2)
			}
		}
	}
	for _, k := range keys {
		if strings.ToLower(k) != k {
			t.Errorf("key %q is not snake_case", k)
		}
	}
	for _, want := range []string{"dest", "factor", "live_workers", "fleet_rate", "breaker_until", "limits.rate", "limits.max_msgs_per_conn", "state.dest"} {
		if !slices.Contains(keys, want) {
			t.Errorf("key %q missing from %s", want, b)
		}
	}
	if _, ok := m["suspended_till"]; ok {
		t.Errorf("zero suspended_till is written: %s", b)
	}
}
