package e2e

import (
	"bufio"
	"context"
	"fmt"
	"html"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/ratedmx"
	"github.com/outflow/outflow/queue"
)

// TestSoakWithFaults runs two outflow workers (a build without the race
// detector, so that RSS is outflow's) on a three-node NATS cluster (streams replicated three times) for 30 minutes at half the
// maximum rate measured at its start, while faults come and go: the relay
// goes down and comes back every tenth of the run, each worker is killed
// once with SIGKILL and restarted on its data dir, a NATS node is killed
// and restarted on its store, and a tenth of the mail goes to a provider
// that throttles above twice that share (421 4.7.28). Every interval (a
// minute, or a thirtieth of a shorter run) it samples each worker's RSS,
// goroutines (its /metrics) and open file descriptors (/proc/PID/fd), and
// JetStream's storage (account info, and the queue's streams apart from
// the events and SENT markers, which are kept by design).
//
// Pass means nothing accepted with 250 is lost; duplicates stay within
// what can have been in flight at the faults (computed below); and,
// between the first sample after a third of the run and the last one
// before the load stops, each taken with the backlog drained, no worker's
// RSS, goroutines or descriptors grows by more than 10%, and the queue's
// streams are empty again once the backlog has drained.
//
// Only with OUTFLOW_LONG=1 (make test-long). OUTFLOW_SOAK=5m shortens it
// (every fault keeps its place as a fraction of the run); OUTFLOW_SOAK_OUT=
// docs writes reliability-soak.csv and reliability-soak.svg there (a
// relative directory is taken from the repository root).
func TestSoakWithFaults(t *testing.T) {
	if !longMode() {
		t.Skip("the soak runs with OUTFLOW_LONG=1 (make test-long)")
	}
	dur := 30 * time.Minute
	if v := os.Getenv("OUTFLOW_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 2*time.Minute {
			t.Fatalf("OUTFLOW_SOAK=%q: want a duration of at least 2m", v)
		}
		dur = d
	}
	every := min(time.Minute, dur/30)
	const natsUser, natsPassword = "outflow", "soak-secret-pw-31d9"
	const workers = 4
	nodes := startNATSCluster(t, natsUser, natsPassword)
	url := clusterURL(nodes, natsUser, natsPassword)

	limited := func(rcpt string) bool { return strings.HasSuffix(rcpt, "@limited.test") }
	mx := ratedmx.Start(t, ratedmx.Options{Rate: 1000, Limited: limited}) // the rate is set once measured
	relay := newSwitchFront(t, mx.Addr())
	dir := t.TempDir()
	users := writeUsers(t, dir)
	// Retries capped at 5 s: the relay's outages are 20 s, and a backlog
	// that retries every second would spend the machine on the retry lane.
	// The rate-limit lane likewise: on its defaults (up to 30 minutes) the
	// throttled mail of limited.test waits out most of the run.
	args := []string{"--users", users, "--relay", relay.addr, "--relay-tls", "none", "--nats-url", url,
		"--nats-replicas", "3", "--workers", strconv.Itoa(workers), "--ack-wait", "5s",
		"--retry-base", "200ms", "--retry-min", "100ms", "--retry-cap", "5s",
		"--ratelimit-base", "500ms", "--ratelimit-min", "200ms", "--ratelimit-cap", "5s"}
	// The workers run a build without the race detector: its shadow
	// memory grows with every goroutine a process ever started (a -race
	// worker's RSS rose 0.5 MiB a minute while Go's own memory,
	// go_memstats_sys_bytes, stayed at 18 MiB), which would hide the RSS
	// of outflow itself.
	bin := filepath.Join(dir, "outflow")
	build := exec.Command("go", "build", "-o", bin, "./cmd/outflow")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build outflow: %v\n%s", err, out)
	}
	names := []string{"s1", "s2"}
	start := func(i int) *daemon {
		return startDaemonBinary(t, bin, filepath.Join(dir, names[i]), slices.Concat(args, []string{"--worker-id", names[i], "--hostname", names[i] + ".test"})...)
	}
	ds := []*daemon{start(0), start(1)}
	var loads []*load
	acceptedAll := func() map[string]bool {
		all := map[string]bool{}
		for _, l := range loads {
			for id := range l.Accepted() {
				all[id] = true
			}
		}
		return all
	}
	logs := func() string {
		return "--- s1 warnings and errors ---\n" + tail(aboveInfo(ds[0].Logs()), 30) +
			"\n--- s2 warnings and errors ---\n" + tail(aboveInfo(ds[1].Logs()), 30) + "\n" + consumerStates(url)
	}

	// The maximum rate, measured here and now (the machine is shared, and
	// its figure in docs/benchmarks.md is for a plain build against
	// Postfix, not a -race build on three replicating servers): four
	// unpaced connections per worker for 20 s, all to the unthrottled
	// domain; the maximum is what reached the sink per second in the last
	// 15 s, or what was accepted, if less.
	for i, d := range ds {
		loads = append(loads, startLoad(t, "max"+names[i], d.SMTPAddr, 4, 0))
	}
	waitFor(t, 120*time.Second, "the first deliveries", func() bool { return len(mx.Messages()) >= 50 })
	sleepUntil(time.Now().Add(5 * time.Second))
	t0, sink0, acc0 := time.Now(), len(mx.Messages()), loads[0].NumAccepted()+loads[1].NumAccepted()
	sleepUntil(t0.Add(15 * time.Second))
	secs := time.Since(t0).Seconds()
	deliverRate := float64(len(mx.Messages())-sink0) / secs
	acceptRate := float64(loads[0].NumAccepted()+loads[1].NumAccepted()-acc0) / secs
	for _, l := range loads {
		l.Stop()
	}
	maxRate := min(deliverRate, acceptRate)
	waitAllDelivered(t, acceptedAll(), mx.Server, 180*time.Second, logs)
	rate := math.Floor(maxRate / 2)
	if rate < 10 {
		t.Fatalf("measured maximum %.0f msg/s (accepted %.0f/s, delivered %.0f/s): too slow a machine to soak", maxRate, acceptRate, deliverRate)
	}
	// A tenth of the load goes to limited.test, which takes twice that
	// share with a burst of a second's worth (at least 3): the catch-ups
	// after each fault meet its limit. With a burst of a fifth of a
	// second's worth (1.2 messages at 5.8/s), outflow's learned rate
	// settled at a quarter of the limit, below the share, and the
	// backlog grew for as long as the load lasted (docs/reliability.md).
	limitedRate := 2 * rate / 10
	mx.SetLimit(limitedRate, max(3, limitedRate))
	t.Logf("maximum rate %.0f msg/s (accepted %.0f/s, delivered %.0f/s); soaking %v at %.0f msg/s, limited.test throttled above %.0f/s",
		maxRate, acceptRate, deliverRate, dur, rate, limitedRate)

	// The faults, each at its fraction of the run. The two kills come
	// before the first third, so that the window whose growth is judged
	// has the same two processes throughout; the NATS restart and the
	// relay's outages fall inside it. The last tenth is quiet, so that the
	// last sample under load finds the backlog drained.
	type fault struct {
		at   time.Duration
		name string
		do   func()
	}
	down := min(20*time.Second, dur/60)
	var faults []fault
	var began time.Time
	flaps := 0
	for f := 0.07; f < 0.9; f += 0.1 {
		flaps++
		faults = append(faults, fault{time.Duration(f * float64(dur)), "relay down", func() {
			relay.Set("refuse")
			// Up again after its outage, counted from when it went down.
			faults = append(faults, fault{time.Since(began) + down, "relay up", func() { relay.Set("proxy") }})
			slices.SortFunc(faults, func(a, b fault) int { return int(a.at - b.at) })
		}})
	}
	kill := func(i int) func() {
		return func() {
			ds[i].Kill()
			ds[i] = start(i)
			loads[i+2].SetAddr(ds[i].SMTPAddr)
		}
	}
	faults = append(faults,
		fault{time.Duration(0.15 * float64(dur)), "kill -9 s2", kill(1)},
		fault{time.Duration(0.25 * float64(dur)), "kill -9 s1", kill(0)},
		fault{time.Duration(0.5 * float64(dur)), "restart nats n2", func() { nodes[1].restart(t) }})
	slices.SortFunc(faults, func(a, b fault) int { return int(a.at - b.at) })
	const kills, natsRestarts = 2, 1

	rcpt := func(n int) string {
		if n%10 == 0 {
			return "r@limited.test"
		}
		return fmt.Sprintf("r%d@dest.test", n%7)
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var samples []soakSample
	var happened []string
	var marks []soakMark
	sample := func(at time.Duration) soakSample {
		s := soakSample{at: at, faults: strings.Join(happened, "; ")}
		happened = nil
		r := compare(acceptedAll(), sinkCounts(mx.Server))
		s.accepted, s.delivered, s.dups = r.accepted, r.accepted-r.missing, r.dups
		for i, d := range ds {
			s.rssKiB[i], s.fds[i], s.goroutines[i] = d.rssKiB(), fdCount(d.pid()), goroutines(d)
		}
		s.js = jetStreamUse(js)
		return s
	}

	for i, d := range ds {
		loads = append(loads, startRatedLoad(t, "soak"+names[i], d.SMTPAddr, 4, rate/2, rcpt))
	}
	began = time.Now()
	samples = append(samples, sample(0))
	next := every
	for time.Since(began) < dur {
		for len(faults) > 0 && time.Since(began) >= faults[0].at {
			f := faults[0]
			faults = faults[1:]
			at := time.Since(began)
			t.Logf("%v: %s (accepted %d, at the sink %d)", at.Round(time.Second), f.name, len(acceptedAll()), len(mx.Messages()))
			f.do()
			happened = append(happened, f.name)
			marks = append(marks, soakMark{at.Minutes(), f.name})
		}
		if time.Since(began) >= next {
			s := sample(next)
			samples = append(samples, s)
			t.Logf("%s", s)
			next += every
		}
		time.Sleep(200 * time.Millisecond) // the run's clock: faults and samples are due at fixed times
	}
	for _, l := range loads {
		l.Stop()
	}
	stopped := time.Since(began)
	accepted := acceptedAll()
	drainStart := time.Now()
	deadline := drainStart.Add(5 * time.Minute)
	for !allDelivered(accepted, mx.Server) && time.Now().Before(deadline) {
		time.Sleep(time.Second) // polling the sink with a deadline
	}
	drained := time.Since(drainStart)
	// The queue's streams empty out a moment after the last delivery (the
	// ack, the body's removal).
	final := sample(time.Since(began))
	for end := time.Now().Add(30 * time.Second); final.js.queue > 0 && time.Now().Before(end); {
		time.Sleep(time.Second) // polling the streams with a deadline
		final = sample(time.Since(began))
	}
	final.faults = "load stopped, backlog drained"
	samples = append(samples, final)
	marks = append(marks, soakMark{stopped.Minutes(), "load stopped"})

	// In flight at each fault, at most: a killed worker's deliveries
	// (--workers); at the NATS restart and at each relay outage, every
	// delivery of both workers (a SENT marker or ack lost in the leader
	// election; a message the relay took whose reply the cut connection
	// lost).
	bound := kills*workers + natsRestarts*2*workers + flaps*2*workers
	r := compare(accepted, sinkCounts(mx.Server))
	var submissions int64
	codes := map[int]int64{}
	for _, l := range loads {
		submissions += l.attempts.Load()
		for c, n := range l.Codes() {
			codes[c] += n
		}
	}
	t.Logf("FIGURES soak: duration=%v rate=%.0f/s max_rate=%.0f/s submissions=%d %s bound=%d relay_outages=%d kills=%d nats_restarts=%d throttles=%d drained_in=%v codes=%v",
		stopped.Round(time.Second), rate, maxRate, submissions, r, bound, flaps, kills, natsRestarts, len(mx.Throttles()), drained.Round(time.Second), codes)

	if out := os.Getenv("OUTFLOW_SOAK_OUT"); out != "" {
		if !filepath.IsAbs(out) {
			out = filepath.Join("..", out)
		}
		title := []string{fmt.Sprintf("outflow soak: %v at %.0f msg/s (half the %.0f measured at its start), 2 workers, 3-node NATS cluster (R3)",
			stopped.Round(time.Minute), rate, maxRate),
			fmt.Sprintf("%d accepted, %d lost, %d duplicates (bound %d); %d relay outages, %d × kill -9, %d NATS node restart, %d throttles by limited.test",
				r.accepted, r.missing, r.dups, bound, flaps, kills, natsRestarts, len(mx.Throttles()))}
		writeSoakFiles(t, out, title, samples, marks)
	}

	if r.missing != 0 {
		t.Errorf("lost %d accepted messages: %v\n%s", r.missing, r.missingIDs, logs())
	}
	if r.dups > bound {
		t.Errorf("%d duplicates, more than the %d envelopes that can have been in flight at the faults", r.dups, bound)
	}
	if len(mx.Throttles()) == 0 {
		t.Errorf("limited.test never throttled: the provider was not in the mix")
	}
	// Growth, judged between samples taken with the backlog drained: at
	// most two seconds of load waiting.
	calm := func(s soakSample) bool { return s.accepted-s.delivered <= int(2*rate) }
	var from, to *soakSample
	for i := range samples[:len(samples)-1] {
		s := &samples[i]
		if s.at >= dur/3 && calm(*s) {
			if from == nil {
				from = s
			}
			to = s
		}
	}
	if from == nil || to == from || to.at < dur*9/10 {
		t.Errorf("no two samples with the backlog drained between %v and the end (from %v, to %v)", dur/3, from, to)
	} else {
		t.Logf("growth judged between %v and %v", from.at, to.at)
		for i, name := range names {
			for _, m := range []struct {
				what     string
				from, to int
			}{{"RSS KiB", from.rssKiB[i], to.rssKiB[i]}, {"goroutines", from.goroutines[i], to.goroutines[i]}, {"open fds", from.fds[i], to.fds[i]}} {
				if m.from <= 0 || m.to <= 0 {
					t.Errorf("%s: %s not sampled (%d, %d)", name, m.what, m.from, m.to)
					continue
				}
				if float64(m.to) > 1.1*float64(m.from) {
					t.Errorf("%s: %s grew from %d at %v to %d at %v, more than 10%%", name, m.what, m.from, from.at, m.to, to.at)
				}
			}
		}
	}
	if final.js.queue != 0 {
		t.Errorf("the queue's streams hold %d bytes after the backlog drained", final.js.queue)
	}
	for _, d := range ds {
		requireNoPanic(t, d.Logs())
		if strings.Contains(d.Logs(), natsPassword) {
			t.Errorf("the NATS password appears in a worker's log")
		}
	}
}

