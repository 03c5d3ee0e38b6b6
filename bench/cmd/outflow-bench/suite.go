package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"
)

// table is one result table: a title, the commands, a header and rows.
type table struct {
	title string
	notes []string
	head  []string
	rows  [][]string
}

func (t *table) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", t.title)
	for _, n := range t.notes {
		fmt.Fprintf(&b, "%s\n", n)
	}
	if len(t.notes) > 0 {
		b.WriteString("\n")
	}
	b.WriteString("| " + strings.Join(t.head, " | ") + " |\n|")
	for range t.head {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range t.rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile returns the p-th percentile (0..100) by nearest rank.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(p/100*float64(len(sorted))+0.5) - 1
	if k < 0 {
		k = 0
	}
	if k >= len(sorted) {
		k = len(sorted) - 1
	}
	return sorted[k]
}

func fmtRuns(xs []float64, unit string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ") + unit
}

type suite struct {
	c       *config
	tables  []*table
	maxRate map[string]float64 // scenario 1 medians (2 KiB), for scenario 2
	last    *outflowProc       // the most recently started outflow
}

func machine() string {
	kern, _ := exec.Command("uname", "-r").Output()
	cpu := ""
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				cpu = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	pf, _ := exec.Command("/usr/sbin/postconf", "-d", "-h", "mail_version").Output()
	return fmt.Sprintf("nproc %d, kernel %s, %s, %s, Postfix %s", runtime.NumCPU(), strings.TrimSpace(string(kern)), cpu,
		runtime.Version(), strings.TrimSpace(string(pf)))
}

