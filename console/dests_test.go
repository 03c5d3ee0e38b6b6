package console

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// TestDestsListsSuspendedPastTheCut: with more destinations waiting than
// the page shows, a suspended one with little mail waiting is still
// listed (destinations whose state is worth seeing come first), the page
// says how many it leaves out, and the name filter finds any of them.
func TestDestsListsSuspendedPastTheCut(t *testing.T) {
	q := ownQueue(t)
	f := newFixtureOn(t, q, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// 600 destinations with two messages each, then the suspended one
	// with one: by waiting mail it is the 601st.
	for batch := 0; batch < 600; batch += 100 {
		var rcpts []string
		for i := batch; i < batch+100; i++ {
			rcpts = append(rcpts, fmt.Sprintf("r@d%03d.many.example", i))
		}
		for range 2 {
			if _, err := q.Enqueue(ctx, &queue.Submission{Tenant: "many", From: "a@b.example", Rcpts: rcpts, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	const quiet = "a-quiet.example"
	if _, err := q.Enqueue(ctx, &queue.Submission{Tenant: "many", From: "a@b.example", Rcpts: []string{"r@" + quiet}, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
		t.Fatal(err)
	}
	if err := throttle.Suspend(ctx, f.c.state, quiet, time.Now().Add(time.Hour), "provider incident", "test"); err != nil {
		t.Fatal(err)
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	for _, p := range []string{"/ui/dests", "/ui/dests?fragment=1"} {
		res, body := get(t, cl, f.ts.URL+p)
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", p, res.StatusCode)
		}
		if !strings.Contains(body, `data-dest="`+quiet+`"`) {
			t.Errorf("GET %s: the suspended %s is not listed", p, quiet)
		}
		if n := strings.Count(body, `<tr data-dest=`); n != destsShown {
			t.Errorf("GET %s: %d rows, want %d", p, n, destsShown)
		}
		if !strings.Contains(body, "Showing 500 of 601 destinations") {
			t.Errorf("GET %s does not say how many it shows", p)
		}
	}
	_, body := get(t, cl, f.ts.URL+"/ui/dests?dest=D599.many")
	if !strings.Contains(body, `data-dest="d599.many.example"`) || strings.Count(body, `<tr data-dest=`) != 1 ||
		strings.Contains(body, "Showing") || !strings.Contains(body, `data-live="/ui/dests?fragment=1&amp;dest=d599.many"`) {
		t.Errorf("filtered by name: want d599.many.example alone, refreshed with the filter:\n%s", body)
	}
	if _, body := get(t, cl, f.ts.URL+"/ui/dests?dest=many.example"); !strings.Contains(body, "Showing 500 of 600 destinations") {
		t.Error("a filter's matches past the cut are not counted")
	}
}

// TestDestURLRefusesWhatTheCLIRefuses: the console takes a destination
// in its URLs as `outflow dest` takes DEST (destname.Check): a list, a
// quote or a name IDNA refuses writes nothing, and a name is changed as
// it is stored ("Gmail.COM." is gmail.com).
func TestDestURLRefusesWhatTheCLIRefuses(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	ctx := context.Background()
	for _, bad := range []string{"gmail.com,yahoo.com", "a;b.example", `a"b.example`, "a'b.example", "a<b.example", `a\b.example`, "\u0301bad.example"} {
		res, body := post(t, cl, f.ts.URL+"/ui/dests/"+url.PathEscape(bad)+"/suspend", url.Values{"for": {"1h"}, "csrf": {csrf}})
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(body, "is not a destination") {
			t.Errorf("suspend %q: %d, want 400", bad, res.StatusCode)
		}
		states, err := throttle.ListStates(ctx, f.c.state)
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range states {
			if strings.ContainsAny(st.Dest, `,;"'<\`) || strings.Contains(st.Dest, "bad.example") {
				t.Errorf("suspend %q wrote a state row for %q", bad, st.Dest)
			}
		}
	}
	res, _ := post(t, cl, f.ts.URL+"/ui/dests/Norm.EXAMPLE./suspend", url.Values{"for": {"1h"}, "csrf": {csrf}})
	if res.StatusCode != http.StatusSeeOther || res.Header.Get("Location") != "/ui/dests/norm.example" {
		t.Fatalf("suspend Norm.EXAMPLE.: %d to %q, want 303 to /ui/dests/norm.example", res.StatusCode, res.Header.Get("Location"))
	}
	if st, err := throttle.GetState(ctx, f.c.state, "norm.example"); err != nil || !st.Suspended(time.Now()) {
		t.Errorf("norm.example not suspended: %+v %v", st, err)
	}
}

// TestDestActionInputErrors: a rate or a duration the form cannot take
// is answered 400 naming the field, and changes nothing; 502 is for the
// store alone.
func TestDestActionInputErrors(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	const dest = "inputs.example"
	for _, c := range []struct {
		action string
		form   url.Values
		field  string
	}{
		{"rate", url.Values{"max": {"NaN"}}, "(max)"},
		{"rate", url.Values{"max": {"+Inf"}}, "(max)"},
		{"rate", url.Values{"max": {"0"}}, "(max)"},
		{"rate", url.Values{"max": {"5"}, "for": {"1ns"}}, "(for)"},
		{"rate", url.Values{"max": {"5"}, "for": {"soon"}}, "(for)"},
		{"suspend", url.Values{"for": {"1ns"}}, "(for)"},
		{"suspend", url.Values{"for": {"-1h"}}, "(for)"},
		{"suspend", url.Values{"for": {"900ms"}}, "(for)"},
	} {
		c.form.Set("csrf", csrf)
		res, body := post(t, cl, f.ts.URL+"/ui/dests/"+dest+"/"+c.action, c.form)
		m := regexp.MustCompile(`<p class="error">([^<]*)</p>`).FindStringSubmatch(body)
		if res.StatusCode != http.StatusBadRequest || m == nil || !strings.Contains(m[1], c.field) || !strings.Contains(m[1], "nothing was changed") {
			t.Errorf("%s %v: %d %q, want 400 naming %s", c.action, c.form, res.StatusCode, m, c.field)
		}
	}
	st, err := throttle.GetState(context.Background(), f.c.state, dest)
	if err != nil || st.RateOverride != 0 || st.Suspended(time.Now()) {
		t.Errorf("a refused form changed the state: %+v %v", st, err)
	}
}

// TestRateClearWithoutCap: clearing a cap that is not there says so, as
// `outflow dest rate --clear` does, and writes nothing.
func TestRateClearWithoutCap(t *testing.T) {
	f := newFixture(t, nil)
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	const dest = "nocap.example"
	if res, _ := post(t, cl, f.ts.URL+"/ui/dests/"+dest+"/rate-clear", url.Values{"csrf": {csrf}}); res.StatusCode != http.StatusSeeOther {
		t.Fatalf("clear rate: %d", res.StatusCode)
	}
	_, page := get(t, cl, f.ts.URL+"/ui/dests/"+dest)
	if !strings.Contains(page, dest+" had no rate cap; nothing to clear.") || strings.Contains(page, "rate cap removed") {
		t.Errorf("clearing no cap: the notice is not that there was none")
	}
	if st, err := throttle.GetState(context.Background(), f.c.state, dest); err != nil || !st.UpdatedAt.IsZero() {
		t.Errorf("clearing no cap wrote the state: %+v %v", st, err)
	}
}

// TestLiveBlocksSayWhenUpdated: each live block (the overview, the
// destinations, a destination) says when it was rendered, in the page and
// in each refresh, for the script's "not updating since" notice.
func TestLiveBlocksSayWhenUpdated(t *testing.T) {
	at := time.Date(2026, 12, 6, 10, 11, 12, 0, time.UTC)
	f := newFixture(t, func(c *Config) { c.Now = func() time.Time { return at } })
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	const want = `updated <time data-asof datetime="2026-12-06T10:11:12Z">10:11:12Z</time>`
	for _, p := range []string{"/ui/", "/ui/?fragment=1", "/ui/dests", "/ui/dests?fragment=1", "/ui/dests/asof.example", "/ui/dests/asof.example?fragment=1"} {
		if _, body := get(t, cl, f.ts.URL+p); strings.Count(body, want) != 1 {
			t.Errorf("GET %s: %d times %q, want once", p, strings.Count(body, want), want)
		}
	}
}
