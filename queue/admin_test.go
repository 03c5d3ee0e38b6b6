package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// deferOne enqueues one message, pulls it and reschedules it on lane at at.
func deferOne(t *testing.T, q *Queue, lane Lane, at time.Time) *Envelope {
	t.Helper()
	ctx := context.Background()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work, err := q.Messages(cctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 1
	n.LastClass = "transient"
	if err := d.Reschedule(ctx, n, lane, at, true); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestFastForwardIsAtomic(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	items, err := q.List(ctx, Filter{State: StateDeferred})
	if err != nil || len(items) != 1 || items[0].Env.ID != e.ID || items[0].NextAt.Before(time.Now().Add(50*time.Minute)) {
		t.Fatalf("list deferred = %+v, %v", items, err)
	}
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	if _, err := q.FastForward(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	d := next(t, retry)
	if d.Env.ID != e.ID || d.Env.Attempt != 1 || string(d.Env.Body) != "Subject: x\r\n\r\nbody\r\n" {
		t.Fatalf("fast-forwarded envelope = %+v (body %q)", d.Env, d.Env.Body)
	}
	// The schedule is gone: a second fast-forward moves nothing, it only
	// reports the envelope as already due.
	if it, err := q.FastForward(ctx, e.ID); err != nil || !it.Due {
		t.Fatalf("second fast-forward: %+v, %v; want already due", it, err)
	}

	if err := d.Skip(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Find(ctx, e.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after ack, find = %v, want not found", err)
	}
}

// TestListDestIgnoresCase: --dest takes a domain as an operator types it;
// "D.Example." lists the mail of d.example, as dest suspend and dest
// status treat it.
func TestListDestIgnoresCase(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	for _, dest := range []string{"d.example", "D.Example", "d.example.", " D.EXAMPLE. "} {
		items, err := q.List(ctx, Filter{State: StateDeferred, Dest: dest})
		if err != nil || len(items) != 1 || items[0].Env.ID != e.ID {
			t.Errorf("list --dest %q = %d items, %v; want %s", dest, len(items), err, e.ID)
		}
	}
	if items, err := q.List(ctx, Filter{State: StateDeferred, Dest: "other.example"}); err != nil || len(items) != 0 {
		t.Errorf("list --dest other.example = %d items, %v; want none", len(items), err)
	}
}

// TestListByRecipient: --rcpt lists the waiting mail to an address, in
// any case, in every lane.
func TestListByRecipient(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deferred := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour)) // to r@d.example
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"Ann@one.example", "bob@two.example"},
		Body: []byte("Subject: x\r\n\r\nx\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	for rcpt, want := range map[string][]string{"ann@ONE.example": {ids[0]}, "bob@two.example": {ids[1]}, "<r@d.example>": {deferred.ID}, "joann@one.example": nil} {
		items, err := q.List(ctx, Filter{Rcpt: rcpt})
		var got []string
		for _, it := range items {
			got = append(got, it.Env.ID)
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("list --rcpt %q = %v, %v; want %v", rcpt, got, err, want)
		}
	}
}

func TestDeadReplayAndDrop(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\nFrom: bad\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 5
	n.AddAttempt(Attempt{Attempt: 5, Class: "transient", Reply: "451 try later"})
	if err := d.Dead(ctx, n, "max-attempts"); err != nil {
		t.Fatal(err)
	}
	it, err := q.Find(ctx, n.ID)
	if err != nil || it.State != StateDead || it.DeadReason != "max-attempts" || len(it.Env.History) != 1 {
		t.Fatalf("dead item = %+v, %v", it, err)
	}
	if _, err := q.FastForward(ctx, n.ID); !errors.Is(err, ErrWrongState) {
		t.Fatalf("fast-forward of a dead letter: %v, want ErrWrongState", err)
	}
	e, err := q.Replay(ctx, n.ID, []byte("From: fixed@b.example\n"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Attempt != 0 || e.Replays != 1 {
		t.Fatalf("replayed envelope keeps its old budget: %+v", e)
	}
	r := next(t, work)
	if r.Env.ID != n.ID || r.Env.Attempt != 0 {
		t.Fatalf("replayed = %+v", r.Env)
	}
	body, err := q.EnvelopeBody(ctx, r.Env)
	if err != nil || !strings.Contains(string(body), "From: fixed@b.example\r\n") || strings.Contains(string(body), "From: bad") {
		t.Fatalf("edited body = %q, %v", body, err)
	}
	if _, err := q.Find(ctx, n.ID); err != nil {
		t.Fatalf("replayed envelope should be queued: %v", err)
	}
	if _, err := q.Drop(ctx, n.ID); err != nil {
		t.Fatal(err)
	}
	hist, err := q.History(ctx, n.ID, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	for _, ev := range hist {
		types = append(types, ev.Type)
	}
	if got := strings.Join(types, ","); !strings.Contains(got, "queued") || !strings.Contains(got, "replayed") || !strings.Contains(got, "dropped") {
		t.Fatalf("history = %s", got)
	}
}

func TestReleaseDestPacesOldestFirst(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ids []string
	for range 3 {
		ids = append(ids, deferOne(t, q, LaneRetry, time.Now().Add(time.Hour)).ID)
	}
	r, err := q.ReleaseDest(ctx, "", "d.example", nil, 10, 0)
	n := len(r)
	if err != nil || n != 3 {
		t.Fatalf("released %d, %v", len(r), err)
	}
	retry, _ := q.Messages(ctx, LaneRetry, 3)
	var got []string
	for range 3 {
		d := next(t, retry)
		got = append(got, d.Env.ID)
		if string(d.Env.Body) != "Subject: x\r\n\r\nbody\r\n" {
			t.Fatalf("released envelope lost its inline body: %q", d.Env.Body)
		}
		_ = d.Skip(ctx)
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("release order %v, want oldest first %v", got, ids)
	}
}

// TestReplayedBodiesReleased: a replay with edited headers edits the
// unsigned body (never a DKIM-signed copy) into a copy for that envelope
// alone; a later edit replaces that copy; and when the envelope is
// delivered its copies and the (single-part) original are all deleted.
func TestReplayedBodiesReleased(t *testing.T) {
	q, _ := startQueueWith(t, Options{InlineBodyMax: -1}) // bodies in the Object Store
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	stored := func(ref string) bool { t.Helper(); return bodyStored(t, ctx, q, ref) }
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	// take pulls the envelope and signs its current body as a worker with
	// a DKIM key does: a signed copy, named for the envelope.
	take := func() *Delivery {
		t.Helper()
		d := next(t, work)
		body, err := q.Body(ctx, d.Env.BodyRef)
		if err != nil {
			t.Fatal(err)
		}
		ref := SignedBodyRef(d.Env)
		if err := q.PutBody(ctx, ref, append([]byte("DKIM-Signature: v=1\r\n"), body...)); err != nil {
			t.Fatal(err)
		}
		d.Env.BodyRef, d.Env.Signed = ref, true
		return d
	}
	replay := func(d *Delivery, edit string) (*Envelope, string) {
		t.Helper()
		signed := d.Env.BodyRef
		if err := d.Dead(ctx, d.Env.Clone(), "max-attempts"); err != nil {
			t.Fatal(err)
		}
		// A worker quick enough to sign the replayed envelope before
		// Replay deletes the dead letter's copy: its copy stays.
		ahead := d.Env.Clone()
		ahead.Replays++
		if err := q.PutBody(ctx, SignedBodyRef(ahead), []byte("DKIM-Signature: v=1\r\n\r\nearly\r\n")); err != nil {
			t.Fatal(err)
		}
		e, err := q.Replay(ctx, ids[0], []byte(edit))
		if err != nil {
			t.Fatal(err)
		}
		if !stored(SignedBodyRef(ahead)) {
			t.Fatal("the replay deleted the copy a worker signed for the replayed envelope")
		}
		if e.Signed || e.BodyRef != EditedBodyRef(e) {
			t.Fatalf("replayed envelope: body %q signed %v; want its own unsigned copy", e.BodyRef, e.Signed)
		}
		if stored(signed) {
			t.Fatal("the replaced signed copy is still stored")
		}
		if !stored(e.MsgID) {
			t.Fatal("the original was deleted by the replay")
		}
		body, err := q.Body(ctx, e.BodyRef)
		if err != nil {
			t.Fatal(err)
		}
		return e, string(body)
	}

	_, body := replay(take(), "X-Fixed: 1\n")
	if strings.Contains(body, "DKIM-Signature") || !strings.Contains(body, "X-Fixed: 1\r\n") {
		t.Fatalf("first edit = %q; want the original, unsigned, with X-Fixed: 1", body)
	}
	e, body := replay(take(), "X-Again: 2\n")
	if strings.Contains(body, "DKIM-Signature") || !strings.Contains(body, "X-Fixed: 1\r\n") || !strings.Contains(body, "X-Again: 2\r\n") {
		t.Fatalf("second edit = %q; want the first edit, unsigned, with X-Again: 2", body)
	}

	d := take()
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []string{d.Env.BodyRef, EditedBodyRef(e), e.MsgID} {
		if stored(ref) {
			t.Errorf("after delivery %s is still stored", ref)
		}
	}
}

// TestEditHeaders: a name set replaces every field of that name, "Name:"
// removes them, a name on several lines gives one field per line, and a
// name both removed and set is refused rather than resolved silently.
func TestEditHeaders(t *testing.T) {
	body := []byte("From: a@src.example\r\nSubject: old\r\nX-Tag: 1\r\nX-Tag: 2\r\nComments: c\r\n\r\nbody\r\n")
	got, err := EditHeaders(body, []byte("subject: new\nX-Tag:\n# a comment\nComments: one\r\nComments: two\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := "From: a@src.example\r\nsubject: new\r\nComments: one\r\nComments: two\r\n\r\nbody\r\n"
	if string(got) != want {
		t.Errorf("edited:\n%q\nwant\n%q", got, want)
	}
	for _, bad := range []string{"X-Tag: 3\nx-tag:\n", "X-Tag:\nX-Tag: 3\n", "not a header\n", "Bad Name: v\n"} {
		if _, err := EditHeaders(body, []byte(bad)); err == nil {
			t.Errorf("edits %q accepted", bad)
		}
	}
}

// A destination's recovery releases its deferred mail, not mail sent
// later whose time has not come: that waits for its time. An operator's
// fast-forward is refused for it.
func TestReleaseDestLeavesScheduledMail(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	at := time.Now().Add(time.Hour)
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
		Body: []byte("Subject: later\r\n\r\nx\r\n"), SendAt: at})
	if err != nil {
		t.Fatal(err)
	}
	// Nor does an operator's fast-forward (the runbook's loop over the
	// deferred mail of a destination meets it too).
	if _, err := q.FastForward(ctx, ids[0]); !errors.Is(err, ErrWrongState) || !strings.Contains(err.Error(), "send_at") {
		t.Fatalf("fast-forward of mail to be sent in an hour: %v, want ErrWrongState naming send_at", err)
	}
	deferred := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	r, err := q.ReleaseDest(ctx, "", "d.example", nil, 0, 0)
	n := len(r)
	if err != nil || n != 1 {
		t.Fatalf("released %d, %v; want the deferred one only", n, err)
	}
	it, err := q.Find(ctx, ids[0])
	if err != nil || it.NextAt.Sub(at).Abs() > time.Millisecond {
		t.Fatalf("scheduled item %+v, %v: want it still due at %v", it, err, at)
	}
	retry, _ := q.Messages(ctx, LaneRetry, 2)
	if d := next(t, retry); d.Env.ID != deferred.ID {
		t.Fatalf("released %s, want %s", d.Env.ID, deferred.ID)
	}
}

// TestDropRacingItsSchedule: a drop that reads a deferred envelope's
// schedule just before the server fires it into the due subject (it
// stores the due copy and removes the schedule, in milliseconds). The
// drop's delete of the schedule then finds nothing; before, the drop
// stopped there with an error ("no message found"), no dropped event,
// and the due copy waited for a worker, which sent it. Now the drop
// completes, removes the due copy of the same step, and a worker that
// fetched the copy first finds the drop's SENT marker and acknowledges
// it unsent. A schedule a release rewrote meanwhile is removed as well.
func TestDropRacingItsSchedule(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := deferOne(t, q, LaneRetry, time.Now().Add(time.Second))
	it, err := q.Find(ctx, e.ID) // the drop's look: the schedule, not yet fired
	if err != nil || it.Due || it.State != StateDeferred {
		t.Fatalf("find before the firing: %+v, %v", it, err)
	}
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	d := next(t, retry) // fired meanwhile, and fetched by a worker that has not looked at it yet
	if d.Env.ID != e.ID || d.Env.Step != e.Step {
		t.Fatalf("due %+v, want %s at step %d", d.Env, e.ID, e.Step)
	}
	if err := q.drop(ctx, it, "admin"); err != nil { // the rest of the drop
		t.Fatal(err)
	}
	if again, err := q.Find(ctx, e.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the drop the due copy waits on: %+v, %v", again, err)
	}
	if done, err := d.AlreadyHandled(ctx); err != nil || !done {
		t.Fatalf("AlreadyHandled = %v, %v for the dropped message's due copy: a worker sends it", done, err)
	}

	// A release that rewrites the schedule (a new sequence on its
	// subject) between the drop's read and its delete: the new schedule
	// goes too, rather than fire later.
	e = deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	if it, err = q.Find(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if r, err := q.ReleaseDest(ctx, "", "d.example", nil, 0, time.Hour); err != nil || len(r) != 1 {
		t.Fatalf("released %d, %v", len(r), err)
	}
	if err := q.drop(ctx, it, "admin"); err != nil {
		t.Fatal(err)
	}
	if again, err := q.Find(ctx, e.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("after the drop the released schedule waits on: %+v, %v", again, err)
	}
}

// TestDropInFlight: a message dropped while a worker holds it. A sibling
// part of the same submission keeps the body they share, though the drop
// and the worker's delivery both release the dropped part's share; and
// the dropped part's next step (a retry, a hold, a dead letter) is not
// written, so it does not come back. A keyed message submitted again
// later under the same id is not taken for the dropped one.
func TestDropInFlight(t *testing.T) {
	q, _ := startQueueWith(t, Options{InlineBodyMax: -1}) // the parts share a stored body
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("Subject: x\r\n\r\nshared\r\n")
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@one.example", "s@two.example"}, Body: body})
	if err != nil || len(ids) != 2 {
		t.Fatal(ids, err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	d := next(t, work)
	if _, err := q.DropBy(ctx, d.Env.ID, "api"); err != nil {
		t.Fatal(err)
	}
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	sibling := next(t, work)
	if got, err := q.EnvelopeBody(ctx, sibling.Env); err != nil || string(got) != string(body) {
		t.Fatalf("sibling %s's body: %q, %v", sibling.Env.ID, got, err)
	}
	if err := sibling.Delivered(ctx, sibling.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	if bodyStored(t, ctx, q, sibling.Env.MsgID) {
		t.Fatal("the body outlived its last part")
	}

	// Each of the next steps, after a drop, writes nothing and acknowledges.
	steps := map[string]func(d *Delivery) error{
		"reschedule": func(d *Delivery) error {
			n := d.Env.Clone()
			n.Attempt = 1
			return d.Reschedule(ctx, n, LaneRetry, time.Now().Add(time.Hour), true)
		},
		"hold": func(d *Delivery) error { return d.Hold(ctx, d.Env.Clone()) },
		"dead": func(d *Delivery) error { return d.Dead(ctx, d.Env.Clone(), "max-attempts") },
	}
	for name, step := range steps {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@one.example"}, Body: body,
			IdempotencyKey: "drop-" + name})
		if err != nil {
			t.Fatal(err)
		}
		d := next(t, work)
		if _, err := q.DropBy(ctx, ids[0], "api"); err != nil {
			t.Fatal(err)
		}
		if err := step(d); err != nil || !d.Dropped(ctx) {
			t.Fatalf("%s after the drop: %v (dropped %v)", name, err, d.Dropped(ctx))
		}
		if it, err := q.Find(ctx, ids[0]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: the dropped message is back as %+v (%v)", name, it, err)
		}
		// The same key's message submitted again, as after the window:
		// another submission time, not dropped.
		again := d.Env.Clone()
		again.SubmittedAt = again.SubmittedAt.Add(25 * time.Hour)
		if (&Delivery{Env: again, q: q}).Dropped(ctx) {
			t.Fatalf("%s: a later submission under the same id counts as dropped", name)
		}
	}
}

// TestReleaseDestOnTheServersClock: a release is written on the NATS
// server's clock, which fires it: a process whose clock is an hour behind
// the server's (offset +1h) writes "now" an hour later than its own.
func TestReleaseDestOnTheServersClock(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := deferOne(t, q, LaneRetry, time.Now().Add(2*time.Hour))
	if r, err := q.ReleaseDest(ctx, "", "d.example", nil, 0, time.Hour); err != nil || len(r) != 1 {
		t.Fatalf("released %d, %v", len(r), err)
	}
	it, err := q.Find(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(it.NextAt); d < 59*time.Minute || d > 61*time.Minute {
		t.Fatalf("released to fire in %v, want an hour (the server's now)", d)
	}
}

// TestListAll: a negative Limit lists every match (queue list --limit 0,
// which the runbook's drop and replay loops use); 0 means 100.
func TestListAll(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 105 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{fmt.Sprintf("r%d@d.example", i)}, Body: []byte("x\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	if all, err := q.List(ctx, Filter{Tenant: "t", Limit: -1}); err != nil || len(all) != 105 {
		t.Fatalf("Limit -1: %d, %v; want all 105", len(all), err)
	}
	if page, err := q.List(ctx, Filter{Tenant: "t"}); err != nil || len(page) != 100 {
		t.Fatalf("Limit 0: %d, %v; want 100", len(page), err)
	}
}

// TestListNewestDead: the console's dead letters page reads the newest
// first from the end of the stream, so the newest are on it however many
// are older, and one replayed since (a gap) is skipped.
func TestListNewestDead(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var dead []string
	for i := range 6 {
		rcpt := "r@a.example"
		if i%2 == 1 {
			rcpt = "r@b.example"
		}
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{rcpt}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	for range 6 {
		d := next(t, work)
		if err := d.Dead(ctx, d.Env.Clone(), "max-attempts"); err != nil {
			t.Fatal(err)
		}
		dead = append(dead, d.Env.ID)
	}
	if _, err := q.Replay(ctx, dead[5], nil); err != nil { // the newest leaves a gap
		t.Fatal(err)
	}
	ids := func(f Filter) []string {
		t.Helper()
		items, err := q.List(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, it := range items {
			if it.State != StateDead {
				t.Errorf("%s listed as %s", it.Env.ID, it.State)
			}
			out = append(out, it.Env.ID)
		}
		return out
	}
	defer func(w uint64) { scanBackWindow = w }(scanBackWindow)
	for _, w := range []uint64{512, 2, 1} { // one window, and several across the gap
		scanBackWindow = w
		if got, want := ids(Filter{State: StateDead, Newest: true, Limit: 2}), []string{dead[4], dead[3]}; !slices.Equal(got, want) {
			t.Errorf("window %d: newest 2 = %v, want %v", w, got, want)
		}
		if got, want := ids(Filter{State: StateDead, Newest: true, Dest: "a.example", Limit: 10}), []string{dead[4], dead[2], dead[0]}; !slices.Equal(got, want) {
			t.Errorf("window %d: a.example's, newest first = %v, want %v", w, got, want)
		}
	}
	if _, err := q.List(ctx, Filter{State: StateDeferred, Newest: true}); err == nil {
		t.Error("newest first of the retry lane: no error")
	}
}

// TestListByGroup: `queue list --dest google` finds the envelopes a worker
// last found in that provider group, whatever their domains, and a domain
// still finds its own; so does an MX site's name.
func TestListByGroup(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, rcpt := range []string{"r@a.example", "r@b.example", "r@c.example"} {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{rcpt}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
			t.Fatal(err)
		}
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	byDest := map[string]string{}
	for range 3 {
		d := next(t, work)
		n := d.Env.Clone()
		if n.Dest != "c.example" {
			n.Group = "google"
		} else {
			n.Group = "mx:mx1.hoster.example"
		}
		if err := d.Reschedule(ctx, n, LaneRetry, time.Now().Add(time.Hour), true); err != nil {
			t.Fatal(err)
		}
		byDest[n.Dest] = n.ID
	}
	list := func(dest string) []string {
		t.Helper()
		items, err := q.List(ctx, Filter{State: StateDeferred, Dest: dest})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, it := range items {
			out = append(out, it.Env.Dest)
		}
		slices.Sort(out)
		return out
	}
	if got := list("Google"); !slices.Equal(got, []string{"a.example", "b.example"}) {
		t.Errorf("group google: %v, want a.example and b.example", got)
	}
	if got := list("a.example"); !slices.Equal(got, []string{"a.example"}) {
		t.Errorf("domain a.example: %v", got)
	}
	if got := list("microsoft"); len(got) != 0 {
		t.Errorf("group microsoft: %v, want none", got)
	}
	if got := list("MX:mx1.hoster.example"); !slices.Equal(got, []string{"c.example"}) {
		t.Errorf("site mx:mx1.hoster.example: %v, want c.example", got)
	}
}
