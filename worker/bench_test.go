package worker

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// BenchmarkDeliveredEvent is the event every delivery publishes, with its
// decision record, through an embedded server in this process (whose
// allocations count in B/op too).
func BenchmarkDeliveredEvent(b *testing.B) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer emb.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	q, err := testqueue.ConnectInProcess(ctx, emb, queue.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer q.Close()
	snd, err := sender.New(sender.Config{Hostname: "outflow.test", Relay: "127.0.0.1:1", RelayTLS: "none"})
	if err != nil {
		b.Fatal(err)
	}
	defer snd.Close()
	p, err := New(Config{WorkerID: "bench", Queue: q, Sender: snd, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	d := &deliverer{Pool: p, id: "bench/31"}
	e := &queue.Envelope{ID: "28kyZUjPp0excjVOwZna1y", MsgID: "28kyZUjPp0excjVOwZna1y", Tenant: "trusted", Dest: "example.com"}
	rcpts := []string{"rcpt@example.com"}
	rec := backoff.Record{MsgID: e.MsgID, Tenant: e.Tenant, Dest: e.Dest, Attempt: 1, WorkerID: d.id,
		Class: string(classify.Delivered), Rule: "positive", Code: 250, EnhancedCode: "2.0.0", Reply: "Ok"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		d.event(queue.EventDelivered, e, 1, rcpts, "", &rec)
		if i++; i%256 == 0 {
			if err := q.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := q.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}
