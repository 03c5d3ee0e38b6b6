package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/submission"
)

// ratedMX is a fake MX that accepts at most limit RCPTs in any sliding
// second and answers Gmail's 421 4.7.28 above it, recording the time of
// every accepted message.
type ratedMX struct {
	*fakemx.Server
	mu       sync.Mutex
	limit    int
	accepted []time.Time
	refused  atomic.Int32
	// throttleNext makes the next RCPT get the 421 whatever the rate;
	// throttledAt records when.
	throttleNext bool
	throttledAt  time.Time
}

func startRatedMX(t *testing.T, limit int) *ratedMX {
	r := &ratedMX{limit: limit}
	r.Server = fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		now := time.Now()
		n := 0
		for i := len(r.accepted) - 1; i >= 0 && now.Sub(r.accepted[i]) < time.Second; i-- {
			n++
		}
		if r.throttleNext {
			r.throttleNext, r.throttledAt = false, now
			n = r.limit
		}
		if n >= r.limit {
			r.refused.Add(1)
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28}, Message: "Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."}
		}
		r.accepted = append(r.accepted, now)
		return nil
	}})
	return r
}

func (r *ratedMX) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Time(nil), r.accepted...)
}

// steadyRate is the arrival rate over the steady part of a run: without
// the first and last tenth (the first tokens of each worker, the tail of
// the backlog). It sorts ts.
func steadyRate(ts []time.Time) float64 {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	lo, hi := len(ts)/10, len(ts)-1-len(ts)/10
	return float64(hi-lo) / ts[hi].Sub(ts[lo]).Seconds()
}

