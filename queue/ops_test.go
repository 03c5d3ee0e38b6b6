package queue

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	got := q.Ops()
	for op, want := range map[string]uint64{"publish_work": 1, "publish_event": 1, "sent_get": 1, "sent_put": 1, "ack": 1, "fetched": 1, "publish_body": 0} {
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
