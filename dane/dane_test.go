package dane

import (
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/outflow/outflow/internal/testpki"
)

func tlsa(usage, sel, mt uint8, cert *x509.Certificate) *dns.TLSA {
	data := cert.Raw
	if sel == SelectorSPKI {
		data = cert.RawSubjectPublicKeyInfo
	}
	switch mt {
	case MatchSHA256:
		s := sha256.Sum256(data)
		data = s[:]
	case MatchSHA512:
		s := sha512.Sum512(data)
		data = s[:]
	}
	return &dns.TLSA{Usage: usage, Selector: sel, MatchingType: mt, Certificate: hex.EncodeToString(data)}
}

type chain struct {
	root, inter *testpki.CA
	leaf        *testpki.Leaf
	certs       []*x509.Certificate // as a server sends them: leaf, intermediate
}

func newChain(t *testing.T, hosts []string, notBefore, notAfter time.Time) *chain {
	t.Helper()
	root, err := testpki.NewRoot("root")
	if err != nil {
		t.Fatal(err)
	}
	inter, err := root.Intermediate("intermediate")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := inter.Issue(hosts, notBefore, notAfter)
	if err != nil {
		t.Fatal(err)
	}
	return &chain{root: root, inter: inter, leaf: leaf, certs: []*x509.Certificate{leaf.Cert, inter.Cert}}
}

func resultOf(err error) string {
	var de *Error
	if errors.As(err, &de) {
		return de.Result
	}
	return ""
}

