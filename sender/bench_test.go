package sender

import (
	"bytes"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
)

// BenchmarkSendPooled measures Send through one pooled connection:
// PIPELINING on, RSET between messages, a ~4 KiB body, one recipient,
// logging off. cpu-ns/op is the process's CPU time (user and system) per
// message: on a shared machine wall-clock ns/op measures the neighbours.
//
//	go test -run '^$' -bench SendPooled -count 6 ./sender/
//
// "fakemx" talks to the loopback fake MX in this process, so its CPU
// counts too; "smtp-sink" talks to Postfix's smtp-sink (skipped when it is
// not installed: make deps), another process, so cpu-ns/op is the sender's
// alone, as in the pipeline's send stage.
//
// fakemx offers CHUNKING, so each message is one BDAT chunk in the write
// that carries RSET, MAIL and RCPT; "fakemx-DATA" hides it and "NoChunking"
// turns it off in the sender, for DATA's two round trips a message. The
// "rtt-2ms" variants put a 2 ms round trip between the two (the server's
// octets reach the sender 2 ms after they left): msgs/s is then set by
// the round trips a message waits for.
func BenchmarkSendPooled(b *testing.B) {
	for _, v := range []struct {
		name       string
		hide       []string
		noChunking bool
		delay      time.Duration
	}{
		{"fakemx", nil, false, 0},
		{"fakemx-DATA", []string{"CHUNKING"}, false, 0},
		{"fakemx-rtt-2ms", nil, false, 2 * time.Millisecond},
		{"fakemx-rtt-2ms-NoChunking", nil, true, 2 * time.Millisecond},
	} {
		b.Run(v.name, func(b *testing.B) {
			w, fake := oneMX(b, fakemx.Options{HideExtensions: v.hide})
			w.rtt = v.delay
			benchSend(b, w, func(c *Config) { c.NoChunking = v.noChunking })
			if c := fake.Connections(); c != 1 {
				b.Errorf("%d connections, want 1", c)
			}
		})
	}
	b.Run("smtp-sink", func(b *testing.B) {
		w := newWorld(b)
		w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "mx.example.test.", Pref: 10}}}
		w.host("mx.example.test", "127.0.0.2")
		w.routes["127.0.0.2:25"] = startSink(b)
		benchSend(b, w, nil)
		if d := len(w.dials()); d != 1 {
			b.Errorf("%d connections, want 1", d)
		}
	})
}

func benchSend(b *testing.B, w *world, tweak func(*Config)) {
	cfg := w.config()
	cfg.Logger = zerolog.Nop()
	cfg.MaxMsgsPerConn = math.MaxInt // measure one connection
	if tweak != nil {
		tweak(&cfg)
	}
	s := w.sender(cfg)
	m := msg("example.test", "bob@example.test")
	m.Body = append(testBody("bench"), bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrs\r\n"), 60)...)
	ctx := b.Context()
	// The connection is opened before the clock starts: the figure is a
	// message on a pooled connection.
	if r := s.Send(ctx, m); r.Rcpts[0].Outcome.Code != 250 {
		b.Fatalf("outcome %+v", r.Rcpts[0].Outcome)
	}
	b.SetBytes(int64(len(m.Body)))
	b.ReportAllocs()
	cpu0 := testutil.ProcessCPU()
	n := 0
	for b.Loop() {
		r := s.Send(ctx, m)
		if r.Rcpts[0].Outcome.Code != 250 {
			b.Fatalf("outcome %+v", r.Rcpts[0].Outcome)
		}
		n++
	}
	b.ReportMetric(float64(testutil.ProcessCPU()-cpu0)/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
}

// startSink runs Postfix's smtp-sink on a free loopback port (it announces
// PIPELINING and 8BITMIME and accepts everything) and returns its address;
// the benchmark is skipped when smtp-sink is not installed.
func startSink(b *testing.B) string {
	bin, err := exec.LookPath("smtp-sink")
	if err != nil {
		bin = "/usr/sbin/smtp-sink"
		if _, err := os.Stat(bin); err != nil {
			b.Skip("smtp-sink not installed (make deps)")
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	var args []string
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // smtp-sink refuses to run as root
	}
	cmd := exec.Command(bin, append(args, addr, "64")...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			b.Fatal(fmt.Errorf("smtp-sink on %s: %w", addr, err))
		}
		time.Sleep(10 * time.Millisecond) // polling interval for the listener, not a wait for an event
	}
}
