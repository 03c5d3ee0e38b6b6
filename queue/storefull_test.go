package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// A delivered envelope whose SENT marker the store refuses (full: the
// store limit, a full disk) is acknowledged all the same, and does not
// come back to be sent again every ack wait.
func TestDeliveredWithoutRoomForTheMarker(t *testing.T) {
	q, _ := startQueueWith(t, Options{AckWait: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	// The SENT bucket takes nothing more.
	s, err := q.js.Stream(ctx, sentStreamName)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.MaxMsgs, cfg.Discard = 1, jetstream.DiscardNew
	if _, err := q.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := q.sent.Put(ctx, "filler", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := q.sent.Put(ctx, "refused", []byte("x")); err == nil {
		t.Fatal("the full bucket took a put")
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	work, err := q.Messages(wctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatalf("delivered, but the step failed (the envelope comes back to be sent again): %v", err)
	}
	// Past the ack wait, nothing is handed out again.
	select {
	case again := <-work:
		t.Fatalf("envelope %s handed out again after its delivery", again.Env.ID)
	case <-time.After(3 * time.Second):
	}
	if items, err := q.List(ctx, Filter{}); err != nil || len(items) != 0 {
		t.Fatalf("still queued: %d items (%v)", len(items), err)
	}
}
