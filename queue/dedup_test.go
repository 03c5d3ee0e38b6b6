package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The server keeps every deduplication id in memory for the stream's whole
// window, so only what can really come twice may carry one: a submission
// with an idempotency key, not every nuid-named envelope.
func TestWorkDedupIDsOnlyForIdempotencyKeys(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := []byte("Subject: hi\r\n\r\nhello\r\n")
	plain, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{"x@one.example"}, Body: body})
	if err != nil {
		t.Fatal(err)
	}
	keyed := func() []string {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{"x@one.example", "y@two.example"}, Body: body, IdempotencyKey: "order-42"})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	k1, k2 := keyed(), keyed()
	if len(k1) != 2 || k1[0] != k2[0] || k1[1] != k2[1] {
		t.Fatalf("same key gave ids %v and %v", k1, k2)
	}
	s, err := q.js.Stream(ctx, StreamWork)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 3 {
		t.Fatalf("work stream holds %d envelopes, want 3 (the resubmission absorbed)", info.State.Msgs)
	}
	want := map[string]string{plain[0]: "", k1[0]: k1[0], k1[1]: k1[1]}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		e, err := DecodeEnvelope(m.Data, m.Header)
		if err != nil {
			t.Fatal(err)
		}
		w, ok := want[e.ID]
		if !ok {
			t.Fatalf("unexpected envelope %s", e.ID)
		}
		if got := m.Header.Get(jetstream.MsgIDHeader); got != w {
			t.Errorf("envelope %s: Nats-Msg-Id %q, want %q", e.ID, got, w)
		}
	}
}

func TestLaneDedupWindowFollowsAckWait(t *testing.T) {
	for _, c := range []struct{ ackWait, want time.Duration }{
		{60 * time.Second, 2 * time.Minute},
		{5 * time.Minute, 10 * time.Minute},
	} {
		if got := laneDedupWindow(c.ackWait); got != c.want {
			t.Errorf("laneDedupWindow(%v) = %v, want %v", c.ackWait, got, c.want)
		}
	}
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{StreamRetry, StreamRateLimit} {
		s, err := q.js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if d := s.CachedInfo().Config.Duplicates; d != 2*time.Minute {
			t.Errorf("%s: duplicate window %v, want 2m with the default 60s ack wait", name, d)
		}
	}
}

// The events stream keeps outcomes for EventsMaxAge (serve's
// --events-max-age), which bounds how far back queue history reaches.
func TestEventsMaxAge(t *testing.T) {
	q, _ := startQueueWith(t, Options{EventsMaxAge: 3 * time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := q.js.Stream(ctx, StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	if age := s.CachedInfo().Config.MaxAge; age != 3*time.Hour {
		t.Errorf("events stream max age %v, want 3h", age)
	}
}
