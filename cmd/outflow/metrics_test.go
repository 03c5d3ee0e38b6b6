package main

import (
	"os"
	"regexp"
	"testing"

	"github.com/outflow/outflow/internal/testutil"
)

// TestEveryMetricDocumented: each metric the code defines has its row in
// docs/metrics.md, and each row there names a metric the code defines, so
// an operator finds every series /metrics serves and none that is gone.
func TestEveryMetricDocumented(t *testing.T) {
	// A metric's name is the literal right after one of these: the
	// client library's Name option and NewDesc, and the packages' small
	// helpers around them (submission's counter, throttle's destGauge).
	def := regexp.MustCompile(`(?:Name:\s*|NewDesc\(|counter\(|destGauge\()"(outflow_[a-z_]+)"`)
	defined := map[string]bool{}
	testutil.EachSource(t, "../..", []string{"e2e", "bench", "data", "node_modules"}, func(_, src string) {
		for _, m := range def.FindAllStringSubmatch(src, -1) {
			defined[m[1]] = true
		}
	})
	if len(defined) < 30 {
		t.Fatalf("found only %d metric definitions: %v", len(defined), defined)
	}
	b, err := os.ReadFile("../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `(outflow_[a-z_]+)` \\|").FindAllStringSubmatch(string(b), -1) {
		rows[m[1]] = true
	}
	for name := range defined {
		if !rows[name] {
			t.Errorf("%s has no row in docs/metrics.md", name)
		}
	}
	for name := range rows {
		if !defined[name] {
			t.Errorf("docs/metrics.md lists %s, which no code defines", name)
		}
	}
}
