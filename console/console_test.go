package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/api"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// The tests share one embedded JetStream (starting one takes seconds on
// a loaded machine); each test uses its own destinations, tenants and keys.
var shared struct {
	once sync.Once
	q    *queue.Queue
	emb  *queue.Embedded
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.q != nil {
		shared.q.Close()
		shared.emb.Shutdown()
	}
	os.RemoveAll(sharedDir)
	os.Exit(code)
}

var sharedDir string

// sharedQueue starts the embedded JetStream once and connects to it.
func sharedQueue(t testing.TB) *queue.Queue {
	t.Helper()
	shared.once.Do(func() {
		sharedDir, shared.err = os.MkdirTemp("", "outflow-console-")
		if shared.err != nil {
			return
		}
		emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: sharedDir})
		if err != nil {
			shared.err = err
			return
		}
		shared.emb = emb
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		shared.q, shared.err = testqueue.ConnectInProcess(ctx, emb, queue.Options{})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.q
}

type fixture struct {
	q        *queue.Queue
	keys     *api.Keys
	c        *Console
	ts       *httptest.Server
	admin    string // an admin key
	adminID  string
	tenant   string // a tenant's (not admin) key
	sessions *sessions
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	return newFixtureOn(t, sharedQueue(t), mod)
}

// ownQueue starts an embedded JetStream of the test's own, for a test
// whose volume of mail (hundreds of destinations, of dead letters) the
// others should not see.
func ownQueue(t *testing.T) *queue.Queue {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	q, err := testqueue.ConnectInProcess(ctx, emb, queue.Options{})
	if err != nil {
		emb.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		q.Close()
		emb.Shutdown()
	})
	return q
}

// newFixtureOn is newFixture on the queue q.
func newFixtureOn(t *testing.T, q *queue.Queue, mod func(*Config)) *fixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	keys, err := api.OpenKeys(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	admin, info, err := keys.Create(ctx, "ops", true)
	if err != nil {
		t.Fatal(err)
	}
	tenant, _, err := keys.Create(ctx, "shop", false)
	if err != nil {
		t.Fatal(err)
	}
	sup, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Queue: q, Keys: keys, Suppressions: sup, StatusWait: 50 * time.Millisecond, Logger: zerolog.Nop()}
	if mod != nil {
		mod(&cfg)
	}
	c, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	mux := http.NewServeMux()
	mux.Handle(Prefix, c.Handler())
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	return &fixture{q: q, keys: keys, c: c, ts: ts, admin: admin, adminID: info.ID, tenant: tenant, sessions: c.sessions}
}

// browser is a client with a cookie jar that does not follow redirects.
func (f *fixture) browser(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar, Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, cl *http.Client, u string) (*http.Response, string) {
	t.Helper()
	res, err := cl.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

func post(t *testing.T, cl *http.Client, u string, form url.Values) (*http.Response, string) {
	t.Helper()
	res, err := cl.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, string(b)
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// signIn signs cl in with key and returns the response to the sign-in POST
// and the session's CSRF token (from the next page).
func (f *fixture) signIn(t *testing.T, cl *http.Client, key string) (*http.Response, string) {
	t.Helper()
	_, page := get(t, cl, f.ts.URL+"/ui/login")
	m := csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no token on the sign-in page:\n%s", page)
	}
	res, _ := post(t, cl, f.ts.URL+"/ui/login", url.Values{"csrf": {m[1]}, "key": {key}})
	if res.StatusCode != http.StatusSeeOther {
		return res, ""
	}
	_, page = get(t, cl, f.ts.URL+"/ui/")
	m = csrfField.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no CSRF token on the overview:\n%s", page)
	}
	return res, m[1]
}

