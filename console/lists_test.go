package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// deadLetters dead-letters n fresh envelopes of tenant on q, one
// destination each (d<i>.dead.example, i from start), and returns their
// ids in the order they died. q is the test's own queue: every envelope
// in its work lane is taken.
func deadLetters(t *testing.T, q *queue.Queue, tenant string, start, n int) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var rcpts []string
	for i := start; i < start+n; i++ {
		rcpts = append(rcpts, fmt.Sprintf("r@d%04d.dead.example", i))
	}
	if _, err := q.Enqueue(ctx, &queue.Submission{Tenant: tenant, From: "a@b.example", Rcpts: rcpts, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, err := q.Messages(ctx, queue.LaneWork, 16)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range n {
		select {
		case d := <-work:
			if err := d.Dead(ctx, d.Env.Clone(), "max-attempts"); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, d.Env.ID)
		case <-ctx.Done():
			t.Fatalf("%d of %d envelopes dead-lettered", len(ids), n)
		}
	}
	return ids
}

var (
	rowID    = regexp.MustCompile(`<tr data-id="([^"]+)">`)
	nextLink = regexp.MustCompile(`<a href="([^"]+)" id="next-page">`)
)

// pageRows returns a listing page's row ids and its next link ("" when
// none).
func pageRows(body string) ([]string, string) {
	var ids []string
	for _, m := range rowID.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	next := ""
	if m := nextLink.FindStringSubmatch(body); m != nil {
		next = strings.ReplaceAll(m[1], "&amp;", "&")
	}
	return ids, next
}

// TestDeadLettersPaged: the dead letters page shows 200 at a time,
// newest first, says of how many, and its next links reach every dead
// letter once, though one shown was replayed and new ones died between
// the pages.
func TestDeadLettersPaged(t *testing.T) {
	q := ownQueue(t)
	f := newFixtureOn(t, q, nil)
	ids := deadLetters(t, q, "paged", 0, 450)
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)

	_, body := get(t, cl, f.ts.URL+"/ui/dead")
	page1, next := pageRows(body)
	if len(page1) != deadShown || next == "" || !strings.Contains(body, "Showing 1–200 of 450 dead letters, newest first") {
		t.Fatalf("first page: %d rows, next %q, want 200 of 450 and a next link", len(page1), next)
	}
	newest := slices.Clone(ids)
	slices.Reverse(newest)
	if !slices.Equal(page1, newest[:200]) {
		t.Fatal("the first page is not the newest 200, newest first")
	}
	// Between the pages: one row shown is replayed (it leaves), three
	// more die (they come first now).
	ctx := context.Background()
	if _, err := q.Replay(ctx, page1[10], nil); err != nil {
		t.Fatal(err)
	}
	more := deadLetters(t, q, "paged", 1000, 4) // the replayed one dies again too
	_, body = get(t, cl, f.ts.URL+next)
	page2, next := pageRows(body)
	if !slices.Equal(page2, newest[200:400]) || next == "" || !strings.Contains(body, "Showing 201–400 of 453 dead letters") {
		t.Fatalf("second page: %d rows from %v, next %q; want the 201st to 400th of the first listing", len(page2), page2[:min(3, len(page2))], next)
	}
	_, body = get(t, cl, f.ts.URL+next)
	page3, next := pageRows(body)
	if !slices.Equal(page3, newest[400:]) || next != "" || !strings.Contains(body, `id="first-page"`) {
		t.Fatalf("last page: %d rows, next %q; want the oldest 50, no next and a link to the first", len(page3), next)
	}
	_ = more

	// A tenant's dead letters page the same way; an unknown position is
	// reported, not taken for the top silently.
	_, body = get(t, cl, f.ts.URL+"/ui/dead?tenant=paged&dest=d0007.dead.example")
	if r, _ := pageRows(body); !slices.Equal(r, []string{ids[7]}) || !strings.Contains(body, "of the dead letters of tenant paged to d0007.dead.example (453 dead letters in all)") {
		t.Errorf("filtered: %v", r)
	}
	if _, body = get(t, cl, f.ts.URL+"/ui/dead?after=x.y"); !strings.Contains(body, "is not a position in the listing") {
		t.Error("a bad position is not reported")
	}
}

