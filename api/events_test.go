package api

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

// GET /v1/events finds what became of the tenant's mail to an address:
// the newest events naming it, in any case, of its own tenant only, by
// type and since; a malformed query is a 400 naming the parameter.
func TestListEventsByRecipient(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	pub := func(typ, tenant, id, rcpt string, at time.Time) {
		t.Helper()
		if err := f.q.PublishEvent(ctx, typ, &queue.Event{ID: id, Tenant: tenant, Dest: "example.net", Recipients: []string{rcpt}, Time: at}); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now().UTC()
	pub(queue.EventDelivered, "acme", "old", "ann@example.net", now.Add(-48*time.Hour)) // stored now, dated two days ago
	pub(queue.EventDelivered, "acme", "m1", "Ann@Example.net", now)
	pub(queue.EventBounced, "acme", "m2", "ann@example.net", now)
	pub(queue.EventDelivered, "other", "m3", "ann@example.net", now)
	pub(queue.EventDelivered, "acme", "m4", "bob@example.net", now)

	ids := func(path string) (string, int) {
		t.Helper()
		r := f.do(t, "GET", path, f.key, nil, nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.raw)
		}
		var out []string
		evs, _ := r.json["events"].([]any)
		for _, ev := range evs {
			out = append(out, ev.(map[string]any)["id"].(string))
		}
		return strings.Join(out, ","), int(r.json["scanned"].(float64))
	}
	// since selects by when the event was stored, not by its time field.
	if got, scanned := ids("/v1/events?recipient=ANN@example.net"); got != "old,m1,m2" || scanned == 0 {
		t.Fatalf("events of ann: %q (%d scanned)", got, scanned)
	}
	if got, _ := ids("/v1/events?recipient=ann@example.net&type=bounced"); got != "m2" {
		t.Fatalf("bounced events of ann: %q", got)
	}
	if got, _ := ids("/v1/events?recipient=ann@example.net&limit=1"); got != "m2" {
		t.Fatalf("the newest event of ann: %q", got)
	}
	if got, _ := ids("/v1/events?recipient=ann@example.net&since=" + now.Add(time.Hour).Format(time.RFC3339)); got != "" {
		t.Fatalf("events stored in the future: %q", got)
	}
	if r := f.do(t, "GET", "/v1/events?recipient=nobody@example.net", f.key, nil, nil); r.status != 200 || !strings.Contains(string(r.raw), `"events":[]`) {
		t.Fatalf("no events: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "GET", "/v1/events?recipient=ann@example.net&tenant=other", f.key, nil, nil); r.status != http.StatusForbidden {
		t.Fatalf("another tenant's events: %d %s", r.status, r.raw)
	}
	for _, bad := range []string{"", "recipient=ann@example.net&type=del.ivered", "recipient=ann@example.net&since=yesterday",
		"recipient=ann@example.net&limit=0", "recipient=ann@example.net&limit=1001"} {
		r := f.do(t, "GET", "/v1/events?"+bad, f.key, nil, nil)
		if r.status != http.StatusBadRequest || r.json["type"] != ProblemBadQuery {
			t.Errorf("GET /v1/events?%s: %d %s", bad, r.status, r.raw)
		}
	}
}

// A look-up that cannot finish in SearchTimeout is a 422 that says how far
// it read and how to narrow it.
func TestListEventsTooBroad(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.SearchTimeout = time.Nanosecond })
	r := f.do(t, "GET", "/v1/events?recipient=ann@example.net", f.key, nil, nil)
	if r.status != http.StatusUnprocessableEntity || r.json["type"] != ProblemQueryTooBroad || !strings.Contains(r.json["detail"].(string), "since") {
		t.Fatalf("a look-up out of time: %d %s", r.status, r.raw)
	}
}

// blockingFind is a queue whose FindEvents waits for release, telling
// started when it begins.
type blockingFind struct {
	Queue
	started chan struct{}
	release chan struct{}
}

func (b *blockingFind) FindEvents(ctx context.Context, q queue.EventQuery) ([]queue.Event, int, error) {
	b.started <- struct{}{}
	<-b.release
	return nil, 0, nil
}

// Look-ups run one at a time per key, tenantSearches at once for the keys
// of one tenant, and maxSearches at once in the process; past any of them
// the answer is too-many-searches with Retry-After (429 for the key's or
// its tenant's own, 503 for a full server). A tenant with as many keys as
// the process has room does not take it all: another tenant's look-up
// still runs.
func TestListEventsConcurrency(t *testing.T) {
	bf := &blockingFind{started: make(chan struct{}, 16), release: make(chan struct{})}
	f := newFixture(t, func(c *Config) { bf.Queue = c.Queue; c.Queue = bf })
	// A failure leaves look-ups blocked: release them before the server
	// closes, which waits for its handlers.
	var once sync.Once
	release := func() { once.Do(func() { close(bf.release) }) }
	t.Cleanup(release)
	ctx := context.Background()
	newKey := func(tenant string) string {
		t.Helper()
		k, _, err := f.srv.Keys().Create(ctx, tenant, false)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	acme := []string{f.key}
	for range maxSearches - 1 {
		acme = append(acme, newKey("acme"))
	}
	other := []string{newKey("other"), newKey("other")}
	third := newKey("third")

	// try sends a look-up: admitted, it is running (its status comes on
	// done once released); refused, its answer.
	done := make(chan int, 16)
	admitted := 0
	try := func(k string) (bool, response) {
		t.Helper()
		res := make(chan response, 1)
		go func() {
			r := f.do(t, "GET", "/v1/events?recipient=ann@example.net", k, nil, nil)
			if r.status == http.StatusOK {
				done <- r.status
			}
			res <- r
		}()
		select {
		case <-bf.started:
			admitted++
			return true, response{}
		case r := <-res:
			return false, r
		case <-time.After(30 * time.Second):
			t.Fatal("a look-up neither ran nor was refused within 30s")
			return false, response{}
		}
	}
	refused := func(what, k string, status int) {
		t.Helper()
		ok, r := try(k)
		if ok {
			t.Fatalf("%s: admitted, want %d %s", what, status, ProblemSearchBusy)
		}
		if r.status != status || r.json["type"] != ProblemSearchBusy || r.header.Get("Retry-After") == "" || r.json["retry_after"] == nil {
			t.Fatalf("%s: %d %s %q, want %d %s with Retry-After", what, r.status, r.raw, r.header.Get("Retry-After"), status, ProblemSearchBusy)
		}
	}
	admit := func(what, k string) {
		t.Helper()
		if ok, r := try(k); !ok {
			t.Fatalf("%s: refused, %d %s", what, r.status, r.raw)
		}
	}

	for i := range tenantSearches {
		admit("acme's look-up within its share", acme[i])
	}
	refused("the same key again", acme[0], http.StatusTooManyRequests)
	refused("acme's look-up past its share", acme[tenantSearches], http.StatusTooManyRequests)
	// acme's slow look-ups leave the rest to the other tenants.
	for i := range maxSearches - tenantSearches {
		admit("another tenant's look-up beside acme's", other[i])
	}
	refused("a look-up of a third tenant in a full server", third, http.StatusServiceUnavailable)

	release()
	for range admitted {
		if s := <-done; s != http.StatusOK {
			t.Fatalf("a look-up within the limits: %d", s)
		}
	}
	for _, k := range []string{acme[tenantSearches], third} {
		if r := f.do(t, "GET", "/v1/events?recipient=ann@example.net", k, nil, nil); r.status != http.StatusOK {
			t.Fatalf("after the others ended: %d %s", r.status, r.raw)
		}
	}
}
