package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/submission"
)

// serveArgs are the flags of an in-process serve that listens on loopback
// ports of its own only.
func serveArgs(data string, more ...string) []string {
	return append([]string{"--data", data, "--smtp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--api-addr", "127.0.0.1:0",
		"--nats-addr", "", "--log-level", "warn", "--shutdown-grace", "1s", "--hostname", "mta.outflow.test"}, more...)
}

func emptyConfig(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFailedStartCreatesNoAccount: a first start that stops on a flag's
// value or on an address in use (found after the embedded server started)
// neither writes the users file nor prints a password: it printed one and
// then its error, and the next start, finding the file, said nothing of it.
func TestFailedStartCreatesNoAccount(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--relay-tls", "plain"}, `--relay-tls "plain"`},
		{[]string{"--tls-policy", "bogus"}, `--tls-policy "bogus"`},
		{[]string{"--http-addr", taken.Addr().String()}, "--http-addr"},
		{[]string{"--api-addr", taken.Addr().String()}, "api"},
	} {
		data := filepath.Join(t.TempDir(), "data")
		cfg, err := parseWith(t, emptyConfig(t), serveArgs(data, c.args...)...)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = serve(context.Background(), cfg, &out)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want one saying %s", c.args, err, c.want)
		}
		if _, err := os.Stat(filepath.Join(data, submission.UsersFileName)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%q: a failed start left a users file (%v)", c.args, err)
		}
		if left, _ := filepath.Glob(filepath.Join(data, pendingUsersPrefix+"*")); len(left) > 0 {
			t.Errorf("%q: a failed start left %v", c.args, left)
		}
		if out.Len() > 0 {
			t.Errorf("%q: a failed start printed %q", c.args, out.String())
		}
	}
}

// signalWriter is a goroutine-safe buffer that closes wrote at the first
// write.
type signalWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	once  sync.Once
	wrote chan struct{}
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.once.Do(func() { close(w.wrote) })
	return w.buf.Write(p)
}

func (w *signalWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestFirstStartShowsAccountOnceUp: the first start that comes up stores
// the generated account and prints it, and the printed password is the
// file's. A later start prints nothing and logs where the account is and
// how to set a new password.
func TestFirstStartShowsAccountOnceUp(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	cfg, err := parseWith(t, emptyConfig(t), serveArgs(data)...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &signalWriter{wrote: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, out) }()
	select {
	case <-out.wrote:
	case err := <-done:
		t.Fatalf("serve stopped before printing the account: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("no account printed")
	}
	users := filepath.Join(data, submission.UsersFileName)
	u, err := submission.LoadUsers(users)
	if err != nil {
		t.Fatalf("account printed, users file: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	m := regexp.MustCompile(`(?m)^  user: +(\S+)\n  password: +(\S+)\n`).FindStringSubmatch(out.String())
	if m == nil || !strings.Contains(out.String(), "created "+users) {
		t.Fatalf("printed %q", out.String())
	}
	if !u.Verify(m[1], m[2]) {
		t.Error("the printed password is not the users file's")
	}
	if left, _ := filepath.Glob(filepath.Join(data, pendingUsersPrefix+"*")); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}

	// The next start finds the file as the first wrote it.
	var logs bytes.Buffer
	_, pending, err := loadUsers(cfg, zerolog.New(&logs))
	if err != nil || pending != nil {
		t.Fatalf("second start: pending %v, %v", pending, err)
	}
	if line := logs.String(); !strings.Contains(line, users) || !strings.Contains(line, "outflow passwd --user outflow") {
		t.Errorf("second start logs %q, want the file and how to set a new password", line)
	}
	// An edited file is the operator's: nothing to say.
	if err := os.WriteFile(users, []byte("app:"+mustHash(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	logs.Reset()
	if _, _, err := loadUsers(cfg, zerolog.New(&logs)); err != nil || logs.String() != "" {
		t.Errorf("own users file: %v, logged %q", err, logs.String())
	}
}

func mustHash(t *testing.T) string {
	t.Helper()
	h, err := submission.HashPassword("secret", 4)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestPendingAccountLosesToAnotherStart: a users file that appears while
// a start is under way is kept; the start stops instead of serving an
// account that is not the file's.
func TestPendingAccountLosesToAnotherStart(t *testing.T) {
	data := t.TempDir()
	_, pending, err := loadUsers(&serveConfig{Data: data}, zerolog.Nop())
	if err != nil || pending == nil {
		t.Fatalf("pending %v, %v", pending, err)
	}
	users := filepath.Join(data, submission.UsersFileName)
	if err := os.WriteFile(users, []byte("other:"+mustHash(t)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := pending.commit(&out); err == nil || out.Len() > 0 {
		t.Errorf("commit over another start's file: %v, printed %q", err, out.String())
	}
	if b, _ := os.ReadFile(users); !strings.HasPrefix(string(b), "other:") {
		t.Errorf("users file replaced: %q", b)
	}
}

// TestUsersFileErrorNamesPasswd: a line whose hash is not bcrypt (a
// password written in clear) is refused with the command that makes one.
func TestUsersFileErrorNamesPasswd(t *testing.T) {
	p := filepath.Join(t.TempDir(), "users")
	if err := os.WriteFile(p, []byte("app:secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, _, err := loadUsers(&serveConfig{Users: p}, zerolog.Nop())
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "not a bcrypt hash") || !strings.Contains(err.Error(), "outflow passwd --user") {
		t.Errorf("error %v, want a usage error naming outflow passwd", err)
	}
	_, _, err = loadUsers(&serveConfig{Users: filepath.Join(t.TempDir(), "none")}, zerolog.Nop())
	if err == nil || strings.Contains(err.Error(), "outflow passwd") {
		t.Errorf("missing file: %v", err)
	}
}