func runSuite(c *config) error {
	abs, err := filepath.Abs(c.outflow)
	if err != nil {
		return err
	}
	c.outflow = abs
	if _, err := os.Stat(c.outflow); err != nil {
		return fmt.Errorf("outflow binary: %w (make build)", err)
	}
	for _, t := range []string{"smtp-sink", "smtp-source", "postfix"} {
		if _, err := lookPath(t); err != nil {
			return err
		}
	}
	s := &suite{c: c, maxRate: map[string]float64{}}
	mode := "full"
	if c.quick {
		mode = "quick"
	}
	fmt.Printf("outflow-bench (%s mode, %d alternating runs per scenario)\nmachine: %s\n\n", mode, c.runs, machine())
	steps := []struct {
		id  string
		run func() error
	}{
		{"1", s.scenario1},
		{"2", s.scenario2},
		{"3", s.scenario3},
		{"4", s.scenario4},
		{"5", s.scenario5},
	}
	for _, st := range steps {
		if !c.scenarios[st.id] {
			continue
		}
		if err := st.run(); err != nil {
			return fmt.Errorf("scenario %s: %w", st.id, err)
		}
		t := s.tables[len(s.tables)-1]
		fmt.Println(t.markdown())
	}
	if c.results != "" {
		var b strings.Builder
		fmt.Fprintf(&b, "Machine: %s. Mode: %s, %d alternating runs.\n\n", machine(), mode, c.runs)
		for _, t := range s.tables {
			b.WriteString(t.markdown() + "\n")
		}
		if err := os.WriteFile(c.results, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// e2eRun is one end-to-end run: smtp-source -> system -> smtp-sink.
type e2eRun struct {
	rate      float64 // messages per second, submission start to last arrival
	submitted time.Duration
	total     time.Duration
}

// system is one side of a comparison.
type system struct {
	name  string
	start func(sinkAddr string) (addr string, stop func(), err error)
}

func (s *suite) outflowSystem(name string, extra ...string) system {
	return system{name: name, start: func(sinkAddr string) (string, func(), error) {
		data, err := os.MkdirTemp("", "outflow-bench-data-")
		if err != nil {
			return "", nil, err
		}
		p, err := startOutflow(s.c.outflow, data, sinkAddr, extra...)
		if err != nil {
			os.RemoveAll(data)
			return "", nil, err
		}
		s.last = p
		return p.SMTPAddr, func() { p.Stop(); os.RemoveAll(data) }, nil
	}}
}

func postfixSystem(extra map[string]string) system {
	return system{name: "Postfix", start: func(sinkAddr string) (string, func(), error) {
		p, err := startPostfix(sinkAddr, extra)
		if err != nil {
			return "", nil, err
		}
		return p.Addr, p.Stop, nil
	}}
}

// directSystem is no system at all: smtp-source talks to smtp-sink
// itself, which measures what the machine allows the load tools.
var directSystem = system{name: "direct", start: func(sinkAddr string) (string, func(), error) {
	return sinkAddr, func() {}, nil
}}

// runE2E starts a sink and the system, sends msgs messages of size bytes
// over 20 sessions with smtp-source, and stops the clock when the sink has
// counted the last one.
func runE2E(sys system, msgs, size int) (e2eRun, error) {
	sk := newSink(freePort())
	if err := sk.Start(); err != nil {
		return e2eRun{}, err
	}
	defer sk.Stop()
	addr, stop, err := sys.start(sk.addr)
	if err != nil {
		return e2eRun{}, err
	}
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	if err := smtpSource(ctx, addr, 20, msgs, size); err != nil {
		return e2eRun{}, err
	}
	sub := time.Since(start)
	end, err := sk.WaitCount(int64(msgs), 15*time.Minute)
	if err != nil {
		return e2eRun{}, fmt.Errorf("%s: %w", sys.name, err)
	}
	total := end.Sub(start)
	return e2eRun{rate: float64(msgs) / total.Seconds(), submitted: sub, total: total}, nil
}

// compare alternates runs of a and b (a first on odd runs, b first on
// even ones) and returns each side's rates.
func (s *suite) compare(a, b system, msgs, size int) (ra, rb []float64, err error) {
	for i := 0; i < s.c.runs; i++ {
		order := []system{a, b}
		if i%2 == 1 {
			order = []system{b, a}
		}
		for _, sys := range order {
			r, err := runE2E(sys, msgs, size)
			if err != nil {
				return nil, nil, err
			}
			fmt.Printf("  run %d %-22s %6d x %6d B: %7.0f msg/s (submission %v, last arrival %v)\n", i+1, sys.name, msgs, size,
				r.rate, r.submitted.Round(time.Millisecond), r.total.Round(time.Millisecond))
			if sys.name == a.name {
				ra = append(ra, r.rate)
			} else {
				rb = append(rb, r.rate)
			}
		}
	}
	return ra, rb, nil
}

func (s *suite) e2eMsgs() int {
	if s.c.quick {
		return 5000
	}
	return 20000
}

func (s *suite) scenario1() error {
	n := s.e2eMsgs()
	t := &table{
		title: "Scenario 1: end-to-end throughput",
		notes: []string{fmt.Sprintf("`smtp-source -s 20 -m %d -l SIZE -f bench@source.test -t rcpt@example.com ADDR` -> system -> relay -> `smtp-sink -c SINK 1024`; clock from the start of smtp-source until the sink counted the last message. Fresh data dir / Postfix instance per run; runs alternate. Messages per second, median of %d runs.", n, s.c.runs)},
		head: []string{"size", "outflow msg/s (runs)", "Postfix msg/s (runs)", "outflow/Postfix",
			"smtp-source → smtp-sink directly msg/s (runs)", "direct/Postfix"},
	}
	for _, size := range []int{2048, 100 << 10} {
		fmt.Printf("scenario 1: %d messages of %d bytes\n", n, size)
		ro, rp, err := s.compare(s.outflowSystem("outflow"), postfixSystem(nil), n, size)
		if err != nil {
			return err
		}
		// The ceiling: the two load tools alone, no MTA between them. No
		// system can relay faster on this machine than its load generator
		// can talk to its sink.
		var rd []float64
		for i := 0; i < s.c.runs; i++ {
			r, err := runE2E(directSystem, n, size)
			if err != nil {
				return err
			}
			fmt.Printf("  run %d %-22s %6d x %6d B: %7.0f msg/s\n", i+1, directSystem.name, n, size, r.rate)
			rd = append(rd, r.rate)
		}
		mo, mp, md := median(ro), median(rp), median(rd)
		if size == 2048 {
			s.maxRate["outflow"], s.maxRate["Postfix"] = mo, mp
		}
		t.rows = append(t.rows, []string{sizeName(size), fmt.Sprintf("**%.0f** (%s)", mo, fmtRuns(ro, "")),
			fmt.Sprintf("**%.0f** (%s)", mp, fmtRuns(rp, "")), fmt.Sprintf("**%.2f**", mo/mp),
			fmt.Sprintf("%.0f (%s)", md, fmtRuns(rd, "")), fmt.Sprintf("%.2f", md/mp)})
	}
	s.tables = append(s.tables, t)
	return nil
}

func (s *suite) scenario5() error {
	n := s.e2eMsgs()
	t := &table{
		title: "Scenario 5: durability cost (`--jetstream-sync always` against the default)",
		notes: []string{fmt.Sprintf("Scenario 1 (%d messages, 20 sessions) through outflow twice: default JetStream sync (fsync every 2 minutes) and `--jetstream-sync always` (fsync before every acknowledgement). Runs alternate; median of %d. Postfix fsyncs every queue file before its 250, so `always` is the like-for-like comparison.", n, s.c.runs)},
		head:  []string{"size", "default msg/s (runs)", "always msg/s (runs)", "always/default"},
	}
	for _, size := range []int{2048, 100 << 10} {
		fmt.Printf("scenario 5: %d messages of %d bytes\n", n, size)
		rd, ra, err := s.compare(s.outflowSystem("outflow"), s.outflowSystem("outflow sync=always", "--jetstream-sync", "always"), n, size)
		if err != nil {
			return err
		}
		md, ma := median(rd), median(ra)
		t.rows = append(t.rows, []string{sizeName(size), fmt.Sprintf("**%.0f** (%s)", md, fmtRuns(rd, "")),
			fmt.Sprintf("**%.0f** (%s)", ma, fmtRuns(ra, "")), fmt.Sprintf("**%.2f**", ma/md)})
	}
	s.tables = append(s.tables, t)
	return nil
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
