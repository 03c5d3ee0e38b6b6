package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/outflow/outflow/internal/postfixinst"
	"github.com/outflow/outflow/queue"
)

// scenario2 measures submission-to-delivery latency at half of each
// system's scenario-1 rate (2 KiB).
func (s *suite) scenario2() error {
	d := 30 * time.Second
	if s.c.quick {
		d = 10 * time.Second
	}
	rates := map[string]float64{"outflow": s.maxRate["outflow"] / 2, "Postfix": s.maxRate["Postfix"] / 2}
	// Without scenario 1: the rates given, or these.
	for name, r := range map[string]float64{"outflow": cmp.Or(s.c.rateOutflow, 1200), "Postfix": cmp.Or(s.c.ratePostfix, 400)} {
		if rates[name] == 0 {
			rates[name] = r / 2
		}
	}
	// outflow none runs at the default's rate: the same load, without the
	// group commit's wait before each 250.
	rates["outflow none"] = rates["outflow"]
	names := []string{"outflow", "outflow none", "Postfix"}
	systems := map[string]system{
		"outflow":      s.outflowSystem("outflow"),
		"outflow none": s.outflowSystem("outflow none", "--durability", "none"),
		"Postfix":      postfixSystem(nil),
	}
	durability := map[string]string{
		"outflow":      "disk (the default)",
		"outflow none": "none",
		"Postfix":      "fsync per queue file",
	}
	t := &table{
		title: "Scenario 2: submission-to-delivery latency at half the maximum rate",
		notes: []string{fmt.Sprintf("A paced Go SMTP client (bench/cmd/outflow-bench/latency.go; 20 kept-open sessions, 2 KiB messages, for %v) stamps each message with the time it sends MAIL FROM; a Go SMTP sink records arrival minus stamp (smtp-sink cannot timestamp messages). Each system runs at half of its own scenario-1 median (2 KiB); outflow with `--durability none` at the default's rate. A 2 s warm-up runs first and messages stamped before the measurement are not counted. Submission: MAIL FROM to the reply after the dot, as the client sees it. Milliseconds; p50/p99 are the medians over %d runs, the order rotating each run.", d, s.c.runs)},
		head:  []string{"system", "durability", "rate msg/s", "submission p50 ms", "submission p99 ms (runs)", "delivery p50 ms (runs)", "delivery p99 ms (runs)", "max ms"},
	}
	type res struct{ p50, p99, max, sp50, sp99 []float64 }
	out := map[string]*res{}
	for _, name := range names {
		out[name] = &res{}
	}
	for i := 0; i < s.c.runs; i++ {
		for k := range names {
			name := names[(i+k)%len(names)]
			ls, err := startLatencySink()
			if err != nil {
				return err
			}
			addr, stop, err := systems[name].start(ls.Addr)
			if err != nil {
				ls.Close()
				return err
			}
			if _, err := pacedSend(addr, rates[name], 2*time.Second, 20, 2048); err != nil {
				stop()
				ls.Close()
				return err
			}
			ls.reset()
			submitPercentiles()
			sent, err := pacedSend(addr, rates[name], d, 20, 2048)
			if err == nil {
				deadline := time.Now().Add(2 * time.Minute)
				for len(ls.latencies()) < sent && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
			}
			lat := ls.latencies()
			sp50, sp99 := submitPercentiles()
			fmt.Printf("  %s (durability %s) submission (MAIL FROM to the reply after the dot): p50 %.1f ms, p99 %.1f ms\n", name, durability[name], sp50, sp99)
			if strings.HasPrefix(name, "outflow") && os.Getenv("BENCH_DEBUG") != "" {
				fmt.Println(s.last.metricsMatching("refus", "deferred", "retry_delay_seconds_count", "attempts_total", "outflow_store_"))
			}
			stop()
			ls.Close()
			if err != nil {
				return err
			}
			if len(lat) == 0 {
				return fmt.Errorf("%s: no message arrived", name)
			}
			r := out[name]
			r.p50 = append(r.p50, percentile(lat, 50))
			r.p99 = append(r.p99, percentile(lat, 99))
			r.max = append(r.max, lat[len(lat)-1])
			r.sp50, r.sp99 = append(r.sp50, sp50), append(r.sp99, sp99)
			fmt.Printf("  run %d %-12s %5.0f msg/s: %d/%d arrived, p50 %.1f ms, p99 %.1f ms, max %.1f ms (stamped %s)\n", i+1, name, rates[name],
				len(lat), sent, percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1], ls.slowest().Format("15:04:05.000"))
		}
	}
	for _, name := range names {
		r := out[name]
		t.rows = append(t.rows, []string{name, durability[name], fmt.Sprintf("%.0f", rates[name]),
			fmt.Sprintf("%.1f", median(r.sp50)), fmt.Sprintf("**%.1f** (%s)", median(r.sp99), fmtRuns1(r.sp99)),
			fmt.Sprintf("**%.1f** (%s)", median(r.p50), fmtRuns1(r.p50)),
			fmt.Sprintf("**%.1f** (%s)", median(r.p99), fmtRuns1(r.p99)), fmt.Sprintf("%.0f", median(r.max))})
	}
	s.tables = append(s.tables, t)
	return nil
}

