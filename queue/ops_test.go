package queue

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/internal/testutil"
)

// One message submitted and delivered costs the operations
// docs/benchmarks.md counts, and the collector exports them.
func TestOpsCountOneDelivery(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t1", From: "a@src.example", Rcpts: []string{"x@one.example"}, Body: []byte("Subject: hi\r\n\r\nhello\r\n")}); err != nil {
		t.Fatal(err)
	}
	ch, err := q.Messages(ctx, LaneWork, 4)
	if err != nil {
		t.Fatal(err)
	}
	d := next(t, ch)
	if done, err := d.AlreadyHandled(ctx); err != nil || done {
		t.Fatalf("AlreadyHandled = %v, %v", done, err)
	}
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	// The marker is stored.
	if ent, err := q.sent.Get(ctx, d.Env.SentKey()); err != nil || string(ent.Value()) != "x@one.example" {
		t.Fatalf("SENT marker after Delivered: %v", err)
	}
	got := q.Ops()
	for op, want := range map[string]uint64{"publish_work": 1, "publish_event": 1, "sent_get": 0, "local_get": 1, "sent_put": 1, "ack": 1, "fetched": 1, "publish_body": 0} {
		if got[op] != want {
			t.Errorf("%s = %d, want %d (all: %v)", op, got[op], want, got)
		}
	}
	if got["fetch"] < 1 {
		t.Errorf("fetch = %d, want at least 1", got["fetch"])
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewDepthCollector(q))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "outflow_jetstream_ops_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			exported[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	if exported["ack"] != 1 || exported["sent_put"] != 1 || len(exported) != int(numOps) {
		t.Errorf("exported %v, want every op and ack 1, sent_put 1", exported)
	}
}

// lastMsg finds what KeyValue.Get finds, and not a deleted key.
func TestLastMsgReadsLikeKeyValueGet(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("absent.0")); err != nil || found {
		t.Fatalf("absent key: found %v, %v", found, err)
	}
	rev, err := q.sent.Put(ctx, "k1.0", []byte("a@b.example"))
	if err != nil {
		t.Fatal(err)
	}
	data, seq, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("k1.0"))
	if err != nil || !found || string(data) != "a@b.example" || seq != rev {
		t.Fatalf("lastMsg = %q, %d, %v, %v; want the value at revision %d", data, seq, found, err, rev)
	}
	if err := q.sent.Delete(ctx, "k1.0"); err != nil {
		t.Fatal(err)
	}
	if _, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("k1.0")); err != nil || found {
		t.Fatalf("deleted key: found %v, %v", found, err)
	}
}

// go test -run '^$' -bench SentLookup -benchmem ./queue
func BenchmarkSentLookup(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	if _, err := q.sent.Put(ctx, "k1.0", []byte("a@b.example")); err != nil {
		b.Fatal(err)
	}
	b.Run("lastMsg", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("k1.0")); err != nil || !found {
				b.Fatal(found, err)
			}
		}
	})
	b.Run("KeyValue.Get", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, err := q.sent.Get(ctx, "k1.0"); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reportCPU reports the process's CPU time (user and system, the embedded
// server's included) per iteration as cpu-ns/op, when the returned func
// runs: on a shared machine wall-clock ns/op measures the neighbours.
func reportCPU(b *testing.B) func() {
	start := testutil.ProcessCPU()
	return func() { b.ReportMetric(float64(testutil.ProcessCPU()-start)/float64(b.N), "cpu-ns/op") }
}