// TestNothingReadableWithoutSignIn: every page redirects to the sign-in
// page, a live refresh gets 401, and a POST changes nothing.
func TestNothingReadableWithoutSignIn(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	for _, p := range []string{"/ui/", "/ui/dests", "/ui/dests/example.com", "/ui/queue?state=dead", "/ui/messages/abc", "/ui/dead", "/ui/suppressions", "/ui/nope"} {
		res, body := get(t, cl, f.ts.URL+p)
		if res.StatusCode != http.StatusSeeOther || !strings.HasPrefix(res.Header.Get("Location"), "/ui/login") {
			t.Errorf("GET %s: %d %q, want 303 to the sign-in page", p, res.StatusCode, res.Header.Get("Location"))
		}
		if strings.Contains(body, "<table") {
			t.Errorf("GET %s shows a table without a session", p)
		}
	}
	if res, _ := get(t, cl, f.ts.URL+"/ui/dests?fragment=1"); res.StatusCode != http.StatusUnauthorized {
		t.Errorf("live refresh without a session: %d, want 401", res.StatusCode)
	}
	res, _ := post(t, cl, f.ts.URL+"/ui/dests/example.com/suspend", url.Values{"for": {"1h"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Errorf("POST without a session: %d, want 303", res.StatusCode)
	}
	st, err := throttle.GetState(context.Background(), f.c.state, "example.com")
	if err != nil || st.Suspended(time.Now()) {
		t.Errorf("a POST without a session suspended the destination: %+v %v", st, err)
	}
	// The stylesheet is not data: the sign-in page needs it.
	if res, body := get(t, cl, f.ts.URL+"/ui/static/style.css"); res.StatusCode != 200 || !strings.Contains(body, "body") {
		t.Errorf("stylesheet: %d", res.StatusCode)
	}
}

// TestSignIn: only an admin key signs in; the cookie is HttpOnly,
// SameSite=Strict and Secure under TLS; a revoked key's session ends;
// sign-out ends it too.
func TestSignIn(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Secure = true })
	for _, k := range []struct {
		key  string
		want int
	}{{"ofk_not-a-key", http.StatusUnauthorized}, {f.tenantKey(), http.StatusForbidden}} {
		res, _ := f.signIn(t, f.browser(t), k.key)
		if res.StatusCode != k.want {
			t.Errorf("sign-in with %.8s…: %d, want %d", k.key, res.StatusCode, k.want)
		}
	}
	// A sign-in form posted without its token (from another site).
	res, _ := post(t, f.browser(t), f.ts.URL+"/ui/login", url.Values{"key": {f.admin}})
	if res.StatusCode != http.StatusForbidden {
		t.Errorf("sign-in without the form's token: %d, want 403", res.StatusCode)
	}

	cl := f.browser(t)
	res, csrf := f.signIn(t, cl, f.admin)
	if res.StatusCode != http.StatusSeeOther || csrf == "" {
		t.Fatalf("admin sign-in: %d", res.StatusCode)
	}
	var sc *http.Cookie
	for _, c := range res.Cookies() {
		if c.Name == sessionCookie {
			sc = c
		}
	}
	if sc == nil || !sc.HttpOnly || !sc.Secure || sc.SameSite != http.SameSiteStrictMode || sc.Path != Prefix {
		t.Fatalf("session cookie %+v: want HttpOnly, Secure, SameSite=Strict, Path /ui/", sc)
	}
	if strings.Contains(sc.Value, f.admin) || strings.Contains(sc.Value, f.admin[4:12]) {
		t.Error("the cookie carries the key")
	}
	if r, body := get(t, cl, f.ts.URL+"/ui/"); r.StatusCode != 200 || !strings.Contains(body, "Lanes") {
		t.Fatalf("overview after sign-in: %d", r.StatusCode)
	}

	// Sign-out needs the CSRF token too, then ends the session.
	if r, _ := post(t, cl, f.ts.URL+"/ui/logout", nil); r.StatusCode != http.StatusForbidden {
		t.Errorf("sign-out without the token: %d, want 403", r.StatusCode)
	}
	post(t, cl, f.ts.URL+"/ui/logout", url.Values{"csrf": {csrf}})
	if r, _ := get(t, cl, f.ts.URL+"/ui/"); r.StatusCode != http.StatusSeeOther {
		t.Errorf("after sign-out: %d, want 303", r.StatusCode)
	}

	// Revoking the key ends its sessions at once.
	cl = f.browser(t)
	f.signIn(t, cl, f.admin)
	if _, err := f.keys.Revoke(context.Background(), f.adminID); err != nil {
		t.Fatal(err)
	}
	if r, _ := get(t, cl, f.ts.URL+"/ui/"); r.StatusCode != http.StatusSeeOther {
		t.Errorf("after the key was revoked: %d, want 303 to the sign-in page", r.StatusCode)
	}
}

