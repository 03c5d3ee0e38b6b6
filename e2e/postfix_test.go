package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/postfixinst"
	"github.com/outflow/outflow/internal/testutil"
)

// TestRelayToPostfixBDAT: outflow relays to a real Postfix smtpd, which
// offers PIPELINING and CHUNKING, so the sender puts each message in one
// BDAT chunk in the write that carries MAIL and RCPT (RFC 3030). Postfix
// holds what it accepts (a header check), and the test reads it back with
// postcat: every message arrives octet for octet, lines that start with a
// dot included (BDAT sends no dot-stuffing), over one connection, and
// Postfix's own count of the session's commands shows BDAT, not DATA. A
// second daemon with --smtp-chunking-off for the destination sends DATA.
func TestRelayToPostfixBDAT(t *testing.T) {
	pf := startPostfix(t)
	dir := t.TempDir()
	d := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--relay", pf.Addr, "--relay-tls", "none")

	// One at a time, each held by Postfix and recorded as delivered by
	// outflow (whose connection is back in its pool by then) before the
	// next is submitted: the later ones go over the pooled connection,
	// after an RSET. Postfix holds a message before outflow has read its
	// 250, so the hold alone would let the next delivery find the
	// connection still busy and open another.
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	bodies := map[string][]byte{}
	var held []string
	for i := range 3 {
		id := fmt.Sprintf("bdat-%d", i)
		body := message(id, ".a line that starts with a dot\r\n..and one with two\r\n.\r\nend of "+id+"\r\n")
		bodies[id] = body
		rcpt := "r" + id + "@dest.test"
		if err := submit(c, "app@sender.test", []string{rcpt}, body); err != nil {
			t.Fatal(err)
		}
		held = pf.waitHeld(t, i+1)
		waitFor(t, 30*time.Second, "outflow's delivered event for "+rcpt, func() bool {
			return strings.Contains(d.cli(t, "queue", "find", rcpt, "--type", "delivered", "--json"), `"type":"delivered"`)
		})
	}
	_ = c.Quit()
	for _, id := range held {
		got := pf.body(t, id)
		var match string
		for mid, want := range bodies {
			// Postfix prepends its Received header; the rest is ours.
			if bytes.HasSuffix(got, bytes.ReplaceAll(want, []byte("\r\n"), []byte("\n"))) {
				match = mid
			}
		}
		if match == "" {
			t.Errorf("held message %s is none of those sent, or changed on the way:\n%s", id, got)
		}
		delete(bodies, match)
	}
	// outflow keeps the connection in its pool; stopping it says QUIT,
	// and Postfix logs the session's commands.
	d.Stop()
	line := pf.waitLog(t, "disconnect from localhost[127.0.0.1] ehlo=")
	if !strings.Contains(line, " mail=3 rcpt=3 bdat=3 rset=2 ") || strings.Contains(line, " data=") {
		t.Errorf("Postfix's session summary %q, want three MAIL, RCPT and BDAT and two RSET on one connection, no DATA", line)
	}

	// --smtp-chunking-off keeps a destination on DATA (in any case).
	d = startDaemon(t, filepath.Join(dir, "data2"), "--users", writeUsers(t, dir), "--relay", pf.Addr, "--relay-tls", "none",
		"--smtp-chunking-off", "Dest.Test")
	c = dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(c, "app@sender.test", []string{"r@dest.test"}, message("data-0", ".dot line\r\n")); err != nil {
		t.Fatal(err)
	}
	_ = c.Quit()
	pf.waitHeld(t, 4)
	d.Stop()
	pf.waitLog(t, "mail=1 rcpt=1 data=1 ")
}

// postfix is a private Postfix instance (internal/postfixinst) that
// holds every message it accepts (a Subject header check) instead of
// passing it on, and logs to its own buffer.
type postfix struct {
	*postfixinst.Instance
	log *testutil.SyncBuffer
}

func startPostfix(t *testing.T) *postfix {
	t.Helper()
	return startPostfixWith(t, func(etc string) map[string]string {
		return map[string]string{"header_checks": "regexp:" + filepath.Join(etc, "hold")}
	}, map[string]string{"hold": "/^Subject:/ HOLD\n"})
}

// startPostfixWith starts a private Postfix that relays dest.test for
// 127.0.0.0/8, with the main.cf settings settings returns for the
// instance's configuration directory, and files (name: content) written
// there before it starts.
func startPostfixWith(t *testing.T, settings func(etc string) map[string]string, files map[string]string) *postfix {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("Postfix's master runs as root only; this test needs root")
	}
	dir := t.TempDir()
	main := map[string]string{
		"myhostname":                   "postfix.test",
		"relay_domains":                "dest.test",
		"smtpd_recipient_restrictions": "permit_mynetworks, reject",
		"maillog_file":                 "/dev/stdout",
	}
	for k, v := range settings(filepath.Join(dir, "etc")) {
		main[k] = v
	}
	inst, err := postfixinst.Prepare(dir, freeAddr(t), main)
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(inst.Conf(), name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pf := &postfix{Instance: inst, log: &testutil.SyncBuffer{}}
	cmd, err := pf.Command("start-fg")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = pf.log, pf.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if stop, err := pf.Command("stop"); err == nil {
			_ = stop.Run()
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("Postfix's log:\n%s", pf.log.String())
		}
	})
	pf.waitLog(t, "daemon started")
	return pf
}

// waitLog waits for a log line containing s and returns it.
func (pf *postfix) waitLog(t *testing.T, s string) string {
	t.Helper()
	var found string
	waitFor(t, 30*time.Second, "Postfix to log "+s, func() bool {
		for _, line := range strings.Split(pf.log.String(), "\n") {
			if strings.Contains(line, s) {
				found = line
				return true
			}
		}
		return false
	})
	return found
}

// waitHeld waits until n messages sit in the hold queue and returns their
// queue ids.
func (pf *postfix) waitHeld(t *testing.T, n int) []string {
	t.Helper()
	var ids []string
	waitFor(t, 60*time.Second, fmt.Sprintf("%d messages held by Postfix", n), func() bool {
		ents, _ := os.ReadDir(filepath.Join(pf.Queue(), "hold"))
		ids = ids[:0]
		for _, e := range ents {
			ids = append(ids, e.Name())
		}
		return len(ids) >= n
	})
	return ids
}

// body returns a held message's headers and body as postcat prints them.
func (pf *postfix) body(t *testing.T, id string) []byte {
	t.Helper()
	out, err := exec.Command("postcat", "-c", pf.Conf(), "-hbq", id).Output()
	if err != nil {
		t.Fatalf("postcat %s: %v", id, err)
	}
	return out
}