// TestQueuePageLimitAndPages: a limit over the maximum is clamped with a
// notice saying so, a bad one is reported, and the queue page's next
// links list every row once.
func TestQueuePageLimitAndPages(t *testing.T) {
	q := ownQueue(t)
	f := newFixtureOn(t, q, nil)
	ids := deadLetters(t, q, "qpaged", 0, 1100)
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)

	_, body := get(t, cl, f.ts.URL+"/ui/queue?state=dead&limit=5000")
	rows, next := pageRows(body)
	if len(rows) != queueMax || !strings.Contains(body, `id="limit-notice"`) || !strings.Contains(body, "5000 is over the 1000 rows a page can show") {
		t.Fatalf("limit=5000: %d rows, notice %v; want 1000 and a notice", len(rows), strings.Contains(body, `id="limit-notice"`))
	}
	if !strings.Contains(next, "limit=1000") || !strings.Contains(next, "state=dead") {
		t.Fatalf("the next link %q does not keep the filters", next)
	}
	_, body = get(t, cl, f.ts.URL+next)
	rest, next := pageRows(body)
	if all := append(rows, rest...); !slices.Equal(all, ids) || next != "" || strings.Contains(body, `id="limit-notice"`) {
		t.Fatalf("two pages: %d+%d rows, next %q; want each of the %d dead letters once, oldest first", len(rows), len(rest), next, len(ids))
	}
	for _, bad := range []string{"abc", "-5", "0"} {
		_, body := get(t, cl, f.ts.URL+"/ui/queue?state=dead&limit="+bad)
		if r, _ := pageRows(body); len(r) != queueDefault || !strings.Contains(body, `id="limit-notice"`) {
			t.Errorf("limit=%s: %d rows, want %d and a notice", bad, len(r), queueDefault)
		}
	}
	// Pages of 400 across the states of a listing.
	var seen []string
	u := f.ts.URL + "/ui/queue?tenant=qpaged&limit=400"
	for u != "" {
		_, body := get(t, cl, u)
		r, next := pageRows(body)
		seen = append(seen, r...)
		u = ""
		if next != "" {
			u = f.ts.URL + next
		}
		if len(seen) > 2*len(ids) {
			t.Fatal("the pages do not end")
		}
	}
	if !slices.Equal(seen, ids) {
		t.Errorf("pages of 400: %d rows, want the %d dead letters once each", len(seen), len(ids))
	}
}

// TestSuppressAddRefusesWhatSubmissionRefuses: the console adds only an
// address the CLI and the API would add: a non-ASCII one (no SMTPUTF8)
// is refused with 400 and not stored.
func TestSuppressAddRefusesWhatSubmissionRefuses(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	for _, bad := range []string{"user@Bücher.example", "no-at-sign", "a b@c.example", "user@[192.0.2.1]"} {
		res, body := post(t, cl, f.ts.URL+"/ui/suppressions/add", url.Values{"csrf": {csrf}, "tenant": {"idn"}, "address": {bad}})
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "Address (address)") || !strings.Contains(body, "nothing was stored") {
			t.Errorf("add %q: %d, want 400 naming the address", bad, res.StatusCode)
		}
	}
	if _, body := post(t, cl, f.ts.URL+"/ui/suppressions/add", url.Values{"csrf": {csrf}, "tenant": {"idn"}, "address": {"user@Bücher.example"}}); !strings.Contains(body, "non-ASCII address without SMTPUTF8") {
		t.Error("the refusal does not give submission's reason")
	}
	list, _, err := f.c.cfg.Suppressions.Page(context.Background(), "idn", 0, 100, 1000, nil)
	if err != nil || len(list) != 0 {
		t.Fatalf("refused addresses stored: %v %v", list, err)
	}
	if res, _ := post(t, cl, f.ts.URL+"/ui/suppressions/add", url.Values{"csrf": {csrf}, "tenant": {"idn"}, "address": {"user@xn--bcher-kva.example"}}); res.StatusCode != http.StatusSeeOther {
		t.Errorf("add of the A-label address: %d, want 303", res.StatusCode)
	}
	t.Cleanup(func() { _ = f.c.cfg.Suppressions.Remove(context.Background(), "idn", "user@xn--bcher-kva.example") })
}

