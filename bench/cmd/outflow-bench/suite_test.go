package main

import (
	"strings"
	"testing"
	"time"
)

// run is an e2eRun of 1,000 messages whose load tools and machine spent
// the given microseconds per message.
func run(busy, source, sink float64) e2eRun {
	us := func(v float64) time.Duration { return time.Duration(v * 1000 * float64(time.Microsecond)) }
	return e2eRun{msgs: 1000, cpu: cpuSplit{busy: us(busy), source: us(source), sink: us(sink)}}
}

func TestRelayBudget(t *testing.T) {
	// Postfix at 650 msg/s: 10 times is 6,500 msg/s, 307.7 µs per message
	// on 2 cores. The load tools took 130 + 50 relayed, leaving 127.7.
	relayed := []e2eRun{run(600, 130, 50), run(590, 120, 60), run(610, 140, 40)}
	direct := []e2eRun{run(230, 120, 110), run(225, 118, 107), run(240, 125, 115)}
	b := newRelayBudget(2, 650, relayed, direct)
	if b.target != 6500 {
		t.Errorf("target = %v, want 6500", b.target)
	}
	if got, want := b.left(), 2e6/6500-130-50; got < want-0.01 || got > want+0.01 {
		t.Errorf("left = %v, want %v", got, want)
	}
	if b.spent != 600-130-50 || b.inbound != 110 {
		t.Errorf("spent %v inbound %v, want 420 and 110", b.spent, b.inbound)
	}
	if n := b.note(2048, 2); !strings.Contains(n, "**128 µs**") || !strings.Contains(n, "outflow took 420") {
		t.Errorf("note: %s", n)
	}

	// 100 KiB: the load tools alone need more than the machine has.
	b = newRelayBudget(2, 465, []e2eRun{run(2200, 200, 440)}, direct)
	if b.left() >= 0 || !strings.Contains(b.note(100<<10, 2), "**nothing**") {
		t.Errorf("left %v, note %s", b.left(), b.note(100<<10, 2))
	}
}

// The /proc parsers, in clock ticks of 10 ms; 0 for what they cannot read.
func TestProcParsers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]byte) time.Duration
		in    string
		ticks int
	}{
		// user+nice+system+irq+softirq+steal = 100+5+50+3+2+1; not idle,
		// iowait or guest.
		{"statBusy", statBusy, "cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n", 161},
		{"statBusy", statBusy, "intr 1 2 3\n", 0},
		// A command name with spaces and a ')' must not shift the fields.
		{"pidStatCPU", pidStatCPU, "4242 (smtp ) sink) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 12345 1000 100\n", 325},
		{"pidStatCPU", pidStatCPU, "garbage", 0},
	} {
		if got, want := tc.parse([]byte(tc.in)), time.Duration(tc.ticks)*10*time.Millisecond; got != want {
			t.Errorf("%s(%q) = %v, want %v", tc.name, tc.in, got, want)
		}
	}
}

func TestParseMetric(t *testing.T) {
	page := `# HELP outflow_store_fsyncs_total fsync calls.
# TYPE outflow_store_fsyncs_total counter
outflow_store_fsyncs_total 1234
outflow_store_fsyncs_totalx 7
outflow_submissions_total{result="accepted"} 10
outflow_submissions_total{result="rejected"} 2.5
`
	if v, ok := parseMetric(strings.NewReader(page), "outflow_store_fsyncs_total"); !ok || v != 1234 {
		t.Errorf("fsyncs = %v, %v; want 1234", v, ok)
	}
	if v, ok := parseMetric(strings.NewReader(page), "outflow_submissions_total"); !ok || v != 12.5 {
		t.Errorf("submissions = %v, %v; want 12.5 (labels summed)", v, ok)
	}
	if _, ok := parseMetric(strings.NewReader(page), "outflow_store_syncs_total"); ok {
		t.Error("a metric not on the page was found")
	}
}

func TestStraceCalls(t *testing.T) {
	summary := `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 91.20    0.120000          60      2000           fsync
  8.80    0.011000          11      1000         3 fdatasync
------ ----------- ----------- --------- --------- ----------------
100.00    0.131000          43      3000         3 total
`
	if n := straceCalls([]byte(summary)); n != 3000 {
		t.Errorf("calls = %d, want 3000", n)
	}
}

// TestLearnTimeline: scenario 6's trace counts arrivals and throttles per
// half second from the start, quiet half seconds included.
func TestLearnTimeline(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }
	got := string(learnTimeline([]time.Time{at(10), at(400), at(1200)}, []time.Time{at(499), at(1700)}, start))
	want := "seconds\tarrivals\tthrottles\n0.0\t2\t1\n0.5\t0\t0\n1.0\t1\t0\n1.5\t0\t1\n"
	if got != want {
		t.Fatalf("timeline\n%q\nwant\n%q", got, want)
	}
}
