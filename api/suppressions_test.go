package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/queue"
)

func TestSuppressedRecipientIs422AndNothingStored(t *testing.T) {
	f := newFixture(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	events, err := f.js.OrderedConsumer(ctx, queue.StreamEvents,
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{queue.EventTypeFilter(queue.EventSuppressed)}})
	if err != nil {
		t.Fatal(err)
	}

	r := f.do(t, "POST", "/v1/suppressions", f.key, map[string]any{"address": "Gone@Example.org", "reason": "unsubscribed"}, nil)
	if r.status != http.StatusCreated || r.json["address"] != "gone@example.org" || r.json["source"] != queue.SuppressAPI {
		t.Fatalf("POST /v1/suppressions: %d %s", r.status, r.raw)
	}
	msg := map[string]any{"from": "app@src.example", "to": []string{"ok@example.net", "gone@example.org"}, "subject": "s", "text": "x"}
	r = f.do(t, "POST", "/v1/messages", f.key, msg, nil)
	if r.status != http.StatusUnprocessableEntity || r.json["type"] != ProblemSuppressed || !strings.Contains(string(r.raw), `"to[1]"`) ||
		!strings.Contains(r.json["detail"].(string), "gone@example.org") {
		t.Fatalf("message to a suppressed recipient: %d %s", r.status, r.raw)
	}
	if q := queued(t, f.q); len(q) != 0 {
		t.Fatalf("stored %d envelopes for a refused request", len(q))
	}
	m, err := events.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no suppressed event: %v", err)
	}
	if !strings.Contains(string(m.Data()), "gone@example.org") || !strings.Contains(string(m.Data()), `"tenant":"acme"`) {
		t.Fatalf("event %s", m.Data())
	}

	// Another tenant's list does not apply.
	other, _, err := f.srv.Keys().Create(ctx, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	f.do(t, "POST", "/v1/messages", other, msg, nil).ids(t)

	// A plain key may not act for another tenant; removal lifts it.
	if r := f.do(t, "GET", "/v1/suppressions?tenant=other", f.key, nil, nil); r.status != http.StatusForbidden {
		t.Fatalf("other tenant's list: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "GET", "/v1/suppressions", f.key, nil, nil); r.status != 200 || !strings.Contains(string(r.raw), "gone@example.org") {
		t.Fatalf("list: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "DELETE", "/v1/suppressions/gone@example.org", f.key, nil, nil); r.status != http.StatusNoContent {
		t.Fatalf("delete: %d %s", r.status, r.raw)
	}
	if ids := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t); len(ids) != 2 {
		t.Fatalf("ids after removal %v", ids)
	}
}

// A retry with the Idempotency-Key of a stored request gets its ids even if
// a recipient was suppressed in between; a new key is refused.
func TestIdempotentRetryIgnoresLaterSuppression(t *testing.T) {
	f := newFixture(t, nil)
	msg := map[string]any{"from": "app@src.example", "to": []string{"later@example.org"}, "text": "x"}
	ids := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-1"}).ids(t)
	if r := f.do(t, "POST", "/v1/suppressions", f.key, map[string]any{"address": "later@example.org"}, nil); r.status != http.StatusCreated {
		t.Fatalf("suppress: %d %s", r.status, r.raw)
	}
	again := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-1"}).ids(t)
	if strings.Join(again, ",") != strings.Join(ids, ",") {
		t.Fatalf("retry ids %v, want %v", again, ids)
	}
	if r := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-2"}); r.status != http.StatusUnprocessableEntity || r.json["type"] != ProblemSuppressed {
		t.Fatalf("new key: %d %s", r.status, r.raw)
	}
}