func fmtRuns1(xs []float64) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%.1f", x)
	}
	return out
}

// backlogSettle is how long scenario 3 lets a freshly seeded backlog rest
// before measuring: the lanes' deduplication window and the file store's
// subject-state expiry (both 2 min), plus the purge timers' slack.
const backlogSettle = 2*time.Minute + 20*time.Second

// scenario3 measures fresh-mail throughput and resident memory with a
// million deferred envelopes in the retry lane, against an empty lane.
func (s *suite) scenario3() error {
	backlog, pfBacklog, msgs := 1_000_000, 50_000, 10000
	if s.c.quick {
		backlog, pfBacklog, msgs = 100_000, 5_000, 3000
	}
	type side struct {
		name string
		p    *outflowProc
		sk   *sink
		data string
		rate []float64
		cpu  []float64 // the daemon's CPU µs per fresh message, per run
		rss  int64
		// rssBurst is the resident memory right after the restart on a
		// freshly seeded backlog, before the server's transient state
		// for recent writes has expired.
		rssBurst int64
	}
	mk := func(name string, seed int) (*side, error) {
		data, err := os.MkdirTemp("", "outflow-bench-backlog-")
		if err != nil {
			return nil, err
		}
		sk := newSink(freePort())
		if err := sk.Start(); err != nil {
			return nil, err
		}
		p, err := startOutflow(s.c.outflow, data, sk.addr)
		if err != nil {
			return nil, err
		}
		if seed > 0 {
			start := time.Now()
			if err := seedDeferred(data, seed); err != nil {
				p.Kill()
				return nil, err
			}
			fmt.Printf("  seeded %d deferred envelopes in %v\n", seed, time.Since(start).Round(time.Millisecond))
			// Measure the steady state: restart on the stored backlog.
			p.Stop()
			if p, err = startOutflow(s.c.outflow, data, sk.addr); err != nil {
				return nil, err
			}
		}
		return &side{name: name, p: p, sk: sk, data: data}, nil
	}
	empty, err := mk("empty retry lane", 0)
	if err != nil {
		return err
	}
	defer func() { empty.p.Stop(); empty.sk.Stop(); os.RemoveAll(empty.data) }()
	full, err := mk(fmt.Sprintf("%d deferred", backlog), backlog)
	if err != nil {
		return err
	}
	defer func() { full.p.Stop(); full.sk.Stop(); os.RemoveAll(full.data) }()
	// A backlog a million strong that was deferred within the last two
	// minutes is also two things the server keeps only for recent writes:
	// the schedules' deduplication ids (the lanes' window, 2 min at the
	// default ack wait) and each file block's subject index (dropped after
	// 2 min without use). Measure the backlog itself: wait until both are
	// gone. The quick mode skips the wait and measures the burst.
	if !s.c.quick {
		time.Sleep(5 * time.Second)
		empty.rssBurst, full.rssBurst = rssKiB(empty.p.Pid()), rssKiB(full.p.Pid())
		fmt.Printf("  waiting %v for the seed's transient server state to expire\n", backlogSettle)
		time.Sleep(backlogSettle)
	}
	run := func(sd *side, n int) (float64, error) {
		cpu0 := procCPU(sd.p.Pid())
		r, err := freshRate(sd.p.SMTPAddr, sd.sk, n)
		sd.cpu = append(sd.cpu, float64((procCPU(sd.p.Pid())-cpu0).Microseconds())/float64(n))
		return r, err
	}
	for _, sd := range []*side{empty, full} {
		if _, err := run(sd, 1000); err != nil { // warm-up
			return err
		}
		sd.cpu = sd.cpu[:0]
	}
	for i := 0; i < s.c.runs; i++ {
		order := []*side{empty, full}
		if i%2 == 1 {
			order = []*side{full, empty}
		}
		for _, sd := range order {
			r, err := run(sd, msgs)
			if err != nil {
				return fmt.Errorf("%s: %w", sd.name, err)
			}
			sd.rate = append(sd.rate, r)
			fmt.Printf("  run %d %-20s %d fresh messages: %.0f msg/s, %.0f µs of outflow's CPU each\n", i+1, sd.name, msgs, r, sd.cpu[len(sd.cpu)-1])
		}
	}
	empty.rss, full.rss = rssKiB(empty.p.Pid()), rssKiB(full.p.Pid())
	perEnv := float64(full.rss-empty.rss) * 1024 / float64(backlog)
	perEnvBurst := float64(full.rssBurst-empty.rssBurst) * 1024 / float64(backlog)
	me, mf := median(empty.rate), median(full.rate)
	// Postfix gets the machine to itself.
	for _, sd := range []*side{empty, full} {
		sd.p.Stop()
		sd.sk.Stop()
	}
	pf, err := s.scenario3Postfix(pfBacklog, msgs)
	if err != nil {
		return fmt.Errorf("scenario 3 on Postfix: %w", err)
	}
	t := &table{
		title: "Scenario 3: deferred backlog",
		notes: []string{fmt.Sprintf("outflow: %d envelopes are stored as retry-lane schedules due in 7 days (queue.SeedDeferred through the daemon's NATS listener), the daemon is restarted on them, and fresh mail (`smtp-source -s 20 -m %d -l 2048`, to smtp-sink) is timed against a daemon with an empty lane; both run side by side, runs alternate, median of %d. Resident memory is VmRSS of the outflow process (embedded NATS included) after the runs; per envelope = (RSS with backlog - RSS empty) / %d. "+
			"Postfix: the same against a Postfix whose deferred queue holds %d messages (submitted to a domain routed to a closed port, with minimal and maximal_backoff_time 7d, so that they are not due either: a million queue files would take longer to create than the whole suite); its memory is the proportional set size (Pss) summed over the instance's processes, since they share most pages. Postfix keeps deferred mail in queue files, not in memory: its per-message figure is mostly which of its processes happen to be alive.", backlog, msgs, s.c.runs, backlog, pfBacklog)},
		head: []string{"system", "deferred", "fresh msg/s (runs)", "memory MiB"},
		rows: [][]string{
			{"outflow", "none", fmt.Sprintf("**%.0f** (%s)", me, fmtRuns(empty.rate, "")), fmt.Sprintf("%.0f", float64(empty.rss)/1024)},
			{"outflow", fmt.Sprintf("%d", backlog), fmt.Sprintf("**%.0f** (%s)", mf, fmtRuns(full.rate, "")), fmt.Sprintf("%.0f", float64(full.rss)/1024)},
			{"outflow", "backlog/none", fmt.Sprintf("**%.2f**", mf/me), fmt.Sprintf("**%.0f bytes per deferred envelope**", perEnv)},
		},
	}
	ce, cf := median(empty.cpu), median(full.cpu)
	t.notes = append(t.notes, fmt.Sprintf("outflow's own CPU per fresh message (/proc/PID/stat, medians; less exposed to the machine's other load than the rates): %.0f µs with the lane empty (%s), %.0f µs with the backlog (%s), %.2f times as much.",
		ce, fmtRuns(empty.cpu, ""), cf, fmtRuns(full.cpu, ""), cf/ce))
	if full.rssBurst > 0 {
		t.notes = append(t.notes, fmt.Sprintf("Right after the restart on the just-seeded backlog, before the lanes' deduplication ids and the blocks' subject indexes expired (%v), outflow's resident memory was %.0f MiB: %.0f bytes per deferred envelope.", backlogSettle, float64(full.rssBurst)/1024, perEnvBurst))
	}
	t.rows = append(t.rows, pf...)
	s.tables = append(s.tables, t)
	return nil
}

