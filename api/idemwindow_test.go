package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

// lostAckQueue is a queue whose next Enqueue, when asked, fails after
// storing the message, as one whose acknowledgement or fsync was lost does
// (queue.ErrMaybeStored), or fails storing nothing.
type lostAckQueue struct {
	*queue.Queue
	next atomic.Int32 // lose or refuse, once; 0: store
}

const (
	lose   = 1
	refuse = 2
)

func (l *lostAckQueue) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	switch l.next.Swap(0) {
	case lose:
		if _, err := l.Queue.Enqueue(ctx, s); err != nil {
			return nil, err
		}
		return nil, fmt.Errorf("queue envelope: %w (%w)", context.DeadlineExceeded, queue.ErrMaybeStored)
	case refuse:
		return nil, errors.New("jetstream unavailable")
	}
	return l.Queue.Enqueue(ctx, s)
}

func newLostAckFixture(t *testing.T) (*fixture, *lostAckQueue) {
	t.Helper()
	var l *lostAckQueue
	f := newFixture(t, func(c *Config) {
		l = &lostAckQueue{Queue: c.Queue.(*failingQueue).Queue}
		c.Queue = l
	})
	return f, l
}

// post sends msg under key and returns the answer.
func (f *fixture) post(t *testing.T, msg map[string]any, key string) response {
	t.Helper()
	return f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": key})
}

func wantProblem(t *testing.T, r response, status int, typ, what string) {
	t.Helper()
	if r.status != status || r.json["type"] != typ {
		t.Fatalf("%s: %d %s, want %d %s", what, r.status, r.raw, status, typ)
	}
}

// TestMaybeStoredKeepsTheKey: a 503 after the message may have been
// stored (a lost acknowledgement) keeps the key the request's. Another
// message under it is refused (it would get the stored one's ids, and, to
// several domains, overwrite the body those recipients are sent); a retry
// that fails storing nothing does not free it either; the identical retry
// goes through with the stored message's ids and the very bytes stored.
func TestMaybeStoredKeepsTheKey(t *testing.T) {
	f, l := newLostAckFixture(t)
	alice := map[string]any{"from": "shop@src.example", "to": []string{"alice@one.example", "alice@two.example"}, "subject": "ALICE", "text": "for alice"}
	bob := map[string]any{"from": "shop@src.example", "to": []string{"bob@one.example", "bob@three.example"}, "subject": "BOB", "text": "for bob"}

	l.next.Store(lose)
	wantProblem(t, f.post(t, alice, "receipt"), http.StatusServiceUnavailable, ProblemUnavailable, "lost acknowledgement")
	stored := queued(t, f.q)
	if len(stored) != 2 {
		t.Fatalf("%d envelopes stored, want 2", len(stored))
	}
	storedBody := body(t, f.q, stored[0].Env.ID)

	wantProblem(t, f.post(t, bob, "receipt"), http.StatusUnprocessableEntity, ProblemIdemMismatch, "another message after a maybe-stored 503")
	l.next.Store(refuse)
	wantProblem(t, f.post(t, alice, "receipt"), http.StatusServiceUnavailable, ProblemUnavailable, "retry refused")
	wantProblem(t, f.post(t, bob, "receipt"), http.StatusUnprocessableEntity, ProblemIdemMismatch, "another message after a retry stored nothing")

	ids := f.post(t, alice, "receipt").ids(t)
	var want []string
	for _, it := range stored {
		want = append(want, it.Env.ID)
	}
	slices.Sort(want)
	if got := slices.Sorted(slices.Values(ids)); !slices.Equal(got, want) {
		t.Fatalf("retry ids %v, want the stored %v", ids, want)
	}
	if n := len(queued(t, f.q)); n != 2 {
		t.Fatalf("%d envelopes after the retry, want the 2 stored", n)
	}
	for _, id := range ids {
		if b := body(t, f.q, id); !bytes.Equal(b, storedBody) {
			t.Fatalf("%s after the retry:\n%s\nwant the bytes first stored:\n%s", id, b, storedBody)
		}
	}
	if again := f.post(t, alice, "receipt"); !slices.Equal(again.ids(t), ids) || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("after the retry: %d %s", again.status, again.raw)
	}
}

