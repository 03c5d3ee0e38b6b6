package sender

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/emersion/go-msgauth/dkim"

	"github.com/outflow/outflow/internal/fakemx"
)

// writeKey writes k as PEM (PKCS#1 for RSA when pkcs1, else PKCS#8) and
// returns the path and the DKIM TXT record of its public half.
func writeKey(t *testing.T, k crypto.Signer, pkcs1 bool) (path, txt string) {
	t.Helper()
	var block *pem.Block
	if rk, ok := k.(*rsa.PrivateKey); ok && pkcs1 {
		block = &pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(rk)}
	} else {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		block = &pem.Block{Type: "PRIVATE KEY", Bytes: der}
	}
	path = filepath.Join(t.TempDir(), "dkim.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	switch pub := k.Public().(type) {
	case *rsa.PublicKey:
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			t.Fatal(err)
		}
		txt = "v=DKIM1; k=rsa; p=" + base64.StdEncoding.EncodeToString(der)
	case ed25519.PublicKey:
		txt = "v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(pub) // RFC 8463 4.2
	}
	return path, txt
}

// verify checks every DKIM signature of msg against records and returns
// the signing domains that verified.
func verify(t *testing.T, msg []byte, records map[string]string) []string {
	t.Helper()
	vs, err := dkim.VerifyWithOptions(bytes.NewReader(msg), &dkim.VerifyOptions{
		LookupTXT: func(name string) ([]string, error) {
			if r, ok := records[name]; ok {
				return []string{r}, nil
			}
			return nil, errors.New("no TXT for " + name)
		},
	})
	if err != nil {
		t.Fatalf("verify: %v", err)
	}
	var ok []string
	for _, v := range vs {
		if v.Err != nil {
			t.Errorf("signature by %s: %v", v.Domain, v.Err)
			continue
		}
		ok = append(ok, v.Domain)
	}
	return ok
}

