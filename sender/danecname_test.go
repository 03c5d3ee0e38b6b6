package sender

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testpki"
	"github.com/outflow/outflow/resolver"
	"github.com/outflow/outflow/tlsrpt"
)

// TestDANECNAMEExpandedName: the MX host mx.example.test is a CNAME to a
// provider's mx.provider.test, which publishes the TLSA records (RFC 7672
// 2.2.2). With a secure chain they apply: a record that does not match
// the served certificate keeps the message from the host, one that does
// verifies it. At the expanded name without records, the MX host name's
// own records apply; with an insecure chain, the expanded name's are not
// used.
func TestDANECNAMEExpandedName(t *testing.T) {
	root, err := testpki.NewRoot("r")
	if err != nil {
		t.Fatal(err)
	}
	inter, _ := root.Intermediate("i")
	leaf, _ := inter.Issue([]string{"mx.provider.test"}, time.Time{}, time.Time{})
	other, _ := inter.Issue([]string{"mx.provider.test"}, time.Time{}, time.Time{})
	rec := func(c *x509.Certificate) string {
		sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
		return "TLSA 3 1 1 " + hex.EncodeToString(sum[:])
	}

	cases := []struct {
		name                 string
		customer, provider   []string // records besides the MX and the address
		providerAD           bool
		delivered, dane      bool
		reportDomain, reason string
	}{
		{name: "mismatch-at-expanded", provider: []string{"_25._tcp.mx " + rec(other.Cert)}, providerAD: true,
			reportDomain: "mx.provider.test", reason: "no TLSA record matches"},
		{name: "match-at-expanded", provider: []string{"_25._tcp.mx " + rec(leaf.Cert)}, providerAD: true,
			delivered: true, dane: true, reportDomain: "mx.provider.test"},
		{name: "none-at-expanded-mismatch-at-alias", customer: []string{"_25._tcp.mx " + rec(other.Cert)}, providerAD: true,
			reportDomain: "mx.example.test", reason: "no TLSA record matches"},
		{name: "insecure-chain", provider: []string{"_25._tcp.mx " + rec(other.Cert)}, providerAD: false,
			delivered: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dnsSrv := fakedns.Start(t)
			z1 := dnsSrv.MustAddZone(t, "example.test", append([]string{"@ MX 10 mx", "mx CNAME mx.provider.test."}, c.customer...)...)
			z2 := dnsSrv.MustAddZone(t, "provider.test", append([]string{"mx A 127.0.0.2"}, c.provider...)...)
			z1.SetAD(true)
			z2.SetAD(c.providerAD)
			r, err := resolver.New(resolver.Config{Servers: []string{dnsSrv.Addr}, Timeout: time.Second, Attempts: 1})
			if err != nil {
				t.Fatal(err)
			}
			w := newWorld(t)
			fake := fakemx.Start(t, fakemx.Options{STARTTLS: true, Certificate: &leaf.TLS})
			w.route("127.0.0.2", fake)
			rep := &reports{}
			cfg := w.config()
			cfg.Resolver, cfg.DANE, cfg.TLSReport = r, r, rep
			res := w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test"))
			if got := len(fake.Messages()) == 1; got != c.delivered {
				t.Fatalf("delivered %v, want %v: %+v", got, c.delivered, res.Rcpts[0].Outcome)
			}
			if c.reason != "" {
				checkTransient(t, res, c.reason)
			}
			if c.dane && !res.TLSVerified {
				t.Errorf("delivered without a DANE-verified session: %+v", res)
			}
			evs := rep.all()
			if c.reportDomain == "" {
				for _, ev := range evs {
					if ev.PolicyType == tlsrpt.PolicyTLSA {
						t.Errorf("a DANE report without DANE: %+v", ev)
					}
				}
				return
			}
			if len(evs) == 0 || evs[0].PolicyType != tlsrpt.PolicyTLSA || evs[0].Domain != c.reportDomain || evs[0].Success != c.delivered {
				t.Errorf("reports %+v; want a TLSA report for %s", evs, c.reportDomain)
			}
		})
	}
}

// TestCanonicalNameNotAnAlias: without a CNAME nothing changes: the TLSA
// records at the MX host name apply (and DANE-TA checks its name).
func TestCanonicalNameNotAnAlias(t *testing.T) {
	p := newPKIMX(t, fakemx.Options{STARTTLS: true})
	dnsSrv := fakedns.Start(t)
	sum := sha256.Sum256(otherLeaf(p).RawSubjectPublicKeyInfo)
	z := dnsSrv.MustAddZone(t, "example.test", "@ MX 10 mx", "mx A 127.0.0.2", "_25._tcp.mx TLSA 3 1 1 "+hex.EncodeToString(sum[:]))
	z.SetAD(true)
	r, err := resolver.New(resolver.Config{Servers: []string{dnsSrv.Addr}, Timeout: time.Second, Attempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if name, ad, err := r.CanonicalName(ctxT(t), "mx.example.test."); err != nil || name != "mx.example.test" || !ad {
		t.Fatalf("CanonicalName: %q %v %v", name, ad, err)
	}
	cfg := p.w.config()
	cfg.Resolver, cfg.DANE = r, r
	res := p.w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test"))
	checkTransient(t, res, "no TLSA record matches")
	if len(p.fake.Messages()) != 0 || !strings.Contains(res.Rcpts[0].Outcome.Text, "mx.example.test") {
		t.Errorf("outcome %+v", res.Rcpts[0].Outcome)
	}
}