func TestDANEEE(t *testing.T) {
	c := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	names := []string{"mx.example.com"}
	for _, r := range []*dns.TLSA{
		tlsa(3, 1, 1, c.leaf.Cert), tlsa(3, 0, 0, c.leaf.Cert), tlsa(3, 0, 2, c.leaf.Cert), tlsa(3, 1, 0, c.leaf.Cert),
	} {
		if err := Verify(c.certs, Usable([]*dns.TLSA{r}), names, time.Now()); err != nil {
			t.Errorf("%d %d %d: %v", r.Usage, r.Selector, r.MatchingType, err)
		}
	}
	// 3.1.1: names and dates do not matter for DANE-EE.
	old := newChain(t, []string{"somewhere.else"}, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	if err := Verify(old.certs, []*dns.TLSA{tlsa(3, 1, 1, old.leaf.Cert)}, names, time.Now()); err != nil {
		t.Errorf("expired, misnamed leaf with DANE-EE: %v", err)
	}
	// Another key: no match.
	other := newChain(t, names, time.Time{}, time.Time{})
	err := Verify(c.certs, []*dns.TLSA{tlsa(3, 1, 1, other.leaf.Cert)}, names, time.Now())
	if resultOf(err) != ResultTLSAInvalid {
		t.Errorf("mismatch: %v", err)
	}
}

func TestDANETA(t *testing.T) {
	names := []string{"mx.example.com", "example.com"}
	c := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	ta := []*dns.TLSA{tlsa(2, 0, 1, c.inter.Cert)}
	if err := Verify(c.certs, ta, names, time.Now()); err != nil {
		t.Errorf("DANE-TA on the intermediate: %v", err)
	}
	if err := Verify(c.certs, []*dns.TLSA{tlsa(2, 1, 2, c.inter.Cert)}, names, time.Now()); err != nil {
		t.Errorf("DANE-TA SPKI SHA-512: %v", err)
	}
	// The destination domain is an accepted reference identifier too.
	byDomain := newChain(t, []string{"example.com"}, time.Time{}, time.Time{})
	if err := Verify(byDomain.certs, []*dns.TLSA{tlsa(2, 0, 1, byDomain.inter.Cert)}, names, time.Now()); err != nil {
		t.Errorf("leaf for the next-hop domain: %v", err)
	}
	// With DANE-TA the name matters...
	wrong := newChain(t, []string{"mx.other.test"}, time.Time{}, time.Time{})
	err := Verify(wrong.certs, []*dns.TLSA{tlsa(2, 0, 1, wrong.inter.Cert)}, names, time.Now())
	if resultOf(err) != ResultHostMismatch {
		t.Errorf("wrong name: %v", err)
	}
	// ...and so do the dates.
	old := newChain(t, []string{"mx.example.com"}, time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
	err = Verify(old.certs, []*dns.TLSA{tlsa(2, 0, 1, old.inter.Cert)}, names, time.Now())
	if resultOf(err) != ResultExpired {
		t.Errorf("expired: %v", err)
	}
	// A TA the server does not send cannot be matched.
	err = Verify(c.certs, []*dns.TLSA{tlsa(2, 0, 1, c.root.Cert)}, names, time.Now())
	if resultOf(err) != ResultTLSAInvalid {
		t.Errorf("root not sent: %v", err)
	}
	// DANE-TA never matches the leaf itself as its anchor.
	err = Verify(c.certs, []*dns.TLSA{tlsa(2, 0, 1, c.leaf.Cert)}, names, time.Now())
	if resultOf(err) != ResultTLSAInvalid {
		t.Errorf("leaf as TA: %v", err)
	}
}

func TestUsable(t *testing.T) {
	c := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	good := tlsa(3, 1, 1, c.leaf.Cert)
	badLen := tlsa(3, 1, 1, c.leaf.Cert)
	badLen.Certificate = badLen.Certificate[:20]
	notHex := tlsa(3, 1, 1, c.leaf.Cert)
	notHex.Certificate = strings.Repeat("zz", 32)
	recs := []*dns.TLSA{
		tlsa(0, 0, 1, c.root.Cert), tlsa(1, 1, 1, c.leaf.Cert), // PKIX usages: not for SMTP
		{Usage: 3, Selector: 2, MatchingType: 1, Certificate: good.Certificate},
		{Usage: 3, Selector: 1, MatchingType: 3, Certificate: good.Certificate},
		badLen, notHex, good,
	}
	u := Usable(recs)
	if len(u) != 1 || u[0] != good {
		t.Fatalf("Usable kept %v", Strings(u))
	}
	if err := Verify(c.certs, nil, nil, time.Now()); resultOf(err) != ResultTLSAInvalid {
		t.Errorf("no usable records: %v", err)
	}
}

type fakeResolver struct {
	recs []*dns.TLSA
	ad   bool
	err  error
	got  string
}

func (f *fakeResolver) LookupTLSA(_ context.Context, port int, proto, host string) ([]*dns.TLSA, bool, error) {
	f.got = "_" + strconv.Itoa(port) + "._" + proto + "." + host
	return f.recs, f.ad, f.err
}

func TestLookup(t *testing.T) {
	c := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	rec := tlsa(3, 1, 1, c.leaf.Cert)
	ctx := context.Background()

	f := &fakeResolver{recs: []*dns.TLSA{rec}, ad: true}
	got, err := Lookup(ctx, f, "mx.example.com.", 25)
	if err != nil || !got.Secure || len(got.Usable) != 1 || f.got != "_25._tcp.mx.example.com" {
		t.Fatalf("secure answer: %+v %v (asked %s)", got, err, f.got)
	}
	// Without AD the records are ignored.
	got, err = Lookup(ctx, &fakeResolver{recs: []*dns.TLSA{rec}}, "mx.example.com", 25)
	if err != nil || got.Secure {
		t.Fatalf("answer without AD: %+v %v", got, err)
	}
	got, err = Lookup(ctx, &fakeResolver{err: &net.DNSError{Err: "no such host", IsNotFound: true}, ad: true}, "mx.example.com", 25)
	if err != nil || got.Secure {
		t.Fatalf("NXDOMAIN: %+v %v", got, err)
	}
	_, err = Lookup(ctx, &fakeResolver{err: &net.DNSError{Err: "server misbehaving", IsTemporary: true}}, "mx.example.com", 25)
	if resultOf(err) != ResultDNSSECInvalid {
		t.Fatalf("SERVFAIL: %v", err)
	}
	// Secure but unusable: DANE applies (TLS mandatory) with nothing to match.
	got, err = Lookup(ctx, &fakeResolver{recs: []*dns.TLSA{tlsa(1, 1, 1, c.leaf.Cert)}, ad: true}, "mx.example.com", 25)
	if err != nil || !got.Secure || len(got.Usable) != 0 || len(got.All) != 1 {
		t.Fatalf("unusable only: %+v %v", got, err)
	}
}

// TestVerifyConnectionInAHandshake runs the check inside crypto/tls.
func TestVerifyConnectionInAHandshake(t *testing.T) {
	c := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	other := newChain(t, []string{"mx.example.com"}, time.Time{}, time.Time{})
	for name, tc := range map[string]struct {
		rec  *dns.TLSA
		fail bool
	}{"match": {tlsa(3, 1, 1, c.leaf.Cert), false}, "mismatch": {tlsa(3, 1, 1, other.leaf.Cert), true}} {
		t.Run(name, func(t *testing.T) {
			cc, sc := net.Pipe()
			defer cc.Close()
			defer sc.Close()
			srv := tls.Server(sc, &tls.Config{Certificates: []tls.Certificate{c.leaf.TLS}})
			go func() { _ = srv.Handshake() }()
			cli := tls.Client(cc, &tls.Config{ServerName: "mx.example.com", InsecureSkipVerify: true,
				VerifyConnection: VerifyConnection([]*dns.TLSA{tc.rec}, []string{"mx.example.com"})})
			_ = cc.SetDeadline(time.Now().Add(10 * time.Second))
			err := cli.Handshake()
			if (err != nil) != tc.fail {
				t.Fatalf("handshake: %v, want failure %v", err, tc.fail)
			}
			if tc.fail && resultOf(err) != ResultTLSAInvalid {
				t.Errorf("error %v does not carry tlsa-invalid", err)
			}
		})
	}
}
