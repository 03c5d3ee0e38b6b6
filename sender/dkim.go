package sender

import (
	"bytes"
	"crypto"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/emersion/go-msgauth/dkim"

	"github.com/outflow/outflow/internal/ascii"
	"github.com/outflow/outflow/internal/mailhdr"
)

// DKIMKey is one signing key: mail whose sender domain is Domain (or a
// subdomain of it, without a key of its own) is signed as d=Domain,
// s=Selector. Give either KeyFile or Signer.
type DKIMKey struct {
	Domain   string // the signing domain (d=), e.g. "example.com"
	Selector string // the selector (s=); the public key is at <Selector>._domainkey.<Domain>
	// KeyFile is a PEM private key: RSA (PKCS#1 "RSA PRIVATE KEY" or
	// PKCS#8) of at least 1024 bits (RFC 8301 3.2; 2048 recommended), or
	// Ed25519 (PKCS#8, RFC 8463).
	KeyFile string
	// Signer is the key itself, instead of KeyFile.
	Signer crypto.Signer
}

// DKIMSigner signs messages with the keys of their sender domain. It is
// safe for concurrent use.
type DKIMSigner struct {
	keys map[string][]DKIMKey // by lower-case domain, in configuration order, Signer loaded
}

// signedHeaders are the fields signed when present (RFC 6376 5.4.1's
// recommendation, plus MIME and List-Unsubscribe, RFC 8058 4).
var signedHeaders = []string{
	"From", "Reply-To", "Subject", "Date", "To", "Cc", "Message-ID",
	"In-Reply-To", "References", "MIME-Version", "Content-Type",
	"Content-Transfer-Encoding", "List-Id", "List-Unsubscribe", "List-Unsubscribe-Post",
	"Resent-Date", "Resent-From", "Resent-To", "Resent-Cc", "Sender",
}

// overSigned are the signed fields a message has at most once (RFC 5322
// 3.6, RFC 2045 and RFC 8058): each is named in h= once more than it
// occurs (RFC 6376 5.4.2, 8.15), so that a field of that name added in
// transit, above or below the original, fails the signature instead of
// being what a reader is shown. The true ones are named even when absent:
// a From, Reply-To, Subject, To, Cc or Sender added to a replayed message
// changes who it seems to be from or for.
var overSigned = map[string]bool{
	"From": true, "Reply-To": true, "Subject": true, "To": true, "Cc": true, "Sender": true,
	"Date": false, "Message-ID": false, "In-Reply-To": false, "References": false,
	"MIME-Version": false, "Content-Type": false, "Content-Transfer-Encoding": false,
	"List-Unsubscribe": false, "List-Unsubscribe-Post": false,
}

// headerKeys lists the fields to sign, in h= order, for a header whose
// fields occur count times (by lower-case name).
func headerKeys(count map[string]int) []string {
	var keys []string
	for _, h := range signedHeaders {
		n := count[strings.ToLower(h)]
		if always, ok := overSigned[h]; ok && (n > 0 || always) {
			n++
		}
		for range n {
			keys = append(keys, h)
		}
	}
	return keys
}

// NewDKIMSigner loads the keys. A domain may have several, each with a
// selector of its own: mail is signed with each (an RSA and an Ed25519
// key, as RFC 8463 3 advises while verifiers learn Ed25519; or the old and
// the new selector while a key is rotated). Two keys with one domain and
// selector are an error.
func NewDKIMSigner(keys []DKIMKey) (*DKIMSigner, error) {
	d := &DKIMSigner{keys: map[string][]DKIMKey{}}
	for _, k := range keys {
		dom := aLabels(k.Domain)
		if dom == "" || k.Selector == "" {
			return nil, errors.New("sender: DKIM key needs a Domain and a Selector")
		}
		for _, o := range d.keys[dom] {
			if strings.EqualFold(o.Selector, k.Selector) {
				return nil, fmt.Errorf("sender: two DKIM keys for %s with selector %s", dom, k.Selector)
			}
		}
		if k.Signer == nil {
			s, err := loadDKIMKey(k.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("sender: DKIM key for %s: %w", dom, err)
			}
			k.Signer = s
		}
		switch pub := k.Signer.Public().(type) {
		case *rsa.PublicKey:
			if pub.N.BitLen() < 1024 {
				return nil, fmt.Errorf("sender: DKIM key for %s: RSA key of %d bits; RFC 8301 requires at least 1024", dom, pub.N.BitLen())
			}
		case ed25519.PublicKey:
		default:
			return nil, fmt.Errorf("sender: DKIM key for %s: %T is neither RSA nor Ed25519", dom, pub)
		}
		k.Domain = dom
		d.keys[dom] = append(d.keys[dom], k)
	}
	return d, nil
}

