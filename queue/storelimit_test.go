package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
)

// queueBacklog starts an embedded server on dir with cfg, stores n
// messages of 100 KiB (one recipient each, bodies inline) and stops it:
// a backlog the relay never took, as a restart finds it.
func queueBacklog(t *testing.T, cfg EmbeddedConfig, n int) {
	t.Helper()
	emb, err := StartEmbedded(cfg)
	if err != nil {
		t.Fatal(err)
	}
	q, err := connectTo(emb, Options{})
	if err != nil {
		emb.Shutdown()
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	body := []byte("Subject: backlog\r\n\r\n" + strings.Repeat("x", 100<<10) + "\r\n")
	for i := range n {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{fmt.Sprintf("r%d@d.example", i)}, Body: body}); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	q.Close()
	emb.Shutdown()
}

// A restart finds the store holding more than its limit (a --store-max
// lowered, or with --store-max 0 a disk that filled up while the daemon
// was down: see the next test). nats-server refuses every write while its
// store's use is over its limit, and given that limit it would freeze the
// store: no deferral, no SENT marker, no event, until another restart. The
// mail already queued must drain all the same, new mail be refused
// (ErrNoRoom: 452 4.3.1) until it has, and the --store-max given hold for
// new mail.
func TestStoreOverItsLimitAtStartStillDrains(t *testing.T) {
	dir := t.TempDir()
	const backlog = 40 // 4 MB
	queueBacklog(t, EmbeddedConfig{DataDir: dir, MaxStore: 64 << 20, Logger: zerolog.Nop()}, backlog)

	const limit = 2 << 20 // under the backlog's use
	var logged testutil.SyncBuffer
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: dir, MaxStore: limit, Logger: zerolog.New(&logged)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	room := emb.StoreRoom()
	used := room.Used()
	if used <= limit {
		t.Fatalf("the backlog holds %d bytes, not over the limit %d: the test tests nothing", used, limit)
	}
	if room.Limit() != limit {
		t.Errorf("limit %d, want the --store-max given, %d", room.Limit(), limit)
	}
	if got, want := room.ServerLimit(), used+StoreReserve(limit); got < want {
		t.Errorf("nats-server's limit %d, want at least the use plus the reserve, %d", got, want)
	}
	if !strings.Contains(logged.String(), `"level":"error"`) || !strings.Contains(logged.String(), "more than its limit at start") ||
		!strings.Contains(logged.String(), "raise --store-max") {
		t.Errorf("no error at start that says the store is over its limit and what to do; logged:\n%s", logged.String())
	}
	q, err := connectTo(emb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()

	small := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"new@d.example"}, Body: []byte("Subject: new\r\n\r\nnew\r\n")}
	if _, err := q.Enqueue(ctx, small); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("new mail with the store over its limit: %v, want ErrNoRoom", err)
	}
	if err := room.Err(); err == nil || !strings.Contains(err.Error(), "still moves on") {
		t.Errorf("the refusal does not say the queued mail moves on: %v", err)
	}

	// Every other message is deferred (its envelope written again, with
	// its body inline), the rest delivered (a SENT marker written); the
	// deferred ones then fire and are delivered.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	work, err := q.Messages(wctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	retry, err := q.Messages(ctx, LaneRetry, 4)
	if err != nil {
		t.Fatal(err)
	}
	deliver := func(d *Delivery) {
		t.Helper()
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatalf("delivery of %s: %v", d.Env.ID, err)
		}
		if _, err := q.sent.Get(ctx, d.Env.SentKey()); err != nil {
			t.Fatalf("no SENT marker for %s: %v", d.Env.ID, err)
		}
	}
	deferred := 0
	for i := range backlog {
		d := next(t, work)
		if i%2 == 1 {
			deliver(d)
			continue
		}
		n := d.Env.Clone()
		n.Attempt = 1
		if err := d.Reschedule(ctx, n, LaneRetry, time.Now().Add(200*time.Millisecond), true); err != nil {
			t.Fatalf("deferral %d of %s: %v", i, d.Env.ID, err)
		}
		deferred++
	}
	for range deferred {
		d := next(t, retry)
		if d.Env.Attempt != 1 {
			t.Fatalf("%s fired at attempt %d, want 1", d.Env.ID, d.Env.Attempt)
		}
		deliver(d)
	}
	wcancel()
	// An ack's removal from the work stream follows its confirmation:
	// polled, not read once.
	testutil.WaitFor(t, 10*time.Second, "nothing queued after the drain", func() bool {
		items, err := q.List(ctx, Filter{})
		return err == nil && len(items) == 0
	})

	// Drained under the limit less the reserve, new mail is taken again
	// (at the next look), held to the --store-max given.
	testutil.WaitFor(t, 10*time.Second, "room for new mail once the backlog drained", func() bool { return room.Err() == nil })
	if _, err := q.Enqueue(ctx, small); err != nil {
		t.Fatalf("new mail after the drain: %v", err)
	}
	if room.Limit() != limit {
		t.Errorf("limit %d after the drain, want the --store-max given, %d", room.Limit(), limit)
	}
}

