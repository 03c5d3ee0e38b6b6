package submission

import (
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testutil"
)

// TestListenNoKeepAlive checks that a connection accepted by Listen's
// listener has TCP keep-alive off and TCP_NODELAY on.
func TestListenNoKeepAlive(t *testing.T) {
	srv, err := New(Config{Addr: "127.0.0.1:0",
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, &fakeQueue{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := srv.Listen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	cc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	c := <-accepted
	if c == nil {
		return
	}
	defer c.Close()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var keepAlive, noDelay int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		if keepAlive, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE); serr != nil {
			return
		}
		noDelay, serr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_NODELAY)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	if keepAlive != 0 || noDelay == 0 {
		t.Errorf("SO_KEEPALIVE %d, TCP_NODELAY %d; want 0 and on", keepAlive, noDelay)
	}
}

// BenchmarkKeepAliveSetup is what Go's default listener does for keep-alive
// at every accepted connection, and Listen's does not: the four
// setsockopt(2) calls of SetKeepAliveConfig with the default 15 s.
func BenchmarkKeepAliveSetup(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	tc := c.(*net.TCPConn)
	cfg := net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second}
	start := testutil.ProcessCPU()
	for b.Loop() {
		if err := tc.SetKeepAliveConfig(cfg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(testutil.ProcessCPU()-start)/float64(b.N), "cpu-ns/op")
}
