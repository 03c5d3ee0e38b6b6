package tlsrpt

import (
	"compress/gzip"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

type txt map[string][]string

func (t txt) LookupTXT(_ context.Context, name string) ([]string, error) { return t[name], nil }

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func stsEvent(ok bool, result string) Event {
	return Event{Domain: "Example.com", PolicyType: PolicySTS, Policy: []string{"version: STSv1", "mode: enforce", "mx: *.example.com", "max_age: 86400"},
		MXHosts: []string{"*.example.com"}, Success: ok, Result: result, ReceivingMX: "mx1.example.com", ReceivingIP: "192.0.2.1"}
}

func TestReportShape(t *testing.T) {
	clk := &clock{t: time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)}
	a, err := New(Config{OrgName: "outflow.test", Contact: "postmaster@outflow.test", Now: clk.now, MaxFailures: 2})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		a.Record(stsEvent(true, ""))
	}
	a.Record(stsEvent(false, ResultNotTrusted))
	a.Record(stsEvent(false, ResultNotTrusted))
	a.Record(stsEvent(false, ResultSTARTTLSNotSupported))
	ev := stsEvent(false, ResultHostMismatch)
	a.Record(ev) // a third kind: past MaxFailures, counted in the summary only
	a.Record(Event{Domain: "mx.dane.test", PolicyType: PolicyTLSA, Policy: []string{"3 1 1 abcd"}, Success: true})

	reps := a.Reports("2026-03-01")
	if len(reps) != 2 {
		t.Fatalf("%d reports", len(reps))
	}
	b, _ := json.Marshal(reps[0])
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	dr := got["date-range"].(map[string]any)
	if dr["start-datetime"] != "2026-03-01T00:00:00Z" || dr["end-datetime"] != "2026-03-01T23:59:59Z" {
		t.Errorf("date-range %v", dr)
	}
	if got["organization-name"] != "outflow.test" || got["contact-info"] != "postmaster@outflow.test" || got["report-id"] == "" {
		t.Errorf("header %v", got)
	}
	pol := got["policies"].([]any)[0].(map[string]any)
	desc := pol["policy"].(map[string]any)
	if desc["policy-type"] != "sts" || desc["policy-domain"] != "example.com" || len(desc["policy-string"].([]any)) != 4 || desc["mx-host"].([]any)[0] != "*.example.com" {
		t.Errorf("policy %v", desc)
	}
	sum := pol["summary"].(map[string]any)
	if sum["total-successful-session-count"] != 3.0 || sum["total-failure-session-count"] != 4.0 {
		t.Errorf("summary %v", sum)
	}
	fd := pol["failure-details"].([]any)
	first := fd[0].(map[string]any)
	if len(fd) != 2 || first["result-type"] != "certificate-not-trusted" || first["failed-session-count"] != 2.0 ||
		first["receiving-mx-hostname"] != "mx1.example.com" || first["receiving-ip"] != "192.0.2.1" {
		t.Errorf("failure-details %v", fd)
	}
	if reps[1].Policies[0].Policy.Domain != "mx.dane.test" || reps[1].Policies[0].Policy.Type != PolicyTLSA {
		t.Errorf("DANE report %+v", reps[1])
	}
}

func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }

type post struct {
	ctype string
	rep   Report
}

// reportServer is a domain's https rua: each report it is sent arrives on
// posts, by the time its POST returns; seen, when not nil, is called with
// it before the POST is answered.
func reportServer(t *testing.T, seen func(Report)) (url string, pool *x509.CertPool, posts chan post) {
	t.Helper()
	posts = make(chan post, 8)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		b, _ := io.ReadAll(zr)
		var rep Report
		if err := json.Unmarshal(b, &rep); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		if seen != nil {
			seen(rep)
		}
		posts <- post{r.Header.Get("Content-Type"), rep}
	}))
	t.Cleanup(srv.Close)
	return srv.URL, srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, posts
}

