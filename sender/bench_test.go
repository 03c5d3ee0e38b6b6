package sender

import (
	"bytes"
	"math"
	"testing"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/fakemx"
)

// BenchmarkSendPooled measures messages per second through one pooled
// connection to a loopback fake MX: PIPELINING on, RSET between messages,
// a ~4 KiB body, one recipient, logging off.
//
//	go test -run '^$' -bench SendPooled -benchtime 5s ./sender/
func BenchmarkSendPooled(b *testing.B) {
	w, fake := oneMX(b, fakemx.Options{})
	cfg := w.config()
	cfg.Logger = zerolog.Nop()
	cfg.MaxMsgsPerConn = math.MaxInt // measure one connection
	s := w.sender(cfg)
	m := msg("example.test", "bob@example.test")
	m.Body = append(testBody("bench"), bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrs\r\n"), 60)...)
	ctx := b.Context()
	b.SetBytes(int64(len(m.Body)))
	n := 0
	for b.Loop() {
		r := s.Send(ctx, m)
		if r.Rcpts[0].Outcome.Code != 250 {
			b.Fatalf("outcome %+v", r.Rcpts[0].Outcome)
		}
		n++
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	if c := fake.Connections(); c != 1 {
		b.Errorf("%d connections, want 1", c)
	}
}
