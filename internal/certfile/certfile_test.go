package certfile

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/testpki"
)

// writePair writes leaf's certificate and key as PEM files in dir.
func writePair(t *testing.T, dir string, leaf *testpki.Leaf) (certFile, keyFile string) {
	t.Helper()
	key, err := x509.MarshalPKCS8PrivateKey(leaf.TLS.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	var certPEM []byte
	for _, der := range leaf.TLS.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// TestReloadTakesARenewedCertificate: a renewed pair is served after a
// reload; a reload of a broken pair fails and keeps the one in use.
func TestReloadTakesARenewedCertificate(t *testing.T) {
	ca, err := testpki.NewRoot("root")
	if err != nil {
		t.Fatal(err)
	}
	issue := func() *testpki.Leaf {
		l, err := ca.Issue([]string{"mail.test"}, time.Time{}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	dir := t.TempDir()
	old, renewed := issue(), issue()
	certFile, keyFile := writePair(t, dir, old)
	c, err := Load(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	serving := func() *x509.Certificate {
		pair, err := c.ServerConfig().GetCertificate(nil)
		if err != nil {
			t.Fatal(err)
		}
		return pair.Leaf
	}
	if !serving().Equal(old.Cert) {
		t.Fatal("not serving the certificate loaded")
	}
	writePair(t, dir, renewed)
	if !serving().Equal(old.Cert) {
		t.Fatal("the new files served before a reload")
	}
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	if !serving().Equal(renewed.Cert) || !c.NotAfter().Equal(renewed.Cert.NotAfter) {
		t.Fatal("the renewed certificate not served after the reload")
	}
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(); err == nil {
		t.Fatal("a broken key reloaded without an error")
	}
	if !serving().Equal(renewed.Cert) {
		t.Fatal("a failed reload changed the certificate served")
	}
	if _, err := Load(certFile, keyFile); err == nil {
		t.Fatal("a broken pair loaded")
	}
}