// With --store-max 0 the limit is nats-server's formula, 75% of the free
// space plus 75% of the store's use: under the use whenever the free space
// is under a third of it. A restart on such a disk (here a full one) must
// let the mail queued move on and refuse new mail; and disk space freed
// while running gives new mail room again without a restart.
func TestStoreLimitOnAFullDiskAtStart(t *testing.T) {
	dir := t.TempDir()
	var free atomic.Uint64
	free.Store(1 << 30)
	freeSpace := func(string) (uint64, error) { return free.Load(), nil }
	queueBacklog(t, EmbeddedConfig{DataDir: dir, Logger: zerolog.Nop(), freeSpace: freeSpace}, 20)

	free.Store(0)
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: dir, ListenAddr: "127.0.0.1:0", Logger: zerolog.Nop(), freeSpace: freeSpace})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	room := emb.StoreRoom()
	used, limit := room.Used(), room.Limit()
	if want := dynamicStoreLimit(0, used); limit != want || limit >= used {
		t.Fatalf("limit %d with %d bytes used and no free space, want nats-server's formula, %d, under the use", limit, used, want)
	}
	if got, want := room.ServerLimit(), used+StoreReserve(limit); got < want {
		t.Errorf("nats-server's limit %d, want at least the use plus the reserve, %d", got, want)
	}
	q, err := connectTo(emb, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	small := &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"new@d.example"}, Body: []byte("Subject: new\r\n\r\nnew\r\n")}
	if _, err := q.Enqueue(ctx, small); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("new mail on a full disk: %v, want ErrNoRoom", err)
	}
	if err := room.Err(); err == nil || !strings.Contains(err.Error(), "free disk space") {
		t.Errorf("the refusal does not say that freeing disk space helps: %v", err)
	}

	// The queued mail moves on: a deferral, a delivery with its marker.
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	work, err := q.Messages(wctx, LaneWork, 1)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, work)
	n := d.Env.Clone()
	n.Attempt = 1
	if err := d.Reschedule(ctx, n, LaneRetry, time.Now().Add(time.Hour), true); err != nil {
		t.Fatalf("deferral on a full disk: %v", err)
	}
	d = next(t, work)
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatalf("delivery on a full disk: %v", err)
	}
	if _, err := q.sent.Get(ctx, d.Env.SentKey()); err != nil {
		t.Fatalf("no SENT marker: %v", err)
	}
	wcancel()

	// A process storing through the listener (`outflow submit`, a fleet
	// worker), connected before nats-server's limit is raised (a reload of
	// its options, which checks every connection's credentials again).
	ci := emb.ClientInfo()
	remote, err := Connect(ctx, Options{URL: ci.URL, User: ci.User, Password: ci.Password, NoSetup: true, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { remote.Close() })

	// Space freed: the limit rises with it at the next look, nats-server's
	// with it, and new mail is taken.
	free.Store(1 << 30)
	testutil.WaitFor(t, 10*time.Second, "room for new mail once disk space is freed", func() bool { return room.Err() == nil })
	if room.Limit() <= limit || room.ServerLimit() < room.Limit() {
		t.Errorf("limit %d (was %d), nats-server's %d: want the limit risen, nats-server's at least as high", room.Limit(), limit, room.ServerLimit())
	}
	if _, err := q.Enqueue(ctx, small); err != nil {
		t.Fatalf("new mail once disk space was freed: %v", err)
	}
	// The remote writer's last answer about the room is at most
	// StoreRoomEvery old; its connection outlived the reload.
	testutil.WaitFor(t, 10*time.Second, "the remote writer's mail taken", func() bool {
		_, err := remote.Enqueue(ctx, small)
		if err != nil && !errors.Is(err, ErrNoRoom) {
			t.Fatalf("remote writer: %v", err)
		}
		return err == nil
	})
}

// storeLimits: nats-server's limit is never under the use plus the reserve
// of the store's limit, which is the --store-max given or nats-server's
// formula.
func TestStoreLimits(t *testing.T) {
	for _, c := range []struct {
		maxStore    int64
		free        uint64
		used        int64
		limit, nats int64
	}{
		{0, 400 << 20, 0, 300 << 20, 300 << 20},
		{0, 400 << 20, 100 << 20, 375 << 20, 375 << 20},
		{0, 30 << 20, 114 << 20, 108 << 20, 114<<20 + 54<<20}, // the report: free under a third of the use
		{0, 0, 0, 1, 1},
		{1 << 30, 0, 100 << 20, 1 << 30, 1 << 30},
		{1 << 30, 0, 1000 << 20, 1 << 30, 1000<<20 + 1<<30/10},
		{128 << 20, 1 << 40, 200 << 20, 128 << 20, 200<<20 + 64<<20},
	} {
		limit, nats := storeLimits(c.maxStore, c.free, c.used)
		if limit != c.limit || nats != c.nats {
			t.Errorf("storeLimits(%d, %d, %d) = %d, %d; want %d, %d", c.maxStore, c.free, c.used, limit, nats, c.limit, c.nats)
		}
	}
}