// sleepUntil waits for a point in time the test itself has chosen (a
// measuring window), not for an event.
func sleepUntil(at time.Time) { time.Sleep(time.Until(at)) }

// soakSample is one row of the soak's CSV.
type soakSample struct {
	at                        time.Duration
	accepted, delivered, dups int
	rssKiB, goroutines, fds   [2]int
	js                        jsUse
	faults                    string
}

func (s soakSample) String() string {
	return fmt.Sprintf("t=%v accepted=%d delivered=%d backlog=%d dups=%d rss_mib=%d/%d goroutines=%d/%d fds=%d/%d js_mib=%.1f queue_kib=%.1f events_mib=%.1f sent_mib=%.1f %s",
		s.at.Round(time.Second), s.accepted, s.delivered, s.accepted-s.delivered, s.dups, s.rssKiB[0]/1024, s.rssKiB[1]/1024,
		s.goroutines[0], s.goroutines[1], s.fds[0], s.fds[1], mib(s.js.total), float64(s.js.queue)/1024, mib(s.js.events), mib(s.js.sent), s.faults)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// jsUse is JetStream storage in bytes, -1 where it could not be read.
type jsUse struct {
	total  int64 // the account's file storage, every replica's streams
	queue  int64 // what is waiting: the lanes, dead letters and bodies
	events int64 // the events stream, kept for --events-max-age by design
	sent   int64 // the SENT markers, kept for --sent-ttl by design
}

func jetStreamUse(js jetstream.JetStream) jsUse {
	// Short: a sample holds up the faults that fall due meanwhile, so a
	// slow one on a loaded machine would stretch an outage well past its
	// planned length.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	u := jsUse{total: -1, queue: -1, events: -1, sent: -1}
	if ai, err := js.AccountInfo(ctx); err == nil {
		u.total = int64(ai.Store)
	}
	bytes := func(name string) int64 {
		st, err := js.Stream(ctx, name)
		if err != nil {
			return -1
		}
		return int64(st.CachedInfo().State.Bytes)
	}
	var q int64
	for _, name := range []string{queue.StreamWork, queue.StreamRetry, queue.StreamRateLimit, queue.StreamDead, "OBJ_" + queue.BucketBodies} {
		b := bytes(name)
		if b < 0 {
			q = -1
			break
		}
		q += b
	}
	u.queue, u.events, u.sent = q, bytes(queue.StreamEvents), bytes("KV_"+queue.BucketSent)
	return u
}

// fdCount is how many file descriptors process pid has open (0 if
// unreadable).
func fdCount(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0
	}
	return len(es)
}

