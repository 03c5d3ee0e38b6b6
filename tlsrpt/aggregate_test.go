package tlsrpt

import (
	"compress/gzip"
	"context"
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

func TestFlushWritesAndPostsFinishedDays(t *testing.T) {
	type post struct {
		ctype string
		rep   Report
	}
	posts := make(chan post, 4)
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
		posts <- post{r.Header.Get("Content-Type"), rep}
	}))
	defer srv.Close()
	pool := srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs

	dir := t.TempDir()
	clk := &clock{t: time.Date(2026, 3, 1, 23, 0, 0, 0, time.UTC)}
	res := txt{"_smtp._tls.example.com": {"v=TLSRPTv1; rua=mailto:tls@example.com," + srv.URL + "/report"}}
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
