package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/ratedmx"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// Scenario 6: polite without being told the limit. A scripted provider
// (internal/ratedmx) accepts an unannounced token-bucket rate and answers
// 421 4.7.28 above it; outflow runs on its defaults, no rate configured.

const (
	learnLimit  = 20.0 // the provider's limit, msgs/s
	learnPass   = "bench-password"
	learnTenant = "tenant-a"
)

// learnOutflow starts outflow on its defaults relaying to the provider,
// with two tenants' accounts; natsURL joins another daemon's NATS.
func (s *suite) learnOutflow(relay, natsURL string) (*outflowProc, func(), error) {
	data, err := os.MkdirTemp("", "outflow-bench-learn-")
	if err != nil {
		return nil, nil, err
	}
	h, err := submission.HashPassword(learnPass, 4)
	if err != nil {
		return nil, nil, err
	}
	users := filepath.Join(data, "bench-users")
	if err := os.WriteFile(users, []byte(learnTenant+":"+h+"\ntenant-b:"+h+"\n"), 0o600); err != nil {
		return nil, nil, err
	}
	extra := []string{"--users", users}
	if natsURL != "" {
		extra = append(extra, "--nats-url", natsURL)
	}
	var logTo io.Writer // the daemon's log, for -learn-trace
	closeTrace := func() {}
	if s.c.learnTrace != "" {
		f, err := os.Create(filepath.Join(s.c.learnTrace, filepath.Base(data)+".log"))
		if err != nil {
			return nil, nil, err
		}
		logTo, closeTrace = f, func() { f.Close() }
		extra = append(extra, "--log-level", "debug")
	}
	p, err := startOutflowLogged(s.c.outflow, data, relay, logTo, extra...)
	if err != nil {
		closeTrace()
		os.RemoveAll(data)
		return nil, nil, err
	}
	return p, func() { p.Stop(); closeTrace(); os.RemoveAll(data) }, nil
}

// learnPair starts the limited provider and one outflow relaying to it;
// stop stops both.
func (s *suite) learnPair() (*ratedmx.Provider, *outflowProc, func(), error) {
	p, err := ratedmx.New(ratedmx.Options{Rate: learnLimit})
	if err != nil {
		return nil, nil, nil, err
	}
	d, stop, err := s.learnOutflow(p.Addr(), "")
	if err != nil {
		p.Close()
		return nil, nil, nil, err
	}
	return p, d, func() { stop(); p.Close() }, nil
}

// natsURLOf is the client URL, with credentials, of the embedded NATS of
// the daemon on data.
func natsURLOf(data string) (string, error) {
	ci, err := queue.ReadClientInfo(data)
	if err != nil {
		return "", err
	}
	return strings.Replace(ci.URL, "nats://", "nats://"+ci.User+":"+ci.Password+"@", 1), nil
}

// authSubmit sends n messages for tenant over one authenticated session,
// to rcpt(i); sent(i) is called as each is accepted.
func authSubmit(addr, tenant string, n int, rcpt func(int) string, sent func(int)) error {
	c, err := smtp.Dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Hello("client.bench.test"); err != nil {
		return err
	}
	if err := c.Auth(sasl.NewPlainClient("", tenant, learnPass)); err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		to := rcpt(i)
		msg := fmt.Sprintf("From: app@sender.test\r\nTo: %s\r\nSubject: learned %d\r\nMessage-ID: <%s-%d@sender.test>\r\n\r\nbody\r\n", to, i, tenant, i)
		if err := c.SendMail("app@sender.test", []string{to}, strings.NewReader(msg)); err != nil {
			return fmt.Errorf("message %d: %w", i, err)
		}
		if sent != nil {
			sent(i)
		}
	}
	return c.Quit()
}

