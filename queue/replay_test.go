package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// deadOne enqueues s, pulls its first envelope from work and parks it in
// dead letters.
func deadOne(t *testing.T, q *Queue, work <-chan *Delivery, s *Submission) *Envelope {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, s); err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 5
	n.AddAttempt(Attempt{Attempt: 5, Class: "transient", Reply: "451 try later"})
	if err := d.Dead(ctx, n, "max-attempts"); err != nil {
		t.Fatal(err)
	}
	return n
}

// near fails unless got is within a minute of want.
func near(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if d := got.Sub(want); d < -time.Minute || d > time.Minute {
		t.Errorf("%s deadline %v, want about %v (%v off)", what, got.Format(time.RFC3339), want.Format(time.RFC3339), d)
	}
}

// TestAdminStampsTheDaemonsDeadline: a daemon started with --max-age 72h
// publishes it, and an admin client (NoSetup, as `outflow queue replay`
// and `outflow submit` connect, perhaps with --nats-url alone) stamps a
// replayed or submitted message's deadline 72 hours on, not the 24-hour
// default.
func TestAdminStampsTheDaemonsDeadline(t *testing.T) {
	const maxAge = 72 * time.Hour
	q, emb := startQueueWith(t, Options{DeadlineAfter: maxAge})
	admin, err := connectTo(emb, Options{NoSetup: true})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if admin.opts.DeadlineAfter != maxAge {
		t.Errorf("admin client's DeadlineAfter = %v, want the daemon's %v", admin.opts.DeadlineAfter, maxAge)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	dead := deadOne(t, q, work, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")})
	e, err := admin.Replay(ctx, dead.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	near(t, "replayed", e.Deadline, time.Now().Add(maxAge))
	if r := next(t, work); r.Env.ID != dead.ID {
		t.Fatalf("replayed %s, got %s", dead.ID, r.Env.ID)
	} else {
		near(t, "replayed (stored)", r.Env.Deadline, time.Now().Add(maxAge))
	}

	if _, err := admin.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"s@d.example"}, Body: []byte("Subject: y\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	near(t, "submitted", next(t, work).Env.Deadline, time.Now().Add(maxAge))

	// A client given its own budget keeps it.
	own, err := connectTo(emb, Options{NoSetup: true, DeadlineAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	if own.opts.DeadlineAfter != time.Hour {
		t.Errorf("a client given DeadlineAfter 1h has %v", own.opts.DeadlineAfter)
	}
}

// TestReplayRefusesSuppressed: a recipient suppressed since the message
// died (its own hard bounce, a complaint) is not sent to by a replay: the
// replay is refused, naming the address, and nothing is queued; asked to
// include suppressed recipients, it queues the message.
func TestReplayRefusesSuppressed(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	dead := deadOne(t, q, work, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"ok@d.example", "Gone@d.example"},
		Body: []byte("Subject: x\r\n\r\nbody\r\n")})
	list, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := list.Add(ctx, Suppression{Tenant: "t", Address: "gone@D.example", Source: SuppressBounce, Reason: "550 5.1.1 no such user"}); err != nil {
		t.Fatal(err)
	}
	// Another tenant's entry for the other address does not count.
	if err := list.Add(ctx, Suppression{Tenant: "other", Address: "ok@d.example", Source: SuppressAdmin}); err != nil {
		t.Fatal(err)
	}
	_, err = q.Replay(ctx, dead.ID, nil)
	var sup *SuppressedError
	if !errors.Is(err, ErrSuppressed) || !errors.As(err, &sup) || len(sup.Rcpts) != 1 || sup.Rcpts[0] != "Gone@d.example" ||
		!strings.Contains(err.Error(), "Gone@d.example") {
		t.Fatalf("replay to a suppressed recipient: %v, want ErrSuppressed naming Gone@d.example", err)
	}
	if it, err := q.Find(ctx, dead.ID); err != nil || it.State != StateDead {
		t.Fatalf("after the refusal: %+v, %v; want still dead", it, err)
	}
	if items, err := q.List(ctx, Filter{State: StateQueued}); err != nil || len(items) != 0 {
		t.Fatalf("after the refusal %d queued, %v; want none", len(items), err)
	}
	e, err := q.ReplayWith(ctx, dead.ID, ReplayOptions{IncludeSuppressed: true})
	if err != nil {
		t.Fatal(err)
	}
	if r := next(t, work); r.Env.ID != dead.ID || len(r.Env.Rcpts) != 2 || e.Replays != 1 {
		t.Fatalf("replayed with --include-suppressed: %+v", r.Env)
	}
}

// TestReleasedBodiesLeaveNoSubjects: a body released once its envelopes
// are done leaves nothing in the body stream, neither its chunk nor a
// deleted marker for its info: each marker stayed for the bucket's TTL
// (19 days), one subject of the server's index per released body.
func TestReleasedBodiesLeaveNoSubjects(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 20
	work, err := q.Messages(ctx, LaneWork, 8)
	if err != nil {
		t.Fatal(err)
	}
	var msgIDs []string
	for i := range n {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example",
			Rcpts: []string{"x@one.example", "y@two.example"}, Body: []byte(fmt.Sprintf("Subject: %d\r\n\r\nhello\r\n", i))})
		if err != nil || len(ids) != 2 {
			t.Fatalf("enqueue: %v %v", ids, err)
		}
		msgIDs = append(msgIDs, strings.TrimSuffix(ids[0], "-1"))
	}
	subjects := func() uint64 {
		t.Helper()
		info, err := q.bodyStream.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.NumSubjects
	}
	if got := subjects(); got != 2*n {
		t.Fatalf("%d subjects in the body stream with %d bodies stored, want %d (info and chunk each)", got, n, 2*n)
	}
	for range 2 * n {
		d := next(t, work)
		if d.Env.Inline() {
			t.Fatalf("%s carries its body: want it stored apart", d.Env.ID)
		}
		if _, err := q.EnvelopeBody(ctx, d.Env); err != nil {
			t.Fatal(err)
		}
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range msgIDs {
		if gone, err := q.BodyGone(ctx, id); err != nil || !gone {
			t.Fatalf("BodyGone(%s) after every part was delivered: %v, %v", id, gone, err)
		}
		if _, err := q.Body(ctx, id); !errors.Is(err, ErrBodyMissing) {
			t.Fatalf("Body(%s) after release: %v, want ErrBodyMissing", id, err)
		}
	}
	if got := subjects(); got != 0 {
		t.Fatalf("%d subjects left in the body stream after every body was released, want 0", got)
	}
	// Stored again under a released name, a body is there to read.
	if err := q.PutBody(ctx, msgIDs[0], []byte("again\r\n")); err != nil {
		t.Fatal(err)
	}
	if b, err := q.Body(ctx, msgIDs[0]); err != nil || string(b) != "again\r\n" {
		t.Fatalf("a body stored again after its release: %q, %v", b, err)
	}
}

// TestReleaseDestReportsEachEnvelope: a recovered destination's release
// reports every envelope it re-timed, with the time written to its
// schedule, and records a released event for each, which `queue history`
// shows: a postmortem had a count in one log line and no way to tell when
// each message was given its new time.
func TestReleaseDestReportsEachEnvelope(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for range 2 {
		ids = append(ids, deferOne(t, q, LaneRetry, time.Now().Add(2*time.Hour)).ID)
	}
	ids = append(ids, deferOne(t, q, LaneRateLimit, time.Now().Add(2*time.Hour)).ID)
	// An hour's clock offset keeps the released schedules from firing
	// while the test reads them.
	released, err := q.ReleaseDest(ctx, "w1", "d.example", nil, 2, time.Hour)
	if err != nil || len(released) != 3 {
		t.Fatalf("released %d, %v; want 3 records", len(released), err)
	}
	items, err := q.List(ctx, Filter{Dest: "d.example"})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]Item{}
	for _, it := range items {
		byID[it.Env.ID] = it
	}
	for i, r := range released {
		it, ok := byID[r.ID]
		switch {
		case r.ID != ids[i] || r.Position != i+1 || r.Of != 3 || r.Dest != "d.example" || r.Tenant != "t":
			t.Errorf("record %d = %+v, want %s at position %d of 3", i, r, ids[i], i+1)
		case !ok:
			t.Errorf("released %s is not waiting", r.ID)
			continue
		}
		wantLane := LaneRetry
		if i == 2 {
			wantLane = LaneRateLimit
		}
		if r.Lane != wantLane {
			t.Errorf("%s released on the %s lane, want %s", r.ID, r.Lane, wantLane)
		}
		at := r.At.Format(time.RFC3339Nano)
		if got := it.Header.Get(HdrNotBefore); got != at {
			t.Errorf("%s: %s header %s, record says %s", r.ID, HdrNotBefore, got, at)
		}
		if got := it.Header.Get("Nats-Schedule"); got != "@at "+at {
			t.Errorf("%s: Nats-Schedule %q, record says %s", r.ID, got, at)
		}
		if want := released[0].At.Add(time.Duration(i) * 500 * time.Millisecond); !r.At.Equal(want) {
			t.Errorf("%s at %v, want %v (paced at 2/s)", r.ID, r.At, want)
		}
		hist, err := q.History(ctx, r.ID, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		var ev *Event
		for k := range hist {
			if hist[k].Type == EventReleased {
				ev = &hist[k]
			}
		}
		if ev == nil || ev.Worker != "w1" || ev.Dest != "d.example" || !strings.Contains(ev.Reason, at) ||
			!strings.Contains(ev.Reason, fmt.Sprintf("%d of 3 at 2/s", i+1)) {
			t.Errorf("%s: released event %+v, want one by w1 naming %s", r.ID, ev, at)
		}
	}
	// `queue find ADDRESS --type released` (the runbook's look at what a
	// resume re-timed) finds them by their recipient.
	found, _, err := q.FindEvents(ctx, EventQuery{Rcpt: "r@d.example", Types: []string{EventReleased}})
	if err != nil || len(found) != 3 {
		t.Errorf("find released by recipient: %d events, %v; want 3", len(found), err)
	}
}

// TestListIDNDest: mail to an internationalised domain is queued under its
// A-labels (submission takes ASCII addresses), and `queue list --dest` or
// `--rcpt` typed with the Unicode name finds it.
func TestListIDNDest(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"ann@xn--bcher-kva.example"},
		Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []Filter{{Dest: "bücher.example"}, {Dest: " Bücher.Example. "}, {Dest: "xn--bcher-kva.example"},
		{Rcpt: "ann@bücher.example"}, {Rcpt: "<Ann@BÜCHER.example>"}, {Rcpt: "ann@xn--bcher-kva.example"}} {
		items, err := q.List(ctx, f)
		if err != nil || len(items) != 1 || items[0].Env.Dest != "xn--bcher-kva.example" {
			t.Errorf("list %+v = %d items, %v; want the message to xn--bcher-kva.example", f, len(items), err)
		}
	}
	if items, err := q.List(ctx, Filter{Dest: "bucher.example"}); err != nil || len(items) != 0 {
		t.Errorf("list --dest bucher.example = %d items, %v; want none", len(items), err)
	}
}

// TestGoneTenantForgotten: a worker process forgets a tenant whose work
// consumer is gone (removed as idle by the server, or by an operator) at
// its next look, both the pull handle and the record that the consumer was
// made, so neither grows with every tenant ever seen; the tenant's next
// mail makes the consumer again at once and is delivered. Handles and
// records idle past the consumers' idle time go as well.
func TestGoneTenantForgotten(t *testing.T) {
	q, _ := startQueue(t)
	q.times.wait, q.times.refresh = 200*time.Millisecond, time.Hour // looks only when called here, and the first
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	enqueue := func(tenant string) string {
		t.Helper()
		ids, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@a.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	remembered := func(tenant string) bool {
		q.tenants.mu.Lock()
		defer q.tenants.mu.Unlock()
		return q.tenants.seen[tenant] != nil
	}
	// A puller that starts no loops (closed), looked with by hand.
	p := &workPuller{q: q, ctx: ctx, buffer: 1, out: make(chan *Delivery), tenants: map[string]*tenantPull{},
		look: make(chan struct{}, 1), unknown: make(chan string, 8), closed: true}
	if _, err := q.ensureTenant(ctx, "gone"); err != nil { // a tenant that sent, its mail delivered
		t.Fatal(err)
	}
	enqueue("other") // mail waiting: the look lists the consumers
	for _, tenant := range []string{"gone", "other"} {
		if err := p.add(tenantConsumer(tenant)); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.js.DeleteConsumer(ctx, StreamWork, tenantConsumer("gone")); err != nil {
		t.Fatal(err)
	}
	if _, err := p.lookAll(); err != nil {
		t.Fatal(err)
	}
	if p.tenants[tenantConsumer("gone")] != nil || remembered("gone") {
		t.Errorf("after a look, the tenant whose consumer is gone is still known: handle %v, remembered %v",
			p.tenants[tenantConsumer("gone")] != nil, remembered("gone"))
	}
	if p.tenants[tenantConsumer("other")] == nil || !remembered("other") {
		t.Errorf("the look forgot a tenant whose consumer is there")
	}
	// Its next mail makes its consumer, before any look.
	id := enqueue("gone")
	if _, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("gone")); err != nil {
		t.Fatalf("the forgotten tenant's next mail did not make its consumer: %v", err)
	}
	work, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{id: true}
	for range 2 { // gone's and other's
		d := next(t, work)
		delete(want, d.Env.ID)
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(want) != 0 {
		t.Fatalf("the forgotten tenant's new mail %s was not delivered", id)
	}

	// Idle past the consumers' idle time: forgotten too.
	now := time.Now().Add(q.tenantIdle() + time.Minute)
	p.pruneHandles(nil, time.Now(), now)
	q.pruneTenants(nil, time.Now(), now)
	if len(p.tenants) != 0 || remembered("other") || remembered("gone") {
		t.Errorf("idle past %v: %d handles and other remembered %v, gone %v; want none", q.tenantIdle(), len(p.tenants), remembered("other"), remembered("gone"))
	}
}

// Two replays of one dead letter at once (two operators, the console and
// the CLI): the deduplicated publish queues the mail once, and the one
// that came second is told it did nothing, not "queued again".
func TestConcurrentReplayToldItDidNothing(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	dead := deadOne(t, q, work, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
		Body: []byte("Subject: x\r\n\r\nbody\r\n")})
	// The other replay's publish, as it lands between this one's look
	// at the dead letter and its own publish: the same deduplication id,
	// on a subject this one's look does not read (as the other's was not
	// there yet when it looked).
	other := dead.Clone()
	other.Replays, other.Step = dead.Replays+1, dead.Step+1
	m, err := other.Encode(workSubject(other.Tenant, other.Dest, "other"+other.ID))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.js.PublishMsg(ctx, m, jetstream.WithMsgID("replay."+other.ID+"."+itoa(other.Replays))); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Replay(ctx, dead.ID, nil); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "another operator") {
		t.Fatalf("the second replay: %v, want told it did nothing", err)
	}
	if evs, _ := q.History(ctx, dead.ID, time.Time{}); countType(evs, EventReplayed) != 0 {
		t.Fatalf("the second replay wrote a replayed event: %v", evs)
	}
}

func countType(evs []Event, typ string) int {
	n := 0
	for _, ev := range evs {
		if ev.Type == typ {
			n++
		}
	}
	return n
}
