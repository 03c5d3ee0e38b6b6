package fakemx

import (
	"crypto/tls"
	"crypto/x509"
	"time"

	"github.com/outflow/outflow/internal/testpki"
)

// throwAwayCert makes a certificate valid for hosts and 127.0.0.1 for one
// day, issued by a root of its own, and a pool that trusts that root.
func throwAwayCert(hosts []string) (tls.Certificate, *x509.CertPool, error) {
	ca, err := testpki.NewRoot("fakemx")
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := ca.Issue(hosts, time.Time{}, time.Time{})
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return leaf.TLS, ca.Pool(), nil
}
