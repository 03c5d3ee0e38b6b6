package e2e

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testpki"
)

// TestSwaksPipelining: a real PIPELINING client (RFC 2920) submits to the
// daemon, whose listener holds back the replies to a group of commands
// until it has read the whole group (submission/listener.go). swaks --pipe
// sends MAIL, RCPT and DATA in one write and waits for all three replies:
// a reply held too long would stall it until its timeout. It does so in
// plaintext from a trusted network and after STARTTLS with AUTH, where a
// writer above TLS does the holding; every message must be delivered.
func TestSwaksPipelining(t *testing.T) {
	swaks, err := exec.LookPath("swaks")
	if err != nil {
		t.Fatal("swaks not installed: run make deps")
	}
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	cert, key := writeServerCert(t, dir)
	d := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--trusted-networks", "127.0.0.0/8",
		"--tls-cert", cert, "--tls-key", key, "--relay", mx.Addr(), "--relay-tls", "none")

	run := func(id string, extra ...string) {
		t.Helper()
		args := append([]string{"--server", d.SMTPAddr, "--from", "app@sender.test", "--to", "r@dest.test",
			"--pipeline", "--timeout", "20", "--header", "Message-ID: <" + id + "@e2e.test>", "--body", "pipelined " + id}, extra...)
		out, err := exec.Command(swaks, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("swaks %v: %v\n%s", extra, err, out)
		}
		// swaks marks a group it sent without waiting with " -> " lines
		// before the first " <- " reply; the 250 of the body is the last.
		if !strings.Contains(string(out), "<-  250") || !strings.Contains(string(out), "354 ") {
			t.Fatalf("swaks %v transcript without the expected replies:\n%s", extra, out)
		}
	}
	run("plain")
	run("tls", "--tls", "--auth", "PLAIN", "--auth-user", testUser, "--auth-password", testPassword)

	if err := mx.WaitForMessages(2, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ids := messageIDs(bodiesOf(mx.Messages()))
	if ids["<plain@e2e.test>"] != 1 || ids["<tls@e2e.test>"] != 1 {
		t.Fatalf("deliveries by Message-ID: %v", ids)
	}
	d.Stop()
}

// writeServerCert writes a certificate for 127.0.0.1 from a throw-away CA
// and its key as PEM files for --tls-cert and --tls-key.
func writeServerCert(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	ca, err := testpki.NewRoot("e2e submission root")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"localhost"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	var certPEM []byte
	for _, der := range leaf.TLS.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(leaf.TLS.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
