package sender

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
)

const testHostname = "out.outflow.test"

// world is a fake Internet: DNS zones from go-mockdns and a dial hook that
// sends each 127.0.0.x:25 address to a fake MX on its random port. An
// address without a fake refuses the connection.
type world struct {
	t      testing.TB
	zones  map[string]mockdns.Zone
	mu     sync.Mutex
	routes map[string]string // "127.0.0.2:25" -> fake server addr
	dialed []string          // every address dialled, in order
	conns  []net.Conn        // every client connection opened
	// sndBuf, when > 0, shrinks each client connection's send buffer.
	sndBuf int
	// recordWrites keeps every Write of client connections in writes.
	recordWrites bool
	writes       []string
	logBuf       syncBuffer
	// rtt, when > 0, hands the server's octets to the client that long
	// after they arrived: a link with that round trip (benchmarks only).
	rtt time.Duration
}

func newWorld(t testing.TB) *world {
	return &world{t: t, zones: map[string]mockdns.Zone{}, routes: map[string]string{}}
}

// mx adds a fake MX host name with the given loopback IPs.
func (w *world) host(name string, ips ...string) {
	w.zones[name+"."] = mockdns.Zone{A: ips}
}

func (w *world) route(ip string, s *fakemx.Server) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.routes[net.JoinHostPort(ip, "25")] = s.Addr()
}

func (w *world) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	w.mu.Lock()
	w.dialed = append(w.dialed, addr)
	target, ok := w.routes[addr]
	w.mu.Unlock()
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: network, Err: syscall.ECONNREFUSED}
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, target)
	if err != nil {
		return nil, err
	}
	if w.sndBuf > 0 {
		_ = c.(*net.TCPConn).SetWriteBuffer(w.sndBuf)
	}
	w.mu.Lock()
	w.conns = append(w.conns, c)
	rec := w.recordWrites
	w.mu.Unlock()
	if rec {
		return &recordingConn{Conn: c, w: w}, nil
	}
	if w.rtt > 0 {
		return newLateConn(c, w.rtt), nil
	}
	return c, nil
}

// lateConn delivers what the server sends d after it arrived, so every
// wait for a reply costs a round trip of d, however many replies arrive
// together. A goroutine reads the socket; deadlines apply to its reads.
type lateConn struct {
	net.Conn
	in  chan lateChunk
	cur []byte
	err error
}

type lateChunk struct {
	at  time.Time
	b   []byte
	err error
}

func newLateConn(c net.Conn, d time.Duration) *lateConn {
	lc := &lateConn{Conn: c, in: make(chan lateChunk, 1024)}
	go func() {
		defer close(lc.in)
		for {
			buf := make([]byte, 32<<10)
			n, err := c.Read(buf)
			lc.in <- lateChunk{at: time.Now().Add(d), b: buf[:n], err: err}
			if err != nil {
				return
			}
		}
	}()
	return lc
}

func (c *lateConn) Read(p []byte) (int, error) {
	for len(c.cur) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		ch, ok := <-c.in
		if !ok {
			return 0, io.EOF
		}
		time.Sleep(time.Until(ch.at))
		c.cur, c.err = ch.b, ch.err
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

// recordingConn keeps the bytes of every Write, one entry per call, so a
// test can see what went out together.
type recordingConn struct {
	net.Conn
	w *world
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.w.mu.Lock()
	c.w.writes = append(c.w.writes, string(p))
	c.w.mu.Unlock()
	return c.Conn.Write(p)
}

func (w *world) writesSeen() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

func (w *world) dials() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.dialed...)
}

// config is a Config wired to the fake world, with short timeouts.
func (w *world) config() Config {
	return Config{
		Hostname:         testHostname,
		Resolver:         &mockdns.Resolver{Zones: w.zones},
		Dial:             w.dial,
		MXAllowLoopback:  true, // the fakes are on 127.0.0.x
		ConnectTimeout:   5 * time.Second,
		GreetingTimeout:  5 * time.Second,
		CommandTimeout:   5 * time.Second,
		DataInitTimeout:  5 * time.Second,
		DataBlockTimeout: 5 * time.Second,
		FinalDotTimeout:  5 * time.Second,
		Logger:           zerolog.New(&w.logBuf).Level(zerolog.DebugLevel),
	}
}

func (w *world) sender(cfg Config) *Sender {
	w.t.Helper()
	s, err := New(cfg)
	if err != nil {
		w.t.Fatalf("New: %v", err)
	}
	w.t.Cleanup(func() { _ = s.Close() })
	return s
}

// syncBuffer is the shared goroutine-safe log sink.
type syncBuffer = testutil.SyncBuffer

func testBody(subject string) []byte {
	return []byte("From: Alice <alice@sender.test>\r\nTo: bob@example.test\r\nSubject: " + subject +
		"\r\nMessage-ID: <" + subject + "@sender.test>\r\n\r\nHello.\r\n.leading dot\r\n")
}

func msg(domain string, rcpts ...string) *Message {
	return &Message{ID: "m1", From: "alice@sender.test", Rcpts: rcpts, Domain: domain, Body: testBody("test")}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// checkDelivered fails unless every recipient got a 250 to the final dot.
func checkDelivered(t *testing.T, r Result) {
	t.Helper()
	for _, rr := range r.Rcpts {
		if rr.Outcome.Stage != classify.StageDataEnd || rr.Outcome.Code != 250 {
			t.Errorf("%s: got %+v, want 250 at StageDataEnd", rr.Rcpt, rr.Outcome)
		}
	}
}

// checkAll fails unless every recipient has the given stage, code and event.
func checkAll(t *testing.T, r Result, stage classify.Stage, code int, ev classify.Event) {
	t.Helper()
	for _, rr := range r.Rcpts {
		o := rr.Outcome
		if o.Stage != stage || o.Code != code || o.Event != ev {
			t.Errorf("%s: got stage=%d code=%d event=%d text=%q; want stage=%d code=%d event=%d",
				rr.Rcpt, o.Stage, o.Code, o.Event, o.Text, stage, code, ev)
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling interval, not a wait for an event
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
