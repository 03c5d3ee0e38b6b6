package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"time"
)

// CA is a certificate authority that signs leaf certificates.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	// chain is the DER of the CA's certificate and any above it up to
	// (not including) the root, sent by servers after their leaf.
	chain [][]byte
	root  *x509.Certificate
}

// NewRoot makes a self-signed root CA named name.
func NewRoot(name string) (*CA, error) { return newCA(name, nil) }

// Intermediate makes a CA signed by ca; servers using its leaves send it
// in their chain.
func (ca *CA) Intermediate(name string) (*CA, error) { return newCA(name, ca) }

// newCA makes a CA named name, signed by parent, or self-signed when
// parent is nil.
func newCA(name string, parent *CA) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	signer, signerKey := tmpl, any(key)
	if parent != nil {
		signer, signerKey = parent.Cert, parent.Key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	if parent == nil {
		return &CA{Cert: cert, Key: key, root: cert}, nil
	}
	chain := append([][]byte{der}, parent.chain...)
	return &CA{Cert: cert, Key: key, chain: chain, root: parent.root}, nil
}

// Leaf is a server certificate with its chain (leaf first, then the
// intermediates, never the root).
type Leaf struct {
	TLS  tls.Certificate
	Cert *x509.Certificate
}

// Issue signs a server certificate for hosts (DNS names; the first is also
// the common name) and 127.0.0.1, valid from notBefore to notAfter; zero
// times mean an hour ago and a day from now.
func (ca *CA) Issue(hosts []string, notBefore, notAfter time.Time) (*Leaf, error) {
	if notBefore.IsZero() {
		notBefore = time.Now().Add(-time.Hour)
	}
	if notAfter.IsZero() {
		notAfter = time.Now().Add(24 * time.Hour)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	cn := "leaf"
	if len(hosts) > 0 {
		cn = hosts[0]
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     hosts,
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	chain := append([][]byte{der}, ca.chain...)
	return &Leaf{TLS: tls.Certificate{Certificate: chain, PrivateKey: key, Leaf: cert}, Cert: cert}, nil
}

// Pool is a pool holding the root this CA descends from.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.root)
	return p
}

// RootPEM is the root certificate in PEM, for a CA file.
func (ca *CA) RootPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.root.Raw})
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		panic(err)
	}
	return n
}
