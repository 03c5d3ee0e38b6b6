package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/submission"
)

// binary is the outflow binary built once for the whole package.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "outflow-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "outflow")
	// A race-detector build sleeps a second before it exits, for other
	// goroutines' reports to finish (GORACE's atexit_sleep_ms). Every CLI
	// command and every daemon a test stops would pay it: the runbook's 44
	// commands alone, 44 seconds. A race is reported when it happens, and
	// still fails the command's exit status (66).
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	build := exec.Command("go", "build", "-race", "-o", binary, "./cmd/outflow")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build outflow:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const (
	testUser     = "app"
	testPassword = "correct horse battery staple"
)

// writeUsers writes a users file with one account and returns its path.
func writeUsers(t *testing.T, dir string) string {
	t.Helper()
	hash, err := submission.HashPassword(testPassword, 4)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "users")
	if err := os.WriteFile(p, []byte(testUser+":"+hash+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// daemon is a running `outflow serve`.
type daemon struct {
	t        *testing.T
	cmd      *exec.Cmd
	SMTPAddr string
	HTTPAddr string
	APIAddr  string // the HTTP API's listener, from its "HTTP API serving" line
	Data     string
	logMu    sync.Mutex
	logs     bytes.Buffer
	exited   chan struct{}
	exitErr  error
}

// startDaemon starts outflow serve with data dir data and extra args, and
// waits (up to 60s) for its "outflow serving" log line.
func startDaemon(t *testing.T, data string, args ...string) *daemon {
	t.Helper()
	d, err := tryStartDaemon(t, data, args...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// tryStartDaemon is startDaemon returning an error (with the daemon's log)
// when the daemon exits or does not serve within 60s, so that a test can
// start it again.
func tryStartDaemon(t *testing.T, data string, args ...string) (*daemon, error) {
	t.Helper()
	return tryStartDaemonBinary(t, binary, data, args...)
}

// startDaemonBinary is startDaemon with another build of outflow, bin (the
// soak measures a build without the race detector, whose shadow memory
// grows with every goroutine the daemon ever started).
func startDaemonBinary(t *testing.T, bin, data string, args ...string) *daemon {
	t.Helper()
	d, err := tryStartDaemonBinary(t, bin, data, args...)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func tryStartDaemonBinary(t *testing.T, bin, data string, args ...string) (*daemon, error) {
	t.Helper()
	// Delivery status notifications are off unless a test turns them on
	// (--dsn=true, a later flag wins): a bounce or dead letter would
	// otherwise add a notice to the fake MX, the queue and the counters
	// that tests about something else count exactly. dsn_test.go tests them.
	all := append([]string{"serve", "--data", data, "--smtp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--api-addr", "127.0.0.1:0", "--nats-addr", "127.0.0.1:0", "--log-level", "info", "--shutdown-grace", "10s", "--dsn=false"}, args...)
	cmd := exec.Command(bin, all...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	d := &daemon{t: t, cmd: cmd, Data: data, exited: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			d.logMu.Lock()
			d.logs.Write(line)
			d.logs.WriteByte('\n')
			d.logMu.Unlock()
			if bytes.Contains(line, []byte(`"HTTP API serving"`)) {
				var m map[string]any
				if json.Unmarshal(line, &m) == nil {
					d.logMu.Lock()
					d.APIAddr, _ = m["api_addr"].(string)
					d.logMu.Unlock()
				}
			}
			if bytes.Contains(line, []byte(`"outflow serving"`)) {
				var m map[string]any
				if json.Unmarshal(line, &m) == nil {
					ready <- m
				}
			}
		}
	}()
	go func() {
		d.exitErr = cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		d.Kill()
		assertNoRepeatedKeys(t, d.Logs()) // every line of every end-to-end run
	})
	select {
	case m := <-ready:
		d.SMTPAddr, _ = m["smtp_addr"].(string)
		d.HTTPAddr, _ = m["http_addr"].(string)
	case <-d.exited:
		return nil, fmt.Errorf("outflow exited before serving: %v\n%s", d.exitErr, d.Logs())
	case <-time.After(60 * time.Second):
		d.Kill()
		return nil, fmt.Errorf("outflow not serving after 60s\n%s", d.Logs())
	}
	return d, nil
}

// Logs returns everything the daemon wrote to stderr so far.
func (d *daemon) Logs() string {
	d.logMu.Lock()
	defer d.logMu.Unlock()
	return d.logs.String()
}

// Stop sends SIGTERM and waits for a clean exit.
func (d *daemon) Stop() {
	d.t.Helper()
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
		if d.exitErr != nil {
			d.t.Errorf("outflow exited with %v\n%s", d.exitErr, d.Logs())
		}
	case <-time.After(60 * time.Second):
		d.t.Errorf("outflow did not stop within 60s of SIGTERM")
		d.Kill()
	}
}

// Kill sends SIGKILL and waits for the process to be gone.
func (d *daemon) Kill() {
	select {
	case <-d.exited:
		return
	default:
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
}

// submit sends one message on an existing (authenticated) client.
func submit(c *smtp.Client, from string, to []string, body []byte) error {
	return testutil.Send(c, from, to, body)
}

// dialAuth connects to the submission port and authenticates.
func dialAuth(t *testing.T, addr, user, pass string) *smtp.Client {
	t.Helper()
	c, err := smtp.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	if err := c.Auth(sasl.NewPlainClient("", user, pass)); err != nil {
		t.Fatal(err)
	}
	return c
}

// message builds a small RFC 5322 message with a unique Message-ID.
func message(id string, extra string) []byte {
	return []byte("From: app@sender.test\r\nTo: rcpt@dest.test\r\nSubject: test " + id +
		"\r\nMessage-ID: <" + id + "@e2e.test>\r\n\r\nbody of " + id + "\r\n" + extra)
}

// messageIDs returns the Message-IDs of the received bodies, counted.
func messageIDs(bodies [][]byte) map[string]int {
	out := map[string]int{}
	for _, b := range bodies {
		for _, line := range strings.Split(string(b), "\r\n") {
			if v, ok := strings.CutPrefix(line, "Message-ID: "); ok {
				out[v]++
				break
			}
		}
	}
	return out
}

// waitFor polls cond every 50ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freeAddr returns a loopback address nothing listens on (connections are
// refused), for a destination that is down.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := l.Addr().String()
	l.Close()
	return a
}

var _ = context.Background

// assertNoRepeatedKeys fails for a JSON log line that carries a key twice
// (a child logger's field added again by the caller), and for a key whose
// values have two JSON types (number, string, array, object, bool; null
// is no type) across the lines of one run: a log store that types a field
// by its first value (Elasticsearch) rejects the lines of the other type,
// as it did the decision lines' list of rcpts after the count on
// "submission accepted".
func assertNoRepeatedKeys(t *testing.T, logs string) {
	t.Helper()
	type firstSeen struct{ typ, line string }
	types := map[string]firstSeen{}
	mixed := map[string]bool{}
	for _, line := range strings.Split(logs, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		dec := json.NewDecoder(strings.NewReader(line))
		if _, err := dec.Token(); err != nil {
			continue
		}
		seen := map[string]bool{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				break
			}
			key, _ := tok.(string)
			if seen[key] {
				t.Errorf("log line repeats %q: %s", key, line)
				return
			}
			seen[key] = true
			var v json.RawMessage
			if err := dec.Decode(&v); err != nil {
				break
			}
			typ := jsonType(v)
			if typ == "" || mixed[key] {
				continue
			}
			if f, ok := types[key]; !ok {
				types[key] = firstSeen{typ, line}
			} else if f.typ != typ {
				mixed[key] = true
				t.Errorf("log key %q has two JSON types: %s here, %s on an earlier line:\n%s\n%s", key, typ, f.typ, line, f.line)
			}
		}
	}
}

// jsonType is the JSON type of an encoded value: number, string, array,
// object or bool; "" for null.
func jsonType(v json.RawMessage) string {
	v = bytes.TrimLeft(v, " \t\r\n")
	if len(v) == 0 {
		return ""
	}
	switch v[0] {
	case '"':
		return "string"
	case '[':
		return "array"
	case '{':
		return "object"
	case 't', 'f':
		return "bool"
	case 'n':
		return ""
	}
	return "number"
}
