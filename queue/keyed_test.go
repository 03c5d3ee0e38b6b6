package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// keyRecordName is the SENT-bucket name of (tenant, key)'s record.
func keyRecordName(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return "idem." + hex.EncodeToString(sum[:16])
}

// ageKey moves the first use of (tenant, key) back by d, as if that long
// had passed since. The work stream's own deduplication window is not
// moved: a message that came out under the first one's id would be
// absorbed by it.
func ageKey(t *testing.T, q *Queue, tenant, key string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := q.sent.Get(ctx, keyRecordName(tenant, key))
	if err != nil {
		t.Fatal(err)
	}
	tok, rest, _ := strings.Cut(string(e.Value()), " ")
	first, split, _ := strings.Cut(tok, "/")
	ns, err := strconv.ParseInt(first, 10, 64)
	if err != nil {
		t.Fatalf("record %q: %v", e.Value(), err)
	}
	v := strconv.FormatInt(ns-int64(d), 10)
	if split != "" {
		v += "/" + split
	}
	if rest != "" {
		v += " " + rest
	}
	if _, err := q.sent.Put(ctx, keyRecordName(tenant, key), []byte(v)); err != nil {
		t.Fatal(err)
	}
}

// TestKeyedHeldForLaterThenAgainAfterTheWindow: a keyed message held for
// later, then the key used again for another message once the window has
// passed (the held one still waiting: send_at may be three days ahead).
// The new message is stored, under ids of its own, and the held one waits
// on, untouched; it was answered with the held one's ids and not stored.
func TestKeyedHeldForLaterThenAgainAfterTheWindow(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"r@d.example"}, IdempotencyKey: "weekly",
		Body: []byte("Subject: week 1\r\n\r\nx\r\n"), SendAt: time.Now().Add(time.Hour)}
	first, err := q.Enqueue(ctx, held)
	if err != nil {
		t.Fatal(err)
	}
	// Within the window the record answers, as before.
	if again, err := q.Enqueue(ctx, held); err != nil || !slices.Equal(again, first) {
		t.Fatalf("retry within the window: %v, %v; want %v", again, err, first)
	}
	ageKey(t, q, "t", "weekly", q.opts.DedupWindow+time.Minute)
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"r@d.example"}, IdempotencyKey: "weekly",
		Body: []byte("Subject: week 2\r\n\r\ny\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1 || ids[0] == first[0] {
		t.Fatalf("after the window: ids %v, the held message's are %v: want a new id", ids, first)
	}
	it, err := q.Find(ctx, ids[0])
	if err != nil {
		t.Fatalf("the new message is not stored: %v", err)
	}
	if it.State != StateQueued || !strings.Contains(string(it.Env.Body), "week 2") {
		t.Fatalf("new message: state %s, body %q", it.State, it.Env.Body)
	}
	old, err := q.Find(ctx, first[0])
	if err != nil || old.State != StateDeferred || !strings.Contains(string(old.Env.Body), "week 1") {
		t.Fatalf("held message: %+v, %v", old, err)
	}
	// A retry of the new message gets its ids again.
	if again, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"r@d.example"}, IdempotencyKey: "weekly",
		Body: []byte("Subject: week 2\r\n\r\ny\r\n")}); err != nil || !slices.Equal(again, ids) {
		t.Fatalf("retry of the new message: %v, %v; want %v", again, err, ids)
	}
}

