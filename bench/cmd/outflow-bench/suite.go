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

	"github.com/outflow/outflow/internal/postfixinst"
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
		if _, err := postfixinst.LookPath(t); err != nil {
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
		{"6", s.scenario6},
		{"7", s.scenario7},
	}
	for _, st := range steps {
		if !c.scenarios[st.id] {
			continue
		}
		before := len(s.tables)
		if err := st.run(); err != nil {
			return fmt.Errorf("scenario %s: %w", st.id, err)
		}
		for _, t := range s.tables[before:] {
			fmt.Println(t.markdown())
		}
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
	msgs      int
	cpu       cpuSplit
	// fsyncs per message counted by the system itself during the run
	// (outflow_store_fsyncs_total); fsyncsOK is false when it has no
	// such count (Postfix, direct, outflow without a group commit).
	fsyncs   float64
	fsyncsOK bool
}

// cpuSplit is where the machine's CPU went during one run, from the start
// of smtp-source to the sink's last message.
type cpuSplit struct {
	busy    time.Duration // every core, everything (/proc/stat)
	source  time.Duration // smtp-source (its rusage)
	sink    time.Duration // smtp-sink (its rusage; it idles outside the run)
	harness time.Duration // this program (polling the sink's count)
}

// relay is the rest of the machine's busy time: the system between the
// load tools, whatever processes it runs, measured the same way for
// outflow and Postfix.
func (c cpuSplit) relay() time.Duration { return c.busy - c.source - c.sink - c.harness }

// perMsg is d per message of r, in microseconds.
func (r e2eRun) perMsg(d time.Duration) float64 {
	return float64(d.Microseconds()) / float64(r.msgs)
}

func rates(runs []e2eRun) []float64 {
	xs := make([]float64, len(runs))
	for i, r := range runs {
		xs[i] = r.rate
	}
	return xs
}

// medianOf is the median of f over runs.
func medianOf(runs []e2eRun, f func(e2eRun) float64) float64 {
	xs := make([]float64, len(runs))
	for i, r := range runs {
		xs[i] = f(r)
	}
	return median(xs)
}

// system is one side of a comparison.
type system struct {
	name  string
	start func(sinkAddr string) (addr string, stop func(), err error)
	// pids, if set, are the processes of the instance started last (for
	// strace); fsyncs, if set, reads its own fsync counter.
	pids   func() []int
	fsyncs func() (float64, bool)
}

func (s *suite) outflowSystem(name string, extra ...string) system {
	var cur *outflowProc
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
		s.last, cur = p, p
		return p.SMTPAddr, func() { p.Stop(); os.RemoveAll(data) }, nil
	}, pids: func() []int { return []int{cur.Pid()} },
		fsyncs: func() (float64, bool) {
			v, ok, err := metricValue(cur.HTTPAddr, "outflow_store_fsyncs_total")
			return v, ok && err == nil
		}}
}

func postfixSystem(extra map[string]string) system {
	var cur *postfixInst
	return system{name: "Postfix", start: func(sinkAddr string) (string, func(), error) {
		p, err := startPostfix(sinkAddr, extra)
		if err != nil {
			return "", nil, err
		}
		cur = p
		return p.Addr, p.Stop, nil
	}, pids: func() []int { return cur.Pids() }}
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
	var fs0 float64
	var fsOK bool
	if sys.fsyncs != nil {
		fs0, fsOK = sys.fsyncs()
	}
	busy0, self0 := machineBusy(), selfCPU()
	start := time.Now()
	srcCPU, err := smtpSource(ctx, addr, 20, msgs, size)
	if err != nil {
		return e2eRun{}, err
	}
	sub := time.Since(start)
	end, err := sk.WaitCount(int64(msgs), 15*time.Minute)
	if err != nil {
		return e2eRun{}, fmt.Errorf("%s: %w", sys.name, err)
	}
	busy, self := machineBusy()-busy0, selfCPU()-self0
	r := e2eRun{msgs: msgs}
	if fsOK {
		fs1, ok := sys.fsyncs()
		r.fsyncs, r.fsyncsOK = (fs1-fs0)/float64(msgs), ok
	}
	sk.Stop() // for its CPU time; the system is idle by now
	r.total = end.Sub(start)
	r.rate, r.submitted = float64(msgs)/r.total.Seconds(), sub
	r.cpu = cpuSplit{busy: busy, source: srcCPU, sink: sk.CPU(), harness: self}
	return r, nil
}

