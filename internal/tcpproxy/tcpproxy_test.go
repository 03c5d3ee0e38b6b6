package tcpproxy

import (
	"bufio"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil"
)

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func start(t *testing.T) *Proxy {
	t.Helper()
	p, err := New("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *client {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c, bufio.NewReader(c)}
}

// roundTrip writes line and reads the echo within wait.
func (c *client) roundTrip(line string, wait time.Duration) (string, error) {
	_ = c.c.SetDeadline(time.Now().Add(wait))
	if _, err := io.WriteString(c.c, line+"\n"); err != nil {
		return "", err
	}
	got, err := c.r.ReadString('\n')
	return strings.TrimSuffix(got, "\n"), err
}

func TestForwards(t *testing.T) {
	p := start(t)
	c := dial(t, p)
	if got, err := c.roundTrip("hello", 5*time.Second); err != nil || got != "hello" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
}

// A blackhole keeps the connection and forwards nothing; after the heal,
// what was written meanwhile arrives, on the same connection.
func TestBlackholeHoldsThenHeals(t *testing.T) {
	p := start(t)
	c := dial(t, p)
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	_, err := c.roundTrip("during", 300*time.Millisecond)
	var ne net.Error
	if err == nil || !(errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("read through a blackhole: %v, want a timeout", err)
	}
	// A connection opened during the blackhole is accepted and silent too.
	c2 := dial(t, p)
	if _, err := c2.roundTrip("new", 300*time.Millisecond); err == nil {
		t.Fatal("a new connection got an answer through the blackhole")
	}
	if p.Conns() < 3 { // c's two sides and c2's accepted side
		t.Fatalf("%d connections open in the blackhole, want them kept", p.Conns())
	}
	p.Heal()
	_ = c.c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := c.r.ReadString('\n'); err != nil || got != "during\n" {
		t.Fatalf("after the heal: %q, %v; want the held line", got, err)
	}
	if got, err := c.roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}
	_ = c2.c.SetDeadline(time.Now().Add(5 * time.Second))
	if got, err := c2.r.ReadString('\n'); err != nil || got != "new\n" {
		t.Fatalf("the connection opened in the blackhole, after the heal: %q, %v", got, err)
	}
}

// A reset closes what is open and every new connection, until the heal.
func TestResetClosesThenHeals(t *testing.T) {
	p := start(t)
	c := dial(t, p)
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Reset()
	if _, err := c.roundTrip("during", 5*time.Second); err == nil {
		t.Fatal("an open connection still answers after a reset")
	}
	// The listener stays, so the dial succeeds (or meets the reset
	// already), and the connection dies.
	if c2, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second); err == nil {
		defer c2.Close()
		cl := &client{c2, bufio.NewReader(c2)}
		if _, err := cl.roundTrip("new", 5*time.Second); err == nil {
			t.Fatal("a new connection answers during a reset")
		}
	}
	p.Heal()
	c3 := dial(t, p)
	if got, err := c3.roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after the heal: %q, %v", got, err)
	}
}

func TestCloseEndsEverything(t *testing.T) {
	p := start(t)
	c := dial(t, p)
	if _, err := c.roundTrip("x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole() // a pipe waiting in the blackhole must end too
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.roundTrip("y", 5*time.Second); err == nil {
		t.Fatal("a connection answers after Close")
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("the listener accepts after Close")
	}
}

// flakyListener is a real listener whose first fails Accept calls return
// EMFILE, as a process out of file descriptors sees, without taking a
// connection from the backlog.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
	calls int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls++
	fail := l.calls <= l.fails
	l.mu.Unlock()
	if fail {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// An accept error that lasts is waited out, and the proxy forwards again
// once accepting works: the connection dialled meanwhile is served.
func TestAcceptRecoversAfterErrors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const fails = 6
	fl := &flakyListener{Listener: ln, fails: fails}
	p := serveOn(fl, echo(t))
	t.Cleanup(func() { p.Close() })
	c := dial(t, p)
	if got, err := c.roundTrip("after the errors", 10*time.Second); err != nil || got != "after the errors" {
		t.Fatalf("round trip: %q, %v", got, err)
	}
	fl.mu.Lock()
	calls := fl.calls
	fl.mu.Unlock()
	if calls != fails+1 && calls != fails+2 { // the loop may be in its next Accept already
		t.Fatalf("Accept called %d times, want %d errors then a connection", calls, fails)
	}
}

// The wait doubles from 5 ms to at most 1 s.
func TestAcceptBackoffDoubles(t *testing.T) {
	var got []time.Duration
	for d := time.Duration(0); len(got) < 10; {
		d = nextAcceptDelay(d)
		got = append(got, d)
	}
	ms := time.Millisecond
	want := []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
}

// Close ends the accept loop while it waits after an error, even from a
// listener that never reports itself closed.
func TestCloseDuringAcceptBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ln, fails: math.MaxInt}
	p := serveOn(fl, echo(t))
	testutil.WaitFor(t, 10*time.Second, "accept errors", func() bool {
		fl.mu.Lock()
		defer fl.mu.Unlock()
		return fl.calls >= 3
	})
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return: the accept loop kept retrying")
	}
}
