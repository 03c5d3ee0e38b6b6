package queue

import (
	"context"
	"strings"
	"testing"
	"time"
)

// operatorEvent returns id's one event of type typ, failing unless there
// is exactly one.
func operatorEvent(t *testing.T, q *Queue, id, typ string) Event {
	t.Helper()
	hist, err := q.History(context.Background(), id, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var found []Event
	for _, ev := range hist {
		if ev.Type == typ {
			found = append(found, ev)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d %s event(s) in %+v, want 1", id, len(found), typ, hist)
	}
	return found[0]
}

// TestOperatorEventsNameWhoAndWhat: a replay, a drop and a fast-forward
// record in their event who did it (worker_id, what `queue history`
// shows and the daemons log as by) and what changed (reason): the budget
// reset and the headers edited, where the message was, its schedule and
// lane. An operator left unnamed (the console) is "admin".
func TestOperatorEventsNameWhoAndWhat(t *testing.T) {
	const by = "admin:ann@ops1"
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// fast-forward: deferred after one attempt, on the retry lane.
	e := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	if _, err := q.FastForwardBy(ctx, e.ID, by); err != nil {
		t.Fatal(err)
	}
	ff := operatorEvent(t, q, e.ID, EventFastFwd)
	if ff.Worker != by || ff.Attempt != 1 || !strings.Contains(ff.Reason, "was deferred after 1 attempt(s), next attempt ") ||
		!strings.Contains(ff.Reason, "retry lane") || len(ff.Recipients) != 1 {
		t.Errorf("fast-forwarded event = %+v, want by %s, attempt 1, the old schedule and lane", ff, by)
	}

	// replay: a dead letter after 5 attempts, its headers edited.
	work, err := q.Messages(ctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	dead := deadOne(t, q, work, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"},
		Body: []byte("Subject: x\r\nX-Bad: 1\r\n\r\nbody\r\n")})
	if _, err := q.ReplayWith(ctx, dead.ID, ReplayOptions{EditHeaders: []byte("Subject: fixed\nX-Bad:\n"), By: by}); err != nil {
		t.Fatal(err)
	}
	rp := operatorEvent(t, q, dead.ID, EventReplayed)
	for _, want := range []string{"attempt budget reset: was dead after 5 attempt(s)", "replay 1, deadline ", "headers set: Subject", "headers removed: X-Bad"} {
		if !strings.Contains(rp.Reason, want) {
			t.Errorf("replayed reason %q lacks %q", rp.Reason, want)
		}
	}
	if rp.Worker != by || rp.Attempt != 5 || strings.Contains(rp.Reason, "fixed") {
		t.Errorf("replayed event = %+v, want by %s, the 5 attempts spent, no header value", rp, by)
	}

	// drop: the replayed message, queued again; then one by the console's
	// default.
	if _, err := q.DropBy(ctx, dead.ID, by); err != nil {
		t.Fatal(err)
	}
	dr := operatorEvent(t, q, dead.ID, EventDropped)
	if dr.Worker != by || dr.Reason != "was queued" {
		t.Errorf("dropped event = %+v, want by %s, reason \"was queued\"", dr, by)
	}

	other := deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	if _, err := q.Drop(ctx, other.ID); err != nil {
		t.Fatal(err)
	}
	if dr := operatorEvent(t, q, other.ID, EventDropped); dr.Worker != OperatorAdmin || !strings.HasPrefix(dr.Reason, "was deferred after 1 attempt(s)") {
		t.Errorf("dropped event without a name = %+v, want by %q", dr, OperatorAdmin)
	}
}