// compare alternates runs of a and b (a first on odd runs, b first on
// even ones) and returns each side's runs.
func (s *suite) compare(a, b system, msgs, size int) (ra, rb []e2eRun, err error) {
	runs, err := s.compareAll([]system{a, b}, msgs, size)
	if err != nil {
		return nil, nil, err
	}
	return runs[0], runs[1], nil
}

// compareAll runs each system once per run, the order rotating by one
// system per run (a, b, c; b, c, a; ...), and returns the runs by system.
func (s *suite) compareAll(systems []system, msgs, size int) ([][]e2eRun, error) {
	out := make([][]e2eRun, len(systems))
	for i := 0; i < s.c.runs; i++ {
		for k := range systems {
			j := (i + k) % len(systems)
			r, err := runE2E(systems[j], msgs, size)
			if err != nil {
				return nil, err
			}
			printRun(i+1, systems[j].name, size, r)
			out[j] = append(out[j], r)
		}
	}
	return out, nil
}

func printRun(i int, name string, size int, r e2eRun) {
	fs := ""
	if r.fsyncsOK {
		fs = fmt.Sprintf("; %.2f fsyncs/msg", r.fsyncs)
	}
	fmt.Printf("  run %d %-22s %6d x %6d B: %7.0f msg/s (submission %v, last arrival %v; CPU µs/msg: source %.0f, sink %.0f, rest %.0f; %.2f cores busy%s)\n",
		i, name, r.msgs, size, r.rate, r.submitted.Round(time.Millisecond), r.total.Round(time.Millisecond),
		r.perMsg(r.cpu.source), r.perMsg(r.cpu.sink), r.perMsg(r.cpu.relay()), r.cpu.busy.Seconds()/r.total.Seconds(), fs)
}

// medianFsyncs is the median of the runs' own fsync counts per message,
// formatted, or "–" when the system has none.
func medianFsyncs(runs []e2eRun) string {
	var xs []float64
	for _, r := range runs {
		if r.fsyncsOK {
			xs = append(xs, r.fsyncs)
		}
	}
	if len(xs) == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", median(xs))
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
	cpu := &table{
		title: "Scenario 1: where the CPU went",
		notes: []string{fmt.Sprintf("The same runs. CPU microseconds per message, medians: smtp-source's and smtp-sink's from their own rusage; the relay's is the rest of the machine's busy time (/proc/stat, %d cores) less the load tools and this harness, the same measure for outflow's one process and Postfix's several; on the direct row, with no relay, it is what else the machine did (its noise floor). Busy cores: the machine's busy time over the run's wall time.", runtime.NumCPU())},
		head:  []string{"size", "system", "msg/s", "busy cores", "smtp-source µs/msg", "smtp-sink µs/msg", "relay µs/msg", "fsyncs/msg"},
	}
	cpu.notes = append(cpu.notes, "", "fsyncs/msg: outflow's group commit (`--durability disk`, the default), the increase of `outflow_store_fsyncs_total` over the run per message, median; the server's own fsyncs are not in it. Postfix's, and outflow's counted with strace, are in scenario 5.")
	for _, size := range []int{2048, 100 << 10} {
		fmt.Printf("scenario 1: %d messages of %d bytes\n", n, size)
		ro, rp, err := s.compare(s.outflowSystem("outflow"), postfixSystem(nil), n, size)
		if err != nil {
			return err
		}
		// The ceiling: the two load tools alone, no MTA between them. No
		// system can relay faster on this machine than its load generator
		// can talk to its sink.
		var rd []e2eRun
		for i := 0; i < s.c.runs; i++ {
			r, err := runE2E(directSystem, n, size)
			if err != nil {
				return err
			}
			printRun(i+1, directSystem.name, size, r)
			rd = append(rd, r)
		}
		mo, mp, md := median(rates(ro)), median(rates(rp)), median(rates(rd))
		if size == 2048 {
			s.maxRate["outflow"], s.maxRate["Postfix"] = mo, mp
		}
		t.rows = append(t.rows, []string{sizeName(size), fmt.Sprintf("**%.0f** (%s)", mo, fmtRuns(rates(ro), "")),
			fmt.Sprintf("**%.0f** (%s)", mp, fmtRuns(rates(rp), "")), fmt.Sprintf("**%.2f**", mo/mp),
			fmt.Sprintf("%.0f (%s)", md, fmtRuns(rates(rd), "")), fmt.Sprintf("%.2f", md/mp)})
		for _, sr := range []struct {
			name string
			runs []e2eRun
		}{{"outflow", ro}, {"Postfix", rp}, {"none (direct)", rd}} {
			relay := fmt.Sprintf("%.0f", medianOf(sr.runs, func(r e2eRun) float64 { return r.perMsg(r.cpu.relay()) }))
			cpu.rows = append(cpu.rows, []string{sizeName(size), sr.name, fmt.Sprintf("%.0f", median(rates(sr.runs))),
				fmt.Sprintf("%.2f", medianOf(sr.runs, func(r e2eRun) float64 { return r.cpu.busy.Seconds() / r.total.Seconds() })),
				fmt.Sprintf("%.0f", medianOf(sr.runs, func(r e2eRun) float64 { return r.perMsg(r.cpu.source) })),
				fmt.Sprintf("%.0f", medianOf(sr.runs, func(r e2eRun) float64 { return r.perMsg(r.cpu.sink) })),
				relay, medianFsyncs(sr.runs)})
		}
		cpu.notes = append(cpu.notes, "", newRelayBudget(runtime.NumCPU(), mp, ro, rd).note(size, runtime.NumCPU()))
	}
	s.tables = append(s.tables, t, cpu)
	return nil
}