// TestStaleTakeoverKeepsTheKey: a request whose first try died after its
// record (its process crashed mid-enqueue: the message may be stored) is
// taken over once stale; that try failing without storing anything leaves
// the key to the request, not to another message.
func TestStaleTakeoverKeepsTheKey(t *testing.T) {
	f, l := newLostAckFixture(t)
	alice := map[string]any{"from": "shop@src.example", "to": []string{"alice@one.example"}, "text": "for alice"}
	raw, err := json.Marshal(alice)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	rec, _ := json.Marshal(idemRecord{Request: hex.EncodeToString(sum[:]), First: time.Now().Add(-time.Hour).UTC().Truncate(time.Second)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.srv.idem.kv.Put(ctx, idemEntry("acme", "crashed"), rec); err != nil {
		t.Fatal(err)
	}
	l.next.Store(refuse)
	r := f.do(t, "POST", "/v1/messages", f.key, raw, map[string]string{"Idempotency-Key": "crashed"})
	wantProblem(t, r, http.StatusServiceUnavailable, ProblemUnavailable, "stale record taken over, enqueue refused")
	bob := map[string]any{"from": "shop@src.example", "to": []string{"bob@one.example"}, "text": "for bob"}
	wantProblem(t, f.post(t, bob, "crashed"), http.StatusUnprocessableEntity, ProblemIdemMismatch, "another message after the takeover")
	if ids := f.do(t, "POST", "/v1/messages", f.key, raw, map[string]string{"Idempotency-Key": "crashed"}).ids(t); len(ids) != 1 {
		t.Fatalf("retry: %v", ids)
	}
}

// expireKey ends (tenant acme, key)'s deduplication window, as a day
// passing would: the API's record expires, and the queue's record of the
// key's first use is moved back past the window. The work stream's own
// deduplication is not: a message under the first one's ids would be
// absorbed by it.
func expireKey(t *testing.T, f *fixture, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.srv.idem.kv.Purge(ctx, idemEntry("acme", key)); err != nil {
		t.Fatal(err)
	}
	sent, err := f.js.KeyValue(ctx, queue.BucketSent)
	if err != nil {
		t.Fatal(err)
	}
	names, err := sent.ListKeysFiltered(ctx, "idem.>")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for name := range names.Keys() {
		e, err := sent.Get(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		tok, rest, _ := strings.Cut(string(e.Value()), " ")
		first, split, _ := strings.Cut(tok, "/") // "<first use>/<split>"
		ns, err := strconv.ParseInt(first, 10, 64)
		if err != nil {
			t.Fatalf("queue's key record %q: %v", e.Value(), err)
		}
		v := strconv.FormatInt(ns-int64(25*time.Hour), 10)
		if split != "" {
			v += "/" + split
		}
		if rest != "" {
			v += " " + rest
		}
		if _, err := sent.Put(ctx, name, []byte(v)); err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 1 {
		t.Fatalf("%d key records in the queue, want the one", n)
	}
}

// TestIdempotencyKeyAgainAfterTheWindow: a key used again once its window
// has passed is a new message, with ids, body and history of its own,
// while the first one still waits: held for later, or queued to several
// domains with its body stored once. (Before, the first case answered the
// held message's ids and stored nothing; the second gave the first one's
// ids, and its recipients the second one's body.)
func TestIdempotencyKeyAgainAfterTheWindow(t *testing.T) {
	t.Run("held for later", func(t *testing.T) {
		f := newFixture(t, nil)
		held := f.post(t, map[string]any{"from": "shop@src.example", "to": []string{"ann@one.example"}, "subject": "week 1", "text": "x",
			"send_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)}, "weekly").ids(t)
		expireKey(t, f, "weekly")
		r := f.post(t, map[string]any{"from": "shop@src.example", "to": []string{"ann@one.example"}, "subject": "week 2", "text": "y"}, "weekly")
		ids := r.ids(t)
		if slices.Equal(ids, held) || r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("after the window: ids %v (replayed %q), the held message's %v", ids, r.header.Get("Idempotent-Replayed"), held)
		}
		if b := body(t, f.q, ids[0]); !bytes.Contains(b, []byte("Subject: week 2")) {
			t.Fatalf("new message stored as %q", b)
		}
		if got := f.do(t, "GET", "/v1/messages/"+held[0], f.key, nil, nil); got.status != 200 || got.json["state"] != "deferred" {
			t.Fatalf("held message: %d %s", got.status, got.raw)
		}
	})
	t.Run("several domains", func(t *testing.T) {
		f := newFixture(t, nil)
		alice := f.post(t, map[string]any{"from": "shop@src.example", "to": []string{"alice@one.example", "alice@two.example"},
			"subject": "ALICE", "text": "for alice"}, "receipt").ids(t)
		expireKey(t, f, "receipt")
		bob := f.post(t, map[string]any{"from": "shop@src.example", "to": []string{"bob@one.example", "bob@three.example"},
			"subject": "BOB", "text": "for bob"}, "receipt").ids(t)
		for _, id := range bob {
			if slices.Contains(alice, id) {
				t.Fatalf("ids %v after the window, the first message's %v", bob, alice)
			}
		}
		for _, id := range alice {
			if b := body(t, f.q, id); !bytes.Contains(b, []byte("Subject: ALICE")) {
				t.Fatalf("Alice's %s now reads %q", id, b)
			}
		}
		for _, id := range bob {
			if b := body(t, f.q, id); !bytes.Contains(b, []byte("Subject: BOB")) {
				t.Fatalf("Bob's %s reads %q", id, b)
			}
		}
		for _, id := range []string{alice[0], bob[0]} {
			got := f.do(t, "GET", "/v1/messages/"+id, f.key, nil, nil)
			if hist, _ := got.json["history"].([]any); got.status != 200 || len(hist) != 1 {
				t.Fatalf("GET %s: %d %s, want its one queued event", id, got.status, got.raw)
			}
		}
	})
}
