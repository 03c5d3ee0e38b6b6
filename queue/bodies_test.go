package queue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestBodyFastPathRoundTrip: bodies.go writes and reads the Object Store's
// own format, so what its fast path stores reads back through nats.go's
// Object Store API, what nats.go stores reads back through the fast path,
// and a delete by either is seen by the other.
func TestBodyFastPathRoundTrip(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	obs, err := q.js.ObjectStore(ctx, BucketBodies)
	if err != nil {
		t.Fatal(err)
	}
	one := []byte("Subject: one chunk\r\n\r\nhello\r\n")
	big := bytes.Repeat([]byte("0123456789abcdef"), bodyChunkSize/16*2+3) // three chunks

	// Fast path → nats.go.
	if err := q.putNewBody(ctx, "fast", one); err != nil {
		t.Fatal(err)
	}
	got, err := obs.GetBytes(ctx, "fast")
	if err != nil || !bytes.Equal(got, one) {
		t.Fatalf("nats.go GetBytes(fast) = %q, %v; want %q", got, err, one)
	}
	info, err := obs.GetInfo(ctx, "fast")
	if err != nil || info.Size != uint64(len(one)) || info.Chunks != 1 {
		t.Fatalf("nats.go GetInfo(fast) = %+v, %v; want size %d in one chunk", info, err, len(one))
	}

	// nats.go → fast path, for one chunk and for several (the fast path
	// hands those to nats.go, and must still read them).
	for name, body := range map[string][]byte{"lib-one": one, "lib-big": big} {
		if _, err := obs.PutBytes(ctx, name, body); err != nil {
			t.Fatal(err)
		}
		got, err := q.Body(ctx, name)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("Body(%s) = %d bytes, %v; want the %d bytes nats.go stored", name, len(got), err, len(body))
		}
	}

	// A delete by the fast path hides the object from nats.go, and the
	// other way round.
	if err := q.deleteBody(ctx, "fast"); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.GetBytes(ctx, "fast"); !errors.Is(err, jetstream.ErrObjectNotFound) {
		t.Errorf("nats.go GetBytes after the fast path's delete = %v; want ErrObjectNotFound", err)
	}
	if err := obs.Delete(ctx, "lib-one"); err != nil {
		t.Fatal(err)
	}
	if _, err := q.Body(ctx, "lib-one"); !errors.Is(err, ErrBodyMissing) {
		t.Errorf("Body after nats.go's delete = %v; want ErrBodyMissing", err)
	}
	// The fast path's delete leaves no chunk behind.
	if err := q.deleteBody(ctx, "lib-big"); err != nil {
		t.Fatal(err)
	}
	st, err := q.bodyStream.Info(ctx, jetstream.WithSubjectFilter(bodyChunkSubject(">")))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range st.State.Subjects {
		if strings.HasPrefix(subj, bodyChunkSubject("")) {
			t.Errorf("chunk %s left after every body was deleted", subj)
		}
	}
}

// The parts of a large message split per recipient finish at about the
// same moment, each counting itself out of one key: every count lands, and
// the last part deletes the shared body.
func TestLastPartManyAtOnce(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const n = 64
	rcpts := make([]string, n)
	for i := range rcpts {
		rcpts[i] = fmt.Sprintf("r%d@d.example", i)
	}
	on := true
	body := make([]byte, InlineBodyMax+1)
	ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "n@b.example", Rcpts: rcpts, Body: body, ListUnsubscribe: &on})
	if err != nil || len(ids) != n {
		t.Fatalf("%d ids, %v", len(ids), err)
	}
	msgID := strings.TrimSuffix(ids[0], "-1")
	var wg sync.WaitGroup
	for _, id := range ids {
		e := &Envelope{ID: id, MsgID: msgID, BodyRef: msgID, Parts: n}
		wg.Go(func() { q.releaseBody(ctx, e) })
	}
	wg.Wait()
	if _, err := q.EnvelopeBody(ctx, &Envelope{MsgID: msgID, BodyRef: msgID}); !errors.Is(err, ErrBodyMissing) {
		t.Fatalf("the shared body after its %d parts finished: %v, want it deleted", n, err)
	}
	if _, err := q.sent.Get(ctx, partsKey(msgID)); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the parts count is left: %v", err)
	}
}

