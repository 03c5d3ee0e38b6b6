package unsubscribe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// fakeStore is the queue and the suppression list in memory, keeping the
// order of the stores, with failures to switch on.
type fakeStore struct {
	mu        sync.Mutex
	ops       []string // "event", "add", "sync", in order
	events    []queue.Event
	list      map[string]queue.Suppression // by tenant "\x00" normalized address
	syncs     int
	failEvent error
	failAdd   error
	failSync  error
	failGet   error
}

func newFakeStore() *fakeStore { return &fakeStore{list: map[string]queue.Suppression{}} }

func (f *fakeStore) PublishEvent(_ context.Context, typ string, ev *queue.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failEvent != nil {
		return f.failEvent
	}
	e := *ev
	e.Type = typ
	f.events = append(f.events, e)
	f.ops = append(f.ops, "event")
	return nil
}

func (f *fakeStore) SyncOutcomes(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failSync != nil {
		return f.failSync
	}
	f.syncs++
	f.ops = append(f.ops, "sync")
	return nil
}

func (f *fakeStore) Add(_ context.Context, s queue.Suppression) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAdd != nil {
		return f.failAdd
	}
	s.Address = queue.NormalizeAddress(s.Address)
	f.list[s.Tenant+"\x00"+s.Address] = s
	f.ops = append(f.ops, "add")
	return nil
}

// AddFirst is queue.Suppressions.AddFirst: an entry that never expires
// (and applies) stays.
func (f *fakeStore) AddFirst(ctx context.Context, s queue.Suppression) (bool, error) {
	f.mu.Lock()
	cur, ok := f.list[s.Tenant+"\x00"+queue.NormalizeAddress(s.Address)]
	f.mu.Unlock()
	if ok && cur.Expires.IsZero() {
		return false, nil
	}
	return true, f.Add(ctx, s)
}

func (f *fakeStore) Suppressed(_ context.Context, tenant, addr string) (*queue.Suppression, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failGet != nil {
		return nil, f.failGet
	}
	s, ok := f.list[tenant+"\x00"+queue.NormalizeAddress(addr)]
	if !ok || !s.Expires.IsZero() && time.Now().After(s.Expires) {
		return nil, nil
	}
	return &s, nil
}

func (f *fakeStore) entry(tenant, addr string) (queue.Suppression, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.list[tenant+"\x00"+queue.NormalizeAddress(addr)]
	return s, ok
}

func (f *fakeStore) snapshot() (ops []string, events []queue.Event) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...), append([]queue.Event(nil), f.events...)
}

type fixture struct {
	links   *Links
	store   *fakeStore
	metrics *Metrics
	h       http.Handler
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{links: testLinks(t), store: newFakeStore(), metrics: NewMetrics(prometheus.NewRegistry())}
	f.h = NewHandler(HandlerConfig{Links: f.links, Store: f.store, Suppressions: f.store, ID: "host/1/api",
		Log: zerolog.Nop(), Metrics: f.metrics})
	return f
}

func (f *fixture) path(tg Target) string { return "/unsubscribe/" + f.links.Token(tg) }

func (f *fixture) do(method, path, contentType string, body io.Reader) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, body)
	if contentType != "" {
		r.Header.Set("Content-Type", contentType)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, r)
	return w
}

func (f *fixture) oneClick(tg Target) *httptest.ResponseRecorder {
	return f.do("POST", f.path(tg), "application/x-www-form-urlencoded", strings.NewReader("List-Unsubscribe=One-Click"))
}

