package submission

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
)

// nullQueue accepts every submission at once: the sessions' cost without
// the store's.
type nullQueue struct{ ids []string }

func (q nullQueue) Enqueue(context.Context, *queue.Submission) ([]string, error) { return q.ids, nil }

// benchBody is a 2 KiB message of 76-octet lines, the size of the
// end-to-end benchmark's, ending with the DATA terminator.
var benchBody = func() []byte {
	var b strings.Builder
	b.WriteString("From: a@example.com\r\nTo: b@example.com\r\nSubject: benchmark\r\n\r\n")
	for b.Len() < 2048-78 {
		b.WriteString(strings.Repeat("x", 74) + "\r\n")
	}
	b.WriteString(".\r\n")
	return []byte(b.String())
}()

// The client's commands, as bytes: a string written to a net.Conn is
// copied first, which would count against the server.
var (
	benchHELO = []byte("HELO client.example.com\r\n")
	benchEHLO = []byte("EHLO client.example.com\r\n")
	benchMail = []byte("MAIL FROM:<sender@example.com>\r\n")
	benchRcpt = []byte("RCPT TO:<rcpt@example.net>\r\n")
	benchData = []byte("DATA\r\n")
	benchQuit = []byte("QUIT\r\n")
)

// benchClient drives raw SMTP dialogues the way smtp-source does: one
// command, then wait for its whole reply.
type benchClient struct {
	b    *testing.B
	conn net.Conn
	r    *bufio.Reader
	body []byte // with the terminator; benchBody if nil
}

func (bc *benchClient) dial(addr *net.TCPAddr) {
	c, err := net.DialTCP("tcp", nil, addr)
	if err != nil {
		bc.b.Fatal(err)
	}
	bc.conn = c
	if bc.r == nil {
		bc.r = bufio.NewReader(c)
	} else {
		bc.r.Reset(c)
	}
	bc.expect('2')
}

// expect reads one reply, whose code must start with class.
func (bc *benchClient) expect(class byte) {
	for {
		line, err := bc.r.ReadSlice('\n')
		if err != nil {
			bc.b.Fatalf("reading reply: %v", err)
		}
		if len(line) < 4 || line[0] != class {
			bc.b.Fatalf("unexpected reply %q", line)
		}
		if line[3] == ' ' {
			return
		}
	}
}

func (bc *benchClient) cmd(line []byte, class byte) {
	if _, err := bc.conn.Write(line); err != nil {
		bc.b.Fatal(err)
	}
	bc.expect(class)
}

func (bc *benchClient) message() {
	bc.cmd(benchMail, '2')
	bc.cmd(benchRcpt, '2')
	bc.cmd(benchData, '3')
	if bc.body != nil {
		bc.cmd(bc.body, '2')
	} else {
		bc.cmd(benchBody, '2')
	}
}

// pipelinedMessage sends MAIL, RCPT and DATA in one write, as a client
// using PIPELINING does (RFC 2920: DATA ends the group), then the body.
func (bc *benchClient) pipelinedMessage() {
	if _, err := bc.conn.Write(benchGroup); err != nil {
		bc.b.Fatal(err)
	}
	bc.expect('2')
	bc.expect('2')
	bc.expect('3')
	bc.cmd(benchBody, '2')
}

var benchGroup = append(append(append([]byte(nil), benchMail...), benchRcpt...), benchData...)

func (bc *benchClient) quit() {
	bc.cmd(benchQuit, '2')
	if err := bc.conn.Close(); err != nil {
		bc.b.Fatal(err)
	}
}

// run is a benchmark's loop of messages, perConn to a connection: open
// starts a connection, send sends one message. It reports the process's
// CPU time per message as cpu-ns/op.
func (bc *benchClient) run(perConn int, open, send func()) {
	b := bc.b
	b.ReportAllocs()
	start := testutil.ProcessCPU()
	i := 0
	for b.Loop() {
		if i%perConn == 0 {
			open()
		}
		send()
		if i++; i%perConn == 0 {
			bc.quit()
		}
	}
	if i%perConn != 0 {
		bc.quit()
	}
	b.ReportMetric(float64(testutil.ProcessCPU()-start)/float64(b.N), "cpu-ns/op")
}

// benchServer starts a listener for the benchmarks: trusted loopback
// clients, serve's default logger (info, with timestamps) writing nowhere,
// and a queue that accepts everything. tweak, if not nil, runs before it
// serves.
func benchServer(b *testing.B, tweak func(*Server)) (*Server, *net.TCPAddr) {
	log := zerolog.New(io.Discard).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	srv, err := New(Config{
		Hostname:        "bench.localdomain",
		TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")},
		Logger:          log,
	}, nullQueue{ids: []string{"0123456789abcdef"}})
	if err != nil {
		b.Fatal(err)
	}
	if tweak != nil {
		tweak(srv)
	}
	l, err := srv.Listen()
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, ErrServerClosed) {
			b.Errorf("shutdown: %v", err)
		}
		if err := <-done; err != nil {
			b.Errorf("serve: %v", err)
		}
	})
	return srv, l.Addr().(*net.TCPAddr)
}

