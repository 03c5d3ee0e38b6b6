package submission

import (
	"net"
	"net/textproto"
	"strings"
	"sync"
	"testing"
)

// writeCounter counts the writes that reach a connection.
type writeCounter struct {
	net.Conn
	mu     sync.Mutex
	writes []string
}

func (w *writeCounter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, string(b))
	w.mu.Unlock()
	return w.Conn.Write(b)
}

func (w *writeCounter) got() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.writes...)
}

// countingListener hands out connections whose writes are counted.
type countingListener struct {
	net.Listener
	conns chan *writeCounter
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	wc := &writeCounter{Conn: c}
	l.conns <- wc
	return wc, nil
}

// Every reply is one write, a multi-line EHLO answer included: go-smtp
// flushes each line, and ten loopback writes per EHLO were most of the
// receive path's system time.
func TestMultiLineReplyIsOneWrite(t *testing.T) {
	ts := startServer(t, Config{Users: testUsers(t)}, &fakeQueue{})
	// A second listener of the same server, counting writes.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: l, conns: make(chan *writeCounter, 1)}
	go func() { _ = ts.srv.Serve(cl) }()

	nc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	wc := <-cl.conns
	tp := textproto.NewConn(nc)
	if _, _, err := tp.ReadResponse(220); err != nil {
		t.Fatal(err)
	}
	if err := tp.PrintfLine("EHLO client.test"); err != nil {
		t.Fatal(err)
	}
	_, ehlo, err := tp.ReadResponse(250)
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(ehlo, "\n") + 1; lines < 4 {
		t.Fatalf("EHLO reply of %d lines, want several: %q", lines, ehlo)
	}
	if err := tp.PrintfLine("NOOP"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.ReadResponse(250); err != nil {
		t.Fatal(err)
	}
	w := wc.got()
	if len(w) != 3 {
		t.Fatalf("%d writes for greeting, EHLO and NOOP, want 3: %q", len(w), w)
	}
	if !strings.HasPrefix(w[1], "250-") || !strings.Contains(w[1], "\r\n250 ") {
		t.Errorf("EHLO write %q, want the whole reply", w[1])
	}
}

func TestIsContinuationLine(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want bool
	}{
		{"250-PIPELINING\r\n", true},
		{"250-\r\n", true},
		{"250 SIZE\r\n", false},
		{"250-PIPELINING", false},        // not a whole line
		{"25a-X\r\n", false},             // not a code
		{"\x17\x03\x03\x2d-\r\n", false}, // a TLS record header
		{"", false},
	} {
		if got := isContinuationLine([]byte(tc.in)); got != tc.want {
			t.Errorf("isContinuationLine(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// nullConn swallows writes.
type nullConn struct {
	net.Conn
	writes int
}

func (c *nullConn) Write(b []byte) (int, error) { c.writes++; return len(b), nil }

// BenchmarkEHLOReplyWrite is go-smtp's writing of an EHLO reply, a line at a
// time, through trackedConn; writes/op is what reaches the socket.
func BenchmarkEHLOReplyWrite(b *testing.B) {
	nc := &nullConn{}
	tc := &trackedConn{Conn: nc}
	lines := [][]byte{
		[]byte("250-Hello client.test\r\n"), []byte("250-PIPELINING\r\n"), []byte("250-8BITMIME\r\n"),
		[]byte("250-ENHANCEDSTATUSCODES\r\n"), []byte("250-CHUNKING\r\n"), []byte("250-SMTPUTF8\r\n"),
		[]byte("250-DSN\r\n"), []byte("250-SIZE 26214400\r\n"), []byte("250 LIMITS RCPTMAX=100\r\n"),
	}
	b.ReportAllocs()
	for b.Loop() {
		for _, l := range lines {
			if _, err := tc.Write(l); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(nc.writes)/float64(b.N), "writes/op")
}