// scenario3Postfix is scenario 3's measurement on Postfix: fresh mail
// through an instance with backlog deferred messages against one without.
func (s *suite) scenario3Postfix(backlog, msgs int) ([][]string, error) {
	type side struct {
		name string
		p    *postfixInst
		sk   *sink
		rate []float64
		rss  int64
	}
	closed := freePort() // nothing listens here: mail routed to it defers
	conf := map[string]string{
		"transport_maps":       "inline:{backlog.example=smtp:" + postfixinst.RelayHost(closed) + "}",
		"minimal_backoff_time": "7d",
		"maximal_backoff_time": "7d",
	}
	var sides []*side
	defer func() {
		for _, sd := range sides {
			sd.p.Stop()
			sd.sk.Stop()
		}
	}()
	for _, seed := range []int{0, backlog} {
		sd := &side{name: "Postfix, empty", sk: newSink(freePort())}
		if seed > 0 {
			sd.name = fmt.Sprintf("Postfix, %d deferred", seed)
		}
		if err := sd.sk.Start(); err != nil {
			return nil, err
		}
		p, err := startPostfix(sd.sk.addr, conf)
		if err != nil {
			sd.sk.Stop()
			return nil, err
		}
		sd.p = p
		sides = append(sides, sd)
		if seed == 0 {
			continue
		}
		start := time.Now()
		if _, err := smtpSourceTo(context.Background(), p.Addr, "rcpt@backlog.example", 20, seed, 2048); err != nil {
			return nil, err
		}
		deadline := time.Now().Add(20 * time.Minute)
		for p.DeferredCount() < seed || p.QueueCount() > seed {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("%d of %d messages deferred after 20 minutes", p.DeferredCount(), seed)
			}
			time.Sleep(500 * time.Millisecond)
		}
		fmt.Printf("  Postfix: %d messages submitted and deferred in %v\n", seed, time.Since(start).Round(time.Millisecond))
	}
	run := func(sd *side, n int) (float64, error) { return freshRate(sd.p.Addr, sd.sk, n) }
	for _, sd := range sides {
		if _, err := run(sd, 1000); err != nil { // warm-up
			return nil, err
		}
	}
	for i := 0; i < s.c.runs; i++ {
		order := []*side{sides[0], sides[1]}
		if i%2 == 1 {
			order = []*side{sides[1], sides[0]}
		}
		for _, sd := range order {
			r, err := run(sd, msgs)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", sd.name, err)
			}
			sd.rate = append(sd.rate, r)
			fmt.Printf("  run %d %-24s %d fresh messages: %.0f msg/s\n", i+1, sd.name, msgs, r)
		}
	}
	empty, full := sides[0], sides[1]
	if n := full.p.DeferredCount(); n < backlog {
		return nil, fmt.Errorf("the deferred queue shrank to %d of %d during the runs", n, backlog)
	}
	empty.rss, full.rss = empty.p.PSSKiB(), full.p.PSSKiB()
	me, mf := median(empty.rate), median(full.rate)
	return [][]string{
		{"Postfix", "none", fmt.Sprintf("**%.0f** (%s)", me, fmtRuns(empty.rate, "")), fmt.Sprintf("%.0f", float64(empty.rss)/1024)},
		{"Postfix", fmt.Sprintf("%d", backlog), fmt.Sprintf("**%.0f** (%s)", mf, fmtRuns(full.rate, "")), fmt.Sprintf("%.0f", float64(full.rss)/1024)},
		{"Postfix", "backlog/none", fmt.Sprintf("**%.2f**", mf/me), fmt.Sprintf("**%.0f bytes per deferred message**", float64(full.rss-empty.rss)*1024/float64(backlog))},
	}, nil
}

