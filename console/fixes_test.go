package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/mailhdr"
	"github.com/outflow/outflow/queue"
)

// A replay's header edits that cannot be applied are the operator's input
// to fix: 400 with the reason, at the confirmation and at the replay, and
// the dead letter stays. Edits that can be are replayed, non-ASCII text
// encoded (no raw 8-bit header, which a next hop without SMTPUTF8 bounces).
func TestReplayBadEditsAre400(t *testing.T) {
	q := ownQueue(t)
	f := newFixtureOn(t, q, nil)
	ids := deadLetters(t, q, "edits", 0, 1)
	id := ids[0]
	cl := f.browser(t)
	_, csrf := f.signIn(t, cl, f.admin)
	for _, edits := range []string{"Bad Name: v", "Subject: a\rBcc: x@evil.example", "Subject: a\x00b", "To: Zoé <zoé@d.example>"} {
		for _, confirm := range []string{"", "yes"} {
			res, page := post(t, cl, f.ts.URL+"/ui/messages/"+id+"/replay", url.Values{"csrf": {csrf}, "edits": {edits}, "confirm": {confirm}})
			if res.StatusCode != http.StatusBadRequest || !strings.Contains(html.UnescapeString(page), "the header edits cannot be applied: edit-headers line 1") {
				t.Errorf("edits %q (confirm %q): %d, want 400 with the reason\n%s", edits, confirm, res.StatusCode, page)
			}
		}
	}
	if it, err := q.Find(context.Background(), id); err != nil || it.State != queue.StateDead {
		t.Fatalf("after refused edits: %v %v, want the dead letter kept", it, err)
	}
	res, page := post(t, cl, f.ts.URL+"/ui/messages/"+id+"/replay", url.Values{"csrf": {csrf}, "edits": {"Subject: Réclamation café\r\n"}, "confirm": {"yes"}})
	if res.StatusCode != http.StatusSeeOther {
		t.Fatalf("replay with a non-ASCII Subject: %d\n%s", res.StatusCode, page)
	}
	it, err := q.Find(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	body, err := q.EnvelopeBody(context.Background(), it.Env)
	if err != nil {
		t.Fatal(err)
	}
	if v := mailhdr.Values(body, "Subject"); len(v) != 1 || v[0] != "=?utf-8?q?R=C3=A9clamation_caf=C3=A9?=" {
		t.Errorf("replayed Subject %q, want it in encoded words", v)
	}
}

// chartsOf is the overview's per-minute totals by type.
func chartsOf(r *rates) map[string]int {
	out := map[string]int{}
	for i, s := range r.series() {
		for _, n := range s {
			out[chartTypes[i]] += n
		}
	}
	return out
}

// The charts count recipients for every type: a delivered or deferred
// attempt for the recipients it lists, a bounce for its one; a
// suspension's refusal (a deferred event without an attempt) is no
// deferral.
func TestChartsCountRecipients(t *testing.T) {
	now := time.Now()
	r := newRates(func() time.Time { return now })
	ev := func(e queue.Event) []byte {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	dec := json.RawMessage(`{"attempt":1}`)
	at := now.Add(-2 * time.Minute)
	r.add(queue.EventDelivered, at, ev(queue.Event{ID: "m1", Recipients: []string{"a@d.example", "b@d.example", "c@d.example"}, Decision: dec}))
	r.add(queue.EventDeferred, at, ev(queue.Event{ID: "m2", Recipients: []string{"a@e.example", "b@e.example"}, Decision: dec}))
	r.add(queue.EventDeferred, at, ev(queue.Event{ID: "m3", Recipients: []string{"a@s.example", "b@s.example"}, Reason: "suspended: s.example: by an operator"}))
	r.add(queue.EventThrottled, at, ev(queue.Event{ID: "m4", Recipients: []string{"a@t.example"}, Decision: dec}))
	r.add(queue.EventBounced, at, ev(queue.Event{ID: "m1", Dest: "d.example", Recipients: []string{"d@d.example"}, Reason: "550 5.1.1 no such user", Decision: dec}))
	r.add(queue.EventBounced, at, ev(queue.Event{ID: "m1", Dest: "d.example", Recipients: []string{"e@d.example"}, Reason: "550 5.1.1 no such user", Async: true}))
	want := map[string]int{queue.EventDelivered: 3, queue.EventDeferred: 2, queue.EventThrottled: 1, queue.EventBounced: 2}
	if got := chartsOf(r); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("charts count %v, want %v (recipients; no suspension refusal)", got, want)
	}
	if b := r.recentBounces("d.example", 10); len(b) != 2 || b[0].Reply != "550 5.1.1 no such user" {
		t.Errorf("recent bounces %+v", b)
	}
}

// outcomeEvents are the events of a message that left the lanes: one
// recipient delivered, another bounced, by one attempt.
func outcomeEvents(id string, t0 time.Time) []queue.Event {
	dec := json.RawMessage(`{"attempt":1,"class":"delivered","code":250,"enhanced_code":"2.0.0","reply":"ok queued as 42"}`)
	return []queue.Event{
		{Type: queue.EventQueued, Time: t0, ID: id, Tenant: "outc", Dest: "o.example", Recipients: []string{"ann@o.example", "bob@o.example"}},
		{Type: queue.EventDelivered, Time: t0.Add(time.Second), ID: id, Tenant: "outc", Dest: "o.example", Attempt: 1,
			Recipients: []string{"ann@o.example"}, Decision: dec},
		{Type: queue.EventBounced, Time: t0.Add(time.Second), ID: id, Tenant: "outc", Dest: "o.example", Attempt: 1,
			Recipients: []string{"bob@o.example"}, Reason: "550 5.1.1 bob: no such user", Decision: dec},
	}
}

// A message that has left the lanes shows its last outcome, tenant and
// destination, and each recipient's outcome with its reply; every event
// names its recipients.
func TestMessagePageShowsOutcomes(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	id := fmt.Sprintf("outcome-%d", time.Now().UnixNano())
	for _, ev := range outcomeEvents(id, time.Now().UTC()) {
		if err := f.q.PublishEvent(ctx, ev.Type, &ev); err != nil {
			t.Fatal(err)
		}
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	res, page := get(t, cl, f.ts.URL+"/ui/messages/"+id)
	if res.StatusCode != 200 {
		t.Fatalf("message page: %d\n%s", res.StatusCode, page)
	}
	for _, want := range []string{
		`id="msg-state">bounced</span>`,
		`<dt>tenant</dt><dd>outc</dd>`,
		`<a href="/ui/dests/o.example">o.example</a>`,
		`<tr><td>ann@o.example</td><td><span class="badge delivered">delivered</span></td>`,
		`250 2.0.0 ok queued as 42`,
		`<tr><td>bob@o.example</td><td><span class="badge bounced">bounced</span></td>`,
		`550 5.1.1 bob: no such user`,
		`<td class="rcpts">ann@o.example, bob@o.example</td>`,
		`<td class="rcpts">bob@o.example</td>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("message page lacks %s", want)
		}
	}
	if strings.Contains(page, "Not waiting anywhere") {
		t.Error("the state is not named")
	}
}

// laneAge reads the age shown on the overview for the lane labelled
// label.
func laneAge(t *testing.T, page, label string) time.Duration {
	t.Helper()
	m := regexp.MustCompile(regexp.QuoteMeta(label) + `</a></td><td class="num">\d+</td><td class="num">[^<]*</td><td>([^ <]+) ago`).FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no age for %s on the overview", label)
	}
	d, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The retry lane's oldest is that of its deferred mail, not of the held
// envelopes stored in the same stream (shown on their own line).
func TestOverviewRetryOldestLeavesOutHeld(t *testing.T) {
	q := ownQueue(t)
	f := newFixtureOn(t, q, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	work, err := q.Messages(ctx, queue.LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	take := func(rcpt string) *queue.Delivery {
		if _, err := q.Enqueue(ctx, &queue.Submission{Tenant: "ov", From: "a@b.example", Rcpts: []string{rcpt}, Body: []byte("Subject: x\r\n\r\nx\r\n")}); err != nil {
			t.Fatal(err)
		}
		select {
		case d := <-work:
			return d
		case <-ctx.Done():
			t.Fatal("no delivery")
		}
		return nil
	}
	d := take("r@held.example")
	if err := d.Hold(ctx, d.Env.Clone()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * time.Second)
	d = take("r@deferred.example")
	if err := d.Reschedule(ctx, d.Env.Clone(), queue.LaneRetry, time.Now().Add(time.Hour), true); err != nil {
		t.Fatal(err)
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, page := get(t, cl, f.ts.URL+"/ui/")
	held, retry := laneAge(t, page, "held (unknown outcome)"), laneAge(t, page, "retry (deferred)")
	if held < 3*time.Second || retry > 2*time.Second {
		t.Errorf("oldest held %v, oldest deferred %v: want the deferred one's age (under 2s), not the held one's", held, retry)
	}
}

// The suppressions page keeps the order entries were written in, as the
// API lists them and docs/console.md says: a page is a stretch of the
// list, so sorting it by address would scatter the addresses over pages.
func TestSuppressionsInWriteOrder(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	order := []string{"zed@w.example", "amy@w.example", "max@w.example"}
	for _, a := range order {
		if err := f.c.cfg.Suppressions.Add(ctx, queue.Suppression{Tenant: "writeorder", Address: a, Source: queue.SuppressAdmin}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.c.cfg.Suppressions.Remove(context.Background(), "writeorder", a) })
	}
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, page := get(t, cl, f.ts.URL+"/ui/suppressions?tenant=writeorder")
	var got []string
	for _, m := range regexp.MustCompile(`<td>([a-z]+@w\.example)</td>`).FindAllStringSubmatch(page, -1) {
		got = append(got, m[1])
	}
	if strings.Join(got, " ") != strings.Join(order, " ") {
		t.Errorf("suppressions shown as %v, want the order written %v", got, order)
	}
}

// A replay starts a new run: the timeline draws the attempts since the
// replay, not the old run's dead letter and the new attempts as retries
// of the old run's first failure.
func TestTimelineStartsAgainAtReplay(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	dec := json.RawMessage(`{"attempt":1}`)
	old := []queue.Event{{Type: queue.EventDeferred, Time: t0, Attempt: 1, Decision: dec},
		{Type: queue.EventDeferred, Time: t0.Add(time.Minute), Attempt: 2, Decision: dec},
		{Type: queue.EventDead, Time: t0.Add(5 * time.Minute), Attempt: 3, Decision: dec}}
	replay := queue.Event{Type: queue.EventReplayed, Time: t0.Add(time.Hour)}
	again := []queue.Event{{Type: queue.EventDeferred, Time: t0.Add(time.Hour + time.Second), Attempt: 1, Decision: dec},
		{Type: queue.EventDeferred, Time: t0.Add(time.Hour + 2*time.Minute), Attempt: 2, Decision: dec}}
	got := string(timeline("m1", nil, append(append(append([]queue.Event{}, old...), replay), again...)))
	strips := strings.Count(got, ">attempt ")
	if strips != 1 || !strings.Contains(got, "since its replay at 2026-12-06T11:00:00Z, first failure 2026-12-06T11:00:01Z") {
		t.Errorf("timeline across a replay: %d strips, want the 1 retry since the replay, titled so\n%s", strips, got)
	}
}

// Mail held for its send_at is deferred but not by its destination: no
// fast-forward is offered (queue.FastForward refuses it with 409), and
// the page says why.
func TestNoFastForwardForSendAt(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	ids, err := f.q.Enqueue(ctx, &queue.Submission{Tenant: "later", From: "a@b.example", Rcpts: []string{"r@later.example"},
		Body: []byte("Subject: x\r\n\r\nx\r\n"), SendAt: time.Now().Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = f.q.Drop(context.Background(), ids[0]) })
	cl := f.browser(t)
	f.signIn(t, cl, f.admin)
	_, page := get(t, cl, f.ts.URL+"/ui/messages/"+ids[0])
	if !strings.Contains(page, `id="msg-state">deferred</span>`) {
		t.Fatalf("send_at mail is not deferred:\n%s", page)
	}
	if strings.Contains(page, `id="fast-forward"`) || !strings.Contains(page, `id="no-fast-forward"`) {
		t.Error("fast-forward offered for mail held for its send_at, or no word why not")
	}
}