// goroutines reads go_goroutines from the daemon's /metrics (0 if
// unreadable).
func goroutines(d *daemon) int {
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + d.HTTPAddr + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return 0
}

// writeSoakFiles writes the samples as reliability-soak.csv and a plot of
// them as reliability-soak.svg into dir.
func writeSoakFiles(t *testing.T, dir string, title []string, samples []soakSample, marks []soakMark) {
	t.Helper()
	var b strings.Builder
	b.WriteString("minute,accepted,delivered,backlog,duplicates,s1_rss_mib,s2_rss_mib,s1_goroutines,s2_goroutines,s1_fds,s2_fds,js_store_mib,js_queue_kib,js_events_mib,js_sent_mib,faults\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%.2f,%d,%d,%d,%d,%.1f,%.1f,%d,%d,%d,%d,%.2f,%.1f,%.2f,%.2f,%q\n", s.at.Minutes(),
			s.accepted, s.delivered, s.accepted-s.delivered, s.dups,
			float64(s.rssKiB[0])/1024, float64(s.rssKiB[1])/1024, s.goroutines[0], s.goroutines[1], s.fds[0], s.fds[1],
			mib(s.js.total), float64(s.js.queue)/1024, mib(s.js.events), mib(s.js.sent), s.faults)
	}
	if err := os.WriteFile(filepath.Join(dir, "reliability-soak.csv"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	x := make([]float64, len(samples))
	for i, s := range samples {
		x[i] = s.at.Minutes()
	}
	col := func(f func(s soakSample) float64) []float64 {
		out := make([]float64, len(samples))
		for i, s := range samples {
			out[i] = f(s)
		}
		return out
	}
	panels := []soakPanel{
		{"RSS, MiB", []soakSeries{
			{"s1", col(func(s soakSample) float64 { return float64(s.rssKiB[0]) / 1024 })},
			{"s2", col(func(s soakSample) float64 { return float64(s.rssKiB[1]) / 1024 })}}},
		{"goroutines", []soakSeries{
			{"s1", col(func(s soakSample) float64 { return float64(s.goroutines[0]) })},
			{"s2", col(func(s soakSample) float64 { return float64(s.goroutines[1]) })}}},
		{"open file descriptors", []soakSeries{
			{"s1", col(func(s soakSample) float64 { return float64(s.fds[0]) })},
			{"s2", col(func(s soakSample) float64 { return float64(s.fds[1]) })}}},
		{"JetStream storage, MiB", []soakSeries{
			{"account", col(func(s soakSample) float64 { return mib(s.js.total) })},
			{"events", col(func(s soakSample) float64 { return mib(s.js.events) })},
			{"SENT", col(func(s soakSample) float64 { return mib(s.js.sent) })},
			{"queue", col(func(s soakSample) float64 { return mib(s.js.queue) })}}},
		{"backlog, messages", []soakSeries{
			{"accepted, not delivered", col(func(s soakSample) float64 { return float64(s.accepted - s.delivered) })}}},
	}
	f, err := os.Create(filepath.Join(dir, "reliability-soak.svg"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := writeSoakPlot(f, title, x, panels, marks); err != nil {
		t.Fatal(err)
	}
}

// soakSeries is one line of a panel; soakPanel one chart with its own y
// axis; soakMark a fault, drawn as a vertical line at its sample.
type soakSeries struct {
	name string
	y    []float64
}

type soakPanel struct {
	title  string
	series []soakSeries
}

type soakMark struct {
	x    float64
	text string
}

// Geometry of the soak plot, in SVG user units.
const (
	soakWidth  = 960
	soakLeft   = 70
	soakRight  = 190 // the legend
	soakTop    = 64  // two title lines
	soakPanelH = 120
	soakGap    = 36
)

var soakColors = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd"}

// writeSoakPlot draws panels stacked over one time axis in minutes, each
// scaled from 0 to its largest value, with the faults as dashed vertical
// lines numbered in the order they happened (their names in the legend
// under the plot). Points below 0 (a value that could not be read) are
// left out.
func writeSoakPlot(w io.Writer, title []string, x []float64, panels []soakPanel, marks []soakMark) error {
	bw := bufio.NewWriter(w)
	innerW := float64(soakWidth - soakLeft - soakRight)
	xMax := 1.0
	if len(x) > 0 {
		xMax = math.Max(xMax, x[len(x)-1])
	}
	xOf := func(v float64) float64 { return soakLeft + v/xMax*innerW }
	plotH := soakTop + len(panels)*(soakPanelH+soakGap)
	height := plotH + 20 + 16*len(marks) + 10
	fmt.Fprintf(bw, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n",
		soakWidth, height, soakWidth, height)
	fmt.Fprintf(bw, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for i, line := range title {
		fmt.Fprintf(bw, `<text x="%d" y="%d" font-size="12"%s>%s</text>`+"\n", 10, 18+16*i, map[bool]string{true: ` font-weight="bold"`}[i == 0], html.EscapeString(line))
	}
	for pi, p := range panels {
		top := float64(soakTop + pi*(soakPanelH+soakGap))
		bottom := top + soakPanelH
		yMax := 0.0
		for _, s := range p.series {
			for _, v := range s.y {
				yMax = math.Max(yMax, v)
			}
		}
		yMax = niceCeil(yMax)
		yOf := func(v float64) float64 { return bottom - v/yMax*soakPanelH }
		fmt.Fprintf(bw, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", soakLeft, top-6, html.EscapeString(p.title))
		fmt.Fprintf(bw, `<rect x="%d" y="%.0f" width="%.0f" height="%d" fill="none" stroke="#999"/>`+"\n", soakLeft, top, innerW, soakPanelH)
		for _, f := range []float64{0, 0.5, 1} {
			y := yOf(f * yMax)
			fmt.Fprintf(bw, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", soakLeft-6, y+4, strconv.FormatFloat(f*yMax, 'f', -1, 64))
			if f == 0.5 {
				fmt.Fprintf(bw, `<line x1="%d" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/>`+"\n", soakLeft, y, soakLeft+innerW, y)
			}
		}
		for mi, m := range marks {
			fmt.Fprintf(bw, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#bbb" stroke-dasharray="3,3"/>`+"\n", xOf(m.x), top, xOf(m.x), bottom)
			if pi == 0 {
				fmt.Fprintf(bw, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#777" font-size="9">%d</text>`+"\n", xOf(m.x), top+10, mi+1)
			}
		}
		for si, s := range p.series {
			color := soakColors[si%len(soakColors)]
			var pts []string
			for i, v := range s.y {
				if v < 0 || i >= len(x) {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", xOf(x[i]), yOf(v)))
			}
			fmt.Fprintf(bw, `<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>`+"\n", color, strings.Join(pts, " "))
			ly := top + 14 + float64(si)*16
			fmt.Fprintf(bw, `<line x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f" stroke="%s" stroke-width="2"/>`+"\n", soakLeft+innerW+12, ly-4, soakLeft+innerW+30, ly-4, color)
			fmt.Fprintf(bw, `<text x="%.0f" y="%.0f">%s</text>`+"\n", soakLeft+innerW+36, ly, html.EscapeString(s.name))
		}
		for m := 0.0; m <= xMax; m += minuteStep(xMax) {
			fmt.Fprintf(bw, `<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", xOf(m), bottom+13, strconv.FormatFloat(m, 'f', -1, 64))
		}
	}
	fmt.Fprintf(bw, `<text x="%.0f" y="%d" text-anchor="middle">minutes since the load started</text>`+"\n", soakLeft+innerW/2, plotH)
	for mi, m := range marks {
		fmt.Fprintf(bw, `<text x="%d" y="%d" fill="#555">%d (%.1f min): %s</text>`+"\n", soakLeft, plotH+20+16*mi, mi+1, m.x, html.EscapeString(m.text))
	}
	fmt.Fprintln(bw, "</svg>")
	return bw.Flush()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// minuteStep is the spacing of the time axis labels: about ten of them.
func minuteStep(span float64) float64 {
	for _, s := range []float64{0.5, 1, 2, 5, 10, 15, 30, 60} {
		if span/s <= 12 {
			return s
		}
	}
	return 120
}