func TestFlushWritesAndPostsFinishedDays(t *testing.T) {
	url, pool, posts := reportServer(t, nil)
	dir := t.TempDir()
	clk := &clock{t: time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)}
	res := txt{"_smtp._tls.example.com": {"v=TLSRPTv1; rua=mailto:tls@example.com," + url + "/report"}}
	state := filepath.Join(dir, "state.json")
	a, err := New(Config{Dir: dir, Post: true, Resolver: res, RootCAs: pool, OrgName: "outflow.test", Now: clk.now, StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	a.Record(stsEvent(true, ""))
	a.Flush(context.Background()) // the day is not over: nothing
	if _, err := os.Stat(filepath.Join(dir, "2026-03-01")); !os.IsNotExist(err) {
		t.Fatalf("a report before the day ended: %v", err)
	}
	// A restart in between keeps the counts.
	if err := a.Save(); err != nil {
		t.Fatal(err)
	}
	a, err = New(Config{Dir: dir, Post: true, Resolver: res, RootCAs: pool, OrgName: "outflow.test", Now: clk.now, StateFile: state})
	if err != nil {
		t.Fatal(err)
	}
	a.Record(stsEvent(false, ResultExpired))
	clk.mu.Lock()
	clk.t = clk.t.Add(2 * time.Hour)
	clk.mu.Unlock()
	a.Flush(context.Background())

	b, err := os.ReadFile(filepath.Join(dir, "2026-03-01", "example.com.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if s := rep.Policies[0].Summary; s.Successful != 1 || s.Failed != 1 {
		t.Errorf("written summary %+v", s)
	}
	select {
	case p := <-posts:
		if p.ctype != MediaType || p.rep.Policies[0].Summary.Failed != 1 {
			t.Errorf("posted %q %+v", p.ctype, p.rep)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing posted")
	}
	if len(posts) != 0 {
		t.Error("posted twice (mailto: must be skipped)")
	}
	if got := a.Reports("2026-03-01"); len(got) != 0 {
		t.Errorf("the flushed day is still counted: %v", got)
	}
}

// A process killed after it posted a day does not post it again when it
// starts next, and keeps the counts of its last periodic save: the state
// file is saved after each flush, before its POSTs, and every
// SaveInterval, not only when Run ends. Run is stepped through its timer;
// a crash is the state file as it is on disk at that moment, read by the
// next process.
func TestCrashAfterFlushPostsNoDayTwice(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "tlsrpt-state.json")
	// crash keeps the state file as a kill now would leave it.
	crash := func(name string) string {
		t.Helper()
		b, err := os.ReadFile(state)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(dir, name)
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return file
	}
	var atPost string // the crash while March 1st is being posted
	url, pool, posts := reportServer(t, func(r Report) {
		if atPost == "" {
			atPost = crash("at-post.json")
		}
	})
	res := txt{"_smtp._tls.example.com": {"v=TLSRPTv1; rua=" + url}}
	clk := &clock{t: time.Date(2026, 3, 1, 22, 0, 0, 0, time.UTC)}
	waits := make(chan time.Duration, 1) // each wait Run starts
	ticks := make(chan time.Time)        // ends it
	open := func(file string) *Aggregator {
		t.Helper()
		a, err := New(Config{Post: true, Resolver: res, RootCAs: pool, OrgName: "outflow.test", Instance: "w1", Now: clk.now, StateFile: file})
		if err != nil {
			t.Fatal(err)
		}
		a.after = func(d time.Duration) <-chan time.Time { waits <- d; return ticks }
		return a
	}
	run := func(a *Aggregator) (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		return func() { cancel(); <-done }
	}
	wait := func(what string) time.Duration {
		t.Helper()
		select {
		case d := <-waits:
			return d
		case <-time.After(10 * time.Second):
			t.Fatalf("Run did not wait again %s", what)
			return 0
		}
	}
	nextPost := func(what string) Report {
		t.Helper()
		select {
		case p := <-posts:
			return p.rep
		case <-time.After(10 * time.Second):
			t.Fatalf("nothing posted %s", what)
			return Report{}
		}
	}
	noPost := func(what string) {
		t.Helper()
		select {
		case p := <-posts:
			t.Fatalf("%s: posted %s again", what, p.rep.ReportID)
		default:
		}
	}
	day := func(r Report) string { return r.DateRange.Start.Format(time.DateOnly) }

	// March 1st, then a graceful stop: its count is in the state file.
	a := open(state)
	a.Record(stsEvent(true, ""))
	stop := run(a)
	wait("on March 1st")
	stop()

	// A start on March 2nd posts March 1st, then counts the day's
	// sessions; the periodic save keeps the first two.
	clk.set(time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC))
	b := open(state)
	stop = run(b)
	t.Cleanup(stop)
	if r := nextPost("for March 1st"); day(r) != "2026-03-01" || r.Policies[0].Summary.Successful != 1 {
		t.Fatalf("posted %s %+v, want March 1st's one session", r.ReportID, r.Policies[0].Summary)
	}
	if d := wait("after the flush"); d != DefaultSaveInterval {
		t.Errorf("Run waits %v between saves, want %v", d, DefaultSaveInterval)
	}
	b.Record(stsEvent(true, ""))
	b.Record(stsEvent(false, ResultNotTrusted))
	ticks <- time.Time{}
	wait("after the periodic save")
	b.Record(stsEvent(true, "")) // after the last save: lost in the crash
	// b never returns from Run before these crashes are read.
	afterSave := crash("after-save.json")

	// Killed while (or right after) posting March 1st: the next start on
	// March 2nd posts nothing.
	open(atPost).Flush(context.Background())
	noPost("a start after a crash at the POST")

	// Killed after the periodic save: the next start on March 3rd posts
	// March 2nd as saved, and March 1st not again.
	clk.set(time.Date(2026, 3, 3, 0, 1, 0, 0, time.UTC))
	open(afterSave).Flush(context.Background())
	r := nextPost("for March 2nd")
	if day(r) != "2026-03-02" {
		t.Fatalf("posted %s after the crash, want March 2nd (March 1st was posted before it)", r.ReportID)
	}
	if s := r.Policies[0].Summary; s.Successful != 1 || s.Failed != 1 {
		t.Errorf("March 2nd after the crash: %+v, want the 1 success and 1 failure saved before it", s)
	}
	noPost("a start after a crash after the periodic save")
}

// TestPostConnectionsDoNotStayOpen: the report POSTs' client closes a
// connection left idle after the day's posts, and keeps few: the zero
// http.Transport keeps every endpoint's connection, unbounded, until the
// far side drops it.
func TestPostConnectionsDoNotStayOpen(t *testing.T) {
	a, err := New(Config{Post: true, Resolver: txt{}})
	if err != nil {
		t.Fatal(err)
	}
	tr, ok := a.http.Transport.(*http.Transport)
	if !ok || tr.IdleConnTimeout <= 0 || tr.IdleConnTimeout > time.Minute || tr.MaxIdleConns <= 0 {
		t.Fatalf("report client's transport %+v: want idle connections closed within a minute, and a bound on them", a.http.Transport)
	}
}