// waitArrivals waits until p has accepted n recipients.
func waitArrivals(p *ratedmx.Provider, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for len(p.Arrivals()) < n {
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d messages after %s", len(p.Arrivals()), n, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil
}

// learnRun is scenario 6.1's figures for one run.
type learnRun struct {
	throttleShare float64 // throttle replies per message
	drainRatio    float64 // drain time over the ideal
	peakRatio     float64 // peak one-second arrivals over the limit
	drain         time.Duration
}

func learnFigures(p *ratedmx.Provider, msgs int, start time.Time, limit float64) learnRun {
	ts := p.Times()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	drain := ts[len(ts)-1].Sub(start)
	ideal := time.Duration(float64(msgs) / limit * float64(time.Second))
	return learnRun{
		throttleShare: float64(len(p.Throttles())) / float64(msgs),
		drainRatio:    drain.Seconds() / ideal.Seconds(),
		peakRatio:     float64(ratedmx.Peak(ts)) / limit,
		drain:         drain,
	}
}

// learnDrain is scenario 6.1 (daemons = 1) and 6.2 (daemons = 2): msgs
// messages split over the daemons, against the unannounced limit.
func (s *suite) learnDrain(daemons, msgs int) (learnRun, error) {
	p, err := ratedmx.New(ratedmx.Options{Rate: s.c.learnLimit, Burst: s.c.learnBurst})
	if err != nil {
		return learnRun{}, err
	}
	defer p.Close()
	first, stop, err := s.learnOutflow(p.Addr(), "")
	if err != nil {
		return learnRun{}, err
	}
	defer stop()
	addrs := []string{first.SMTPAddr}
	if daemons == 2 {
		url, err := natsURLOf(first.Data)
		if err != nil {
			return learnRun{}, err
		}
		second, stop2, err := s.learnOutflow(p.Addr(), url)
		if err != nil {
			return learnRun{}, err
		}
		defer stop2()
		addrs = append(addrs, second.SMTPAddr)
		time.Sleep(6 * time.Second) // both registered (the heartbeat is 5 s) before the load
	}
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, len(addrs))
	for i, addr := range addrs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- authSubmit(addr, learnTenant, msgs/len(addrs), func(j int) string { return fmt.Sprintf("d%d-%d@limited.test", i, j) }, nil)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return learnRun{}, err
		}
	}
	if err := waitArrivals(p, msgs, 10*time.Minute); err != nil {
		return learnRun{}, err
	}
	if s.c.learnTrace != "" {
		name := filepath.Join(s.c.learnTrace, fmt.Sprintf("6.%d-%s.tsv", daemons, start.Format("150405")))
		if err := os.WriteFile(name, learnTimeline(p.Times(), p.Throttles(), start), 0o644); err != nil {
			return learnRun{}, err
		}
	}
	return learnFigures(p, msgs, start, s.c.learnLimit), nil
}

// learnTimeline is a provider's arrivals and throttle replies per half
// second from start, as tab-separated lines (seconds, arrivals, throttles):
// what a run's figures summarise, to lay beside the daemons' logs.
func learnTimeline(arrivals, throttles []time.Time, start time.Time) []byte {
	const step = 500 * time.Millisecond
	var arr, thr []int
	count := func(into *[]int, ts []time.Time) {
		for _, t := range ts {
			k := max(0, int(t.Sub(start)/step))
			for len(*into) <= k {
				*into = append(*into, 0)
			}
			(*into)[k]++
		}
	}
	count(&arr, arrivals)
	count(&thr, throttles)
	var b strings.Builder
	b.WriteString("seconds\tarrivals\tthrottles\n")
	for k := range max(len(arr), len(thr)) {
		a, t := 0, 0
		if k < len(arr) {
			a = arr[k]
		}
		if k < len(thr) {
			t = thr[k]
		}
		fmt.Fprintf(&b, "%.1f\t%d\t%d\n", float64(k)*step.Seconds(), a, t)
	}
	return []byte(b.String())
}

// learnPostfix is scenario 6.1 with Postfix on its default timers, the
// anchor: throttled mail waits out minimal_backoff_time and the queue
// manager's runs.
func (s *suite) learnPostfix(msgs int, timeout time.Duration) (learnRun, error) {
	p, err := ratedmx.New(ratedmx.Options{Rate: s.c.learnLimit, Burst: s.c.learnBurst})
	if err != nil {
		return learnRun{}, err
	}
	defer p.Close()
	pf, err := startPostfix(p.Addr(), nil)
	if err != nil {
		return learnRun{}, err
	}
	defer pf.Stop()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := smtpSourceTo(ctx, pf.Addr, "r@limited.test", 20, msgs, 1024); err != nil {
		return learnRun{}, err
	}
	if err := waitArrivals(p, msgs, timeout); err != nil {
		return learnRun{}, fmt.Errorf("postfix: %w", err)
	}
	return learnFigures(p, msgs, start, s.c.learnLimit), nil
}