func TestDKIMSignAndVerify(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	_, edKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaPath, rsaTXT := writeKey(t, rsaKey, true)
	rsa8Path, _ := writeKey(t, rsaKey, false)
	edPath, edTXT := writeKey(t, edKey, false)
	signer, err := NewDKIMSigner([]DKIMKey{
		{Domain: "sender.test", Selector: "s1", KeyFile: rsaPath},
		{Domain: "pkcs8.test", Selector: "s1", KeyFile: rsa8Path},
		{Domain: "ed.test", Selector: "ed1", KeyFile: edPath},
	})
	if err != nil {
		t.Fatal(err)
	}
	records := map[string]string{
		"s1._domainkey.sender.test": rsaTXT,
		"s1._domainkey.pkcs8.test":  rsaTXT,
		"ed1._domainkey.ed.test":    edTXT,
	}
	for _, tc := range []struct {
		name, envFrom, hdrFrom, want string
	}{
		{"rsa pkcs1", "bounce@other.test", "alice@sender.test", "sender.test"},
		{"rsa pkcs8", "x@pkcs8.test", "x@pkcs8.test", "pkcs8.test"},
		{"ed25519", "bob@ed.test", "Bob <bob@ed.test>", "ed.test"},
		{"subdomain uses parent key", "a@news.sender.test", "a@news.sender.test", "sender.test"},
		{"envelope when header has none", "alice@sender.test", "", "sender.test"},
		// A display name in a charset net/mail cannot decode: signed as
		// the From's domain all the same, not the envelope's.
		{"From name in ISO-2022-JP", "bounce@pkcs8.test", "=?ISO-2022-JP?B?GyRCJTclZyVDJVcbKEI=?= <info@sender.test>", "sender.test"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := "To: bob@example.test\r\nSubject: hi\r\n"
			if tc.hdrFrom != "" {
				body = "From: " + tc.hdrFrom + "\r\n" + body
			}
			body += "\r\nHello.\r\n.dot line\r\n"
			signed, err := signer.Sign(tc.envFrom, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(signed, []byte("DKIM-Signature: ")) || !bytes.HasSuffix(signed, []byte(body)) {
				t.Fatalf("signed message:\n%s", signed)
			}
			if got := verify(t, signed, records); len(got) != 1 || got[0] != tc.want {
				t.Errorf("verified domains %v, want %s", got, tc.want)
			}
		})
	}

	t.Run("a raw control byte in a field", func(t *testing.T) {
		// An unencoded ISO-2022-JP Subject before From: every field
		// present is still signed (net/textproto refused the header, and
		// the mail went out unsigned).
		body := "Subject: \x1b$B$3$s$K$A$O\x1b(B\r\nFrom: alice@sender.test\r\nTo: bob@example.test\r\nMessage-ID: <m@sender.test>\r\n\r\nHello.\r\n"
		signed, err := signer.Sign("alice@sender.test", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		sig := string(signed[:bytes.Index(signed, []byte("\r\nSubject:"))])
		for _, h := range []string{"from", "subject", "to", "message-id"} {
			if !strings.Contains(strings.ToLower(strings.ReplaceAll(sig, "\r\n\t", "")), h) {
				t.Errorf("%s not signed: %s", h, sig)
			}
		}
		if d := verify(t, signed, records); len(d) != 1 {
			t.Fatalf("verified %v", d)
		}
	})

	t.Run("header fields only, no empty line after them", func(t *testing.T) {
		// RFC 5322 allows a message without a body, and SMTP submission
		// takes one: it is signed (with the empty line that ends its
		// header added), not sent unsigned.
		for _, body := range []string{
			"From: alice@sender.test\r\nSubject: s\r\n",
			"From: alice@sender.test\r\nSubject: s",
		} {
			signed, err := signer.Sign("alice@sender.test", []byte(body))
			if err != nil {
				t.Fatalf("%q: %v", body, err)
			}
			if !bytes.HasSuffix(signed, []byte("Subject: s\r\n\r\n")) {
				t.Errorf("%q signed as %q, want the header ended by an empty line", body, signed)
			}
			if d := verify(t, signed, records); len(d) != 1 || d[0] != "sender.test" {
				t.Errorf("%q: verified %v", body, d)
			}
		}
	})

	t.Run("internationalised domain in either form", func(t *testing.T) {
		// A key configured as bücher.example signs as its A-labels, for
		// a From in either form.
		idn, err := NewDKIMSigner([]DKIMKey{{Domain: "Bücher.Example", Selector: "s1", KeyFile: rsaPath}})
		if err != nil {
			t.Fatal(err)
		}
		recs := map[string]string{"s1._domainkey.xn--bcher-kva.example": rsaTXT}
		for _, from := range []string{"a@bücher.example", "a@xn--bcher-kva.example"} {
			body := "From: " + from + "\r\nSubject: hi\r\n\r\nx\r\n"
			signed, err := idn.Sign(from, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got := verify(t, signed, recs); len(got) != 1 || got[0] != "xn--bcher-kva.example" {
				t.Errorf("From %s: verified %v, want xn--bcher-kva.example", from, got)
			}
		}
	})

	t.Run("fields added in transit fail the signature", func(t *testing.T) {
		// Over-signing (RFC 6376 8.15): a second Subject or From, or a
		// Reply-To the original did not have, added above or below the
		// signed fields, no longer verifies; a trace field still does.
		body := "From: alice@sender.test\r\nTo: bob@example.test\r\nSubject: invoice\r\nDate: Mon, 7 Dec 2026 01:00:00 +0000\r\n\r\nPay here.\r\n"
		signed, err := signer.Sign("alice@sender.test", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		sigEnd := bytes.Index(signed, []byte("\r\nFrom:")) + 2
		check := func(name, msg string, want bool) {
			t.Helper()
			vs, err := dkim.VerifyWithOptions(strings.NewReader(msg), &dkim.VerifyOptions{
				LookupTXT: func(n string) ([]string, error) { return []string{records[n]}, nil },
			})
			if err != nil || len(vs) != 1 {
				t.Fatalf("%s: %v, %d signatures", name, err, len(vs))
			}
			if got := vs[0].Err == nil; got != want {
				t.Errorf("%s: verifies %v, want %v (%v)", name, got, want, vs[0].Err)
			}
		}
		sig, rest := string(signed[:sigEnd]), string(signed[sigEnd:])
		hdrEnd := strings.Index(rest, "\r\n\r\n") + 2
		check("as signed", string(signed), true)
		check("a trace field above", "Received: from relay.test\r\n"+string(signed), true)
		for _, f := range []string{"Subject: urgent: new bank details", "From: ceo@sender.test", "Reply-To: thief@evil.test", "Cc: carol@example.test", "Date: Tue, 8 Dec 2026 01:00:00 +0000"} {
			check(f+" above", sig+f+"\r\n"+rest, false)
			check(f+" below", sig+rest[:hdrEnd]+f+"\r\n"+rest[hdrEnd:], false)
		}
	})

	t.Run("two keys for one domain sign twice", func(t *testing.T) {
		// RSA and Ed25519 side by side (RFC 8463 3), or the old and the
		// new selector during a rotation: a signature each, both valid,
		// each over the message as submitted.
		dual, err := NewDKIMSigner([]DKIMKey{
			{Domain: "sender.test", Selector: "s1", KeyFile: rsaPath},
			{Domain: "sender.test", Selector: "ed1", KeyFile: edPath},
		})
		if err != nil {
			t.Fatal(err)
		}
		body := "From: alice@sender.test\r\nTo: bob@example.test\r\nSubject: hi\r\n\r\nHello.\r\n"
		signed, err := dual.Sign("alice@sender.test", []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasSuffix(signed, []byte(body)) || bytes.Count(signed, []byte("DKIM-Signature: ")) != 2 {
			t.Fatalf("signed message:\n%s", signed)
		}
		recs := map[string]string{"s1._domainkey.sender.test": rsaTXT, "ed1._domainkey.sender.test": edTXT}
		if got := verify(t, signed, recs); len(got) != 2 || got[0] != "sender.test" || got[1] != "sender.test" {
			t.Errorf("verified %v, want two signatures of sender.test", got)
		}
	})

	t.Run("no key leaves the body alone", func(t *testing.T) {
		body := []byte("From: a@unsigned.test\r\n\r\nx\r\n")
		out, err := signer.Sign("a@unsigned.test", body)
		if err != nil || !bytes.Equal(out, body) {
			t.Errorf("got %q, %v", out, err)
		}
	})

	t.Run("survives delivery", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{})
		s := w.sender(w.config())
		m := msg("example.test", "bob@example.test")
		signed, err := signer.Sign(m.From, m.Body)
		if err != nil {
			t.Fatal(err)
		}
		m.Body = signed
		checkDelivered(t, s.Send(ctxT(t), m))
		got := fake.Messages()[0].Data
		if !bytes.Equal(got, signed) {
			t.Fatal("the bytes changed in transit")
		}
		if d := verify(t, got, records); len(d) != 1 || d[0] != "sender.test" {
			t.Errorf("verified %v", d)
		}
	})
}

func TestDKIMKeyErrors(t *testing.T) {
	// Go refuses to generate (or use) RSA keys under 1024 bits, so a
	// signer that only claims a 512-bit public key stands in for one.
	small := publicOnly{&rsa.PublicKey{N: new(big.Int).Lsh(big.NewInt(1), 511), E: 65537}}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	_ = os.WriteFile(bad, []byte("not pem"), 0o600)
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	for name, keys := range map[string][]DKIMKey{
		"short rsa":  {{Domain: "a.test", Selector: "s", Signer: small}},
		"ecdsa":      {{Domain: "a.test", Selector: "s", Signer: ec}},
		"not pem":    {{Domain: "a.test", Selector: "s", KeyFile: bad}},
		"no file":    {{Domain: "a.test", Selector: "s", KeyFile: filepath.Join(t.TempDir(), "missing")}},
		"no key":     {{Domain: "a.test", Selector: "s"}},
		"no domain":  {{Selector: "s", Signer: ed}},
		"duplicates": {{Domain: "a.test", Selector: "s", Signer: ed}, {Domain: "A.test.", Selector: "S", Signer: ed}},
	} {
		if _, err := NewDKIMSigner(keys); err == nil {
			t.Errorf("%s: no error", name)
		} else if strings.Contains(err.Error(), "PRIVATE KEY-----") {
			t.Errorf("%s: key material in error", name)
		}
	}
}

// publicOnly is a crypto.Signer that can only show its public key.
type publicOnly struct{ pub crypto.PublicKey }

func (p publicOnly) Public() crypto.PublicKey { return p.pub }

func (p publicOnly) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errors.New("cannot sign")
}