func (f *fixture) tenantKey() string { return f.tenant }

// TestSessionExpires: a session ends SessionTTL after sign-in.
func TestSessionExpires(t *testing.T) {
	now := time.Now()
	clock := func() time.Time { return now }
	f := newFixture(t, func(c *Config) { c.Now = func() time.Time { return clock() }; c.SessionTTL = time.Hour })
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	now = now.Add(59 * time.Minute)
	if r, _ := get(t, cl, f.ts.URL+"/ui/dests"); r.StatusCode != 200 {
		t.Fatalf("within the TTL: %d", r.StatusCode)
	}
	now = now.Add(2 * time.Minute)
	if r, _ := get(t, cl, f.ts.URL+"/ui/dests"); r.StatusCode != http.StatusSeeOther {
		t.Errorf("past the TTL: %d, want 303", r.StatusCode)
	}
}

// TestCSRFRefused: a state-changing POST without the session's token, with
// a wrong one, or from another site changes nothing; with it, it does.
func TestCSRFRefused(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	u := f.ts.URL + "/ui/dests/example.com/suspend"
	suspended := func() bool {
		st, err := throttle.GetState(context.Background(), f.c.state, "example.com")
		if err != nil {
			t.Fatal(err)
		}
		return st.Suspended(time.Now())
	}
	for name, form := range map[string]url.Values{
		"no token":    {"for": {"1h"}},
		"wrong token": {"for": {"1h"}, "csrf": {csrf[:len(csrf)-2] + "xx"}},
	} {
		res, body := post(t, cl, u, form)
		if res.StatusCode != http.StatusForbidden || !strings.Contains(body, "CSRF") {
			t.Errorf("%s: %d, want 403 naming the CSRF token", name, res.StatusCode)
		}
	}
	req, _ := http.NewRequest("POST", u, strings.NewReader(url.Values{"for": {"1h"}, "csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	if res, err := cl.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("cross-site POST with the right token: %v %v, want 403", res.StatusCode, err)
	}
	if suspended() {
		t.Fatal("a refused POST suspended the destination")
	}
	res, _ := post(t, cl, u, url.Values{"for": {"1h"}, "reason": {"provider incident"}, "csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("suspend with the token: %d", res.StatusCode)
	}
	if !suspended() {
		t.Fatal("suspend with the token did not suspend")
	}
	st, _ := throttle.GetState(context.Background(), f.c.state, "example.com")
	if st.Reason != "provider incident" || !strings.HasPrefix(st.UpdatedBy, "console:"+f.adminID) {
		t.Errorf("state %+v: want the reason and the console key as author", st)
	}
	_, page := get(t, cl, f.ts.URL+"/ui/dests/example.com")
	if !strings.Contains(page, "example.com suspended until") || !strings.Contains(page, "provider incident") {
		t.Errorf("destination page after suspend lacks the notice or the reason")
	}
	post(t, cl, f.ts.URL+"/ui/dests/example.com/resume", url.Values{"csrf": {csrf}})
	if suspended() {
		t.Error("resume did not resume")
	}
}

// TestRateCapSetAndCleared: the destination page's rate form pins a rate
// across the fleet and its clear form removes the pin.
func TestRateCapSetAndCleared(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	pinned := func() float64 {
		st, err := throttle.GetState(context.Background(), f.c.state, "example.com")
		if err != nil {
			t.Fatal(err)
		}
		return st.RateOverride
	}
	_, page := get(t, cl, f.ts.URL+"/ui/dests/example.com")
	if !strings.Contains(page, "/ui/dests/example.com/rate-clear") {
		t.Fatal("the destination page has no form to clear the rate cap")
	}
	if res, _ := post(t, cl, f.ts.URL+"/ui/dests/example.com/rate", url.Values{"max": {"5"}, "csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("set rate: %d", res.StatusCode)
	}
	if r := pinned(); r != 5 {
		t.Fatalf("pinned %v after setting 5/s", r)
	}
	if res, _ := post(t, cl, f.ts.URL+"/ui/dests/example.com/rate-clear", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("clear rate: %d", res.StatusCode)
	}
	if r := pinned(); r != 0 {
		t.Fatalf("pinned %v after clearing the cap", r)
	}
	if _, page := get(t, cl, f.ts.URL+"/ui/dests/example.com"); !strings.Contains(page, "rate cap removed") {
		t.Error("no notice after clearing the cap")
	}
}

// TestDestPageShowsThePlateau: a learned rate's plateau (where its steps
// stop after a cut) is on the destination page, with its next probe.
func TestDestPageShowsThePlateau(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	st := throttle.DestState{Dest: "example.com", LearnedRate: 1.8, LearnedPlateau: 1.97,
		LearnedProbeAt: time.Now().Add(time.Hour), LearnedProbes: 2, UpdatedAt: time.Now().UTC()}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.c.state.Put(context.Background(), throttle.StateKey("example.com"), b); err != nil {
		t.Fatal(err)
	}
	_, page := get(t, cl, f.ts.URL+"/ui/dests/example.com")
	for _, want := range []string{"<dt>plateau</dt>", "1.97/s, under the rate the last throttle answered", "next probe over it in ", "(2 probe(s) over it met a throttle)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the destination page lacks %q", want)
		}
	}
}

// TestMessagePageEscapesHeaders: hostile header values are shown as text,
// never as markup, and the body is never shown.
func TestMessagePageEscapesHeaders(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	body := "Subject: <script>alert('subject')</script>\r\n" +
		"From: \"x\" <a@b.example>\"><img src=x onerror=alert(1)>\r\n" +
		"X-Note: </pre><b>bold</b>\r\n\r\nthe secret body <script>alert('body')</script>\r\n"
	ids, err := f.q.Enqueue(ctx, &queue.Submission{Tenant: "shop", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte(body)})
	if err != nil {
		t.Fatal(err)
	}
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	res, page := get(t, cl, f.ts.URL+"/ui/messages/"+ids[0])
	if res.StatusCode != 200 {
		t.Fatalf("message page: %d\n%s", res.StatusCode, page)
	}
	for _, bad := range []string{"<script>alert", "<img src=x", "<b>bold</b>", "secret body"} {
		if strings.Contains(page, bad) {
			t.Errorf("message page contains %q", bad)
		}
	}
	if !strings.Contains(page, "Subject: &lt;script&gt;alert(&#39;subject&#39;)&lt;/script&gt;") {
		t.Errorf("the Subject is not shown escaped:\n%s", page)
	}

	// Drop asks first, then drops.
	res, page = post(t, cl, f.ts.URL+"/ui/messages/"+ids[0]+"/drop", url.Values{"csrf": {csrf}})
	if res.StatusCode != 200 || !strings.Contains(page, `name="confirm" value="yes"`) {
		t.Fatalf("drop without confirmation: %d, want the confirmation page", res.StatusCode)
	}
	if _, err := f.q.Find(ctx, ids[0]); err != nil {
		t.Fatalf("dropped before confirmation: %v", err)
	}
	res, _ = post(t, cl, f.ts.URL+"/ui/messages/"+ids[0]+"/drop", url.Values{"csrf": {csrf}, "confirm": {"yes"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("confirmed drop: %d", res.StatusCode)
	}
	if _, err := f.q.Find(ctx, ids[0]); err == nil {
		t.Error("confirmed drop left the message")
	}
	// The dropped event names the session, as `outflow queue drop` names
	// the operator.
	var by string
	testutil.WaitFor(t, 10*time.Second, "the dropped event", func() bool {
		evs, _ := f.q.History(ctx, ids[0], time.Time{})
		for _, ev := range evs {
			if ev.Type == queue.EventDropped {
				by = ev.Worker
				return true
			}
		}
		return false
	})
	if !strings.HasPrefix(by, "admin:console:") {
		t.Errorf("dropped by %q, want the console session (admin:console:…)", by)
	}
}

// TestPagesRender: every page renders for a signed-in admin, the queue
// search uses queue list's filters, and the overview counts the lanes.
func TestPagesRender(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	if _, err := f.q.Enqueue(ctx, &queue.Submission{Tenant: "shop", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: hi\r\n\r\nx\r\n")}); err != nil {
		t.Fatal(err)
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	for p, want := range map[string]string{
		"/ui/":                          "d.example",
		"/ui/dests":                     "d.example",
		"/ui/dests/d.example":           "As each worker applies it",
		"/ui/queue?tenant=shop":         "d.example",
		"/ui/queue?tenant=other":        "nothing",
		"/ui/queue?state=bogus":         "unknown state",
		"/ui/dead":                      "no dead letters",
		"/ui/suppressions?tenant=empty": "the list is empty", // the queue is shared: other tests add entries
		"/ui/dests?fragment=1":          "d.example",
		"/ui/messages/nosuchmessage12":  "No message",
		"/ui/dests/a%3Eb":               "is not a destination",
	} {
		res, body := get(t, cl, f.ts.URL+p)
		if !strings.Contains(body, want) {
			t.Errorf("GET %s (%d) lacks %q", p, res.StatusCode, want)
		}
		if want == "is not a destination" && res.StatusCode != http.StatusBadRequest {
			t.Errorf("GET %s: %d, want 400", p, res.StatusCode)
		}
		if strings.HasSuffix(p, "fragment=1") && strings.Contains(body, "<html") {
			t.Errorf("GET %s: a fragment is a whole page", p)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no Content-Security-Policy", p)
		}
	}
	// The error page's way on is a plain link: its own policy
	// (script-src 'self') blocks a javascript: URL.
	if res, body := get(t, cl, f.ts.URL+"/ui/messages/nosuchmessage12"); !strings.Contains(body, `href="/ui/queue"`) || strings.Contains(body, "javascript:") {
		t.Errorf("not-found page (%d) links no messages list, or a javascript: URL:\n%s", res.StatusCode, body)
	}
}

// TestTemplatesNeedNoInlineScript: the Content-Security-Policy allows
// scripts from the console's own files only, so no page may count on a
// javascript: URL, an inline event handler or an inline script, which a
// browser would refuse.
func TestTemplatesNeedNoInlineScript(t *testing.T) {
	inline := regexp.MustCompile(`(?i)javascript:|\son[a-z]+\s*=|<script(\s[^>]*)?>\s*[^<\s]`)
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil || len(names) == 0 {
		t.Fatalf("templates: %v %v", names, err)
	}
	for _, name := range names {
		b, err := templateFS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if m := inline.Find(b); m != nil {
			t.Errorf("%s: %q, which the Content-Security-Policy blocks", name, m)
		}
	}
}

// TestAlertsLinkConsolePages: every alert in docs/alerts.yaml carries a
// console annotation, and each, with its labels filled in, is a page the
// console serves.
func TestAlertsLinkConsolePages(t *testing.T) {
	b, err := os.ReadFile("../docs/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*- alert: (\S+)`).FindAllStringSubmatch(string(b), -1)
	links := regexp.MustCompile(`(?m)^\s*console: "http://127\.0\.0\.1:8025(/ui/(?:[^"\\]|\\.)*)"$`).FindAllStringSubmatch(string(b), -1)
	if len(alerts) < 10 || len(links) != len(alerts) {
		t.Fatalf("%d alerts, %d console annotations: want one per alert", len(alerts), len(links))
	}
	f := newFixture(t, nil)
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	for _, lane := range []string{"retry", "ratelimit"} {
		for _, l := range links {
			// Prometheus renders annotations as Go templates with $labels.
			tm, err := template.New("a").Parse(`{{$labels := .Labels}}` + strings.ReplaceAll(l[1], `\"`, `"`))
			if err != nil {
				t.Fatalf("%s: %v", l[1], err)
			}
			var u strings.Builder
			if err := tm.Execute(&u, map[string]any{"Labels": map[string]string{"dest": "storm.example", "lane": lane}}); err != nil {
				t.Fatal(err)
			}
			res, body := get(t, cl, f.ts.URL+u.String())
			if res.StatusCode != http.StatusOK || strings.Contains(body, `class="error"`) {
				t.Errorf("%s: %d\n%s", u.String(), res.StatusCode, body)
			}
		}
	}
}

// A bounce mailed back after delivery is no attempt, nor is a
// suspension's refusal: the retry timeline is the one the attempts alone
// draw.
func TestTimelineLeavesOutLaterBounces(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	attempts := []queue.Event{{Type: queue.EventDeferred, Time: t0, Attempt: 1, Reason: "451 4.3.0 try later", Decision: []byte(`{"attempt":1}`)},
		{Type: queue.EventDelivered, Time: t0.Add(30 * time.Second), Attempt: 2}}
	later := append(slices.Clone(attempts), queue.Event{Type: queue.EventBounced, Time: t0.Add(2 * time.Hour), Async: true})
	want := timeline("m1", nil, attempts)
	if want == "" {
		t.Fatal("no timeline for a retried message")
	}
	if got := timeline("m1", nil, later); got != want {
		t.Fatal("a later bounce was drawn as an attempt")
	}
	held := slices.Insert(slices.Clone(attempts), 1, queue.Event{Type: queue.EventDeferred, Time: t0.Add(10 * time.Second),
		Attempt: 1, Reason: "suspended: a.test: suspended by an operator"})
	if got := timeline("m1", nil, held); got != want {
		t.Fatal("a suspension's refusal was drawn as an attempt")
	}
}

// The suppression list filters by source, as `suppress list --source`
// does: who unsubscribed, apart from who bounced.
func TestSuppressionsBySource(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	sup, err := f.q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []queue.Suppression{
		{Tenant: "srcfilter", Address: "left@d.example", Source: queue.SuppressUnsubscribe},
		{Tenant: "srcfilter", Address: "gone@d.example", Source: queue.SuppressBounce},
	} {
		if err := sup.Add(ctx, s); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sup.Remove(context.Background(), s.Tenant, s.Address) })
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, body := get(t, cl, f.ts.URL+"/ui/suppressions?tenant=srcfilter&source=unsubscribe")
	if !strings.Contains(body, "left@d.example") || strings.Contains(body, "gone@d.example") || !strings.Contains(body, "<option selected>unsubscribe</option>") {
		t.Fatalf("filtered by source:\n%s", body)
	}
	if _, body := get(t, cl, f.ts.URL+"/ui/suppressions?tenant=srcfilter&source=spam"); !strings.Contains(body, "no such source: spam") ||
		!strings.Contains(body, "gone@d.example") {
		t.Fatalf("an unknown source:\n%s", body)
	}
}

// The suppressions page reads only what it shows: the first 1,000
// entries, with a note that more follow rather than a count it would
// have to read the whole list for.
func TestSuppressionsPageShowsAThousand(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	sup, err := f.q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1003 {
		s := queue.Suppression{Tenant: "many", Address: fmt.Sprintf("r%04d@d.example", i), Source: queue.SuppressBounce}
		if i%400 == 7 { // 7, 407, 807
			s.Source = queue.SuppressUnsubscribe
		}
		if err := sup.Add(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, body := get(t, cl, f.ts.URL+"/ui/suppressions?tenant=many")
	if n := strings.Count(body, "@d.example</td>"); n != 1000 || !strings.Contains(body, "Showing 1000 of more than 1000;") ||
		!strings.Contains(body, "r0999@d.example") || strings.Contains(body, "r1000@d.example") {
		t.Fatalf("%d rows of 1003 entries; the note: %v", n, strings.Contains(body, "Showing 1000 of more than 1000;"))
	}
	// Its next link shows the rest, and no further link.
	m := regexp.MustCompile(`href="(/ui/suppressions\?tenant=many&amp;source=&amp;after=\d+)">next<`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no link to the next entries")
	}
	_, body = get(t, cl, f.ts.URL+strings.ReplaceAll(m[1], "&amp;", "&"))
	if n := strings.Count(body, "@d.example</td>"); n != 3 || !strings.Contains(body, "r1002@d.example") || strings.Contains(body, ">next<") ||
		!strings.Contains(body, ">first<") {
		t.Fatalf("the next page: %d rows, want the last 3, a link to the first and none further", n)
	}
	_, body = get(t, cl, f.ts.URL+"/ui/suppressions?tenant=many&source=unsubscribe")
	if n := strings.Count(body, "@d.example</td>"); n != 3 || strings.Contains(body, "Showing") {
		t.Fatalf("unsubscribes: %d rows, want 3 and no note", n)
	}
	if _, body = get(t, cl, f.ts.URL+"/ui/suppressions?after=x"); !strings.Contains(body, "not a position in the list") {
		t.Fatal("a bad position not reported")
	}
}

// TestFindByRecipient: the queue page lists the mail to a recipient that
// still waits and links to the find page, which lists the events naming
// the address in any case, newest first, each linked to its message; a
// tenant narrows it.
func TestFindByRecipient(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	for _, ev := range []struct{ typ, tenant, id, rcpt string }{
		{queue.EventDelivered, "findshop", "findm1", "Ann@Find.example"},
		{queue.EventBounced, "findshop", "findm2", "ann@find.example"},
		{queue.EventDelivered, "findother", "findm3", "ann@find.example"},
		{queue.EventDelivered, "findshop", "findm4", "bob@find.example"},
	} {
		if err := f.q.PublishEvent(ctx, ev.typ, &queue.Event{ID: ev.id, Tenant: ev.tenant, Dest: "find.example", Recipients: []string{ev.rcpt}}); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := f.q.Enqueue(ctx, &queue.Submission{Tenant: "findshop", From: "a@b.example", Rcpts: []string{"ANN@find.example"},
		Body: []byte("Subject: hi\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	other, err := f.q.Enqueue(ctx, &queue.Submission{Tenant: "findshop", From: "a@b.example", Rcpts: []string{"bob@find.example"},
		Body: []byte("Subject: hi\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, body := get(t, cl, f.ts.URL+"/ui/queue?rcpt=ann@find.example&tenant=findshop")
	if !strings.Contains(body, ids[0]) || strings.Contains(body, other[0]) ||
		!strings.Contains(body, `href="/ui/find?rcpt=ann%40find.example&amp;tenant=findshop"`) {
		t.Fatalf("the queue page's recipient search:\n%s", body)
	}
	_, body = get(t, cl, f.ts.URL+"/ui/find?rcpt=ann@find.example&tenant=findshop")
	if !strings.Contains(body, `href="/ui/messages/findm1"`) || !strings.Contains(body, `href="/ui/messages/findm2"`) ||
		strings.Contains(body, "findm3") || strings.Contains(body, "findm4") || !strings.Contains(body, `href="/ui/queue?rcpt=ann%40find.example&amp;tenant=findshop"`) {
		t.Fatalf("find for findshop:\n%s", body)
	}
	if strings.Index(body, "findm2") > strings.Index(body, "findm1") {
		t.Error("not newest first")
	}
	if _, body := get(t, cl, f.ts.URL+"/ui/find?rcpt=ANN@find.example&since=6h"); !strings.Contains(body, "findm3") ||
		!strings.Contains(body, "<option selected>6h</option>") {
		t.Fatalf("find across tenants:\n%s", body)
	}
	if _, body := get(t, cl, f.ts.URL+"/ui/find?rcpt=nobody@find.example"); !strings.Contains(body, "no events name nobody@find.example") {
		t.Fatalf("find of nobody:\n%s", body)
	}
}

// TestCookieSecureBehindAProxy: a listener without TLS behind a reverse
// proxy that ends it (X-Forwarded-Proto: https) still marks the session
// cookie Secure, so the browser never sends it over plain HTTP; a plain
// request without the header does not.
func TestCookieSecureBehindAProxy(t *testing.T) {
	c := &Console{}
	for proto, want := range map[string]bool{"https": true, "HTTPS": true, "http": false, "": false} {
		r := httptest.NewRequest("POST", "/ui/login", nil)
		if proto != "" {
			r.Header.Set("X-Forwarded-Proto", proto)
		}
		w := httptest.NewRecorder()
		c.setCookie(w, r, sessionCookie, "tok", 60)
		cs := w.Result().Cookies()
		if len(cs) != 1 || cs[0].Secure != want {
			t.Errorf("X-Forwarded-Proto %q: cookies %+v, want Secure %v", proto, cs, want)
		}
	}
}

// TestSignInFailuresLimited: failed sign-ins are counted by reason and
// against the client's address in the limiter the console is given (the
// API's, in outflow serve): at its limit the address's refused sign-ins
// are answered 429 with Retry-After until the window ends, and a valid
// admin key still signs in, from it and from another address. The log has
// the first failure and the one at the limit, not a line per failure.
func TestSignInFailuresLimited(t *testing.T) {
	var logs testutil.SyncBuffer
	now := time.Now()
	clock := func() time.Time { return now }
	lim := api.NewAuthLimiter(3, time.Minute, func() time.Time { return clock() })
	f := newFixture(t, func(c *Config) {
		c.AuthLimiter = lim
		c.Logger = zerolog.New(&logs).Level(zerolog.InfoLevel)
	})
	// A failure of an API key from the same address counts here too.
	lim.Fail(netip.MustParseAddr("127.0.0.1"))
	for _, k := range []struct {
		key  string
		want int
	}{{"ofk_not-a-key", http.StatusUnauthorized}, {f.tenantKey(), http.StatusForbidden}} {
		if res, _ := f.signIn(t, f.browser(t), k.key); res.StatusCode != k.want {
			t.Fatalf("sign-in with %.8s…: %d, want %d", k.key, res.StatusCode, k.want)
		}
	}
	if got, want := f.c.SignInFailures(), [numSignInReasons]uint64{1, 1}; got != want {
		t.Errorf("SignInFailures %v, want %v (unknown, not-admin)", got, want)
	}

	now = now.Add(15 * time.Second)
	res, _ := f.signIn(t, f.browser(t), "ofk_not-a-key")
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") != "45" {
		t.Fatalf("unknown key from an address at its limit: %d, Retry-After %q; want 429, 45", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if lim.Refused() != 1 || f.c.SignInFailures() != [numSignInReasons]uint64{2, 1} {
		t.Errorf("Refused %d, SignInFailures %v; want 1, the 429 counted", lim.Refused(), f.c.SignInFailures())
	}
	if res, csrf := f.signIn(t, f.browser(t), f.admin); res.StatusCode != http.StatusSeeOther || csrf == "" {
		t.Fatalf("admin key from an address at its limit: %d, want 303 (signed in)", res.StatusCode)
	}

	// Another address signs in (the form's token as a browser sends it).
	form := url.Values{"csrf": {"tok"}, "key": {f.admin}}
	req := httptest.NewRequest(http.MethodPost, "/ui/login", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: preCookie, Value: "tok"})
	req.RemoteAddr = "127.0.0.2:40000"
	rec := httptest.NewRecorder()
	f.c.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("admin key from another address: %d, want 303", rec.Code)
	}

	now = now.Add(45 * time.Second)
	if res, csrf := f.signIn(t, f.browser(t), f.admin); res.StatusCode != http.StatusSeeOther || csrf == "" {
		t.Fatalf("admin key after the window: %d", res.StatusCode)
	}

	var warn []string
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(l, `"level":"warn"`) {
			warn = append(warn, l)
		}
	}
	if len(warn) != 1 || !strings.Contains(warn[0], `"reason":"not-admin","failures":3`) || !strings.Contains(warn[0], `"remote":"127.0.0.1:`) {
		t.Errorf("warnings, want the one at the limit (the first failure was the API's):\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "not-a-key") {
		t.Errorf("a key was logged:\n%s", logs.String())
	}
}