// learnHalving is scenario 6.3: a steady supply at twice the limit; the
// limit halves after the rate is learned, then is restored.
func (s *suite) learnHalving(settle, halved, restored time.Duration) (quiet time.Duration, after int, climb time.Duration, err error) {
	p, d, stop, err := s.learnPair()
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	total := int((settle + halved + restored).Seconds() * 2 * learnLimit)
	done := make(chan error, 1)
	go func() {
		c := time.NewTicker(time.Second / time.Duration(2*learnLimit))
		defer c.Stop()
		done <- authSubmit(d.SMTPAddr, learnTenant, total, func(i int) string { <-c.C; return fmt.Sprintf("h%d@limited.test", i) }, nil)
	}()
	time.Sleep(settle)
	halvedAt := time.Now()
	p.SetRate(learnLimit / 2)
	time.Sleep(halved)
	restoredAt := time.Now()
	p.SetRate(learnLimit)
	time.Sleep(restored)
	thr := p.Throttles()
	// Throttles stop: the start of the first 5 s without one after the
	// halving.
	quiet = -1
	for at := halvedAt; at.Add(5 * time.Second).Before(restoredAt); at = at.Add(100 * time.Millisecond) {
		if ratedmx.Count(thr, at, at.Add(5*time.Second)) == 0 {
			quiet = at.Sub(halvedAt)
			break
		}
	}
	after = ratedmx.Count(thr, halvedAt, restoredAt)
	// The climb: the first 2 s window after the restore with arrivals at
	// 80% of the restored limit.
	ts := p.Times()
	climb = -1
	for at := restoredAt; at.Add(2 * time.Second).Before(time.Now()); at = at.Add(100 * time.Millisecond) {
		if float64(ratedmx.Count(ts, at, at.Add(2*time.Second)))/2 >= 0.8*learnLimit {
			climb = at.Add(2 * time.Second).Sub(restoredAt)
			break
		}
	}
	return quiet, after, climb, nil
}

