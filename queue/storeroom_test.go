package queue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Near the store's limit (a small --store-max here: 4 MiB, of which the
// last 2 MiB are the reserve) new mail is refused with ErrNoRoom before
// the server refuses anything, and the room left is the mail already
// accepted's: a schedule made before still fires, a deferral is still
// stored, a delivery status notification still queued.
func TestStoreReserveKeepsRoomForQueuedMail(t *testing.T) {
	const limit = 4 << 20
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), MaxStore: limit, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q, err := connectTo(emb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	if got := emb.StoreRoom().Limit(); got != limit {
		t.Fatalf("limit %d, want the --store-max given, %d", got, limit)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// One message deferred, its schedule due once the store is full.
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	work, err := q.Messages(wctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := q.Messages(ctx, LaneRetry, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 1
	due := time.Now().Add(3 * time.Second)
	if err := d.Reschedule(ctx, n, LaneRetry, due, true); err != nil {
		t.Fatal(err)
	}
	wcancel() // no worker takes the filler

	// New mail until the first refusal: ErrNoRoom, with the store still
	// under its limit less most of the reserve.
	body := []byte("Subject: filler\r\n\r\n" + strings.Repeat("x", 100<<10) + "\r\n")
	accepted := 0
	var refusal error
	for range 200 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: body}); err != nil {
			refusal = err
			break
		}
		accepted++
	}
	if !errors.Is(refusal, ErrNoRoom) {
		t.Errorf("after %d messages: first refusal %v, want ErrNoRoom", accepted, refusal)
	}
	if err := emb.StoreRoom().Err(); !errors.Is(err, ErrNoRoom) {
		t.Errorf("StoreRoom().Err() = %v, want ErrNoRoom", err)
	}
	t.Logf("accepted %d messages of %d KiB; refused: %v", accepted, len(body)>>10, refusal)

	// The schedule made before fires, and the deferral that follows is
	// stored: the room left is for them.
	var r *Delivery
	select {
	case r = <-retry:
	case <-time.After(15 * time.Second):
		t.Fatalf("the schedule due at %s did not fire with the store full", due.Format(time.TimeOnly))
	}
	if r.Env.ID != d.Env.ID {
		t.Fatalf("fired %s, want %s", r.Env.ID, d.Env.ID)
	}
	n2 := r.Env.Clone()
	n2.Attempt = 2
	if err := r.Reschedule(ctx, n2, LaneRetry, time.Now().Add(500*time.Millisecond), true); err != nil {
		t.Fatalf("deferral refused with the store full: %v", err)
	}
	r2 := next(t, retry)
	if r2.Env.ID != d.Env.ID || r2.Env.Attempt != 2 {
		t.Fatalf("fired %s attempt %d, want %s attempt 2", r2.Env.ID, r2.Env.Attempt, d.Env.ID)
	}
	if err := r2.Skip(ctx); err != nil {
		t.Fatal(err)
	}
	// A notification on mail already accepted is not new mail.
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", Rcpts: []string{"a@b.example"}, Body: []byte("Subject: dsn\r\n\r\nreport\r\n"),
		Source: SourceDSN, IsReport: true}); err != nil {
		t.Fatalf("notification refused: %v", err)
	}
}

// StoreReserve: a tenth of the limit, at least MinStoreReserve, at most
// half; and the room comes back only an eighth of the reserve under the
// mark, so that a store at the mark does not flap.
func TestStoreReserve(t *testing.T) {
	for _, c := range []struct{ limit, want int64 }{
		{0, 0},
		{4 << 20, 2 << 20},
		{100 << 20, 50 << 20},
		{200 << 20, 64 << 20},
		{10 << 30, 1 << 30},
	} {
		if got := StoreReserve(c.limit); got != c.want {
			t.Errorf("StoreReserve(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	r := &StoreRoom{}
	const limit = 10 << 30 // reserve 1 GiB, mark 9 GiB
	for _, c := range []struct {
		used  int64
		short bool
	}{
		{8 << 30, false},
		{9<<30 - 1, false},
		{9 << 30, true},
		{9<<30 - 64<<20, true}, // within an eighth of the reserve: still short
		{9<<30 - 129<<20, false},
	} {
		r.set(c.used, limit)
		if err := r.Err(); (err != nil) != c.short || c.short && !errors.Is(err, ErrNoRoom) {
			t.Errorf("used %d of %d: Err() = %v, want short %v", c.used, int64(limit), err, c.short)
		}
	}
	r.set(1<<30, 0) // limit unknown: nothing refused
	if err := r.Err(); err != nil {
		t.Errorf("no limit known: %v", err)
	}
}

// TestStoreReserveHoldsForRemoteWriters: a process that stores through the
// daemon's embedded server over a socket (`outflow submit`, a fleet worker
// with --nats-url) is refused new mail with ErrNoRoom once the daemon's
// store is short of room, as the daemon's own listeners are: its mail took
// the reserve kept for the mail already queued.
func TestStoreReserveHoldsForRemoteWriters(t *testing.T) {
	const limit = 4 << 20
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), MaxStore: limit, ListenAddr: "127.0.0.1:0", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	daemon, err := connectTo(emb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ci := emb.ClientInfo()
	remote, err := Connect(ctx, Options{URL: ci.URL, User: ci.User, Password: ci.Password, NoSetup: true, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Close() })
	small := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}
	if _, err := remote.Enqueue(ctx, small); err != nil {
		t.Fatalf("with room: %v", err)
	}
	body := []byte("Subject: filler\r\n\r\n" + strings.Repeat("x", 100<<10) + "\r\n")
	for range 200 {
		if _, err := daemon.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: body}); err != nil {
			if !errors.Is(err, ErrNoRoom) {
				t.Fatal(err)
			}
			break
		}
	}
	if err := emb.StoreRoom().Err(); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("the daemon's store still has room: %v", err)
	}
	// The remote writer's last answer is at most StoreRoomEvery old.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := remote.Enqueue(ctx, small)
		if errors.Is(err, ErrNoRoom) {
			if !strings.Contains(err.Error(), "at the daemon") {
				t.Errorf("the refusal does not say whose store: %v", err)
			}
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the remote writer was never refused")
		}
		time.Sleep(100 * time.Millisecond) // polling for the next look, with a deadline
	}
	// A notification on mail already accepted still passes.
	if _, err := remote.Enqueue(ctx, &Submission{Tenant: "t", Rcpts: []string{"a@b.example"}, Body: []byte("Subject: dsn\r\n\r\nreport\r\n"),
		Source: SourceDSN, IsReport: true}); err != nil {
		t.Fatalf("notification refused: %v", err)
	}
}