func loadDKIMKey(path string) (crypto.Signer, error) {
	if path == "" {
		return nil, errors.New("neither KeyFile nor Signer given")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, fmt.Errorf("%s: no PEM block", path)
	}
	switch block.Type {
	case "RSA PRIVATE KEY":
		k, err := x509.ParsePKCS1PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return k, nil
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("%s: %T cannot sign", path, k)
		}
		return s, nil
	}
	return nil, fmt.Errorf("%s: PEM block %q; want RSA PRIVATE KEY or PRIVATE KEY", path, block.Type)
}

// Sign returns body with a DKIM-Signature field (RFC 6376, relaxed/relaxed
// canonicalization, SHA-256) prepended for each key of the domain of the
// From header, or of the envelope sender from when the header has none.
// Without a matching key it returns body unchanged. Call it once, before
// the first attempt, so that every retry sends identical bytes.
func (d *DKIMSigner) Sign(from string, body []byte) ([]byte, error) {
	if d == nil || len(d.keys) == 0 {
		return body, nil
	}
	// The header read as submission reads it (a raw control byte in a
	// Subject, a From name in any charset), not as net/textproto and
	// net/mail do: they refused such mail, and it went out unsigned,
	// signed under the envelope's domain, or with only From signed.
	domain := ""
	if froms := mailhdr.Values(body, "From"); len(froms) > 0 {
		if list, err := mailhdr.Addresses(froms[0]); err == nil && len(list) > 0 {
			domain = domainOf(list[0].Address)
		}
	}
	if domain == "" {
		domain = domainOf(from)
	}
	signers, ok := d.keyFor(domain)
	if !ok {
		return body, nil
	}
	// A message of header fields only, with no empty line after them
	// (RFC 5322 allows it; SMTP submission takes it), is what the
	// signature's reader cannot take: it wants the header section ended.
	// The empty line is added to what is signed and sent, an empty body
	// either way.
	body = withHeaderEnd(body)
	// From is first in signedHeaders and always over-signed, so it is
	// always signed (RFC 6376 5.4).
	keys := headerKeys(mailhdr.Names(body))
	var out bytes.Buffer
	out.Grow(len(body) + 600*len(signers))
	for _, key := range signers {
		// Each signature covers the message as submitted (no signature
		// names another in h=), so they are made apart and stacked.
		var one bytes.Buffer
		one.Grow(len(body) + 600)
		err := dkim.Sign(&one, bytes.NewReader(body), &dkim.SignOptions{
			Domain:                 key.Domain,
			Selector:               key.Selector,
			Signer:                 key.Signer,
			Hash:                   crypto.SHA256,
			HeaderCanonicalization: dkim.CanonicalizationRelaxed,
			BodyCanonicalization:   dkim.CanonicalizationRelaxed,
			HeaderKeys:             keys,
		})
		if err != nil {
			return nil, fmt.Errorf("sender: DKIM sign as %s (selector %s): %w", key.Domain, key.Selector, err)
		}
		out.Write(one.Bytes()[:one.Len()-len(body)])
	}
	out.Write(body)
	return out.Bytes(), nil
}

// withHeaderEnd returns body with its header section ended by an empty
// line: body itself when it has one (or starts with it: no header at
// all), else a copy with the line ending the last field where it is
// missing and then the empty line.
func withHeaderEnd(body []byte) []byte {
	if bytes.HasPrefix(body, crlf) || bytes.Contains(body, []byte("\r\n\r\n")) {
		return body
	}
	out := make([]byte, 0, len(body)+4)
	out = append(out, body...)
	if len(out) > 0 && !bytes.HasSuffix(out, crlf) {
		out = append(out, crlf...)
	}
	return append(out, crlf...)
}

// Signs says whether mail from domain would be signed (a key of its own or
// of a parent domain).
func (d *DKIMSigner) Signs(domain string) bool {
	if d == nil {
		return false
	}
	_, ok := d.keyFor(aLabels(domain))
	return ok
}

// keyFor finds the keys of domain or of its closest parent, so that
// news.example.com is signed as example.com (aligned under DMARC's relaxed
// mode) unless it has keys of its own.
func (d *DKIMSigner) keyFor(domain string) ([]DKIMKey, bool) {
	for domain != "" {
		if k, ok := d.keys[domain]; ok {
			return k, true
		}
		_, parent, found := strings.Cut(domain, ".")
		if !found || !strings.Contains(parent, ".") {
			break
		}
		domain = parent
	}
	return nil, false
}

func domainOf(addr string) string {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 {
		return ""
	}
	return aLabels(strings.TrimSuffix(addr[i+1:], ">"))
}

// aLabels is domain in the form the key map holds and d= names (RFC 6376
// 3.5 wants its A-labels): ascii.Domain's, so that a From at
// bücher.example finds the key for xn--bcher-kva.example and the other way
// round.
func aLabels(domain string) string { return ascii.Domain(domain) }