// learnTenants is scenario 6.4: tenant A's backlog of a messages to the
// limited destination, then tenant B's b messages; B's latencies.
func (s *suite) learnTenants(a, b int) (p50, p99 time.Duration, left int, err error) {
	p, d, stop, err := s.learnPair()
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	if err := authSubmit(d.SMTPAddr, learnTenant, a, func(i int) string { return fmt.Sprintf("a%d@limited.test", i) }, nil); err != nil {
		return 0, 0, 0, err
	}
	var mu sync.Mutex
	sent := map[string]time.Time{}
	if err := authSubmit(d.SMTPAddr, "tenant-b", b, func(i int) string {
		r := fmt.Sprintf("b%d@limited.test", i)
		mu.Lock()
		sent[r] = time.Now()
		mu.Unlock()
		return r
	}, nil); err != nil {
		return 0, 0, 0, err
	}
	deadline := time.Now().Add(5 * time.Minute)
	var lat []time.Duration
	for {
		lat = lat[:0]
		arr := p.Arrivals()
		mu.Lock()
		for _, x := range arr {
			if at, ok := sent[strings.Trim(x.Rcpt, "<>")]; ok {
				lat = append(lat, x.At.Sub(at))
			}
		}
		mu.Unlock()
		if len(lat) == b {
			left = a - (len(arr) - b)
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, 0, fmt.Errorf("tenant B: %d of %d delivered after 5m", len(lat), b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return lat[len(lat)/2], lat[(len(lat)*99+99)/100-1], left, nil
}

func (s *suite) scenario6() error {
	msgs, runs := max(60, int(s.c.learnSecs*s.c.learnLimit)), s.c.runs
	backlog := 10000
	settle, halved, restored := 30*time.Second, 30*time.Second, 60*time.Second
	postfixTimeout := 30 * time.Minute
	if s.c.quick {
		backlog = 2000
		settle, halved, restored = 20*time.Second, 20*time.Second, 40*time.Second
	}
	t := &table{
		title: "Scenario 6: an unannounced limit (learned rates), outflow on its defaults",
		notes: []string{
			fmt.Sprintf("A scripted provider (internal/ratedmx) accepts a token bucket of %g msg/s (burst %g) and answers 421 4.7.28 to every RCPT above it. outflow runs with no rate configured. 6.1: %d messages over one authenticated session; 6.2: the same split over two daemons on one NATS; medians of %d runs. Drain is the last arrival after the first submission, against the ideal %d/%g s; peak is the most arrivals in any one second, against the limit.", s.c.learnLimit, s.c.burst(), msgs, runs, msgs, s.c.learnLimit),
			"Postfix (same provider, its default timers, relaying as smarthost) is the anchor for 6.1: each 421 defers the message for minimal_backoff_time (300 s) and later queue runs.",
		},
		head: []string{"run", "throttle replies / messages", "drain / ideal", "peak / limit", "drain s"},
	}
	part := func(n string) bool { return strings.Contains(","+s.c.learnParts+",", ","+n+",") }
	for _, daemons := range []int{1, 2} {
		if !part(fmt.Sprint(daemons)) {
			continue
		}
		var thr, dr, pk, secs []float64
		for i := 0; i < runs; i++ {
			r, err := s.learnDrain(daemons, msgs)
			if err != nil {
				return err
			}
			fmt.Printf("  6.%d run %d: throttles %.1f%%, drain %.2fx (%.1fs), peak %.2fx\n", daemons, i+1, 100*r.throttleShare, r.drainRatio, r.drain.Seconds(), r.peakRatio)
			thr, dr, pk, secs = append(thr, r.throttleShare*100), append(dr, r.drainRatio), append(pk, r.peakRatio), append(secs, r.drain.Seconds())
		}
		name := "6.1 outflow, one daemon"
		if daemons == 2 {
			name = "6.2 outflow, two daemons"
		}
		t.rows = append(t.rows, []string{name, fmtMedian(thr, "%.1f%%"), fmtMedian(dr, "%.2fx"), fmtMedian(pk, "%.2fx"), fmtMedian(secs, "%.1f")})
	}
	if os.Geteuid() == 0 && !s.c.noAnchor && part("1") {
		r, err := s.learnPostfix(msgs, postfixTimeout)
		if err != nil {
			t.rows = append(t.rows, []string{"6.1 Postfix (anchor)", err.Error(), "", "", ""})
		} else {
			fmt.Printf("  6.1 Postfix: throttles %.1f%%, drain %.2fx (%.1fs), peak %.2fx\n", 100*r.throttleShare, r.drainRatio, r.drain.Seconds(), r.peakRatio)
			t.rows = append(t.rows, []string{"6.1 Postfix (anchor), one run", fmt.Sprintf("%.1f%%", 100*r.throttleShare), fmt.Sprintf("%.2fx", r.drainRatio), fmt.Sprintf("%.2fx", r.peakRatio), fmt.Sprintf("%.1f", r.drain.Seconds())})
		}
	}
	if len(t.rows) > 0 {
		s.tables = append(s.tables, t)
	}

	h := &table{
		title: "Scenario 6.3: the limit halves (20 → 10 msg/s) and is restored",
		notes: []string{fmt.Sprintf("A steady supply at 40 msg/s. The limit halves %s after the start (the rate learned by then) and is restored %s later; measured until %s after that. Throttles stop: the start of the first 5 s without a throttle reply after the halving. Climb: the end of the first 2 s window after the restore with arrivals at 80%% of 20 msg/s.", settle, halved, restored)},
		head:  []string{"run", "throttles stop after s", "throttle replies after the halving", "climb to 80% after s"},
	}
	for i := 0; i < runs && part("3"); i++ {
		quiet, after, climb, err := s.learnHalving(settle, halved, restored)
		if err != nil {
			return err
		}
		fmt.Printf("  6.3 run %d: quiet after %.1fs, %d throttles, climb %.1fs\n", i+1, quiet.Seconds(), after, climb.Seconds())
		h.rows = append(h.rows, []string{fmt.Sprint(i + 1), secsOrNever(quiet), fmt.Sprint(after), secsOrNever(climb)})
	}
	if len(h.rows) > 0 {
		s.tables = append(s.tables, h)
	}

	f := &table{
		title: "Scenario 6.4: tenant fair share",
		notes: []string{fmt.Sprintf("Tenant A submits %d messages to the limited destination (20 msg/s, learned); then tenant B submits 20 to the same destination. Submission-to-delivery latency of B's messages.", backlog)},
		head:  []string{"run", "tenant B p50 s", "tenant B p99 s", "A's messages still waiting"},
	}
	for i := 0; i < runs && part("4"); i++ {
		p50, p99, left, err := s.learnTenants(backlog, 20)
		if err != nil {
			return err
		}
		fmt.Printf("  6.4 run %d: B p50 %.2fs p99 %.2fs, %d of A's waiting\n", i+1, p50.Seconds(), p99.Seconds(), left)
		f.rows = append(f.rows, []string{fmt.Sprint(i + 1), fmt.Sprintf("%.2f", p50.Seconds()), fmt.Sprintf("%.2f", p99.Seconds()), fmt.Sprint(left)})
	}
	if len(f.rows) > 0 {
		s.tables = append(s.tables, f)
	}
	return nil
}

func secsOrNever(d time.Duration) string {
	if d < 0 {
		return "not within the run"
	}
	return fmt.Sprintf("%.1f", d.Seconds())
}

// fmtMedian is "median (run, run, …)" in format f.
func fmtMedian(xs []float64, f string) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(f, x)
	}
	return fmt.Sprintf(f, median(xs)) + " (" + strings.Join(parts, ", ") + ")"
}
