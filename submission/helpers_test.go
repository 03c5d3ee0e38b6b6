package submission

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/queue"
)

// testWait bounds every wait in these tests; nothing sleeps.
const testWait = 10 * time.Second

const (
	testUser     = "app"
	testPassword = "correct horse battery staple"
)

// fakeQueue records submissions. err, when set, is returned instead;
// block, when set, makes Enqueue wait for it (after signalling entered).
type fakeQueue struct {
	mu      sync.Mutex
	subs    []*queue.Submission // copies: the listener reuses the body's buffer
	heads   []int               // free octets in front of each body in its frame, -1 for none
	err     error
	block   chan struct{}
	entered chan struct{}
	n       int
}

func (f *fakeQueue) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	if f.entered != nil {
		f.entered <- struct{}{}
	}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	f.n++
	// The listener reuses the body's buffer once Enqueue returns: keep a
	// copy, as the real queue keeps what it stored.
	c := *s
	c.Body, c.Frame = bytes.Clone(s.Body), nil
	f.subs = append(f.subs, &c)
	head := len(s.Frame) - len(s.Body)
	if len(s.Body) == 0 || head <= 0 || &s.Frame[head] != &s.Body[0] {
		head = -1 // the body is not the tail of its frame
	}
	f.heads = append(f.heads, head)
	return []string{fmt.Sprintf("id%d", f.n)}, nil
}

// frameHeads returns heads.
func (f *fakeQueue) frameHeads() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.heads...)
}

func (f *fakeQueue) got() []*queue.Submission {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*queue.Submission(nil), f.subs...)
}

// syncBuffer is the shared goroutine-safe log sink.
type syncBuffer = testutil.SyncBuffer

// testUsers returns a Users with testUser at bcrypt's minimum cost.
func testUsers(t *testing.T) *Users {
	t.Helper()
	h, err := bcrypt.GenerateFromPassword([]byte(testPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	u, err := ParseUsers(strings.NewReader(testUser + ":" + string(h) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

type testServer struct {
	srv  *Server
	addr string
	reg  *prometheus.Registry
	logs *syncBuffer
	done chan error
}

// startServer serves cfg on 127.0.0.1:0; tweak, if given, runs before
// Serve. The server is shut down at the end of the test.
func startServer(t *testing.T, cfg Config, q Enqueuer, tweak ...func(*Server)) *testServer {
	t.Helper()
	ts := &testServer{reg: prometheus.NewRegistry(), logs: &syncBuffer{}, done: make(chan error, 1)}
	if cfg.Hostname == "" {
		cfg.Hostname = "mx.test"
	}
	cfg.Registerer = ts.reg
	cfg.Logger = zerolog.New(ts.logs)
	srv, err := New(cfg, q)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tweak {
		f(srv)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.srv, ts.addr = srv, l.Addr().String()
	go func() { ts.done <- srv.Serve(l) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testWait)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil && !errors.Is(err, ErrServerClosed) {
			t.Errorf("shutdown: %v", err)
		}
		select {
		case err := <-ts.done:
			// A test that only used another listener (dialCounted) can
			// shut down before this Serve got going; it then returns
			// ErrServerClosed, as documented.
			if err != nil && !errors.Is(err, ErrServerClosed) {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(testWait):
			t.Error("Serve did not return after Shutdown")
		}
	})
	return ts
}

// counter reads a counter or gauge value from the test registry.
func (ts *testServer) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := ts.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			if m.GetGauge() != nil {
				return m.GetGauge().GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// dial opens a go-smtp client and says EHLO.
func (ts *testServer) dial(t *testing.T) *smtp.Client {
	t.Helper()
	c, err := smtp.Dial(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	c.CommandTimeout = testWait
	c.SubmissionTimeout = testWait
	t.Cleanup(func() { c.Close() })
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	return c
}

// dialAuth opens a client authenticated as testUser with PLAIN.
func (ts *testServer) dialAuth(t *testing.T) *smtp.Client {
	t.Helper()
	c := ts.dial(t)
	if err := c.Auth(sasl.NewPlainClient("", testUser, testPassword)); err != nil {
		t.Fatalf("auth: %v", err)
	}
	return c
}

// wantCode checks that err is an SMTP reply with code and enhanced code
// (ec may be zero to skip it).
func wantCode(t *testing.T, err error, code int, ec smtp.EnhancedCode) *smtp.SMTPError {
	t.Helper()
	var se *smtp.SMTPError
	if !errors.As(err, &se) {
		t.Fatalf("want SMTP %d %v, got %v", code, ec, err)
	}
	if se.Code != code || (ec != smtp.EnhancedCode{} && se.EnhancedCode != ec) {
		t.Fatalf("want SMTP %d %v, got %d %v %q", code, ec, se.Code, se.EnhancedCode, se.Message)
	}
	return se
}

// send runs one transaction on c and returns the error of the first step
// that failed.
// data sends body as the open transaction's message on c.
func data(t *testing.T, c *smtp.Client, body string) {
	t.Helper()
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(w, body); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

func send(c *smtp.Client, from string, to []string, body string) error {
	return testutil.Send(c, from, to, []byte(body))
}

// raw is a hand-driven SMTP dialogue, for what a well-behaved client
// library will not send.
type raw struct {
	t *testing.T
	c net.Conn
	r *textproto.Reader
}

func (ts *testServer) raw(t *testing.T) *raw {
	t.Helper()
	c, err := net.DialTimeout("tcp", ts.addr, testWait)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &raw{t: t, c: c, r: textproto.NewReader(bufioReader(c))}
	rc.expect(220)
	return rc
}

// write sends s as-is.
func (rc *raw) write(s string) {
	rc.t.Helper()
	_ = rc.c.SetWriteDeadline(time.Now().Add(testWait))
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// cmd sends one command line and expects the reply code.
func (rc *raw) cmd(line string, code int) string {
	rc.t.Helper()
	rc.write(line + "\r\n")
	return rc.expect(code)
}

// reply reads one (possibly multi-line) reply.
func (rc *raw) reply() (int, string, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(testWait))
	return rc.r.ReadResponse(0)
}

// expect reads one reply and checks its code; it returns the text.
func (rc *raw) expect(code int) string {
	rc.t.Helper()
	got, msg, err := rc.reply()
	if got != code {
		rc.t.Fatalf("want %d, got %d %q (%v)", code, got, msg, err)
	}
	return msg
}

// expectClosed waits for the server to close the connection.
func (rc *raw) expectClosed() {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(testWait))
	line, err := rc.r.ReadLine()
	if err == nil {
		rc.t.Fatalf("want connection closed, got %q", line)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		rc.t.Fatal("connection still open")
	}
}

// login does EHLO and AUTH PLAIN as testUser.
func (rc *raw) login() {
	rc.t.Helper()
	rc.cmd("EHLO client.test", 250)
	rc.cmd("AUTH PLAIN "+plainIR("", testUser, testPassword), 235)
}

// eventually polls cond until it holds or testWait passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(testWait)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		case <-tick.C:
		}
	}
}

func bufioReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

func bufioTextReader(c net.Conn) *textproto.Reader { return textproto.NewReader(bufio.NewReader(c)) }

// plainIR is the base64 initial response of AUTH PLAIN.
func plainIR(identity, user, pass string) string {
	return base64.StdEncoding.EncodeToString([]byte(identity + "\x00" + user + "\x00" + pass))
}