// BenchmarkSMTPSession runs whole SMTP dialogues over loopback against the
// listener with a queue that accepts everything: connect, HELO (as
// smtp-source says) or EHLO, MAIL, RCPT, DATA of 2 KiB, QUIT. An
// iteration is one message: OnePerConn* opens a connection per message
// like smtp-source, TenPerConn sends ten per connection, and
// TenPerConnPipelined sends each message's MAIL, RCPT and DATA in one
// write after EHLO, as a PIPELINING client (Postfix's smtp) does. The client runs in
// the same process, so cpu-ns/op (the process's CPU time per message, from
// getrusage) includes its share; it is the same for every build of the
// server. The logger is serve's default (info, with timestamps) writing
// nowhere.
func BenchmarkSMTPSession(b *testing.B) {
	_, addr := benchServer(b, nil)

	for _, tc := range []struct {
		name      string
		hello     []byte
		perConn   int
		pipelined bool
	}{
		{"OnePerConn", benchHELO, 1, false},
		{"OnePerConnEHLO", benchEHLO, 1, false},
		{"TenPerConn", benchHELO, 10, false},
		{"TenPerConnPipelined", benchEHLO, 10, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			bc := &benchClient{b: b}
			b.SetBytes(int64(len(benchBody)))
			send := bc.message
			if tc.pipelined {
				send = bc.pipelinedMessage
			}
			bc.run(tc.perConn, func() {
				bc.dial(addr)
				bc.cmd(tc.hello, '2')
			}, send)
		})
	}
}

var benchSTARTTLS = []byte("STARTTLS\r\n")

// BenchmarkSMTPSessionTLS is BenchmarkSMTPSession's TenPerConn under TLS:
// EHLO, STARTTLS, EHLO again, ten messages, QUIT, with each message's
// MAIL, RCPT and DATA one command at a time (OneByOne) or in one write
// (Pipelined). An iteration is one message and a tenth of a TLS handshake.
func BenchmarkSMTPSessionTLS(b *testing.B) {
	cert, pool := selfSigned(b)
	srvTLS := &tls.Config{Certificates: []tls.Certificate{cert}}
	cliTLS := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
	_, addr := benchServer(b, func(s *Server) { s.cfg.TLSConfig, s.smtp.TLSConfig = srvTLS, srvTLS })
	for _, pipelined := range []bool{false, true} {
		name := "OneByOne"
		if pipelined {
			name = "Pipelined"
		}
		b.Run(name, func(b *testing.B) {
			bc := &benchClient{b: b}
			b.SetBytes(int64(len(benchBody)))
			send := bc.message
			if pipelined {
				send = bc.pipelinedMessage
			}
			bc.run(10, func() {
				bc.dial(addr)
				bc.cmd(benchEHLO, '2')
				bc.cmd(benchSTARTTLS, '2')
				tc := tls.Client(bc.conn, cliTLS)
				if err := tc.Handshake(); err != nil {
					b.Fatal(err)
				}
				bc.conn = tc
				bc.r.Reset(tc)
				bc.cmd(benchEHLO, '2')
			}, send)
		})
	}
}

// BenchmarkDataBody is BenchmarkSMTPSession's TenPerConn with 2 KiB and
// 100 KiB bodies, read through dotReader and through go-smtp's own DATA
// reader (plainData): the difference is the octet loop dotReader replaces.
func BenchmarkDataBody(b *testing.B) {
	big := []byte(strings.Repeat(strings.Repeat("y", 74)+"\r\n", 100<<10/76) + ".\r\n")
	for _, size := range []struct {
		name string
		body []byte
	}{{"2KiB", benchBody}, {"100KiB", big}} {
		for _, plain := range []bool{false, true} {
			name := size.name + "/dotReader"
			if plain {
				name = size.name + "/go-smtp"
			}
			b.Run(name, func(b *testing.B) {
				_, addr := benchServer(b, func(s *Server) { s.plainData = plain })
				bc := &benchClient{b: b, body: size.body}
				b.SetBytes(int64(len(size.body)))
				bc.run(10, func() {
					bc.dial(addr)
					bc.cmd(benchHELO, '2')
				}, bc.message)
			})
		}
	}
}

// captureBackend hands the server's sessions out and keeps the go-smtp
// connection of the first one.
type captureBackend struct {
	backend
	conns chan *smtp.Conn
}

func (b captureBackend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	select {
	case b.conns <- c:
	default:
	}
	return b.backend.NewSession(c)
}

// BenchmarkSessionMessage is submission's own share of a message, without
// go-smtp's parsing and the sockets: on a connection go-smtp has accepted
// (over loopback, as in BenchmarkSMTPSession), each iteration calls what
// go-smtp calls for one message on a connection of its own: the session's
// creation at HELO, Mail, Rcpt, Data with the 2 KiB body (as go-smtp's
// DATA reader hands it over, without the terminator), Reset, Logout.
func BenchmarkSessionMessage(b *testing.B) {
	cb := captureBackend{conns: make(chan *smtp.Conn, 1)}
	srv, addr := benchServer(b, func(srv *Server) {
		cb.backend = backend{srv}
		srv.smtp.Backend = cb
	})
	bc := &benchClient{b: b}
	bc.dial(addr)
	bc.cmd(benchHELO, '2')
	var c *smtp.Conn
	select {
	case c = <-cb.conns:
	case <-time.After(testWait):
		b.Fatal("no session")
	}
	body := benchBody[:len(benchBody)-len(".\r\n")]
	rd := bytes.NewReader(nil)
	b.ReportAllocs()
	start := testutil.ProcessCPU()
	for b.Loop() {
		s := srv.newSession(c)
		if err := s.Mail("sender@example.com", &smtp.MailOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := s.Rcpt("rcpt@example.net", &smtp.RcptOptions{}); err != nil {
			b.Fatal(err)
		}
		rd.Reset(body)
		var se *smtp.SMTPError
		if err := s.Data(rd); !errors.As(err, &se) || se.Code != 250 {
			b.Fatal(err)
		}
		s.Reset()
		_ = s.Logout()
	}
	b.ReportMetric(float64(testutil.ProcessCPU()-start)/float64(b.N), "cpu-ns/op")
	bc.quit()
}
