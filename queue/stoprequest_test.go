package queue

import (
	"context"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil"
)

// stopWithRequestOpen runs a pull of the work lane on q with a buffer of
// three while tenant t has one envelope: the pull request that fetched it
// stays open at the server, for two more (pullWait). Nobody takes it; the
// pull is stopped, and the give-back waited for.
func stopWithRequestOpen(t *testing.T, q *Queue) {
	t.Helper()
	enqueueN(t, q, 1, "t")
	held := &Holding{}
	ctx, cancel := context.WithCancel(WithHolding(context.Background(), held))
	defer cancel()
	if _, err := q.Messages(ctx, LaneWork, 3); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "the envelope fetched", func() bool { return q.Ops()["fetched"] >= 1 })
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if n, err := held.Wait(wctx); err != nil || n != 1 {
		t.Fatalf("given back %d (%v), want the one fetched", n, err)
	}
}

// TestStopGiveBackNotToItsOwnRequest: a stopping pull's request, still
// open at the server (waiting for two more envelopes), must not be handed
// what the pull gives back. The server hands a given-back envelope out
// again 10 ms after the nak, to the first request waiting on its
// consumer: it handed it to the stopping process's own, which gave it
// back again if it still read its connection (another process got it on
// its third delivery or later), and lost it if it had closed the
// connection meanwhile (a restart): the restarted server waited for the
// ack wait. The give-back now comes due once that request has ended.
func TestStopGiveBackNotToItsOwnRequest(t *testing.T) {
	t.Run("another process", func(t *testing.T) {
		q, emb := queueIn(t, t.TempDir())
		defer emb.Shutdown()
		defer q.Close()
		other, err := connectTo(emb, Options{AckWait: stopAckWait})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		stopWithRequestOpen(t, q)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := other.Messages(ctx, LaneWork, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := receive(t, ch, 1, 10*time.Second, "at the other process")[0]
		if d.Deliveries != 2 {
			t.Fatalf("delivery %d of the envelope, want the second: the stopped pull's request got it after its give-back", d.Deliveries)
		}
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("restart", func(t *testing.T) {
		dir := t.TempDir()
		q, emb := queueIn(t, dir)
		stopWithRequestOpen(t, q)
		q.Close()
		emb.Shutdown()
		q2, emb2 := queueIn(t, dir)
		defer emb2.Shutdown()
		defer q2.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		ch, err := q2.Messages(ctx, LaneWork, 1)
		if err != nil {
			t.Fatal(err)
		}
		d := receive(t, ch, 1, 10*time.Second, "after the restart")[0]
		if err := d.Skip(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