// freshRate sends n 2 KiB messages to addr over 20 sessions and returns
// the rate at which they reached sk (from the start of sending to the
// last arrival).
func freshRate(addr string, sk *sink, n int) (float64, error) {
	base := sk.Count()
	start := time.Now()
	if _, err := smtpSource(context.Background(), addr, 20, n, 2048); err != nil {
		return 0, err
	}
	end, err := sk.WaitCount(base+int64(n), 10*time.Minute)
	if err != nil {
		return 0, err
	}
	return float64(n) / end.Sub(start).Seconds(), nil
}

// seedDeferred connects to the daemon on data's NATS listener and stores n
// deferred envelopes due in 7 days.
func seedDeferred(data string, n int) error {
	ci, err := queue.ReadClientInfo(data)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	q, err := queue.Connect(ctx, queue.Options{URL: ci.URL, User: ci.User, Password: ci.Password, NoSetup: true, Name: "outflow-bench seed"})
	if err != nil {
		return err
	}
	defer q.Close()
	return q.SeedDeferred(ctx, n, "backlog.example", time.Now().Add(7*24*time.Hour))
}

// scenario4: the sink is down while msgs messages are submitted and for
// outage in all, then comes back; arrivals are sampled every 50 ms.
func (s *suite) scenario4() error {
	msgs, outage, rate := 10000, 60*time.Second, 200.0
	if s.c.quick {
		msgs, outage = 2000, 20*time.Second
	}
	type result struct {
		peak, fixedPeak int64
		drain           time.Duration
		arrived         int64
	}
	runOne := func(sys system) (result, error) {
		sk := newSink(freePort())
		addr, stop, err := sys.start(sk.addr)
		if err != nil {
			return result{}, err
		}
		defer stop()
		t0 := time.Now()
		if _, err := smtpSource(context.Background(), addr, 20, msgs, 2048); err != nil {
			return result{}, err
		}
		time.Sleep(time.Until(t0.Add(outage)))
		if err := sk.Start(); err != nil {
			return result{}, err
		}
		defer sk.Stop()
		up := time.Now()
		type sample struct {
			t time.Time
			n int64
		}
		samples := []sample{{up, 0}}
		timeout := 10 * time.Minute
		if sys.name == "Postfix" {
			timeout = 15 * time.Minute
		}
		var last time.Time
		for time.Since(up) < timeout {
			time.Sleep(50 * time.Millisecond)
			n := sk.Count()
			if n > samples[len(samples)-1].n {
				last = time.Now()
			}
			samples = append(samples, sample{time.Now(), n})
			if n >= int64(msgs) {
				break
			}
		}
		r := result{arrived: samples[len(samples)-1].n}
		if !last.IsZero() {
			r.drain = last.Sub(up)
		}
		j := 0
		for i := range samples {
			for samples[i].t.Sub(samples[j].t) > time.Second {
				j++
			}
			if d := samples[i].n - samples[j].n; d > r.peak {
				r.peak = d
			}
		}
		// Fixed one-second buckets from the moment the sink came back.
		buckets := map[int]int64{}
		for i := 1; i < len(samples); i++ {
			buckets[int(samples[i].t.Sub(up)/time.Second)] += samples[i].n - samples[i-1].n
		}
		for _, v := range buckets {
			r.fixedPeak = max(r.fixedPeak, v)
		}
		return r, nil
	}
	t := &table{
		title: "Scenario 4: recovery after an outage",
		notes: []string{fmt.Sprintf("The sink (smtp-sink) is down (port closed) while `smtp-source -s 20 -m %d -l 2048` submits, and stays down until %v after submission began; then it comes back and its count is sampled every 50 ms. outflow runs with `--dest-rate %.0f` and otherwise default retry timers; Postfix with default timers and no rate limit: its `default_destination_rate_delay` takes whole seconds only (at least 1 s between deliveries, i.e. at most 1 msg/s), which would take %d s to drain, so the closest equivalent is none. Peak = most arrivals in any 1 s window (sliding); the fixed-bucket peak counts whole seconds from the sink's return. Drain = sink back to last arrival.", msgs, outage, rate, msgs)},
		head:  []string{"system", "peak 1 s arrivals (sliding / fixed)", "peak / configured rate", "drain time", "arrived"},
	}
	systems := []system{s.outflowSystem("outflow", "--dest-rate", fmt.Sprintf("%g", rate))}
	if !s.c.quick {
		systems = append(systems, postfixSystem(nil))
	} else {
		t.notes = append(t.notes, "", "Quick mode runs outflow only: Postfix's first retry after the outage comes with its queue run, up to `queue_run_delay` = 300 s later.")
	}
	runs := 1
	t.notes = append(t.notes, "", fmt.Sprintf("One run per system (each takes %v to several minutes).", outage))
	for i := 0; i < runs; i++ {
		for _, sys := range systems {
			fmt.Printf("scenario 4: %s, %d messages, %v outage\n", sys.name, msgs, outage)
			r, err := runOne(sys)
			if err != nil {
				return err
			}
			ratio := "-"
			if sys.name != "Postfix" {
				ratio = fmt.Sprintf("**%.2f**", float64(r.peak)/rate)
			}
			fmt.Printf("  %s: peak %d/s (fixed %d), drain %v, arrived %d\n", sys.name, r.peak, r.fixedPeak, r.drain.Round(100*time.Millisecond), r.arrived)
			t.rows = append(t.rows, []string{sys.name, fmt.Sprintf("**%d** / %d", r.peak, r.fixedPeak), ratio, r.drain.Round(100 * time.Millisecond).String(), fmt.Sprintf("%d/%d", r.arrived, msgs)})
		}
	}
	s.tables = append(s.tables, t)
	return nil
}

var _ = sort.Float64s
