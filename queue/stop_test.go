package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil"
)

// stopAckWait is the ack wait of the stop tests: far longer than any of
// their deadlines, so that an envelope they see again came back through a
// give-back, not through the ack wait running out.
const stopAckWait = time.Minute

// queueIn starts an embedded server on dir and connects to it with the
// stop tests' ack wait; the caller stops both.
func queueIn(t *testing.T, dir string) (*Queue, *Embedded) {
	t.Helper()
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	q, err := connectTo(emb, Options{AckWait: stopAckWait})
	if err != nil {
		emb.Shutdown()
		t.Fatal(err)
	}
	return q, emb
}

// enqueueN queues n envelopes for tenant, one recipient each, and returns
// their ids.
func enqueueN(t *testing.T, q *Queue, n int, tenant string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ids := map[string]bool{}
	for i := range n {
		got, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "s@src.example",
			Rcpts: []string{fmt.Sprintf("r%d@one.example", i)}, Body: []byte("Subject: x\r\n\r\nx\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		ids[got[0]] = true
	}
	return ids
}

// receive takes n envelopes from ch within within, failing the test with
// what says when they do not come.
func receive(t *testing.T, ch <-chan *Delivery, n int, within time.Duration, what string) []*Delivery {
	t.Helper()
	var got []*Delivery
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for len(got) < n {
		select {
		case d := <-ch:
			got = append(got, d)
		case <-deadline.C:
			t.Fatalf("%s: %d of %d envelopes within %v (ack wait %v)", what, len(got), n, within, stopAckWait)
		}
	}
	return got
}

// TestStopGivesBackAcrossRestart: envelopes a stopping process had fetched
// and no worker had taken are given back as its pulls stop, and the
// server hands them out again as soon as it is started again on its store
// (a daemon's graceful restart), not after the ack wait. A plain nak did
// not survive the restart: the server kept "hand it out again" in memory
// only, and the restarted one found the envelopes pending since their
// fetch and waited out the ack wait: a minute of "queued, attempt 0".
func TestStopGivesBackAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	q, emb := queueIn(t, dir)
	ids := enqueueN(t, q, 3, "t")
	held := &Holding{}
	ctx, cancel := context.WithCancel(WithHolding(context.Background(), held))
	// Nobody reads: the three wait in the pull's list for a worker.
	if _, err := q.Messages(ctx, LaneWork, 3); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 15*time.Second, "three envelopes fetched", func() bool { return q.Ops()["fetched"] >= 3 })
	cancel()
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if n, err := held.Wait(wctx); err != nil || n != 3 {
		t.Fatalf("given back %d (%v), want the 3 fetched", n, err)
	}
	q.Close()
	emb.Shutdown()

	q2, emb2 := queueIn(t, dir)
	defer emb2.Shutdown()
	defer q2.Close()
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	ch, err := q2.Messages(ctx2, LaneWork, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range receive(t, ch, 3, 10*time.Second, "after the restart") {
		if !ids[d.Env.ID] {
			t.Fatalf("unexpected or repeated envelope %s", d.Env.ID)
		}
		delete(ids, d.Env.ID)
		if err := d.Skip(ctx2); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStopGiveBackOrTakeNeverBoth: a worker takes envelopes at the very
// moment the pulls stop. Each envelope is either taken (and then held
// here, never acknowledged) or given back, never both: another consumer
// gets exactly the ones not taken (given back, or never fetched), at once,
// and none of those taken (a give-back of a taken one would have the
// server hand it out again while its worker holds it).
func TestStopGiveBackOrTakeNeverBoth(t *testing.T) {
	q, emb := queueIn(t, t.TempDir())
	defer emb.Shutdown()
	defer q.Close()
	other, err := connectTo(emb, Options{AckWait: stopAckWait})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	// A tenant per round: a round's pulls, stopped, may keep a pull
	// request open at the server for a few seconds, on their tenant's
	// consumer only.
	for round := range 4 {
		ids := enqueueN(t, q, 12, fmt.Sprintf("t%d", round))
		held := &Holding{}
		ctx, cancel := context.WithCancel(WithHolding(context.Background(), held))
		before := q.Ops()["fetched"]
		ch, err := q.Messages(ctx, LaneWork, 48)
		if err != nil {
			t.Fatal(err)
		}
		// Some wait fetched. A pull asks for its share of the buffer,
		// which the earlier rounds' tenants, their taken envelopes still
		// pending, share too.
		testutil.WaitFor(t, 15*time.Second, "envelopes fetched", func() bool { return q.Ops()["fetched"] >= before+4 })
		// The worker takes one, then takes up to two more while the stop
		// comes (at least one of the four or more fetched is left for
		// the give-back).
		taken := map[string]bool{next(t, ch).Env.ID: true}
		stopped := make(chan struct{})
		reader := make(chan struct{})
		go func() {
			defer close(reader)
			for len(taken) < 3 {
				select {
				case d, ok := <-ch:
					if !ok {
						return
					}
					taken[d.Env.ID] = true
				case <-stopped:
					// Whatever is ready in the same instant still
					// counts: select picks at random.
					select {
					case d, ok := <-ch:
						if ok {
							taken[d.Env.ID] = true
						}
					default:
					}
					return
				}
			}
		}()
		cancel()
		close(stopped)
		<-reader
		wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
		n, err := held.Wait(wctx)
		wcancel()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 || n+len(taken) > len(ids) {
			t.Fatalf("round %d: %d taken and %d given back of %d", round, len(taken), n, len(ids))
		}
		// Another process pulls only now, so that it can get nothing but
		// what was given back.
		octx, ocancel := context.WithCancel(context.Background())
		och, err := other.Messages(octx, LaneWork, 12)
		if err != nil {
			t.Fatal(err)
		}
		// What was given back, and what was never fetched.
		for _, d := range receive(t, och, len(ids)-len(taken), 10*time.Second, fmt.Sprintf("round %d: the envelopes not taken, at the other consumer", round)) {
			if taken[d.Env.ID] {
				t.Fatalf("round %d: %s handed out again although a worker took it", round, d.Env.ID)
			}
			if !ids[d.Env.ID] {
				t.Fatalf("round %d: unexpected envelope %s", round, d.Env.ID)
			}
			if err := d.Skip(octx); err != nil {
				t.Fatal(err)
			}
		}
		ocancel()
	}
}
