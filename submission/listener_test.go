package submission

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"net/textproto"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
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
	nc, wc := dialCounted(t, ts)
	tp := textproto.NewConn(nc)
	ehlo := greet(t, tp)
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

// dialCounted connects to a second listener of ts's server whose
// connections count the writes that reach the socket.
func dialCounted(t *testing.T, ts *testServer) (net.Conn, *writeCounter) {
	t.Helper()
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
	t.Cleanup(func() { nc.Close() })
	if err := nc.SetDeadline(time.Now().Add(testWait)); err != nil {
		t.Fatal(err)
	}
	return nc, <-cl.conns
}

// greet reads the greeting, says EHLO and returns the EHLO reply's text.
func greet(t *testing.T, tp *textproto.Conn) string {
	t.Helper()
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
	return ehlo
}

// sendGroup writes a group of commands to w in one write, reads the
// replies with codes from tp, and returns the writes that reached the
// server's socket meanwhile (under TLS, records).
func sendGroup(t *testing.T, w io.Writer, tp *textproto.Conn, wc *writeCounter, group string, codes ...int) []string {
	t.Helper()
	before := len(wc.got())
	if _, err := io.WriteString(w, group); err != nil {
		t.Fatal(err)
	}
	for _, code := range codes {
		if _, _, err := tp.ReadResponse(code); err != nil {
			t.Fatalf("after %q: %v", group, err)
		}
	}
	return wc.got()[before:]
}

// A PIPELINING client's group of commands (RFC 2920) is answered in one
// write: the replies to MAIL, RCPT and DATA wait while go-smtp's buffer
// still holds the group's next command. No reply waits for the client: a
// group that does not end in DATA is answered once the buffer is used up,
// and a reply held when go-smtp closes the connection is written first.
func TestPipelinedRepliesAreOneWrite(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, q)
	nc, wc := dialCounted(t, ts)
	tp := textproto.NewConn(nc)
	if ehlo := greet(t, tp); !strings.Contains(ehlo, "PIPELINING") {
		t.Fatalf("EHLO %q, want PIPELINING advertised", ehlo)
	}
	send := func(group string, codes ...int) []string {
		t.Helper()
		return sendGroup(t, nc, tp, wc, group, codes...)
	}

	w := send("MAIL FROM:<a@example.com>\r\nRCPT TO:<b@example.net>\r\nRCPT TO:<c@example.net>\r\nDATA\r\n", 250, 250, 250, 354)
	if len(w) != 1 || strings.Count(w[0], "250 ") != 3 || !strings.HasPrefix(w[0], "250 ") || !strings.Contains(w[0], "\r\n354 ") {
		t.Fatalf("the group's replies came in %d writes, want one with 250, 250, 250, 354: %q", len(w), w)
	}
	if w := send("Subject: pipelined\r\n\r\nhello\r\n.\r\n", 250); len(w) != 1 {
		t.Errorf("end of data answered in %d writes: %q", len(w), w)
	}
	if n := len(q.got()); n != 1 {
		t.Fatalf("%d messages queued, want 1", n)
	}
	// Without DATA at the end the client waits for both replies: they go
	// out when the buffer is used up, together.
	if w := send("MAIL FROM:<a@example.com>\r\nRCPT TO:<d@example.net>\r\n", 250, 250); len(w) != 1 {
		t.Errorf("MAIL and RCPT answered in %d writes, want 1: %q", len(w), w)
	}
	// A group whose last command has only partly arrived: the reply to
	// the first is held while its end is buffered, and written when
	// go-smtp has to wait for the rest, before the client sends it.
	send("RSET\r\n", 250)
	send("MAIL FROM:<a@example.com>\r\nRCPT TO:<e@exa", 250)
	send("mple.net>\r\n", 250)
	// QUIT with more behind it: go-smtp closes the connection while the
	// 221 is held, and the close writes it.
	w = send("RSET\r\nQUIT\r\nNOOP\r\n", 250, 221)
	if len(w) != 1 || !strings.Contains(w[0], "\r\n221 ") {
		t.Errorf("RSET and QUIT answered in writes %q, want one with 250 and 221", w)
	}
	if _, err := tp.ReadLine(); err != io.EOF {
		t.Errorf("after QUIT: %v, want the connection closed", err)
	}
}