// TestBodiesOutliveDeadLetters: a body stored apart is kept at least as
// long as any dead letter that can name it: one sent later (MaxSendAhead)
// that used its whole age budget (DeadlineAfter) and then waited out the
// dead letters' age. Bodies kept only the dead letters' age and a day
// expired under the dead letters of mail sent three days later.
func TestBodiesOutliveDeadLetters(t *testing.T) {
	q, _ := startQueueWith(t, Options{DeadlineAfter: 5 * 24 * time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := q.bodies.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if need := q.opts.DeadMaxAge + 5*24*time.Hour + MaxSendAhead; st.TTL() < need {
		t.Fatalf("bodies kept %v, less than the %v a dead letter can name one", st.TTL(), need)
	}
}

// TestReplayedBodyOutlivesItsNextDeadLetter: the bucket's TTL counts from
// when a body was stored, so a replay late in a dead letter's life gave
// the replayed envelope a body that could expire before its own dead
// letter did (stored T0, dead T0+1d, replayed T0+14d, dead again T0+15d
// and kept to T0+29d, the body gone at T0+19d). With a short TTL standing
// in for that: a replay that finds its body kept for less than a new life
// needs stores it again (the same bytes, which a sibling still reads), and
// one that finds it kept long enough leaves it alone.
func TestReplayedBodyOutlivesItsNextDeadLetter(t *testing.T) {
	q, emb := startQueueWith(t, Options{InlineBodyMax: -1}) // bodies in the Object Store
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	work, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("Subject: twice\r\n\r\nhello\r\n")
	// A: one destination; B: two, one of which dies while the other waits.
	idsA, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"x@one.example"}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	idsB, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@src.example", Rcpts: []string{"x@one.example", "y@two.example"}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	byID := map[string]*Delivery{}
	for range 3 {
		d := next(t, work)
		byID[d.Env.ID] = d
	}
	die := func(id string) *Envelope {
		t.Helper()
		d := byID[id]
		n := d.Env.Clone()
		n.Attempt = 5
		if err := d.Dead(ctx, n, "max-attempts"); err != nil {
			t.Fatal(err)
		}
		return n
	}
	a, b := die(idsA[0]), die(idsB[0])
	sibling := byID[idsB[1]]

	// A bucket TTL far beyond a new life's need: nothing is stored again.
	keptA, err := q.BodyKeptUntil(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.Replay(ctx, a.ID, nil); err != nil {
		t.Fatal(err)
	}
	if again, err := q.BodyKeptUntil(ctx, a); err != nil || !again.Equal(keptA) {
		t.Errorf("a body kept long enough was stored again: kept until %v, was %v (%v)", again, keptA, err)
	}

	// A short TTL: the body would expire before the replayed envelope's
	// dead letter could.
	info, err := q.bodyStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := info.Config
	cfg.MaxAge = time.Hour
	if _, err := q.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	admin, err := connectTo(emb, Options{NoSetup: true}) // `outflow queue replay`, seeing the TTL now in force
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	keptB, err := admin.BodyKeptUntil(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	replayed := time.Now()
	if _, err := admin.Replay(ctx, b.ID, nil); err != nil {
		t.Fatal(err)
	}
	again, err := admin.BodyKeptUntil(ctx, b)
	if err != nil || !again.After(keptB) || again.Before(replayed.Add(time.Hour)) {
		t.Fatalf("replay late in the body's life: kept until %v (was %v), want stored again, kept to %v or later (%v)",
			again, keptB, replayed.Add(time.Hour), err)
	}
	for _, d := range []*Delivery{next(t, work), next(t, work), sibling} {
		got, err := q.EnvelopeBody(ctx, d.Env)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("%s reads %q, %v after the body was stored again", d.Env.ID, got, err)
		}
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	}
	// Stored again, the body left no chunk behind: all three delivered,
	// the body stream is empty.
	if info, err := q.bodyStream.Info(ctx); err != nil || info.State.Msgs != 0 {
		t.Fatalf("body stream after every envelope was delivered: %+v, %v; want empty", info.State, err)
	}
}

// TestBodyKeptUntil: what queue inspect shows of a stored body's life,
// the time it was stored plus the bucket's TTL; nothing for a body that
// travels in its envelope.
func TestBodyKeptUntil(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	before := time.Now()
	big := "Subject: x\r\n\r\n" + strings.Repeat("a", InlineBodyMax) + "\r\n"
	for _, body := range []string{"Subject: x\r\n\r\nsmall\r\n", big} {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	work, _ := q.Messages(ctx, LaneWork, 2)
	ttl := q.opts.DeadMaxAge + q.opts.DeadlineAfter + MaxSendAhead + 24*time.Hour
	for range 2 {
		d := next(t, work)
		until, err := q.BodyKeptUntil(ctx, d.Env)
		switch {
		case err != nil:
			t.Fatal(err)
		case d.Env.Inline() && !until.IsZero():
			t.Errorf("inline body kept until %v, want nothing", until)
		case !d.Env.Inline() && (until.Before(before.Add(ttl)) || until.After(time.Now().Add(ttl))):
			t.Errorf("stored body kept until %v, want %v after it was stored", until, ttl)
		}
	}
}
