package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/ratedmx"
	"github.com/outflow/outflow/submission"
)

// learnedArgs run a daemon on its defaults (no rate configured) against a
// provider through --relay.
func learnedArgs(users, relay string) []string {
	return []string{"--users", users, "--relay", relay, "--relay-tls", "none"}
}

// report is the figures of one run against a Provider, for the log.
type learnedRun struct {
	msgs      int
	throttles int
	drain     time.Duration
	peak      int
}

func (r learnedRun) String() string {
	return fmt.Sprintf("%d messages: %d throttle replies (%.1f%%), drained in %.1fs, peak %d/s",
		r.msgs, r.throttles, 100*float64(r.throttles)/float64(r.msgs), r.drain.Seconds(), r.peak)
}

func measure(p *ratedmx.Provider, n int, start time.Time) learnedRun {
	ts := p.Times()
	sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
	return learnedRun{msgs: n, throttles: len(p.Throttles()), drain: ts[len(ts)-1].Sub(start), peak: ratedmx.Peak(ts)}
}

// TestLearnsUnannouncedRate: a provider accepts 20/s and throttles above
// it; outflow on its defaults learns the rate from the first throttle
// and keeps to it. Before learned rates, 96% of the messages met a
// throttle and the peak was 25/s; the bounds here are generous (a shared
// machine), the figures are in docs/benchmarks.md (make bench).
func TestLearnsUnannouncedRate(t *testing.T) {
	const limit, total = 20, 300
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/a", learnedArgs(writeUsers(t, dir), p.Addr())...)
	start := time.Now()
	submitThrough(t, []*daemon{d}, total, "l", "r@limited.test")
	if err := p.WaitForMessages(total, 120*time.Second); err != nil {
		t.Fatalf("%v; %s\n%s", err, measure(p, total, start), grepLines(d.Logs(), `"destination state changed"`))
	}
	r := measure(p, total, start)
	t.Log(r)
	t.Logf("learned-rate changes:\n%s", grepLines(d.Logs(), `"change":"learned-rate"`))
	if r.throttles > total/4 {
		t.Errorf("%d throttle replies for %d messages: the rate was not learned", r.throttles, total)
	}
	if r.peak > 2*limit {
		t.Errorf("peak %d/s against a limit of %d/s", r.peak, limit)
	}
	status := d.cli(t, "dest", "status", "limited.test")
	t.Logf("dest status:\n%s", status)
	if !strings.Contains(status, "learned:       ") || strings.Contains(status, "learned:       nothing") || !strings.Contains(status, "learned") {
		t.Errorf("dest status does not show a learned rate:\n%s", status)
	}
	if list := d.cli(t, "dest", "list"); !strings.Contains(list, "limited.test") || !strings.Contains(list, "/s") {
		t.Errorf("dest list does not show the learned rate:\n%s", list)
	}
	m := d.scrape(t)
	if v := m[`outflow_dest_learned_rate{dest="limited.test"}`]; v <= 0 || v > 2*limit {
		t.Errorf("outflow_dest_learned_rate = %v", v)
	}
	if !strings.Contains(d.Logs(), `"change":"learned-rate"`) || !strings.Contains(d.Logs(), `"paced_by"`) {
		t.Error("no learned-rate transition or paced decision in the log")
	}
	if h := d.cli(t, "queue", "history", "dest-limited-test"); !strings.Contains(h, "dest-learned") {
		t.Errorf("no dest-learned event in the history of dest-limited-test:\n%s", h)
	}
	// An operator clears it: the next throttle seeds afresh.
	if out := d.cli(t, "dest", "forget", "limited.test"); !strings.Contains(out, "learned limits cleared") {
		t.Fatalf("dest forget: %s", out)
	}
	waitFor(t, 5*time.Second, "forgotten", func() bool {
		return strings.Contains(d.cli(t, "dest", "status", "limited.test"), "learned:       nothing")
	})
}