// TestSuppressionRequestProblems: POST /v1/suppressions answers a faulty
// body with the problem types docs/api.md lists, as POST /v1/messages
// does: a misspelt field is unknown-field naming it (not a generic
// bad-json), a wrong type names its field, and an unusable address is
// bad-address with the reason alone. Nothing is stored.
func TestSuppressionRequestProblems(t *testing.T) {
	f := newFixture(t, nil)
	cases := []struct {
		name   string
		body   string
		status int
		typ    string
		field  string
		detail string // a substring of the detail
	}{
		{"unknown field", `{"address":"a@one.example","reasn":"typo"}`, 400, ProblemUnknownField, "reasn", `"reasn" is not a field of a suppression`},
		{"wrong type", `{"address":5}`, 400, ProblemBadJSON, "address", "address: want string, got number"},
		{"not an object", `["a@one.example"]`, 400, ProblemBadJSON, "", "must be a JSON object"},
		{"bad time", `{"address":"a@one.example","expires":"tomorrow"}`, 400, ProblemBadJSON, "", "RFC 3339"},
		{"trailing data", `{"address":"a@one.example"} {}`, 400, ProblemBadJSON, "", "data after the JSON object"},
		{"a closing bracket after", `{"address":"a@one.example"}]`, 400, ProblemBadJSON, "", "data after the JSON object"},
		{"bad address", `{"address":"no-at-sign"}`, 422, ProblemBadAddress, "address", "address: missing @domain"},
		{"missing address", `{"reason":"x"}`, 400, ProblemMissingField, "address", ""},
		{"expires in the past", `{"address":"a@one.example","expires":"2020-01-01T00:00:00Z"}`, 422, ProblemBadExpires, "expires", "2020-01-01T00:00:00Z has passed"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := f.do(t, "POST", "/v1/suppressions", f.key, c.body, nil)
			if r.status != c.status || r.json["type"] != c.typ {
				t.Fatalf("got %d %s, want %d %s", r.status, r.raw, c.status, c.typ)
			}
			if d, _ := r.json["detail"].(string); !strings.Contains(d, c.detail) || strings.Contains(d, "Go struct") || strings.Contains(d, "submission:") {
				t.Errorf("detail %q, want it to say %q in the API's terms", d, c.detail)
			}
			if c.field != "" {
				errs, _ := r.json["errors"].([]any)
				if len(errs) != 1 || errs[0].(map[string]any)["field"] != c.field {
					t.Errorf("errors %v, want one for field %q", r.json["errors"], c.field)
				}
			}
		})
	}
	if r := f.do(t, "GET", "/v1/suppressions", f.key, nil, nil); r.status != 200 || strings.Contains(string(r.raw), "one.example") {
		t.Fatalf("a refused request stored an entry: %d %s", r.status, r.raw)
	}
}

