package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/nats-io/nats.go"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/queue"
)

// Helpers shared by the reliability tests (issue 10): fault injection,
// a steady submission load that remembers what was accepted with 250, and
// counting at the sink by Message-ID.

// longMode reports whether the heavy variants run (make test-long).
func longMode() bool { return os.Getenv("OUTFLOW_LONG") == "1" }

// fastRetry are serve flags that make the retry lane recover in seconds.
var fastRetry = []string{"--retry-base", "100ms", "--retry-min", "50ms", "--retry-cap", "1s", "--relay-tls", "none"}

var serveHelp struct {
	once sync.Once
	text string
}

// serveHasFlag reports whether `outflow serve` knows --name, so a test can
// use a flag the lead has not added yet and skip, saying so, until then.
func serveHasFlag(name string) bool {
	serveHelp.once.Do(func() {
		out, _ := exec.Command(binary, "serve", "--help").CombinedOutput()
		serveHelp.text = string(out)
	})
	return strings.Contains(serveHelp.text, "--"+name+" ")
}

// optionalFlag returns [--name value] when serve has the flag, else nil.
func optionalFlag(name, value string) []string {
	if serveHasFlag(name) {
		return []string{"--" + name, value}
	}
	return nil
}

// pid is the daemon's process id.
func (d *daemon) pid() int { return d.cmd.Process.Pid }

// alive reports whether the daemon process is still running.
func (d *daemon) alive() bool {
	select {
	case <-d.exited:
		return false
	default:
		return true
	}
}

// rssKiB is the daemon's resident set size in KiB (0 if unreadable).
func (d *daemon) rssKiB() int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.pid()))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return 0
}

// countLog counts log lines containing every one of parts.
func (d *daemon) countLog(parts ...string) int {
	n := 0
	for _, line := range strings.Split(d.Logs(), "\n") {
		ok := line != ""
		for _, p := range parts {
			if !strings.Contains(line, p) {
				ok = false
				break
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// requireNoPanic fails if the daemon logged a recovered panic or a data race.
func requireNoPanic(t *testing.T, logs string) {
	t.Helper()
	for _, bad := range []string{`"delivery panicked"`, "WARNING: DATA RACE", "panic:", "fatal error:"} {
		if strings.Contains(logs, bad) {
			t.Errorf("daemon log contains %q", bad)
		}
	}
}

var msgIDRe = regexp.MustCompile(`(?m)^Message-ID: (<[^>\r\n]*>)\r?$`)

// sinkCounts counts the messages a fake MX accepted, by Message-ID.
func sinkCounts(mx *fakemx.Server) map[string]int {
	out := map[string]int{}
	for _, m := range mx.Messages() {
		if s := msgIDRe.FindSubmatch(m.Data); s != nil {
			out[string(s[1])]++
		} else {
			out["(none)"]++
		}
	}
	return out
}

// tally compares what was accepted with what arrived: missing are accepted
// ids never delivered, dups the extra copies of accepted ids, extra the
// ids delivered that were never confirmed with 250 (a submission cut off by
// a kill after its data was stored: legitimate, and counted).
type tally struct {
	accepted, delivered, missing, dups, extra int
	missingIDs                                []string
}

func (t tally) String() string {
	return fmt.Sprintf("accepted=%d delivered_unique=%d missing=%d duplicates=%d unconfirmed_delivered=%d",
		t.accepted, t.delivered, t.missing, t.dups, t.extra)
}

func compare(accepted map[string]bool, got map[string]int) tally {
	var r tally
	r.accepted = len(accepted)
	for id, n := range got {
		r.delivered++
		if accepted[id] {
			r.dups += n - 1
		} else {
			r.extra++
		}
	}
	for id := range accepted {
		if got[id] == 0 {
			r.missing++
			if len(r.missingIDs) < 10 {
				r.missingIDs = append(r.missingIDs, id)
			}
		}
	}
	return r
}

// allDelivered reports whether every accepted id has reached the sink.
func allDelivered(accepted map[string]bool, mx *fakemx.Server) bool {
	got := sinkCounts(mx)
	for id := range accepted {
		if got[id] == 0 {
			return false
		}
	}
	return true
}

// load submits messages continuously over SMTP from conns connections to
// whatever address addr currently holds (a restarted daemon gets a new
// port), and records each Message-ID that got a 250. Errors (the daemon
// being killed, a 451) just make it reconnect and carry on with a new
// message: only a 250 counts as accepted.
type load struct {
	t        *testing.T
	prefix   string
	addr     atomic.Value // string
	rcpt     func(n int) string
	mu       sync.Mutex
	accepted map[string]bool
	attempts atomic.Int64
	failures atomic.Int64
	codes    sync.Map // reply code -> *atomic.Int64
	seq      atomic.Int64
	stop     chan struct{}
	wg       sync.WaitGroup
	pace     time.Duration
	tokens   chan struct{} // when set, one per submission (startRatedLoad)
}

func startLoad(t *testing.T, prefix, addr string, conns int, pace time.Duration) *load {
	l := &load{t: t, prefix: prefix, accepted: map[string]bool{}, stop: make(chan struct{}), pace: pace,
		rcpt: func(n int) string { return fmt.Sprintf("r%d@dest.test", n%7) }}
	l.addr.Store(addr)
	for c := range conns {
		l.wg.Add(1)
		go l.run(c)
	}
	t.Cleanup(l.Stop)
	return l
}

// startRatedLoad is a load of rate submissions per second in all, from
// conns connections, with rcpt choosing the recipient of message n. Time
// lost (a daemon down, slow replies) is not made up later: the load never
// runs faster than rate, beyond a burst of a tenth of a second's worth.
func startRatedLoad(t *testing.T, prefix, addr string, conns int, rate float64, rcpt func(n int) string) *load {
	burst := max(1, int(rate/10))
	l := &load{t: t, prefix: prefix, accepted: map[string]bool{}, stop: make(chan struct{}), rcpt: rcpt,
		tokens: make(chan struct{}, burst)}
	l.addr.Store(addr)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		const tick = 10 * time.Millisecond
		tk := time.NewTicker(tick)
		defer tk.Stop()
		var due float64
		for {
			select {
			case <-l.stop:
				return
			case <-tk.C:
			}
			for due += rate * tick.Seconds(); due >= 1; due-- {
				select {
				case l.tokens <- struct{}{}:
				default: // the submitters are behind: the token is dropped
				}
			}
		}
	}()
	for c := range conns {
		l.wg.Add(1)
		go l.run(c)
	}
	t.Cleanup(l.Stop)
	return l
}

// SetAddr points the load at a restarted daemon.
func (l *load) SetAddr(a string) { l.addr.Store(a) }

// Stop ends the load and waits for the submitters.
func (l *load) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// Accepted returns a copy of the accepted Message-IDs.
func (l *load) Accepted() map[string]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]bool, len(l.accepted))
	for k := range l.accepted {
		out[k] = true
	}
	return out
}