func (f *fixture) count(result string) float64 {
	var m dto.Metric
	if err := f.metrics.Requests.WithLabelValues(result).Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// Every answer carries the headers that keep it out of caches, indexes,
// referrers and frames.
func checkSecurityHeaders(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	h := w.Header()
	for k, v := range map[string]string{"Cache-Control": "no-store", "X-Robots-Tag": "noindex", "Referrer-Policy": "no-referrer"} {
		if h.Get(k) != v {
			t.Errorf("%s: %q, want %q", k, h.Get(k), v)
		}
	}
	csp := h.Get("Content-Security-Policy")
	for _, d := range []string{"default-src 'none'", "style-src 'unsafe-inline'", "form-action 'self'"} {
		if !strings.Contains(csp, d) {
			t.Errorf("Content-Security-Policy %q lacks %s", csp, d)
		}
	}
}

// A GET shows the page with its form and records nothing: a link scanner
// fetching the URL must not unsubscribe anyone.
func TestGetShowsForm(t *testing.T) {
	f := newFixture(t)
	for _, method := range []string{"GET", "HEAD"} {
		w := f.do(method, f.path(testTarget), "", nil)
		if w.Code != 200 || w.Header().Get("Content-Type") != "text/html; charset=utf-8" {
			t.Fatalf("%s: %d %q", method, w.Code, w.Header().Get("Content-Type"))
		}
		checkSecurityHeaders(t, w)
		if method == "HEAD" {
			continue
		}
		body := w.Body.String()
		for _, s := range []string{"Unsubscribe Alice.Smith@example.org from these messages?", `<form method="post">`,
			`<input type="hidden" name="List-Unsubscribe" value="One-Click">`, `<button type="submit">`} {
			if !strings.Contains(body, s) {
				t.Errorf("page lacks %q:\n%s", s, body)
			}
		}
		for _, s := range []string{"<script", "src=", "href=", "http://", "https://"} {
			if strings.Contains(body, s) {
				t.Errorf("page has %q:\n%s", s, body)
			}
		}
	}
	if ops, _ := f.store.snapshot(); len(ops) != 0 {
		t.Fatalf("a GET stored %v", ops)
	}
	if _, ok := f.store.entry("shop", testTarget.Rcpt); ok {
		t.Fatal("a GET suppressed the address")
	}
	if f.count(ResultPage) != 2 {
		t.Errorf("page count %v", f.count(ResultPage))
	}
}

// A one-click POST records the event, puts the address on the list, syncs
// both, and only then answers 200.
func TestPostUnsubscribes(t *testing.T) {
	f := newFixture(t)
	w := f.oneClick(testTarget)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "Alice.Smith@example.org is unsubscribed") {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	checkSecurityHeaders(t, w)
	ops, events := f.store.snapshot()
	if strings.Join(ops, ",") != "event,add,sync" {
		t.Fatalf("stores %v, want the event, the entry, then the sync", ops)
	}
	ev := events[0]
	if ev.Type != queue.EventUnsubscribed || ev.ID != testTarget.ID || ev.MsgID != "Xk3bQ9zNUID0aBcDeFgHiJ" ||
		ev.Tenant != "shop" || len(ev.Recipients) != 1 || ev.Recipients[0] != "alice.smith@example.org" ||
		ev.Worker != "host/1/api" || !ev.Async || ev.Reason != "one-click" {
		t.Fatalf("event %+v", ev)
	}
	s, ok := f.store.entry("shop", testTarget.Rcpt)
	if !ok || s.Source != queue.SuppressUnsubscribe || s.Address != "alice.smith@example.org" ||
		s.Reason != "unsubscribed (message Xk3bQ9zNUID0aBcDeFgHiJ-2)" || !s.Expires.IsZero() {
		t.Fatalf("entry %+v, %v", s, ok)
	}
	if f.count(ResultUnsubscribed) != 1 {
		t.Errorf("unsubscribed count %v", f.count(ResultUnsubscribed))
	}
}

// Each body RFC 8058 allows counts as one click; a POST with another body,
// or none, unsubscribes too, with the reason "link".
func TestPostBodies(t *testing.T) {
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	_ = mw.WriteField("List-Unsubscribe", "One-Click")
	_ = mw.Close()
	for i, c := range []struct {
		ct, body, reason string
	}{
		{"application/x-www-form-urlencoded", "List-Unsubscribe=One-Click", "one-click"},
		{"application/x-www-form-urlencoded; charset=utf-8", "List-Unsubscribe=One-Click", "one-click"},
		{mw.FormDataContentType(), mp.String(), "one-click"},
		{"", "", "link"},
		{"text/plain", "please", "link"},
		{"application/x-www-form-urlencoded", "List-Unsubscribe=Other", "link"},
		{"application/x-www-form-urlencoded", "%zz", "link"},
		{"multipart/form-data; boundary=x", "not multipart", "link"},
	} {
		f := newFixture(t)
		tg := testTarget
		tg.ID = "id" + string(rune('a'+i))
		w := f.do("POST", f.path(tg), c.ct, strings.NewReader(c.body))
		_, events := f.store.snapshot()
		if w.Code != 200 || len(events) != 1 || events[0].Reason != c.reason {
			t.Errorf("%q %q: %d, events %+v", c.ct, c.body, w.Code, events)
		}
	}
}

// A provider may POST twice: the second finds the address unsubscribed,
// answers 200, and records nothing more.
func TestPostTwice(t *testing.T) {
	f := newFixture(t)
	if w := f.oneClick(testTarget); w.Code != 200 {
		t.Fatal(w.Code)
	}
	w := f.oneClick(testTarget)
	if w.Code != 200 || !strings.Contains(w.Body.String(), "is unsubscribed") {
		t.Fatalf("%d %s", w.Code, w.Body)
	}
	// Another message's link for the same address is the same request.
	other := testTarget
	other.ID = "another"
	if w := f.oneClick(other); w.Code != 200 {
		t.Fatal(w.Code)
	}
	// The first: event, add, sync; each repeat syncs what it read (a
	// first POST may still be waiting for its own sync).
	if ops, events := f.store.snapshot(); len(events) != 1 || strings.Join(ops, ",") != "event,add,sync,sync,sync" {
		t.Fatalf("stores %v, events %+v", ops, events)
	}
	if f.count(ResultAlready) != 2 || f.count(ResultUnsubscribed) != 1 {
		t.Errorf("already %v, unsubscribed %v", f.count(ResultAlready), f.count(ResultUnsubscribed))
	}
}

// An address a hard bounce put on the list keeps that entry; the event is
// recorded all the same. An entry that expires gives way to the
// unsubscribe, which does not.
func TestPostKeepsStrongerEntry(t *testing.T) {
	f := newFixture(t)
	bounce := queue.Suppression{Tenant: "shop", Address: "alice.smith@example.org", Reason: "550 5.1.1 user unknown",
		Source: queue.SuppressBounce}
	_ = f.store.Add(context.Background(), bounce)
	f.store.ops = nil
	w := f.oneClick(testTarget)
	if w.Code != 200 {
		t.Fatal(w.Code)
	}
	ops, events := f.store.snapshot()
	if strings.Join(ops, ",") != "event,sync" || len(events) != 1 || events[0].Type != queue.EventUnsubscribed {
		t.Fatalf("stores %v, events %+v", ops, events)
	}
	if s, _ := f.store.entry("shop", testTarget.Rcpt); s != bounce {
		t.Fatalf("entry %+v, want the bounce's", s)
	}

	f = newFixture(t)
	temp := queue.Suppression{Tenant: "shop", Address: "alice.smith@example.org", Reason: "paused", Source: queue.SuppressAPI,
		Expires: time.Now().Add(time.Hour)}
	_ = f.store.Add(context.Background(), temp)
	if w := f.oneClick(testTarget); w.Code != 200 {
		t.Fatal(w.Code)
	}
	if s, _ := f.store.entry("shop", testTarget.Rcpt); s.Source != queue.SuppressUnsubscribe || !s.Expires.IsZero() {
		t.Fatalf("entry %+v, want an unsubscribe that does not expire", s)
	}
}

// A failure of any store is a 503 with Retry-After, and claims nothing:
// no sync after a failed store, no page that says done.
func TestPostStoreFailure(t *testing.T) {
	boom := errors.New("no JetStream")
	for _, c := range []struct {
		name string
		set  func(*fakeStore)
		ops  string
	}{
		{"lookup", func(s *fakeStore) { s.failGet = boom }, ""},
		{"event", func(s *fakeStore) { s.failEvent = boom }, ""},
		{"suppression", func(s *fakeStore) { s.failAdd = boom }, "event"},
		{"sync", func(s *fakeStore) { s.failSync = boom }, "event,add"},
	} {
		f := newFixture(t)
		c.set(f.store)
		w := f.oneClick(testTarget)
		if w.Code != 503 || w.Header().Get("Retry-After") != "5" || !strings.Contains(w.Body.String(), "Try again in a moment") ||
			strings.Contains(w.Body.String(), "is unsubscribed") {
			t.Errorf("%s: %d %q %s", c.name, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		checkSecurityHeaders(t, w)
		if !strings.Contains(w.Body.String(), `<form method="post">`) {
			t.Errorf("%s: the retry page has no button", c.name)
		}
		if ops, _ := f.store.snapshot(); strings.Join(ops, ",") != c.ops || f.store.syncs != 0 {
			t.Errorf("%s: stores %v", c.name, ops)
		}
		if f.count(ResultError) != 1 {
			t.Errorf("%s: error count %v", c.name, f.count(ResultError))
		}
		// The retry, once the store is back, does the whole of it.
		*f.store = fakeStore{list: f.store.list}
		if w := f.oneClick(testTarget); w.Code != 200 {
			t.Errorf("%s: retry %d", c.name, w.Code)
		}
	}
}

// A token that does not open is a 404 that says no more, whatever the
// method; the list is not asked.
func TestInvalidLink(t *testing.T) {
	f := newFixture(t)
	tok := f.links.Token(testTarget)
	other, _ := New([]byte("another key, another fleet......"), testBase)
	for _, path := range []string{"/unsubscribe/", "/unsubscribe", "/unsubscribe/x", "/unsubscribe/" + tok[:len(tok)-1],
		"/unsubscribe/" + other.Token(testTarget), "/unsubscribe/" + f.links.Token(Target{Rcpt: "a@b", ID: "x"}),
		"/unsubscribe/" + f.links.Token(Target{Tenant: "shop", Rcpt: "nobody", ID: "x"})} {
		for _, method := range []string{"GET", "POST"} {
			w := f.do(method, path, "application/x-www-form-urlencoded", strings.NewReader("List-Unsubscribe=One-Click"))
			if w.Code != 404 || !strings.Contains(w.Body.String(), "This unsubscribe link is not valid") {
				t.Errorf("%s %s: %d %s", method, path, w.Code, w.Body)
			}
			checkSecurityHeaders(t, w)
		}
	}
	f.store.failGet = errors.New("must not be asked")
	if w := f.do("POST", "/unsubscribe/nope", "", nil); w.Code != 404 {
		t.Error(w.Code)
	}
	if ops, _ := f.store.snapshot(); len(ops) != 0 {
		t.Fatalf("stores %v", ops)
	}
	// A trailing slash added to a good link does not break it.
	if w := f.do("GET", f.path(testTarget)+"/", "", nil); w.Code != 200 {
		t.Errorf("trailing slash: %d", w.Code)
	}
}

func TestBodyTooLarge(t *testing.T) {
	f := newFixture(t)
	big := "List-Unsubscribe=One-Click&pad=" + strings.Repeat("x", 70<<10)
	for _, ct := range []string{"application/x-www-form-urlencoded", "text/plain"} {
		if w := f.do("POST", f.path(testTarget), ct, strings.NewReader(big)); w.Code != 413 {
			t.Errorf("%s: %d", ct, w.Code)
		}
	}
	if ops, _ := f.store.snapshot(); len(ops) != 0 {
		t.Fatalf("stores %v", ops)
	}
	// Just under the limit is read.
	fits := "List-Unsubscribe=One-Click&pad=" + strings.Repeat("x", 60<<10)
	if w := f.do("POST", f.path(testTarget), "application/x-www-form-urlencoded", strings.NewReader(fits)); w.Code != 200 {
		t.Errorf("a body under the limit: %d", w.Code)
	}
}

func TestOtherMethods(t *testing.T) {
	f := newFixture(t)
	for _, m := range []string{"PUT", "DELETE", "PATCH", "OPTIONS"} {
		w := f.do(m, f.path(testTarget), "", nil)
		if w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD, POST" {
			t.Errorf("%s: %d, Allow %q", m, w.Code, w.Header().Get("Allow"))
		}
	}
	if ops, _ := f.store.snapshot(); len(ops) != 0 {
		t.Fatalf("stores %v", ops)
	}
}

// The address on the page is escaped: a link sealed for any address
// cannot put markup into the page.
func TestPageEscapes(t *testing.T) {
	f := newFixture(t)
	tg := Target{Tenant: "shop", Rcpt: `"<script>alert(1)</script>"@example.org`, ID: "x"}
	for _, w := range []*httptest.ResponseRecorder{f.do("GET", f.path(tg), "", nil), f.oneClick(tg)} {
		body := w.Body.String()
		if w.Code != 200 || strings.Contains(body, "<script>") || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
			t.Errorf("%d:\n%s", w.Code, body)
		}
	}
}

func TestMetricsPrecreated(t *testing.T) {
	reg := prometheus.NewRegistry()
	NewMetrics(reg)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || mfs[0].GetName() != "outflow_unsubscribe_requests_total" || len(mfs[0].GetMetric()) != 5 {
		t.Fatalf("%v, %v", mfs, err)
	}
	var m *Metrics
	m.count(ResultPage) // a nil *Metrics counts nothing
}