// GET /v1/suppressions takes source and since, so an application can
// fetch who unsubscribed since it last looked; a source or time it does
// not know is 400 bad-query.
func TestListSuppressionsFiltered(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	sup := f.srv.cfg.Suppressions.(*queue.Suppressions)
	old := time.Now().Add(-48 * time.Hour).UTC().Truncate(time.Second)
	for _, s := range []queue.Suppression{
		{Tenant: "acme", Address: "left@example.org", Source: queue.SuppressUnsubscribe},
		{Tenant: "acme", Address: "left-long-ago@example.org", Source: queue.SuppressUnsubscribe, Created: old},
		{Tenant: "acme", Address: "gone@example.org", Source: queue.SuppressBounce},
	} {
		if err := sup.Add(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	addresses := func(r response) string {
		var out []string
		list, ok := r.json["suppressions"].([]any)
		if !ok {
			t.Fatalf("suppressions %v is not a list: %s", r.json["suppressions"], r.raw)
		}
		for _, e := range list {
			out = append(out, e.(map[string]any)["address"].(string))
		}
		return strings.Join(out, ",")
	}
	since := time.Now().Add(-24 * time.Hour).UTC().Format(time.RFC3339)
	// In the order written (a page is read without the rest of the list).
	for _, c := range []struct{ query, want string }{
		{"", "left@example.org,left-long-ago@example.org,gone@example.org"},
		{"?source=unsubscribe", "left@example.org,left-long-ago@example.org"},
		{"?source=unsubscribe&since=" + since, "left@example.org"},
		{"?since=" + since, "left@example.org,gone@example.org"},
		{"?source=complaint", ""},
	} {
		if r := f.do(t, "GET", "/v1/suppressions"+c.query, f.key, nil, nil); r.status != 200 || addresses(r) != c.want {
			t.Errorf("GET %s: %d %s, want %s", c.query, r.status, r.raw, c.want)
		}
	}
	for _, q := range []string{"?source=spam", "?since=yesterday"} {
		if r := f.do(t, "GET", "/v1/suppressions"+q, f.key, nil, nil); r.status != 400 || r.json["type"] != ProblemBadQuery {
			t.Errorf("GET %s: %d %s, want 400 bad-query", q, r.status, r.raw)
		}
	}
}

// GET /v1/suppressions answers a page at a time: limit entries (100 by
// default, at most 1,000), a next_cursor while more follow; walking the
// cursors returns every entry of the tenant exactly once (none of another
// tenant's, none expired), and so does a walk filtered by source.
func TestListSuppressionsPages(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	sup := f.srv.cfg.Suppressions.(*queue.Suppressions)
	want, unsub := map[string]bool{}, map[string]bool{}
	for i := range 257 {
		s := queue.Suppression{Tenant: "acme", Address: fmt.Sprintf("a%03d@example.org", i), Source: queue.SuppressBounce}
		if i%10 == 3 {
			s.Source = queue.SuppressUnsubscribe
			unsub[s.Address] = true
		}
		want[s.Address] = true
		if err := sup.Add(ctx, s); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 { // another tenant's entries between them
			if err := sup.Add(ctx, queue.Suppression{Tenant: "other", Address: fmt.Sprintf("o%03d@example.org", i)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := sup.Add(ctx, queue.Suppression{Tenant: "acme", Address: "expired@example.org", Expires: time.Now().Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	page := func(query string) (addrs []string, next string) {
		t.Helper()
		r := f.do(t, "GET", "/v1/suppressions"+query, f.key, nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", query, r.status, r.raw)
		}
		var l SuppressionList
		if err := json.Unmarshal(r.raw, &l); err != nil {
			t.Fatal(err)
		}
		for _, s := range l.Suppressions {
			if s.Tenant != "acme" {
				t.Fatalf("GET %s: another tenant's entry %+v", query, s)
			}
			addrs = append(addrs, s.Address)
		}
		return addrs, l.NextCursor
	}
	walk := func(query string, limit int) map[string]bool {
		t.Helper()
		seen := map[string]bool{}
		cursor, pages := "", 0
		for {
			q := query + "&limit=" + strconv.Itoa(limit)
			if cursor != "" {
				q += "&cursor=" + url.QueryEscape(cursor)
			}
			addrs, next := page(q)
			pages++
			if len(addrs) > limit {
				t.Fatalf("a page of %d entries for limit=%d", len(addrs), limit)
			}
			for _, a := range addrs {
				if seen[a] {
					t.Fatalf("%s twice in the walk %s", a, query)
				}
				seen[a] = true
			}
			if next == "" {
				break
			}
			if pages > 1000 {
				t.Fatal("the walk does not end")
			}
			cursor = next
		}
		return seen
	}
	if got := walk("?", 50); !maps.Equal(got, want) {
		t.Fatalf("walked %d entries, want the %d of the tenant", len(got), len(want))
	}
	if got := walk("?source=unsubscribe", 7); !maps.Equal(got, unsub) {
		t.Fatalf("walked %d unsubscribes, want %d", len(got), len(unsub))
	}

	// The default limit, the largest, and the last page without a cursor.
	if addrs, next := page(""); len(addrs) != 100 || next == "" || addrs[0] != "a000@example.org" || addrs[99] != "a099@example.org" {
		t.Fatalf("default page: %d entries (%v … ), next %q", len(addrs), addrs[:min(3, len(addrs))], next)
	}
	if addrs, next := page("?limit=1000"); len(addrs) != 257 || next != "" {
		t.Fatalf("limit=1000: %d entries, next %q", len(addrs), next)
	}
	if addrs, next := page("?limit=257"); len(addrs) != 257 || next != "" {
		t.Fatalf("limit=257: %d entries, next %q (nothing follows the last)", len(addrs), next)
	}

	// A cursor or limit the route did not give is a 400 bad-query naming it.
	for _, c := range []struct{ query, field string }{
		{"?limit=0", "limit"}, {"?limit=1001", "limit"}, {"?limit=ten", "limit"}, {"?limit=-5", "limit"},
		{"?cursor=nonsense", "cursor"}, {"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("s0")), "cursor"},
		{"?cursor=" + base64.RawURLEncoding.EncodeToString([]byte("x12")), "cursor"}, {"?cursor=%3D%3D", "cursor"},
	} {
		r := f.do(t, "GET", "/v1/suppressions"+c.query, f.key, nil, nil)
		errs, _ := r.json["errors"].([]any)
		if r.status != http.StatusBadRequest || r.json["type"] != ProblemBadQuery || r.header.Get("Content-Type") != "application/problem+json" ||
			len(errs) != 1 || errs[0].(map[string]any)["field"] != c.field {
			t.Errorf("GET %s: %d %s, want 400 bad-query naming %s", c.query, r.status, r.raw, c.field)
		}
	}
}
