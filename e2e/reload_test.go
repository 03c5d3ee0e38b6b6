package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/submission"
)

// TestReloadOnSIGHUP: `kill -HUP` makes the daemon read its users file and
// its certificate again, without a restart. A compromised account's
// password changed in the file stops working at once, and its session
// already open is ended at its next MAIL; an account added works; a
// renewed certificate is served to the next STARTTLS. A file that does not
// load is logged and the one in use stays. Before, each of these took a
// restart, every client's session cut with it.
func TestReloadOnSIGHUP(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	certFile, keyFile := writeServerCert(t, dir)
	users := writeUsers(t, dir)
	d := startDaemon(t, filepath.Join(dir, "data"), "--users", users, "--tls-cert", certFile, "--tls-key", keyFile,
		"--relay", mx.Addr(), "--relay-tls", "none")

	// session starts a session over STARTTLS and returns it with the
	// certificate served, authenticated as user when password is set.
	session := func(user, password string) (*smtp.Client, *x509.Certificate, error) {
		t.Helper()
		c, err := smtp.DialStartTLS(d.SMTPAddr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if err := c.Noop(); err != nil { // the handshake done
			t.Fatal(err)
		}
		state, ok := c.TLSConnectionState()
		if !ok || len(state.PeerCertificates) == 0 {
			t.Fatal("no TLS on the session")
		}
		return c, state.PeerCertificates[0], c.Auth(sasl.NewPlainClient("", user, password))
	}
	open, before, err := session(testUser, testPassword)
	if err != nil {
		t.Fatal(err)
	}

	// The account's password changes, another is added, the certificate
	// is renewed; then the signal.
	writeServerCert(t, dir) // a new pair in the same files
	line := func(user, password string) string {
		h, err := submission.HashPassword(password, 4)
		if err != nil {
			t.Fatal(err)
		}
		return user + ":" + h + "\n"
	}
	if err := os.WriteFile(users, []byte(line(testUser, "a new password")+line("carol", "carol's password")), 0o600); err != nil {
		t.Fatal(err)
	}
	hup := func(want string, n int) {
		t.Helper()
		if err := syscall.Kill(d.pid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 20*time.Second, want, func() bool { return strings.Count(d.Logs(), want) >= n })
	}
	hup("reload: users file taken", 1)
	waitFor(t, 20*time.Second, "the certificate reloaded", func() bool { return strings.Contains(d.Logs(), "reload: certificate taken") })

	err = open.Mail("app@sender.test", nil)
	if se, ok := err.(*smtp.SMTPError); !ok || se.Code != 421 || !strings.Contains(se.Message, "credentials have changed") {
		t.Fatalf("the open session's MAIL after its password changed: %v, want 421", err)
	}
	if _, _, err := session(testUser, testPassword); err == nil {
		t.Fatal("the old password still authenticates")
	}
	c, after, err := session(testUser, "a new password")
	if err != nil {
		t.Fatalf("the new password: %v", err)
	}
	if after.Equal(before) {
		t.Fatal("the certificate served after the reload is the old one")
	}
	if err := submit(c, "app@sender.test", []string{"r@dest.test"}, message("after-reload", "")); err != nil {
		t.Fatalf("a message after the reload: %v", err)
	}
	if _, _, err := session("carol", "carol's password"); err != nil {
		t.Fatalf("the account added: %v", err)
	}
	if err := mx.WaitForMessages(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	// A users file that does not load keeps the accounts in use.
	if err := os.WriteFile(users, []byte("not a users line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	hup("reload: users file not taken", 1)
	if _, _, err := session(testUser, "a new password"); err != nil {
		t.Fatalf("after a broken users file: %v", err)
	}
	m := d.scrape(t)
	if m[`outflow_reloads_total{result="ok",what="users"}`] != 1 || m[`outflow_reloads_total{result="error",what="users"}`] != 1 ||
		m[`outflow_reloads_total{result="ok",what="smtp-tls"}`] != 2 {
		t.Fatalf("reload counters: ok %v, error %v, certificates %v", m[`outflow_reloads_total{result="ok",what="users"}`],
			m[`outflow_reloads_total{result="error",what="users"}`], m[`outflow_reloads_total{result="ok",what="smtp-tls"}`])
	}
	if exp := m[`outflow_tls_certificate_expiry_timestamp_seconds{listener="smtp"}`]; int64(exp) != after.NotAfter.Unix() {
		t.Fatalf("certificate expiry exported %v, want %d", exp, after.NotAfter.Unix())
	}
	d.Stop()
}
