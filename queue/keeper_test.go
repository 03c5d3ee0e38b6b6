package queue

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// workBlocks lists the work stream's block files by name and inode: a
// block replaced by a new one shows as a new name.
func workBlocks(t *testing.T, emb *Embedded) []string {
	t.Helper()
	dir := filepath.Join(emb.Server().JetStreamConfig().StoreDir, server.DEFAULT_GLOBAL_ACCOUNT, "streams", StreamWork, "msgs")
	paths, err := filepath.Glob(filepath.Join(dir, "*.blk"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, filepath.Base(p)+"@"+strconv.FormatUint(fi.Sys().(*syscall.Stat_t).Ino, 10))
	}
	slices.Sort(out)
	return out
}

// deliverAll takes n envelopes off the work lane, acknowledges them as
// delivered, and waits until the server has taken the acks (the ack after
// a SENT marker is not confirmed): the tenant's consumer has nothing
// pending or in flight.
func deliverAll(t *testing.T, ctx context.Context, q *Queue, ch <-chan *Delivery, n int) {
	t.Helper()
	for range n {
		d := next(t, ch)
		if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := q.lanes[LaneWork].Consumer(ctx, tenantConsumer("t1"))
		if err == nil {
			if ci, err := c.Info(ctx); err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the acks were not taken within 10s: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// With the store syncer, the queue keeps a keeper in the work stream's
// last block, so acks that drain the stream no longer make the file store
// replace that block (a new file, and a directory fsync at the next group
// commit); and every count of the work lane leaves the keeper out.
func TestKeeperKeepsTheLastBlock(t *testing.T) {
	q, emb := syncedQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sub := func(id string) *Submission {
		return &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{id + "@one.example"}, Body: []byte("Subject: hi\r\n\r\nhello\r\n")}
	}
	if _, err := q.Enqueue(ctx, sub("m1")); err != nil {
		t.Fatal(err)
	}
	// The first sync found the stream's block: a keeper follows.
	keeperAt := func() time.Time {
		deadline := time.Now().Add(10 * time.Second)
		for {
			m, err := q.lanes[LaneWork].GetLastMsgForSubject(ctx, subjWorkKeeper)
			if err == nil {
				return m.Time
			}
			if time.Now().After(deadline) {
				t.Fatalf("no keeper in the work stream: %v", err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	kt := keeperAt()
	ch, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	deliverAll(t, ctx, q, ch, 1)
	before := workBlocks(t, emb)
	for _, id := range []string{"m2", "m3"} {
		if _, err := q.Enqueue(ctx, sub(id)); err != nil {
			t.Fatal(err)
		}
		deliverAll(t, ctx, q, ch, 1)
	}
	if after := workBlocks(t, emb); !slices.Equal(before, after) {
		t.Fatalf("the drained stream's block was replaced: %v, then %v", before, after)
	}

	// Counts: the stream holds the keeper alone.
	if n, err := q.Depth(ctx, LaneWork); err != nil || n != 0 {
		t.Fatalf("Depth(work) = %d, %v; want 0", n, err)
	}
	if orphans, err := q.workOrphans(ctx); err != nil || orphans {
		t.Fatalf("workOrphans = %v, %v; want none", orphans, err)
	}
	work := func() LaneStat {
		stats, err := q.LaneStats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return stats[0]
	}
	if ls := work(); ls.Lane != "work" || ls.Depth != 0 || !ls.Oldest.IsZero() {
		t.Fatalf("work lane %+v: want depth 0 and no oldest", ls)
	}
	// One envelope behind the keeper: counted, and the oldest is its own.
	if _, err := q.Enqueue(ctx, sub("m4")); err != nil {
		t.Fatal(err)
	}
	if ls := work(); ls.Depth != 1 || !ls.Oldest.After(kt) {
		t.Fatalf("work lane %+v: want depth 1 and the envelope's time, after the keeper's %v", ls, kt)
	}
	if _, err := q.adoptTenants(ctx); err != nil {
		t.Fatal(err)
	}
	for name := range q.lanes[LaneWork].ConsumerNames(ctx).Name() {
		if name != tenantConsumer("t1") {
			t.Fatalf("consumer %q: the keeper was taken for a tenant's mail", name)
		}
	}
	deliverAll(t, ctx, q, ch, 1)

	// With the keeper alone, the first-envelope read that LaneStats makes
	// after an envelope is acknowledged between its count and the read
	// finds nothing, as jetstream.ErrMsgNotFound, which workState counts
	// again on (CI caught that race once).
	info0, err := q.lanes[LaneWork].Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.lanes[LaneWork].GetMsg(ctx, info0.State.FirstSeq, jetstream.WithGetMsgSubject(workFilter("*", "*", "*"))); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("first envelope behind the keeper alone: %v, want ErrMsgNotFound", err)
	}

	// A second keeper replaces the first: the stream holds one.
	if err := q.publishKeeper(); err != nil {
		t.Fatal(err)
	}
	info, err := q.lanes[LaneWork].Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("work stream after a second keeper: %+v, %v; want the keeper alone", info.State, err)
	}
}

// Without the store syncer (durability none, a fleet) no keeper is
// published: the stream holds only envelopes.
func TestNoKeeperWithoutTheStoreSyncer(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{"x@one.example"}, Body: []byte("Subject: hi\r\n\r\nhello\r\n")}); err != nil {
		t.Fatal(err)
	}
	if got := q.Ops()["publish_keeper"]; got != 0 {
		t.Fatalf("publish_keeper = %d without a store syncer", got)
	}
	info, err := q.lanes[LaneWork].Info(ctx)
	if err != nil || info.State.Msgs != 1 {
		t.Fatalf("work stream %+v, %v; want the envelope alone", info.State, err)
	}
}
