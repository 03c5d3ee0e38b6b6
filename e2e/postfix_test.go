package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	d := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--relay", pf.addr, "--relay-tls", "none")

	// One at a time, each held before the next is submitted: the later
	// ones go over the pooled connection, after an RSET.
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	bodies := map[string][]byte{}
	var held []string
	for i := range 3 {
		id := fmt.Sprintf("bdat-%d", i)
		body := message(id, ".a line that starts with a dot\r\n..and one with two\r\n.\r\nend of "+id+"\r\n")
		bodies[id] = body
		if err := submit(c, "app@sender.test", []string{"r" + id + "@dest.test"}, body); err != nil {
			t.Fatal(err)
		}
		held = pf.waitHeld(t, i+1)
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
	d = startDaemon(t, filepath.Join(dir, "data2"), "--users", writeUsers(t, dir), "--relay", pf.addr, "--relay-tls", "none",
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

// postfix is a private Postfix instance: its own configuration, queue and
// log under a test directory, smtpd on a free loopback port, holding
// every message it accepts (a Subject header check) instead of passing it
// on. The system's Postfix daemon is never started.
type postfix struct {
	dir, conf, addr string
	log             *testutil.SyncBuffer
}

func startPostfix(t *testing.T) *postfix {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("Postfix's master runs as root only; this test needs root")
	}
	bin, err := exec.LookPath("postfix")
	if err != nil {
		t.Fatal("postfix not installed: run make deps")
	}
	pfUser, err := user.Lookup("postfix")
	if err != nil {
		t.Fatalf("no postfix user (Debian's postfix package makes it): %v", err)
	}
	// Postfix's daemons run as the postfix user and must reach the queue.
	dir := t.TempDir()
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pf := &postfix{dir: dir, conf: filepath.Join(dir, "conf"), addr: freeAddr(t), log: &testutil.SyncBuffer{}}
	data := filepath.Join(dir, "data")
	for _, p := range []string{pf.conf, data, filepath.Join(dir, "queue")} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var uid, gid int
	fmt.Sscan(pfUser.Uid, &uid)
	fmt.Sscan(pfUser.Gid, &gid)
	if err := os.Chown(data, uid, gid); err != nil {
		t.Fatal(err)
	}
	mainCF := fmt.Sprintf(`compatibility_level = 3.6
queue_directory = %s/queue
data_directory = %s
command_directory = /usr/sbin
daemon_directory = /usr/lib/postfix/sbin
mail_owner = postfix
setgid_group = postdrop
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
myhostname = postfix.test
mydestination =
mynetworks = 127.0.0.0/8
relay_domains = dest.test
smtpd_recipient_restrictions = permit_mynetworks, reject
header_checks = regexp:%s/hold
maillog_file = /dev/stdout
`, dir, data, pf.conf)
	// Every service the accepting side uses, none chrooted.
	masterCF := pf.addr + ` inet n - n - - smtpd
pickup unix n - n 60 1 pickup
cleanup unix n - n - 0 cleanup
qmgr unix n - n 300 1 qmgr
rewrite unix - - n - - trivial-rewrite
bounce unix - - n - 0 bounce
defer unix - - n - 0 bounce
trace unix - - n - 0 bounce
proxymap unix - - n - - proxymap
showq unix n - n - - showq
error unix - - n - - error
retry unix - - n - - error
anvil unix - - n - 1 anvil
scache unix - - n - 1 scache
postlog unix-dgram n - n - 1 postlogd
`
	for name, content := range map[string]string{"main.cf": mainCF, "master.cf": masterCF, "hold": "/^Subject:/ HOLD\n"} {
		if err := os.WriteFile(filepath.Join(pf.conf, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-c", pf.conf, "start-fg")
	cmd.Stdout, cmd.Stderr = pf.log, pf.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = exec.Command(bin, "-c", pf.conf, "stop").Run()
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
		ents, _ := os.ReadDir(filepath.Join(pf.dir, "queue", "hold"))
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
	out, err := exec.Command("postcat", "-c", pf.conf, "-hbq", id).Output()
	if err != nil {
		t.Fatalf("postcat %s: %v", id, err)
	}
	return out
}
