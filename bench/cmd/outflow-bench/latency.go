package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/testutil"
)

// stampHeader carries the submission time (Unix nanoseconds) from the
// paced client to the latency sink.
const stampHeader = "X-Bench-Sent: "

// latencySink is a small SMTP sink that records, per message, the time
// from the stamp its client put in the header to its arrival. smtp-sink
// cannot do that; throughput figures come from smtp-sink, latency figures
// from here.
type latencySink struct {
	srv   *smtp.Server
	ln    net.Listener
	Addr  string
	mu    sync.Mutex
	lat   []float64 // milliseconds
	since int64     // only messages stamped at or after this (Unix ns) count
	n     atomic.Int64
	slow  int64 // the stamp of the slowest message counted, to find it in a daemon's log (BENCH_LOGS)
	slowL float64
}

func startLatencySink() (*latencySink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ls := &latencySink{ln: ln, Addr: ln.Addr().String()}
	ls.srv = smtp.NewServer(ls)
	ls.srv.Domain = "sink.localdomain"
	ls.srv.MaxMessageBytes = 64 << 20
	ls.srv.ReadTimeout, ls.srv.WriteTimeout = time.Minute, time.Minute
	go func() { _ = ls.srv.Serve(ln) }()
	return ls, nil
}

func (ls *latencySink) Close() { _ = ls.srv.Close() }

func (ls *latencySink) NewSession(*smtp.Conn) (smtp.Session, error) { return &sinkSession{ls: ls}, nil }

// reset forgets what was recorded and ignores, from now on, messages
// stamped before now (the warm-up's stragglers).
func (ls *latencySink) reset() {
	ls.mu.Lock()
	ls.lat, ls.slow, ls.slowL = nil, 0, 0
	ls.since = time.Now().UnixNano()
	ls.mu.Unlock()
}

// slowest returns when the slowest message counted was stamped.
func (ls *latencySink) slowest() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return time.Unix(0, ls.slow).UTC()
}

func (ls *latencySink) latencies() []float64 {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := append([]float64(nil), ls.lat...)
	sort.Float64s(out)
	return out
}

type sinkSession struct{ ls *latencySink }

func (*sinkSession) Mail(string, *smtp.MailOptions) error { return nil }
func (*sinkSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (*sinkSession) Reset()                               {}
func (*sinkSession) Logout() error                        { return nil }

func (s *sinkSession) Data(r io.Reader) error {
	br := bufio.NewReader(r)
	var sent int64
	for {
		line, err := br.ReadSlice('\n')
		if v, ok := bytes.CutPrefix(line, []byte(stampHeader)); ok {
			sent, _ = strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		}
		if err != nil || len(bytes.TrimSpace(line)) == 0 {
			break
		}
	}
	_, _ = io.Copy(io.Discard, br)
	now := time.Now().UnixNano()
	s.ls.n.Add(1)
	if sent > 0 {
		s.ls.mu.Lock()
		if sent >= s.ls.since {
			l := float64(now-sent) / 1e6
			s.ls.lat = append(s.ls.lat, l)
			if l > s.ls.slowL {
				s.ls.slow, s.ls.slowL = sent, l
			}
		}
		s.ls.mu.Unlock()
	}
	return nil
}

// pacedSend submits messages of size bytes to addr at rate per second for
// d over sessions connections (kept open), stamping each with the time its
// MAIL FROM is sent. It returns how many were accepted.
func pacedSend(addr string, rate float64, d time.Duration, sessions, size int) (int, error) {
	total := int(rate * d.Seconds())
	jobs := make(chan int, total)
	go func() {
		start := time.Now()
		for i := 0; i < total; i++ {
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			if w := time.Until(due); w > 0 {
				time.Sleep(w)
			}
			jobs <- i
		}
		close(jobs)
	}()
	pad := bytes.Repeat([]byte("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.\r\n"), size/66+1)
	var ok atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for w := 0; w < sessions; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var c *smtp.Client
			for i := range jobs {
				if c == nil {
					var err error
					if c, err = smtp.Dial(addr); err != nil {
						errs <- err
						return
					}
					if err := c.Hello("client.bench.test"); err != nil {
						errs <- err
						return
					}
				}
				stamp := time.Now().UnixNano()
				var b bytes.Buffer
				fmt.Fprintf(&b, "From: bench@source.test\r\nTo: rcpt@example.com\r\nSubject: latency %d\r\nMessage-ID: <lat%d.%d@bench.test>\r\n%s%d\r\n\r\n", i, i, stamp, stampHeader, stamp)
				b.Write(pad[:max(0, size-b.Len())])
				t0 := time.Now()
				err := testutil.Send(c, "bench@source.test", []string{"rcpt@example.com"}, b.Bytes())
				submitMu.Lock()
				submitMs = append(submitMs, float64(time.Since(t0).Microseconds())/1000)
				submitMu.Unlock()
				if err != nil {
					c.Close()
					c = nil
					continue
				}
				ok.Add(1)
			}
			if c != nil {
				_ = c.Quit()
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		return int(ok.Load()), err
	default:
	}
	return int(ok.Load()), nil
}

// submitMs records how long each paced submission took (MAIL FROM to the
// reply after the final dot), for telling submission latency from
// delivery latency.
var (
	submitMu sync.Mutex
	submitMs []float64
)

func submitPercentiles() (p50, p99 float64) {
	submitMu.Lock()
	defer submitMu.Unlock()
	s := append([]float64(nil), submitMs...)
	submitMs = nil
	sort.Float64s(s)
	return percentile(s, 50), percentile(s, 99)
}