// submitThrough submits total messages to rcpt, split evenly over the
// daemons, one connection each, concurrently.
func submitThrough(t *testing.T, ds []*daemon, total int, prefix, rcpt string) {
	t.Helper()
	var wg sync.WaitGroup
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
			defer cl.Close()
			for j := range total / len(ds) {
				if err := submit(cl, "app@sender.test", []string{rcpt}, message(fmt.Sprintf("%s%d-%d", prefix, i, j), "")); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// peakPerSecond is the most arrivals in any one-second window starting at
// an arrival.
func peakPerSecond(ts []time.Time) int {
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	peak := 0
	for i := range ts {
		j := i
		for j < len(ts) && ts[j].Sub(ts[i]) < time.Second {
			j++
		}
		peak = max(peak, j-i)
	}
	return peak
}

// TestFleetSharesDestinationRate runs two outflow processes on one NATS
// (the second joins the first's embedded server through its client
// listener) against a destination that enforces its own rate, and checks
// the rate the destination sees stays within 10% of the configured fleet
// rate: each worker takes its share.
func TestFleetSharesDestinationRate(t *testing.T) {
	const rate, total = 20, 160
	mx := startRatedMX(t, rate+rate/5) // the receiver tolerates a little more than our configured rate
	dir := t.TempDir()
	users := writeUsers(t, dir)
	common := []string{"--users", users, "--relay", mx.Addr(), "--relay-tls", "none", "--dest-rate", fmt.Sprint(rate),
		"--retry-base", "200ms", "--retry-min", "100ms", "--retry-cap", "1s", "--ratelimit-base", "500ms", "--ratelimit-min", "200ms", "--ratelimit-cap", "2s"}
	a := startDaemon(t, dir+"/a", append(common, "--worker-id", "A")...)
	url := natsURLOf(t, dir+"/a")
	b := startDaemon(t, dir+"/b", append(common, "--worker-id", "B", "--nats-url", url)...)
	// Both are registered before the load starts.
	waitFor(t, 20*time.Second, "both workers live", func() bool {
		return strings.Contains(a.cli(t, "dest", "status", "rated.test"), "  2  ")
	})
	submitThrough(t, []*daemon{a, b}, total, "f", "r@rated.test")
	t.Logf("status during the run:\n%s", a.cli(t, "dest", "status", "rated.test"))
	if err := mx.WaitForMessages(total, 90*time.Second); err != nil {
		t.Fatalf("%v (refused %d)", err, mx.refused.Load())
	}
	ts := mx.times()
	got := steadyRate(ts)
	t.Logf("%d messages in %.1fs; steady rate %.1f/s (configured %d/s); peak one-second %d; refused by the receiver %d",
		len(ts), ts[len(ts)-1].Sub(ts[0]).Seconds(), got, rate, peakPerSecond(ts), mx.refused.Load())
	t.Logf("delivered by A: %d, by B: %d; rate refusals A: %d, B: %d", strings.Count(a.Logs(), `"outcome":"delivered"`), strings.Count(b.Logs(), `"outcome":"delivered"`),
		strings.Count(a.Logs(), `local-rate`), strings.Count(b.Logs(), `local-rate`))
	if got > rate*1.1 || got < rate*0.9 {
		t.Fatalf("fleet rate %.1f/s, want within 10%% of %d/s", got, rate)
	}
	a.Stop()
	b.Stop()
}

// TestStoppedWorkerLeavesTheFleetAtOnce: a daemon stopped gracefully takes
// its key out of the workers' registry before it lets go of NATS, so the
// others' shares of each rate grow at once, not after the registry's TTL
// (15 s). Its delete came after the connection's drain, and failed: with a
// random instance in each key, every restart left a worker counted that
// no longer was, holding a share of every rate and connection limit.
func TestStoppedWorkerLeavesTheFleetAtOnce(t *testing.T) {
	dir := t.TempDir()
	users := writeUsers(t, dir)
	common := []string{"--users", users, "--relay", "127.0.0.1:9", "--relay-tls", "none", "--dest-rate", "10"}
	a := startDaemon(t, dir+"/a", append(common, "--worker-id", "A")...)
	b := startDaemon(t, dir+"/b", append(common, "--worker-id", "B", "--nats-url", natsURLOf(t, dir+"/a"))...)
	waitFor(t, 20*time.Second, "both workers live", func() bool {
		return strings.Contains(a.cli(t, "dest", "status", "rated.test"), "  2  ")
	})
	b.Stop()
	stopped := time.Now()
	waitFor(t, 20*time.Second, "A alone", func() bool {
		return strings.Contains(a.cli(t, "dest", "status", "rated.test"), "  1  ")
	})
	if took := time.Since(stopped); took > 5*time.Second {
		t.Fatalf("A counted the stopped worker for %s after it exited, want its key deleted at its stop", took)
	}
	a.Stop()
}

// outageProxy forwards to target while up; while down it accepts and hangs
// up at once, as a destination that is unreachable does.
type outageProxy struct {
	ln     net.Listener
	target string
	up     atomic.Bool
}

func startProxy(t *testing.T, target string) *outageProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &outageProxy{ln: ln, target: target}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if !p.up.Load() {
				c.Close()
				continue
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", p.target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return p
}

// TestRecoveryAfterOutage: the destination is down while a backlog builds,
// then comes back. The first delivery follows within 5 s (the breaker's
// half-open probe), the backlog is released at the destination's rate,
// oldest first, without a spike, and drains close to the ideal time.
func TestRecoveryAfterOutage(t *testing.T) {
	const rate, backlog = 25, 150
	outage := 10 * time.Second
	if os.Getenv("OUTFLOW_LONG") != "" {
		outage = 30 * time.Second
	}
	mx := startRatedMX(t, 1000)
	px := startProxy(t, mx.Addr())
	dir := t.TempDir()
	// Default breaker settings: the first delivery after the return must
	// come from the breaker's own half-open probe.
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", px.ln.Addr().String(),
		"--relay-tls", "none", "--dest-rate", fmt.Sprint(rate), "--connect-timeout", "2s", "--command-timeout", "5s")
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	for i := range backlog {
		if err := submit(cl, "app@sender.test", []string{"r@down.test"}, message(fmt.Sprintf("o%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	_ = cl.Quit()
	waitFor(t, 30*time.Second, "the breaker to open", func() bool { return strings.Contains(d.Logs(), `"open"`) })
	// Let the outage run its course, then bring the destination back.
	deadline := time.Now().Add(outage)
	waitFor(t, outage+5*time.Second, "the outage period", func() bool { return time.Now().After(deadline) })
	up := time.Now()
	px.up.Store(true)
	if err := mx.WaitForMessages(backlog, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, lastLines(d.Logs(), 40))
	}
	ts := mx.times()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	first := ts[0].Sub(up)
	drain := ts[len(ts)-1].Sub(up)
	ideal := time.Duration(float64(backlog) / rate * float64(time.Second))
	peak := peakPerSecond(ts)
	t.Logf("outage %v, backlog %d, rate %d/s: first delivery %.2fs after recovery, peak %d/s, drained in %.2fs (ideal %.2fs, ratio %.2f)",
		outage, backlog, rate, first.Seconds(), peak, drain.Seconds(), ideal.Seconds(), drain.Seconds()/ideal.Seconds())
	if first > 5*time.Second {
		t.Errorf("first delivery %v after recovery, want within 5s", first)
	}
	if float64(peak) > 1.2*rate {
		t.Errorf("peak %d arrivals in one second, want at most 1.2 x %d", peak, rate)
	}
	if drain.Seconds() > 1.3*ideal.Seconds()+first.Seconds() {
		t.Errorf("drained in %v, want at most 1.3 x the ideal %v (after the first delivery at %v)", drain, ideal, first)
	}
	d.Stop()
}

func lastLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// TestSuspendedTenantDestinationDoesNotDelayOthers: tenant "bulk" sends to
// a suspended destination; tenant "app"'s mail to another destination is
// delivered at once.
func TestSuspendedTenantDestinationDoesNotDelayOthers(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	h1, _ := submission.HashPassword(testPassword, 4)
	users := filepath.Join(dir, "users")
	if err := os.WriteFile(users, []byte(testUser+":"+h1+"\nbulk:"+h1+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir+"/data", "--users", users, "--relay", mx.Addr(), "--relay-tls", "none")
	d.cli(t, "dest", "suspend", "blocked.test", "--for", "1h")
	bulk := dialAuth(t, d.SMTPAddr, "bulk", testPassword)
	for i := range 200 {
		if err := submit(bulk, "bulk@sender.test", []string{"r@blocked.test"}, message(fmt.Sprintf("b%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	app := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(app, "app@sender.test", []string{"r@open.test"}, message("urgent", "")); err != nil {
		t.Fatal(err)
	}
	if err := mx.WaitForMessages(1, 10*time.Second); err != nil {
		t.Fatalf("tenant app's mail waited behind tenant bulk's suspended backlog: %v", err)
	}
	t.Logf("tenant app delivered %.2fs after submission, with 200 of tenant bulk's messages for a suspended destination ahead of it",
		time.Since(start).Seconds())
	if n := len(mx.Messages()); n != 1 {
		t.Fatalf("%d messages delivered; the suspended destination got mail", n)
	}
	d.Stop()
}

// workerView is one worker's answer in `dest status --json`.
type workerView struct {
	Worker      string  `json:"worker_id"`
	Factor      float64 `json:"factor"`
	LiveWorkers int     `json:"live_workers"`
}

// TestClusterSharesRateAndThrottle: the same fleet behaviour on a 3-node
// NATS cluster (replicated streams and buckets): two workers together keep
// within 10% of the destination's rate, and a throttle one of them sees
// cuts the rate of both within a second.
func TestClusterSharesRateAndThrottle(t *testing.T) {
	const natsUser, natsPassword = "outflow", "throttle-cluster-pw"
	nodes := startNATSCluster(t, natsUser, natsPassword)
	url := clusterURL(nodes, natsUser, natsPassword)
	const rate, total = 20, 160
	mx := startRatedMX(t, rate+rate/5)
	dir := t.TempDir()
	common := []string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--nats-url", url,
		"--nats-replicas", "3", "--dest-rate", fmt.Sprint(rate),
		"--retry-base", "200ms", "--retry-min", "100ms", "--retry-cap", "1s",
		"--ratelimit-base", "500ms", "--ratelimit-min", "200ms", "--ratelimit-cap", "2s"}
	a := startDaemon(t, dir+"/a", append(common, "--worker-id", "A")...)
	b := startDaemon(t, dir+"/b", append(common, "--worker-id", "B")...)
	status := func() []workerView {
		out, err := runCLI(t, "dest", "status", "rated.test", "--json", "--nats-url", url)
		if err != nil {
			t.Fatalf("dest status: %v %s", err, out)
		}
		var v struct {
			Workers []workerView `json:"workers"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("dest status --json: %v\n%s", err, out)
		}
		return v.Workers
	}
	waitFor(t, 30*time.Second, "both workers live on the cluster", func() bool {
		v := status()
		return len(v) == 2 && v[0].LiveWorkers == 2 && v[1].LiveWorkers == 2
	})
	submitThrough(t, []*daemon{a, b}, total, "c", "r@rated.test")
	if err := mx.WaitForMessages(total, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	ts := mx.times()
	got := steadyRate(ts)
	t.Logf("cluster: %d messages, steady rate %.1f/s (configured %d/s), peak one-second %d", len(ts), got, rate, peakPerSecond(ts))
	if got > rate*1.1 || got < rate*0.9 {
		t.Errorf("fleet rate on the cluster %.1f/s, want within 10%% of %d/s", got, rate)
	}

	// One throttled reply, to whichever worker sends next.
	mx.mu.Lock()
	mx.throttleNext = true
	mx.mu.Unlock()
	cl := dialAuth(t, a.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "app@sender.test", []string{"r@rated.test"}, message("throttle-probe", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	var at time.Time
	waitFor(t, 30*time.Second, "the throttled reply", func() bool {
		mx.mu.Lock()
		defer mx.mu.Unlock()
		at = mx.throttledAt
		return !at.IsZero()
	})
	// Each worker's own /metrics shows the factor it applies; poll both.
	factor := func(d *daemon) float64 {
		v, ok := d.scrape(t)[`outflow_dest_rate_factor{dest="rated.test"}`]
		if !ok {
			return 1
		}
		return v
	}
	waitFor(t, 10*time.Second, "both workers to apply the cut", func() bool { return factor(a) < 1 && factor(b) < 1 })
	took := time.Since(at)
	t.Logf("a throttle seen by one worker cut both workers' rate within %v", took.Round(time.Millisecond))
	if took > time.Second {
		t.Errorf("the workers slowed down %v after the throttle, want within a second", took)
	}
	if v := status(); len(v) != 2 || v[0].Factor >= 1 || v[1].Factor >= 1 {
		t.Errorf("dest status does not show the cut on both workers: %+v", v)
	}
	a.Stop()
	b.Stop()
}