// TestKeyedAgainAfterTheWindowOwnBody: a message to two domains (its body
// stored once, shared by its envelopes), then another one under the same
// key once the window has passed, while the first one's envelopes still
// wait. Each keeps its own body, parts count and history; the second one's
// parts finishing leave the first one's body. With ids from the key alone
// the second overwrote the first's body (its recipients got the other
// message) and reset its parts count, and its ids were the first's.
func TestKeyedAgainAfterTheWindowOwnBody(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alice, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "shop@src.example", Rcpts: []string{"alice@one.example", "alice@two.example"},
		IdempotencyKey: "receipt", Body: []byte("Subject: ALICE\r\n\r\nfor alice\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	ageKey(t, q, "t", "receipt", q.opts.DedupWindow+time.Minute)
	bob, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "shop@src.example", Rcpts: []string{"bob@one.example", "bob@three.example"},
		IdempotencyKey: "receipt", Body: []byte("Subject: BOB\r\n\r\nfor bob\r\n")})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range bob {
		if slices.Contains(alice, id) {
			t.Fatalf("ids %v after the window, the first message's %v: want new ones", bob, alice)
		}
	}
	items := map[string]*Item{}
	for _, id := range append(slices.Clone(alice), bob...) {
		it, err := q.Find(ctx, id)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		items[id] = it
	}
	aliceMsg, bobMsg := items[alice[0]].Env.MsgID, items[bob[0]].Env.MsgID
	if aliceMsg == bobMsg || items[alice[0]].Env.BodyRef == items[bob[0]].Env.BodyRef {
		t.Fatalf("message ids %s and %s, body refs %s and %s: want each its own", aliceMsg, bobMsg, items[alice[0]].Env.BodyRef, items[bob[0]].Env.BodyRef)
	}
	for msgID, want := range map[string]string{aliceMsg: "2", bobMsg: "2"} {
		if e, err := q.sent.Get(ctx, partsKey(msgID)); err != nil || string(e.Value()) != want {
			t.Fatalf("parts of %s: %v, want %s", msgID, err, want)
		}
	}
	// Bob's parts delivered: his body goes, Alice's stays.
	work, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		d := next(t, work)
		if d.Env.MsgID != bobMsg {
			continue // Alice's: still waiting
		}
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range alice {
		b, err := q.EnvelopeBody(ctx, items[id].Env)
		if err != nil || !strings.Contains(string(b), "Subject: ALICE") {
			t.Fatalf("Alice's %s after Bob's were delivered: %q, %v", id, b, err)
		}
	}
	// Each id's history is its own message's.
	for _, id := range []string{alice[0], bob[0]} {
		hist, err := q.History(ctx, id, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range hist {
			if ev.MsgID != items[id].Env.MsgID {
				t.Fatalf("history of %s holds %+v", id, ev)
			}
		}
		if len(hist) == 0 {
			t.Fatalf("no history for %s", id)
		}
	}
}

// TestKeyedConcurrentFirstTries: tries of one keyed submission at once
// (a client that retried while its first request still ran, through
// another process) agree on one first use, so on one set of ids, and the
// work stream holds the message once.
func TestKeyedConcurrentFirstTries(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := func() *Submission {
		return &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"x@one.example", "y@two.example"},
			IdempotencyKey: "race", Body: []byte("Subject: once\r\n\r\nx\r\n")}
	}
	const n = 6
	got := make([][]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = q.Enqueue(ctx, sub()) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || !slices.Equal(got[i], got[0]) {
			t.Fatalf("try %d: %v, %v; try 0: %v", i, got[i], errs[i], got[0])
		}
	}
	if again, err := q.Enqueue(ctx, sub()); err != nil || !slices.Equal(again, got[0]) {
		t.Fatalf("a retry after them: %v, %v; want %v", again, err, got[0])
	}
	s, err := q.js.Stream(ctx, StreamWork)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Fatalf("work stream: %+v, %v; want the 2 envelopes once", info.State, err)
	}
}

// TestKeyedRetrySplitsAsTheFirstTry: a retry whose caller would split the
// message otherwise (per recipient where the first try went per domain:
// the tenant's return path turned on between the tries, or `outflow
// submit` unable to read it) makes the first try's envelopes again. Its
// own split numbered other recipients under the same part ids: two of its
// envelopes were dropped as repeats and the third stored anew, so one
// recipient got the message twice.
func TestKeyedRetrySplitsAsTheFirstTry(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := func(perRcpt bool) *Submission {
		return &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"a@x.example", "b@x.example", "c@y.example"},
			IdempotencyKey: "k2", PerRecipient: perRcpt, Body: []byte("Subject: s\r\n\r\nx\r\n")}
	}
	first, err := q.Enqueue(ctx, sub(false))
	if err != nil {
		t.Fatal(err)
	}
	again, err := q.Enqueue(ctx, sub(true))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again, first) {
		t.Fatalf("retry split otherwise: ids %v, the first try's %v", again, first)
	}
	items, err := q.List(ctx, Filter{Tenant: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var rcpts []string
	for _, it := range items {
		rcpts = append(rcpts, it.Env.Rcpts...)
	}
	slices.Sort(rcpts)
	if len(items) != 2 || !slices.Equal(rcpts, []string{"a@x.example", "b@x.example", "c@y.example"}) {
		t.Fatalf("stored %d envelopes for %v, want the first try's 2 for each recipient once", len(items), rcpts)
	}
}
