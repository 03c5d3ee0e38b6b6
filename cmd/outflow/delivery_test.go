package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/sender"
)

// TestTLSCAFile: the file's root verifies a certificate it signed, on top
// of the system roots; a file without a certificate is refused.
func TestTLSCAFile(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "relay.internal"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, DNSNames: []string{"relay.internal"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "ca.pem")
	os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	pool, err := rootCAs(file)
	if err != nil || pool == nil {
		t.Fatalf("rootCAs: %v", err)
	}
	cert, _ := x509.ParseCertificate(der)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "relay.internal"}); err != nil {
		t.Errorf("the file's root does not verify: %v", err)
	}
	if pool, err := rootCAs(""); pool != nil || err != nil {
		t.Errorf("without the flag: %v %v, want the system pool (nil)", pool, err)
	}
	empty := filepath.Join(dir, "empty.pem")
	os.WriteFile(empty, []byte("not a certificate\n"), 0o600)
	if _, err := rootCAs(empty); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Errorf("a file without a certificate: %v", err)
	}
	if _, err := rootCAs(filepath.Join(dir, "missing.pem")); err == nil {
		t.Error("a missing file was accepted")
	}
}

func TestEgressConfig(t *testing.T) {
	eg, err := newEgress(&deliveryConfig{Egress: []egressConfig{{Address: "127.0.0.2", EHLO: "o2.test", Pool: "p"}, {Address: "127.0.0.3"}}},
		map[string]tenantConfig{"app": {EgressPool: "p"}}, "")
	if err != nil || eg.Len() != 2 {
		t.Fatalf("newEgress: %v", err)
	}
	if c := eg.Candidates("app", "a.test"); len(c) != 1 || c[0].Addr.String() != "127.0.0.2" || c[0].EHLO != "o2.test" {
		t.Errorf("app's pool: %v", c)
	}
	for _, bad := range []struct {
		c    deliveryConfig
		t    map[string]tenantConfig
		want string
	}{
		{deliveryConfig{Egress: []egressConfig{{Address: "192.0.2.10"}}}, nil, "cannot bind"},
		{deliveryConfig{Egress: []egressConfig{{Address: "mta1"}}}, nil, "address"},
		{deliveryConfig{}, map[string]tenantConfig{"app": {EgressPool: "p"}}, "no [[egress]]"},
		{deliveryConfig{Egress: []egressConfig{{Address: "127.0.0.2"}}}, map[string]tenantConfig{"app": {EgressPool: "p"}}, `pool "p"`},
	} {
		if _, err := newEgress(&bad.c, bad.t, ""); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: err %v, want %q", bad.c, err, bad.want)
		}
	}
	if eg, err := newEgress(&deliveryConfig{}, nil, ""); eg != nil || err != nil {
		t.Errorf("no egress: %v %v", eg, err)
	}
}

// TestEgressRelayFamily: through a relay at an IP address, only the
// [[egress]] addresses of its family are used (a connection bound to one
// of the other cannot reach it: every attempt from it failed before
// leaving the host and spent the message's attempt), and a pool with none
// of them is refused at start, naming the relay and the pool; with an
// IPv4-only pool and an IPv6 relay every message was deferred until
// max-age. A relay by host name keeps every address.
func TestEgressRelayFamily(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback (%v)", err)
	} else {
		ln.Close()
	}
	mixed := &deliveryConfig{Egress: []egressConfig{{Address: "::1", Pool: "bulk"}, {Address: "127.0.0.2", Pool: "bulk"}, {Address: "127.0.0.3", Pool: "vip"}}}
	eg, err := newEgress(mixed, map[string]tenantConfig{"news": {EgressPool: "bulk"}}, "127.0.0.9:2525")
	if err != nil {
		t.Fatalf("IPv4 relay, every pool with an IPv4 address: %v", err)
	}
	if eg.Len() != 2 || slices.ContainsFunc(eg.Pool("news"), func(s sender.Source) bool { return !s.Addr.Is4() }) || len(eg.Pool("news")) == 0 {
		t.Errorf("IPv4 relay: sources %v, news's IPv6 address kept", eg.All())
	}
	for range 3 {
		if c := eg.Candidates("news", "a.test"); len(c) != 1 || c[0].Addr.String() != "127.0.0.2" {
			t.Errorf("news's candidates through an IPv4 relay: %v, want 127.0.0.2 only", c)
		}
	}
	for _, relay := range []string{"[::1]:2525", "[::ffff:127.0.0.9]:2525"} {
		_, err := newEgress(mixed, nil, relay)
		want := `pool "vip" (127.0.0.3) has no IPv6`
		if relay != "[::1]:2525" {
			want = "" // an IPv4-mapped relay is IPv4: every pool has one
		}
		if want == "" && err != nil || want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), relay)) {
			t.Errorf("relay %s: err %v, want %q", relay, err, want)
		}
	}
	v4only := &deliveryConfig{Egress: []egressConfig{{Address: "127.0.0.2"}}}
	if _, err := newEgress(v4only, nil, "[::1]:2525"); err == nil || !strings.Contains(err.Error(), "relay [::1]:2525 is an IPv6 address") {
		t.Errorf("IPv4-only egress, IPv6 relay: %v, want a refusal at start", err)
	}
	if eg, err := newEgress(mixed, nil, "relay.internal:2525"); err != nil || eg.Len() != 3 {
		t.Errorf("relay by name: %v %v, want every address", eg, err)
	}
}