// relayBudget is how much CPU per message a relay could spend and still
// run at 10 times Postfix's rate on this machine. The load tools' costs are
// the ones measured with outflow in between (smtp-sink is cheaper fed by a
// pipelining relay over kept-open connections than by smtp-source), which
// leaves a relay the most; smtp-sink receiving straight from smtp-source is
// the same inbound work done in C with nothing stored or sent.
type relayBudget struct {
	target  float64 // msg/s: 10 times Postfix
	perMsg  float64 // µs of CPU per message the machine has at target
	source  float64 // µs smtp-source took per message, relayed
	sink    float64 // µs smtp-sink took per message, relayed
	spent   float64 // µs outflow took per message
	inbound float64 // µs smtp-sink took per message straight from smtp-source
}

func newRelayBudget(cores int, postfixRate float64, relayed, direct []e2eRun) relayBudget {
	target := 10 * postfixRate
	return relayBudget{
		target:  target,
		perMsg:  float64(cores) * 1e6 / target,
		source:  medianOf(relayed, func(r e2eRun) float64 { return r.perMsg(r.cpu.source) }),
		sink:    medianOf(relayed, func(r e2eRun) float64 { return r.perMsg(r.cpu.sink) }),
		spent:   medianOf(relayed, func(r e2eRun) float64 { return r.perMsg(r.cpu.relay()) }),
		inbound: medianOf(direct, func(r e2eRun) float64 { return r.perMsg(r.cpu.sink) }),
	}
}

// left is the CPU per message a relay would have at the target.
func (b relayBudget) left() float64 { return b.perMsg - b.source - b.sink }

func (b relayBudget) note(size, cores int) string {
	left := fmt.Sprintf("**%.0f µs**", b.left())
	if b.left() <= 0 {
		left = fmt.Sprintf("**nothing** (%.0f µs)", b.left())
	}
	return fmt.Sprintf("%s: at 10 times Postfix (%.0f msg/s) the %d cores give %.0f µs of CPU per message. With outflow in between, smtp-source and smtp-sink took %.0f and %.0f µs of it, which leaves a relay %s per message to receive, store and send it; outflow took %.0f. smtp-sink alone spends %.0f µs receiving a message from smtp-source (the direct row), storing and sending nothing.",
		sizeName(size), b.target, cores, b.perMsg, b.source, b.sink, left, b.spent, b.inbound)
}

func sizeName(n int) string {
	if n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