// TestActionAfterSessionEnded: a form posted after the session ended
// (a restart ends them all) is not done, and the sign-in page says so and
// leads back to the page the form was on.
func TestActionAfterSessionEnded(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	const dest = "lost.example"
	// The daemon restarts: its sessions are gone.
	f.sessions.mu.Lock()
	clear(f.sessions.m)
	f.sessions.mu.Unlock()

	req, _ := http.NewRequest("POST", f.ts.URL+"/ui/dests/"+dest+"/suspend", strings.NewReader(url.Values{"for": {"1h"}, "csrf": {csrf}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Referer", f.ts.URL+"/ui/dests/"+dest+"?x=1")
	res, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	loc := res.Header.Get("Location")
	u, err := url.Parse(loc)
	if res.StatusCode != http.StatusSeeOther || err != nil || u.Path != "/ui/login" || u.Query().Get("lost") != "1" || u.Query().Get("next") != "/ui/dests/"+dest+"?x=1" {
		t.Fatalf("POST after the session ended: %d to %q, want 303 to the sign-in page with lost=1 and the form's page as next", res.StatusCode, loc)
	}
	if st, err := throttle.GetState(context.Background(), f.c.state, dest); err != nil || st.Suspended(time.Now()) {
		t.Fatalf("the action was done: %+v %v", st, err)
	}
	_, page := get(t, cl, f.ts.URL+loc)
	if !strings.Contains(page, "Your session had ended; the action was NOT done") || !strings.Contains(page, `name="next" value="/ui/dests/`+dest+`?x=1"`) {
		t.Fatalf("the sign-in page does not say the action was lost, or drops next:\n%s", page)
	}
	// Signing in there leads back to the form's page.
	m := csrfField.FindStringSubmatch(page)
	res, _ = post(t, cl, f.ts.URL+"/ui/login", url.Values{"csrf": {m[1]}, "key": {f.admin}, "next": {"/ui/dests/" + dest + "?x=1"}, "lost": {"1"}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/dests/"+dest+"?x=1" {
		t.Errorf("sign-in: %d to %q, want the form's page", res.StatusCode, res.Header.Get("Location"))
	}

	// Only a console page is taken from the Referer: its path, not its
	// host; for a confirmation page (the URL of its action), the page
	// above it.
	for ref, want := range map[string]string{
		"https://evil.example/ui/dests?x=1":      "/ui/dests?x=1",
		f.ts.URL + "/ui/messages/abc/drop":       "/ui/messages/abc",
		f.ts.URL + "/ui/dests/lost.example/rate": "/ui/dests/lost.example",
		f.ts.URL + "/ui/nosuchpage/at/all":       "",
		"http://h//evil.example/ui/":             "",
		"/ui/login?next=/ui/":                    "",
		"":                                       "",
	} {
		cl := f.browser(t)
		req, _ := http.NewRequest("POST", f.ts.URL+"/ui/dests/"+dest+"/suspend", strings.NewReader("for=1h"))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Referer", ref)
		res, err := cl.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		u, _ := url.Parse(res.Header.Get("Location"))
		if u.Query().Get("lost") != "1" || u.Query().Get("next") != want {
			t.Errorf("Referer %q: redirected to %q, want lost=1 and next %q", ref, res.Header.Get("Location"), want)
		}
	}
}
