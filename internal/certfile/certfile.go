// Package certfile holds a TLS certificate read from a PEM certificate
// file and its key, which can be read again while listeners use it: a
// renewed certificate (certbot, cert-manager) is taken up on a reload
// without a restart, and a reload that fails keeps the one in use.
package certfile

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Cert is a certificate and key pair from two files. Its GetCertificate
// serves the pair last read.
type Cert struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate]
}

// Load reads the pair, or returns an error naming the files.
func Load(certFile, keyFile string) (*Cert, error) {
	c := &Cert{certFile: certFile, keyFile: keyFile}
	if err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the files again; on an error the pair in use stays.
func (c *Cert) Reload() error {
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("certificate %s, key %s: %w", c.certFile, c.keyFile, err)
	}
	if pair.Leaf == nil {
		if len(pair.Certificate) == 0 {
			return errors.New("certificate " + c.certFile + ": no certificate")
		}
		if pair.Leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("certificate %s: %w", c.certFile, err)
		}
	}
	c.cur.Store(&pair)
	return nil
}

// NotAfter is when the certificate in use expires.
func (c *Cert) NotAfter() time.Time { return c.cur.Load().Leaf.NotAfter }

// GetCertificate is tls.Config's GetCertificate: the pair last read.
func (c *Cert) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// ServerConfig is a TLS 1.2+ server configuration serving c.
func (c *Cert) ServerConfig() *tls.Config {
	return &tls.Config{GetCertificate: c.GetCertificate, MinVersion: tls.VersionTLS12}
}
