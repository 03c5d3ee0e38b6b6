package e2e

import (
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// scrape returns the daemon's /metrics as name{labels} -> value.
func (d *daemon) scrape(t *testing.T) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + d.HTTPAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestMetricsAfterScenario: one message deferred once then delivered, one
// bounced; the counters say exactly that, and no label carries an address
// or a message id.
func TestMetricsAfterScenario(t *testing.T) {
	var first atomic.Bool
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		if strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user"}
		}
		if first.CompareAndSwap(false, true) {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "later"}
		}
		return nil
	}})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--retry-base", "100ms", "--retry-min", "50ms", "--retry-cap", "200ms")
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(cl, "app@sender.test", []string{"ok@dest.test"}, message("m1", "")); err != nil {
		t.Fatal(err)
	}
	if err := submit(cl, "app@sender.test", []string{"gone@dest.test"}, message("m2", "")); err != nil {
		t.Fatal(err)
	}
	_ = cl.Quit()
	if err := mx.WaitForMessages(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	var m map[string]float64
	waitFor(t, 10*time.Second, "counters", func() bool {
		m = d.scrape(t)
		return m["outflow_delivered_recipients_total"] == 1 && m["outflow_bounced_recipients_total"] == 1
	})
	// Collectors are read one after another, so the scrape that saw the
	// last counter move may hold an older value of another: read again.
	m = d.scrape(t)
	// Attempts by class, over all lanes (which lane an attempt came from
	// depends on scheduling; the fault matrix in package worker checks it).
	byClass := map[string]float64{}
	for k, v := range m {
		if c, ok := strings.CutPrefix(k, `outflow_attempts_total{class="`); ok {
			byClass[c[:strings.IndexByte(c, '"')]] += v
		}
	}
	if byClass["transient"] != 1 || byClass["delivered"] != 1 || byClass["permanent"] != 1 {
		t.Errorf("attempts by class = %v, want one each of transient, delivered, permanent", byClass)
	}
	want := map[string]float64{
		`outflow_submissions_total{result="accepted"}`:    2,
		`outflow_delivery_latency_seconds_count`:          1,
		`outflow_retry_delay_seconds_count{lane="retry"}`: 1,
		`outflow_dead_letters_total`:                      0,
		`outflow_workers_live`:                            1,
		`outflow_queue_depth{lane="dead"}`:                0,
		// Per destination, for the bounce-storm alert.
		`outflow_dest_attempts_total{class="permanent",dest="dest.test"}`: 1,
		`outflow_dest_attempts_total{class="transient",dest="dest.test"}`: 1,
	}
	// Which delivery came first (the bounce's notice to sender.test or
	// the retried message) depends on scheduling; per destination they add
	// up to the attempts by class.
	destDelivered := 0.0
	for k, v := range m {
		if strings.HasPrefix(k, `outflow_dest_attempts_total{class="delivered",`) {
			destDelivered += v
		}
	}
	if destDelivered != byClass["delivered"] {
		t.Errorf("delivered attempts per destination add up to %v, by class %v", destDelivered, byClass["delivered"])
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	// The group commit (--durability disk, the default) released the two
	// 250s and the deferral, and fsynced.
	if m["outflow_store_sync_requests_total"] < 3 || m["outflow_store_fsyncs_total"] == 0 || m["outflow_store_syncs_total"] == 0 {
		t.Errorf("store syncer: %v requests, %v syncs, %v fsyncs; want at least 3 requests and some syncs and fsyncs",
			m["outflow_store_sync_requests_total"], m["outflow_store_syncs_total"], m["outflow_store_fsyncs_total"])
	}
	bad := regexp.MustCompile(`@|[A-Za-z0-9]{22}`)
	for k := range m {
		if i := strings.IndexByte(k, '{'); i >= 0 && bad.MatchString(k[i:]) {
			t.Errorf("unbounded label (address or id) in %s", k)
		}
	}
	d.Stop()
}

// TestDashboardsNameRealMetrics: every metric that docs/alerts.yaml and
// docs/grafana-dashboard.json use is one the code defines, so the alerts
// and panels cannot silently point at nothing after a rename.
func TestDashboardsNameRealMetrics(t *testing.T) {
	defined := map[string]bool{}
	re := regexp.MustCompile(`"(outflow_[a-z_]+)"`)
	err := filepath.WalkDir("..", func(p string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	use := regexp.MustCompile(`outflow_[a-z_]+`)
	for _, doc := range []string{"../docs/alerts.yaml", "../docs/grafana-dashboard.json"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		names := use.FindAllString(string(b), -1)
		if len(names) < 5 {
			t.Fatalf("%s names only %d metrics", doc, len(names))
		}
		for _, n := range names {
			base := n
			for _, suf := range []string{"_bucket", "_count", "_sum"} {
				base = strings.TrimSuffix(base, suf)
			}
			if !defined[base] {
				t.Errorf("%s uses %s, which no code defines", doc, n)
			}
		}
	}
}

// TestSharedGaugesNotSummed: the gauges every process of a fleet reads
// from the shared streams and state (the lanes', a destination's) are
// the same number in each process; summed across a fleet, the dashboard
// showed the dead letters of two processes as twice as many. The alerts
// and the dashboard take their max, or one series, never their sum.
// And the breaker's alert fires for a destination that times out, whose
// breaker shows open only for the cooldown and half-open (1) while its
// probe waits: "== 2" held for 30 minutes never fired.
func TestSharedGaugesNotSummed(t *testing.T) {
	summed := regexp.MustCompile(`sum\s*(by\s*\([^)]*\)\s*)?\(\s*(outflow_queue_[a-z_]+|outflow_dest_(suspended|breaker_state|rate_factor|rate|conns)[a-z_]*)\b`)
	for _, doc := range []string{"../docs/alerts.yaml", "../docs/grafana-dashboard.json"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range summed.FindAllString(string(b), -1) {
			if !strings.Contains(m, "_total") {
				t.Errorf("%s sums a shared gauge: %s (take its max)", doc, m)
			}
		}
	}
	b, err := os.ReadFile("../docs/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "outflow_dest_breaker_state) == 2") {
		t.Error("OutflowBreakerOpen fires only while the breaker shows open (2), not while its probe waits (1)")
	}
}

// TestAPISubmissionsCounted: mail submitted over the HTTP API is counted,
// by result, in outflow_api_submissions_total, as SMTP's is in
// outflow_submissions_total (it was in no metric: a spam run through a
// leaked API key, or the store failing under API traffic, went unseen).
// Every result is exported from the start, at 0, for the alerts.
func TestAPISubmissionsCounted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir))
	if d.APIAddr == "" {
		t.Fatalf("no HTTP API address in the log\n%s", d.Logs())
	}
	m := d.scrape(t)
	for _, r := range []string{"accepted", "rejected", "tempfail"} {
		if v, ok := m[`outflow_api_submissions_total{result="`+r+`"}`]; !ok || v != 0 {
			t.Errorf("outflow_api_submissions_total{result=%q} = %v (present %v) at start, want 0", r, v, ok)
		}
	}
	key := adminCLI(t, d.Data, "apikey", "create", "--tenant", "shop")
	post := func(body string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+d.APIAddr+"/v1/messages", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	if s := post(`{"from":"orders@shop.test","to":["buyer@dest.test"],"subject":"s","text":"hi"}`); s != http.StatusAccepted {
		t.Fatalf("POST: %d", s)
	}
	if s := post(`{"from":"orders@shop.test","to":["buyer@dest.test"],"subjcet":"s","text":"hi"}`); s != http.StatusBadRequest {
		t.Fatalf("POST of an unknown field: %d", s)
	}
	m = d.scrape(t)
	for k, want := range map[string]float64{
		`outflow_api_submissions_total{result="accepted"}`: 1,
		`outflow_api_submissions_total{result="rejected"}`: 1,
		`outflow_api_submissions_total{result="tempfail"}`: 0,
		`outflow_submissions_total{result="accepted"}`:     0, // SMTP's
	} {
		if got, ok := m[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	d.Stop()
}
