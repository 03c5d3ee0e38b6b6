package queue

import (
	"context"
	"strings"
	"testing"
	"time"
)

// inlineLimitQueue starts a queue that keeps bodies of up to 64 octets
// inline, with a context for the test, a body under the limit and one over.
func inlineLimitQueue(t *testing.T) (q *Queue, ctx context.Context, small, large []byte) {
	t.Helper()
	q, _ = startQueueWith(t, Options{InlineBodyMax: 64})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return q, ctx, []byte("Subject: small\r\n\r\nhi\r\n"), []byte("Subject: large\r\n\r\n" + strings.Repeat("x", 80) + "\r\n")
}

// A body of one destination up to the inline limit travels inside its
// envelope, through the retry lane and into dead letters; a larger one, or
// one shared by several destinations, is stored once in the Object Store.
func TestInlineBodies(t *testing.T) {
	q, ctx, small, large := inlineLimitQueue(t)
	for _, c := range []struct {
		name   string
		body   []byte
		rcpts  []string
		inline bool
	}{
		{"small, one destination", small, []string{"r@d.example"}, true},
		{"over the limit", large, []string{"r@d.example"}, false},
		{"two destinations", small, []string{"r@d.example", "s@e.example"}, false},
	} {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: c.rcpts, Body: c.body})
		if err != nil {
			t.Fatal(err)
		}
		it, err := q.Find(ctx, ids[0])
		if err != nil {
			t.Fatal(err)
		}
		e := it.Env
		if e.Inline() != c.inline {
			t.Errorf("%s: inline = %v, want %v", c.name, e.Inline(), c.inline)
		}
		msgID := e.MsgID
		if got := bodyStored(t, ctx, q, msgID); got == c.inline {
			t.Errorf("%s: Object Store holds the body: %v, want %v", c.name, got, !c.inline)
		}
		body, err := q.EnvelopeBody(ctx, e)
		if err != nil || string(body) != string(c.body) || e.Size != int64(len(c.body)) {
			t.Errorf("%s: body %q (size %d), %v", c.name, body, e.Size, err)
		}
		for _, id := range ids {
			if _, err := q.Drop(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Through the retry lane and into dead letters, the body stays whole.
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	deferOne(t, q, LaneRetry, time.Now().Add(100*time.Millisecond))
	const deferred = "Subject: x\r\n\r\nbody\r\n" // deferOne's body
	r := next(t, retry)
	if !r.Env.Inline() || string(r.Env.Body) != deferred {
		t.Fatalf("due envelope body %q (inline %v)", r.Env.Body, r.Env.Inline())
	}
	if err := r.Dead(ctx, r.Env.Clone(), "max-attempts"); err != nil {
		t.Fatal(err)
	}
	it, err := q.Find(ctx, r.Env.ID)
	if err != nil || it.State != StateDead || string(it.Env.Body) != deferred {
		t.Fatalf("dead letter %+v, %v", it, err)
	}
	items, err := q.List(ctx, Filter{State: StateDead})
	if err != nil || len(items) != 1 || items[0].Env.Body != nil {
		t.Fatalf("a listing should hold no bodies: %+v, %v", items, err)
	}
}

// A replay that edits headers edits an inline body without outflow's DKIM
// signature (the first SigLen bytes), so the worker can sign it again.
func TestReplayInlineSignedBody(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	orig := "Subject: x\r\n\r\nbody\r\n"
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte(orig)})
	if err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	for i, edit := range []string{"X-Fixed: 1\n", "X-Again: 2\n"} {
		d := next(t, work)
		sig := "DKIM-Signature: v=1; s=" + string(rune('a'+i)) + "\r\n"
		e := d.Env.Clone()
		e.Body, e.Signed, e.SigLen = append([]byte(sig), e.Body...), true, len(sig)
		if err := d.Dead(ctx, e, "max-attempts"); err != nil {
			t.Fatal(err)
		}
		re, err := q.Replay(ctx, ids[0], []byte(edit))
		if err != nil {
			t.Fatal(err)
		}
		if !re.Inline() || re.Signed || re.SigLen != 0 || re.Size != int64(len(re.Body)) {
			t.Fatalf("replayed envelope: %+v", re)
		}
		b := string(re.Body)
		if strings.Contains(b, "DKIM-Signature") || !strings.Contains(b, "X-Fixed: 1\r\n") || !strings.HasSuffix(b, "\r\n\r\nbody\r\n") {
			t.Fatalf("edit %d = %q; want the unsigned body with the edits so far", i+1, b)
		}
		if i == 1 && !strings.Contains(b, "X-Again: 2\r\n") {
			t.Fatalf("second edit = %q", b)
		}
	}
}