// Under TLS the same groups are answered in one record each: the EHLO
// answer, and the 250s of a group with the reply that ends it. Only 250s
// are held there (see tlsReplies), so a QUIT behind an RSET still gets its
// 221 before go-smtp closes the connection.
func TestPipelinedRepliesUnderTLS(t *testing.T) {
	cert, pool := selfSigned(t)
	q := &fakeQueue{}
	ts := startServer(t, Config{TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}},
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, q)
	nc, wc := dialCounted(t, ts)
	tp := textproto.NewConn(nc)
	greet(t, tp)
	if err := tp.PrintfLine("STARTTLS"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tp.ReadResponse(220); err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(nc, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	tp = textproto.NewConn(tc)
	send := func(group string, codes ...int) int {
		t.Helper()
		return len(sendGroup(t, tc, tp, wc, group, codes...))
	}
	if n := send("EHLO client.test\r\n", 250); n != 1 {
		t.Errorf("EHLO under TLS answered in %d writes, want 1", n)
	}
	if n := send("MAIL FROM:<a@example.com>\r\nRCPT TO:<b@example.net>\r\nRCPT TO:<c@example.net>\r\nDATA\r\n", 250, 250, 250, 354); n != 1 {
		t.Errorf("the group's replies under TLS came in %d writes, want 1", n)
	}
	if n := send("Subject: pipelined\r\n\r\nhello\r\n.\r\n", 250); n != 1 {
		t.Errorf("end of data answered in %d writes", n)
	}
	if n := len(q.got()); n != 1 {
		t.Fatalf("%d messages queued, want 1", n)
	}
	if n := send("RSET\r\nQUIT\r\nNOOP\r\n", 250, 221); n < 1 {
		t.Errorf("RSET and QUIT answered in %d writes", n)
	}
	if _, err := tp.ReadLine(); err != io.EOF {
		t.Errorf("after QUIT: %v, want the connection closed", err)
	}
}

func TestReplyLine(t *testing.T) {
	for _, tc := range []struct {
		in       string
		last, ok bool
	}{
		{"250-PIPELINING\r\n", false, true},
		{"250-\r\n", false, true},
		{"250 SIZE\r\n", true, true},
		{"354 Go ahead\r\n", true, true},
		{"250\r\n", true, true},
		{"250-PIPELINING", false, false},        // not a whole line
		{"250 OK\n", false, false},              // not CRLF
		{"25a-X\r\n", false, false},             // not a code
		{"250xOK\r\n", false, false},            // no separator
		{"\x17\x03\x03\x2d-\r\n", false, false}, // a TLS record header
		{"\x17\x03\x03 \r\n", false, false},
		{"", false, false},
	} {
		if last, ok := replyLine([]byte(tc.in)); last != tc.last || ok != tc.ok {
			t.Errorf("replyLine(%q) = %v, %v; want %v, %v", tc.in, last, ok, tc.last, tc.ok)
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

// scriptConn is a socket whose reads return the octets of in, at most
// chunk at a time, and then err; it records the size of each read.
type scriptConn struct {
	net.Conn
	in    []byte
	chunk int
	err   error
	sizes []int // each read's size, unless count
	count bool  // count reads in reads only
	reads int
}

func (c *scriptConn) Read(b []byte) (int, error) {
	c.reads++
	if !c.count {
		c.sizes = append(c.sizes, len(b))
	}
	if len(c.in) == 0 {
		return 0, c.err
	}
	n := copy(b, c.in[:min(len(c.in), c.chunk)])
	c.in = c.in[n:]
	if len(c.in) == 0 && c.err != io.EOF {
		return n, c.err // the last octets and the error in one read
	}
	return n, nil
}

// A body is read from the socket up to 32 KiB at a time, and what the
// caller's buffer had no room for reaches it, in order, on the next reads,
// whatever the state then: the octets after a body (the next command, or
// TLS after STARTTLS) are never skipped or reordered. Commands are read
// with the caller's buffer as before.
func TestReadAheadKeepsTheStream(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 200 {
		in := make([]byte, rng.IntN(300<<10))
		for i := range in {
			in[i] = byte(rng.IntN(256))
		}
		endErr := io.EOF
		if round%3 == 0 {
			endErr = errors.New("connection reset")
		}
		sc := &scriptConn{in: bytes.Clone(in), chunk: 1 + rng.IntN(readAheadSize+1000), err: endErr}
		tc := &trackedConn{Conn: sc, srv: &Server{}}
		var out []byte
		var err error
		for {
			tc.inData = rng.IntN(4) != 0
			before := len(sc.sizes)
			b := make([]byte, 1+rng.IntN(8<<10))
			var n int
			n, err = tc.Read(b)
			out = append(out, b[:n]...)
			if !tc.inData && len(sc.sizes) > before && sc.sizes[len(sc.sizes)-1] != len(b) {
				t.Fatalf("round %d: a command read of %d octets asked the socket for %d", round, len(b), sc.sizes[len(sc.sizes)-1])
			}
			if err != nil {
				break
			}
		}
		if err != endErr {
			t.Fatalf("round %d: read ended with %v, want %v", round, err, endErr)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("round %d: %d octets read, %d sent, first difference at %d", round, len(out), len(in), firstDiff(out, in))
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// A 100 KiB body that the client has already written takes four reads of
// the socket, not one per 4 KiB of go-smtp's buffer.
func TestReadAheadTakesTheBodyAtOnce(t *testing.T) {
	for _, tc := range []struct {
		size  int
		sizes []int
	}{
		{100 << 10, []int{readAheadSize, readAheadSize, readAheadSize, readAheadSize, readAheadSize}},
		{2 << 10, []int{readAheadSize, readAheadSize}},
	} {
		body := bytes.Repeat([]byte(strings.Repeat("x", 78)+"\r\n"), tc.size/80)
		sc := &scriptConn{in: bytes.Clone(body), chunk: readAheadSize, err: io.EOF}
		conn := &trackedConn{Conn: sc, srv: &Server{}, inData: true}
		got, err := io.ReadAll(bufio.NewReaderSize(conn, 4096))
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("read %d octets (%v), want the %d sent", len(got), err, len(body))
		}
		// The last read is the one that finds the end of the stream.
		if !slices.Equal(sc.sizes, tc.sizes) {
			t.Errorf("a %d-octet body read from the socket as %v, want %v", len(body), sc.sizes, tc.sizes)
		}
	}
}

// BenchmarkBodyRead is go-smtp's 4 KiB buffer reading a 100 KiB body
// through trackedConn from a socket that holds all of it, read ahead (as a
// body is) and passed through (as commands are); reads/op is the read(2)
// calls it costs, which the fake socket does not charge for.
func BenchmarkBodyRead(b *testing.B) {
	body := bytes.Repeat([]byte(strings.Repeat("x", 78)+"\r\n"), 100<<10/80)
	for _, ahead := range []bool{true, false} {
		name := "ahead"
		if !ahead {
			name = "through"
		}
		b.Run(name, func(b *testing.B) {
			sc := &scriptConn{chunk: 1 << 20, err: io.EOF, count: true}
			tc := &trackedConn{Conn: sc, srv: &Server{}, inData: ahead}
			br := bufio.NewReaderSize(tc, 4096)
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				sc.in = body
				br.Reset(tc)
				// As dotReader reads: a fill of the buffer, then all of it.
				for {
					if _, err := br.Peek(1); err != nil {
						break
					}
					_, _ = br.Discard(br.Buffered())
				}
			}
			b.ReportMetric(float64(sc.reads)/float64(b.N), "reads/op")
		})
	}
}
