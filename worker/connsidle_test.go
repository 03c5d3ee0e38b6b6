package worker

import (
	"bytes"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
)

// connsGate admits everything until refuse is set; then it refuses the
// admissions to refuseDest "conns", as a throttle does a worker at its share
// of the destination's connection limit (none, once a learned limit dropped
// or the shares moved).
type connsGate struct {
	throttle.OpenGate
	refuseDest string
	refuse     atomic.Bool
	refusals   atomic.Int32
}

func (g *connsGate) Admit(ctx context.Context, domain, tenant, source string) (throttle.Permit, throttle.Refusal) {
	if domain == g.refuseDest && g.refuse.Load() {
		g.refusals.Add(1)
		return nil, throttle.Refusal{Until: time.Now().Add(time.Second), Reason: "conns"}
	}
	return g.OpenGate.Admit(ctx, domain, tenant, source)
}

// watchedConn is a client connection whose QUIT and close the test sees.
type watchedConn struct {
	net.Conn
	addr         string // the MX address dialled
	quit, closed atomic.Bool
}

func (c *watchedConn) Write(b []byte) (int, error) {
	if bytes.Contains(b, []byte("QUIT\r\n")) {
		c.quit.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// mxWorld sends every 127.0.0.x:25 to one fake MX and keeps the client's
// connections.
type mxWorld struct {
	target string
	mu     sync.Mutex
	conns  []*watchedConn
}

func (w *mxWorld) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, w.target)
	if err != nil {
		return nil, err
	}
	wc := &watchedConn{Conn: c, addr: addr}
	w.mu.Lock()
	w.conns = append(w.conns, wc)
	w.mu.Unlock()
	return wc, nil
}

func (w *mxWorld) to(addr string) []*watchedConn {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*watchedConn
	for _, c := range w.conns {
		if c.addr == addr {
			out = append(out, c)
		}
	}
	return out
}

// TestConnsRefusalClosesIdleConnections: a worker refused "conns" for a
// destination closes its idle pooled connections to the destination's MX
// host at once, and leaves another destination's alone. Before, they stayed
// open for the sender's idle timeout (30 s): a provider that counts
// connections refused those of the worker holding the fleet's share (421 at
// the greeting), and a fleet of three sent nothing for 30 s.
func TestConnsRefusalClosesIdleConnections(t *testing.T) {
	e := newEnv(t, nil)
	mw := &mxWorld{target: e.mx.Addr()}
	zones := map[string]mockdns.Zone{
		"a.test.":    {MX: []net.MX{{Host: "mx.a.test.", Pref: 10}}},
		"b.test.":    {MX: []net.MX{{Host: "mx.b.test.", Pref: 10}}},
		"mx.a.test.": {A: []string{"127.0.0.2"}},
		"mx.b.test.": {A: []string{"127.0.0.3"}},
	}
	snd, err := sender.New(sender.Config{Hostname: "outflow.test", Resolver: &mockdns.Resolver{Zones: zones},
		Dial: mw.dial, MXAllowLoopback: true, FinalDotTimeout: 2 * time.Second, CommandTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = snd.Close() })
	gate := &connsGate{refuseDest: "a.test"}
	e.startPool(func(c *Config) { c.Sender, c.Gate, c.Workers = snd, gate, 1 })
	defer e.stopPool()

	e.waitEvent(e.submit("r@a.test"), queue.EventDelivered)
	e.waitEvent(e.submit("r@b.test"), queue.EventDelivered)
	a, b := mw.to("127.0.0.2:25"), mw.to("127.0.0.3:25")
	if len(a) != 1 || len(b) != 1 || a[0].closed.Load() || b[0].closed.Load() {
		t.Fatalf("want one idle connection to each MX host; a %d, b %d", len(a), len(b))
	}

	gate.refuse.Store(true)
	id := e.submit("s@a.test")
	testutil.WaitFor(t, 10*time.Second, "a conns refusal", func() bool { return gate.refusals.Load() > 0 })
	testutil.WaitFor(t, 5*time.Second, "QUIT and close of the idle connection to a.test's MX", func() bool {
		return a[0].quit.Load() && a[0].closed.Load()
	})
	if b[0].quit.Load() || b[0].closed.Load() {
		t.Error("b.test's idle connection was closed by a.test's refusal")
	}

	// Admitted again, the envelope goes out on a new connection.
	gate.refuse.Store(false)
	e.waitEvent(id, queue.EventDelivered)
	if n := len(mw.to("127.0.0.2:25")); n != 2 {
		t.Errorf("%d connections to a.test's MX, want 2", n)
	}
}