// NumAccepted is how many messages got a 250 so far.
func (l *load) NumAccepted() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.accepted)
}

func (l *load) code(c int) {
	v, _ := l.codes.LoadOrStore(c, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// Codes returns how often each final reply code was seen.
func (l *load) Codes() map[int]int64 {
	out := map[int]int64{}
	l.codes.Range(func(k, v any) bool { out[k.(int)] = v.(*atomic.Int64).Load(); return true })
	return out
}

func (l *load) stopped() bool {
	select {
	case <-l.stop:
		return true
	default:
		return false
	}
}

func (l *load) run(c int) {
	defer l.wg.Done()
	var cl *smtp.Client
	defer func() {
		if cl != nil {
			cl.Close()
		}
	}()
	for !l.stopped() {
		if cl == nil {
			var err error
			cl, _, err = dialAuthNoFatal(l.addr.Load().(string))
			if err != nil {
				cl = nil
				select {
				case <-l.stop:
					return
				case <-time.After(100 * time.Millisecond): // the daemon is restarting: poll
				}
				continue
			}
		}
		if l.tokens != nil {
			select {
			case <-l.stop:
				return
			case <-l.tokens:
			}
		}
		n := int(l.seq.Add(1))
		id := fmt.Sprintf("<%s-%d@e2e.test>", l.prefix, n)
		body := []byte("From: app@sender.test\r\nTo: " + l.rcpt(n) + "\r\nSubject: load " + strconv.Itoa(n) +
			"\r\nMessage-ID: " + id + "\r\n\r\nload message " + strconv.Itoa(n) + " from submitter " + strconv.Itoa(c) + "\r\n")
		l.attempts.Add(1)
		err := submit(cl, "app@sender.test", []string{l.rcpt(n)}, body)
		if err == nil {
			l.code(250)
			l.mu.Lock()
			l.accepted[id] = true
			l.mu.Unlock()
		} else {
			l.failures.Add(1)
			var se *smtp.SMTPError
			if errors.As(err, &se) {
				l.code(se.Code)
				if se.Code == 250 {
					l.t.Errorf("submit error carrying 250: %v", err)
				}
				_ = cl.Reset()
			} else {
				l.code(0) // connection lost: no reply
				cl.Close()
				cl = nil
			}
		}
		if l.pace > 0 {
			select {
			case <-l.stop:
				return
			case <-time.After(l.pace): // pacing the load, not waiting for an event
			}
		}
	}
}

// dialAuthNoFatal is dialAuth for goroutines: it returns errors.
func dialAuthNoFatal(addr string) (*smtp.Client, net.Conn, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	c := smtp.NewClient(conn)
	// go-smtp's own deadlines (5 and 12 minutes) override the socket's.
	c.CommandTimeout, c.SubmissionTimeout = 60*time.Second, 90*time.Second
	if err := c.Hello("client.test"); err != nil {
		c.Close()
		return nil, nil, err
	}
	if err := c.Auth(sasl.NewPlainClient("", testUser, testPassword)); err != nil {
		c.Close()
		return nil, nil, err
	}
	return c, conn, nil
}

// waitAllDelivered waits until every accepted id has reached mx.
func waitAllDelivered(t *testing.T, accepted map[string]bool, mx *fakemx.Server, timeout time.Duration, logs func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !allDelivered(accepted, mx) {
		if time.Now().After(deadline) {
			r := compare(accepted, sinkCounts(mx))
			t.Fatalf("after %v: %s; first missing %v\n--- daemon log tail ---\n%s", timeout, r, r.missingIDs, tail(logs(), 60))
		}
		time.Sleep(100 * time.Millisecond) // polling the sink with a deadline
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// natsURLOf is the URL, credentials included, of the embedded NATS of the
// daemon whose data dir is data: what a second daemon's --nats-url names
// to join it as a worker on another machine would.
func natsURLOf(t *testing.T, data string) string {
	t.Helper()
	ci, err := queue.ReadClientInfo(data)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Replace(ci.URL, "nats://", "nats://"+ci.User+":"+ci.Password+"@", 1)
}

// natsFor connects to a running daemon's embedded NATS with the
// credentials it wrote into its data dir.
func natsFor(t *testing.T, data string) *nats.Conn {
	t.Helper()
	ci, err := queue.ReadClientInfo(data)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ci.URL, nats.UserInfo(ci.User, ci.Password), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatalf("connect to the daemon's NATS %s: %v", ci.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// runCLI runs the outflow binary with args and returns stdout+stderr.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	return string(out), err
}

// switchFront is a TCP front for the relay whose behaviour a test flips at
// run time: proxy to the real (fake) MX, refuse connections (listener
// closed), hang (accept and never answer), or greet with a fixed reply and
// hang up. It always listens on the same 127.0.0.1 port.
type switchFront struct {
	t      *testing.T
	addr   string
	target string
	mode   atomic.Value // string: "proxy", "refuse", "hang", "greet"
	greet  string

	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
	closed bool
}

func newSwitchFront(t *testing.T, target string) *switchFront {
	t.Helper()
	f := &switchFront{t: t, target: target, conns: map[net.Conn]struct{}{}}
	f.mode.Store("proxy")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.addr = ln.Addr().String()
	f.ln = ln
	f.wg.Add(1)
	go f.accept(ln)
	t.Cleanup(f.Close)
	return f
}

// Set switches the behaviour; "refuse" closes the listener so connections
// are refused, any other mode reopens it on the same port. Connections held
// open (hanging or proxied) are closed when the mode changes.
func (f *switchFront) Set(mode string) {
	f.t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mode.Store(mode)
	// Like a server restart: connections of the old mode end, pooled
	// ones included.
	for c := range f.conns {
		c.Close()
	}
	switch {
	case mode == "refuse" && f.ln != nil:
		f.ln.Close()
		f.ln = nil
	case mode != "refuse" && f.ln == nil:
		var ln net.Listener
		var err error
		for i := 0; i < 100; i++ { // the port was ours a moment ago
			if ln, err = net.Listen("tcp", f.addr); err == nil {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			f.t.Fatalf("reopen %s: %v", f.addr, err)
		}
		f.ln = ln
		f.wg.Add(1)
		go f.accept(ln)
	}
}

func (f *switchFront) accept(ln net.Listener) {
	defer f.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			c.Close()
			return
		}
		f.conns[c] = struct{}{}
		f.mu.Unlock()
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			defer func() {
				f.mu.Lock()
				delete(f.conns, c)
				f.mu.Unlock()
				c.Close()
			}()
			switch f.mode.Load().(string) {
			case "hang":
				_, _ = io.Copy(io.Discard, c) // until the client or Set closes it
			case "greet":
				_, _ = io.WriteString(c, f.greet)
			default:
				up, err := net.DialTimeout("tcp", f.target, 5*time.Second)
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{})
				go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); close(done) }()
				_, _ = io.Copy(c, up)
				c.(*net.TCPConn).CloseWrite()
				<-done
			}
		}()
	}
}

// Close stops the front and every connection it holds.
func (f *switchFront) Close() {
	f.mu.Lock()
	f.closed = true
	if f.ln != nil {
		f.ln.Close()
		f.ln = nil
	}
	for c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
	f.wg.Wait()
}