// TestLearnedRateFollowsAHalving: the provider halves its limit mid-run,
// then restores it. The throttles stop soon after the halving, and the
// learned rate climbs back once the limit is restored.
func TestLearnedRateFollowsAHalving(t *testing.T) {
	if testing.Short() {
		t.Skip("a minute of traffic")
	}
	const limit = 20
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/a", learnedArgs(writeUsers(t, dir), p.Addr())...)
	// A steady supply, faster than the limit, for the whole test.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
		defer cl.Close()
		tk := time.NewTicker(time.Second / (2 * limit))
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			if err := submit(cl, "app@sender.test", []string{"r@limited.test"}, message(fmt.Sprintf("h%d", i), "")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()

	learned := func() float64 {
		return d.scrape(t)[`outflow_dest_learned_rate{dest="limited.test"}`]
	}
	waitFor(t, 30*time.Second, "a rate learned and settled near the limit", func() bool {
		r := learned()
		return r >= 0.6*limit && r <= 1.2*limit
	})
	halved := time.Now()
	p.SetRate(limit / 2)
	// Throttles stop: none in a 5 s window, within 30 s of the halving.
	var quietAt time.Time
	waitFor(t, 30*time.Second, "throttles stop after the halving", func() bool {
		now := time.Now()
		if now.Sub(halved) < 6*time.Second {
			return false
		}
		if ratedmx.Count(p.Throttles(), now.Add(-5*time.Second), now) == 0 {
			quietAt = now.Add(-5 * time.Second)
			return true
		}
		return false
	})
	after := ratedmx.Count(p.Throttles(), halved, time.Now())
	t.Logf("halved at 10/s: throttles stopped %.1fs after the halving, %d throttle replies since; learned %.2f/s",
		quietAt.Sub(halved).Seconds(), after, learned())
	restored := time.Now()
	p.SetRate(limit)
	waitFor(t, 90*time.Second, "the learned rate climbs back to 80% of the restored limit", func() bool {
		return learned() >= 0.8*limit
	})
	t.Logf("restored to 20/s: learned rate at 80%% after %.1fs", time.Since(restored).Seconds())
}

// TestTenantFairShare: tenant A's campaign fills a rate-limited
// destination's queue; tenant B's few messages to the same destination
// are delivered within seconds, not behind A's backlog.
func TestTenantFairShare(t *testing.T) {
	const limit, campaign, few = 20, 600, 10
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit})
	dir := t.TempDir()
	users := writeTenantUsers(t, dir, "tenant-a", "tenant-b")
	d := startDaemon(t, dir+"/a", learnedArgs(users, p.Addr())...)
	// A's campaign; its rate is learned meanwhile.
	ca := dialAuth(t, d.SMTPAddr, "tenant-a", testPassword)
	for i := range campaign {
		if err := submit(ca, "news@a.test", []string{fmt.Sprintf("a%d@limited.test", i)}, message(fmt.Sprintf("a%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	ca.Close()
	waitFor(t, 30*time.Second, "A's backlog is being paced", func() bool { return len(p.Arrivals()) >= 3*limit })
	// B's password resets.
	cb := dialAuth(t, d.SMTPAddr, "tenant-b", testPassword)
	sent := map[string]time.Time{}
	for i := range few {
		rcpt := fmt.Sprintf("b%d@limited.test", i)
		sent[rcpt] = time.Now()
		if err := submit(cb, "reset@b.test", []string{rcpt}, message(fmt.Sprintf("b%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	cb.Close()
	var lat []time.Duration
	waitFor(t, 60*time.Second, "B's messages delivered", func() bool {
		lat = lat[:0]
		for _, a := range p.Arrivals() {
			if at, ok := sent[strings.Trim(a.Rcpt, "<>")]; ok {
				lat = append(lat, a.At.Sub(at))
			}
		}
		return len(lat) == few
	})
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	left := campaign - (len(p.Arrivals()) - few)
	t.Logf("tenant B: p50 %s, max %s, while %d of A's messages were still waiting", lat[few/2], lat[few-1], left)
	if left < 3*limit {
		t.Fatalf("A's backlog had drained (%d left): the test measured nothing", left)
	}
	if testing.Verbose() {
		t.Logf("tenant B's decisions:\n%s", grepLines(d.Logs(), `"tenant":"tenant-b"`))
	}
	if lat[few-1] > 10*time.Second {
		t.Errorf("tenant B's slowest message took %s behind A's backlog", lat[few-1])
	}
}

// writeTenantUsers writes a users file with one account per tenant, all
// with testPassword.
func writeTenantUsers(t *testing.T, dir string, tenants ...string) string {
	t.Helper()
	h, err := submission.HashPassword(testPassword, 4)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, name := range tenants {
		b.WriteString(name + ":" + h + "\n")
	}
	p := filepath.Join(dir, "users")
	if err := os.WriteFile(p, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// grepLines is the lines of logs that contain s.
func grepLines(logs, s string) string {
	var out []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestLearnedRateTwoWorkersOneMessageBurst: two daemons on one NATS share
// a provider that allows 6/s with a burst of 1.2 messages, so that any
// two sends within about 130 ms of each other meet a throttle. Each
// daemon paced its half on its own phase; phases that fell together made
// pairs on every turn, each pair a throttle, each throttle a cut, and the
// soak's two workers settled at a quarter of such a limit with a growing
// backlog (docs/reliability.md). On the fleet's shared grid of slots
// their turns interleave and the rate learned stays near the limit.
func TestLearnedRateTwoWorkersOneMessageBurst(t *testing.T) {
	if !longMode() {
		t.Skip("a minute of traffic; OUTFLOW_LONG=1 (make test-long)")
	}
	const limit, total = 6.0, 240
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit, Burst: 1.2})
	dir := t.TempDir()
	users := writeUsers(t, dir)
	a := startDaemon(t, dir+"/a", append(learnedArgs(users, p.Addr()), "--worker-id", "A")...)
	url := natsURLOf(t, dir+"/a")
	b := startDaemon(t, dir+"/b", append(learnedArgs(users, p.Addr()), "--worker-id", "B", "--nats-url", url)...)
	waitFor(t, 15*time.Second, "both workers registered", func() bool {
		return a.scrape(t)["outflow_workers_live"] == 2 && b.scrape(t)["outflow_workers_live"] == 2
	})
	start := time.Now()
	submitThrough(t, []*daemon{a, b}, total, "g", "r@limited.test")
	ideal := time.Duration(float64(total) / limit * float64(time.Second))
	if err := p.WaitForMessages(total, 4*ideal); err != nil {
		t.Fatalf("%v; %s; learned %.2f/s", err, measure(p, total, start), a.scrape(t)[`outflow_dest_learned_rate{dest="limited.test"}`])
	}
	r := measure(p, total, start)
	learned := a.scrape(t)[`outflow_dest_learned_rate{dest="limited.test"}`]
	t.Logf("%s (ideal %v); learned %.2f/s", r, ideal, learned)
	t.Logf("learned-rate changes:\n%s", grepLines(a.Logs()+b.Logs(), `"change":"learned-rate"`))
	if r.drain > 2*ideal {
		t.Errorf("drained in %v, over twice the ideal %v", r.drain, ideal)
	}
	if r.throttles > total/5 {
		t.Errorf("%d throttle replies for %d messages", r.throttles, total)
	}
}

// TestLearnedRateResumesAfterABlock: a provider that takes 20/s refuses
// everything for 40 s (ratedmx's limit at 0), then takes 20/s again. The
// block's cuts take the learned rate to learn-min; the first delivery
// after it resumes the rate at a quarter of the rate before the block, and
// the daemon delivers at half the limit again within a minute. Without the
// resume it had not, 4 minutes after the block (24.3 s with it; one run
// each, 2026-12-07, docs/throttling.md "Blocks").
func TestLearnedRateResumesAfterABlock(t *testing.T) {
	if !longMode() {
		t.Skip("two and a half minutes of traffic; OUTFLOW_LONG=1 (make test-long)")
	}
	const limit = 20
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/a", learnedArgs(writeUsers(t, dir), p.Addr())...)
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		submitThrough(t, []*daemon{d}, 2400, "b", "r@limited.test")
	}()
	waitFor(t, 120*time.Second, "300 delivered before the block", func() bool { return len(p.Times()) >= 300 })
	p.SetLimit(0, 0)
	blocked := time.Now()
	waitFor(t, 60*time.Second, "40 s of block", func() bool { return time.Since(blocked) > 40*time.Second })
	p.SetLimit(limit, limit/5)
	open := time.Now()
	waitFor(t, 60*time.Second, "half the limit again (50 in 5 s)", func() bool {
		return ratedmx.Count(p.Times(), time.Now().Add(-5*time.Second), time.Now()) >= limit*5/2
	})
	t.Logf("half the limit %.1f s after the block ended", time.Since(open).Seconds())
	if !strings.Contains(d.Logs(), "resumed: delivered again after a block") {
		t.Errorf("no resumed learned-rate line:\n%s", grepLines(d.Logs(), `"change":"learned-rate"`))
	}
}
