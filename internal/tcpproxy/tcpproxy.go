package tcpproxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Mode is what a Proxy does with traffic.
type Mode int

const (
	// Forward copies bytes both ways (the default).
	Forward Mode = iota
	// Blackhole stops copying in both directions and keeps every socket
	// open; new connections are accepted and not dialled onwards until the
	// proxy heals.
	Blackhole
	// Reset closes every connection with RST and closes new ones at once.
	Reset
)

func (m Mode) String() string {
	switch m {
	case Forward:
		return "forward"
	case Blackhole:
		return "blackhole"
	case Reset:
		return "reset"
	}
	return "unknown"
}

// dialTimeout bounds the dial to the target of a new connection.
const dialTimeout = 5 * time.Second

// The accept loop waits after an error other than the listener's closing
// (EMFILE, ENFILE, ECONNABORTED ...) before it tries again, so that a
// lasting one does not spin a core: from acceptBackoffMin, doubling up to
// acceptBackoffMax, back to the start at the next accepted connection, as
// net/http's Server.Serve does.
const (
	acceptBackoffMin = 5 * time.Millisecond
	acceptBackoffMax = time.Second
)

// nextAcceptDelay is the wait after an accept error that followed a wait
// of d (0: the first error since a connection was accepted).
func nextAcceptDelay(d time.Duration) time.Duration {
	if d <= 0 {
		return acceptBackoffMin
	}
	return min(2*d, acceptBackoffMax)
}

// Proxy forwards connections from its listener to one target address. Its
// methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	mode    Mode
	changed chan struct{} // closed and replaced at every mode change
	conns   map[net.Conn]struct{}
	closed  bool
	done    chan struct{} // closed by Close: ends the accept loop's wait
	wg      sync.WaitGroup
}

// New listens on listen (e.g. "127.0.0.1:0") and forwards to target.
func New(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	return serveOn(ln, target), nil
}

// serveOn starts a proxy that accepts on ln and forwards to target.
func serveOn(ln net.Listener, target string) *Proxy {
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Mode is the current mode.
func (p *Proxy) Mode() Mode {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mode
}

// Set switches to m. Switching to Reset closes every open connection.
func (p *Proxy) Set(m Mode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == m {
		return
	}
	p.mode = m
	close(p.changed)
	p.changed = make(chan struct{})
	if m == Reset {
		for c := range p.conns {
			resetConn(c)
		}
	}
}

// Blackhole is Set(Blackhole).
func (p *Proxy) Blackhole() { p.Set(Blackhole) }

// Reset is Set(Reset).
func (p *Proxy) Reset() { p.Set(Reset) }

// Heal is Set(Forward).
func (p *Proxy) Heal() { p.Set(Forward) }

// Conns is the number of connections open through the proxy, each side
// counted once.
func (p *Proxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the listener and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	close(p.done)
	close(p.changed)
	p.changed = make(chan struct{})
	err := p.ln.Close()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// resetConn closes c so that the peer sees a reset, not an orderly end.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// track adds c to the open connections; false when the proxy is closed or
// resetting, and c has been closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.mode == Reset {
		resetConn(c)
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

// waitForward blocks while the proxy is blackholed; it reports whether
// traffic may flow (false: reset or closed).
func (p *Proxy) waitForward() bool {
	for {
		p.mu.Lock()
		m, closed, ch := p.mode, p.closed, p.changed
		p.mu.Unlock()
		switch {
		case closed || m == Reset:
			return false
		case m == Forward:
			return true
		}
		<-ch
	}
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	var delay time.Duration
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			delay = nextAcceptDelay(delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
			continue
		}
		delay = 0
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

// serve dials the target once the proxy forwards, then copies both ways.
func (p *Proxy) serve(down net.Conn) {
	defer p.wg.Done()
	defer p.untrack(down)
	if !p.waitForward() {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		resetConn(down)
		return
	}
	if !p.track(up) {
		return
	}
	defer p.untrack(up)
	done := make(chan struct{})
	go func() {
		p.pipe(up, down)
		close(done)
	}()
	p.pipe(down, up)
	<-done
}

// pipe copies src to dst, holding each chunk (and the end of the stream)
// while the proxy is blackholed: src is not read meanwhile, so the
// sender's socket buffers fill and its writes block, as they would over a
// dead link.
func (p *Proxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.waitForward() {
			resetConn(dst)
			resetConn(src)
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite() // the other direction may still be talking
				return
			}
			dst.Close()
			return
		}
	}
}
