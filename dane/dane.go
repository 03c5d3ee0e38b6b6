package dane

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Resolver is the DNS this package needs. authenticated is the AD bit of
// the answer.
type Resolver interface {
	LookupTLSA(ctx context.Context, port int, proto, host string) (recs []*dns.TLSA, authenticated bool, err error)
}

// AddrAuthenticator is a Resolver that can also say whether a host's
// address records came authenticated (package resolver's does). Lookup
// asks it when a TLSA lookup fails: a host whose addresses are not
// DNSSEC-secure is in no position to publish TLSA records (RFC 7672
// 2.2.2 looks them up only for secure addresses), so the failure does not
// rule it out.
type AddrAuthenticator interface {
	AddrAuthenticated(ctx context.Context, host string) (bool, error)
}

// TLSA parameters this package knows (RFC 6698 7.2-7.4, RFC 7218 names).
const (
	UsagePKIXTA  = 0
	UsagePKIXEE  = 1
	UsageDANETA  = 2
	UsageDANEEE  = 3
	SelectorCert = 0
	SelectorSPKI = 1
	MatchFull    = 0
	MatchSHA256  = 1
	MatchSHA512  = 2
)

// Result types of RFC 8460 4.3.2 that verification failures map to.
const (
	ResultTLSAInvalid     = "tlsa-invalid"
	ResultDNSSECInvalid   = "dnssec-invalid"
	ResultHostMismatch    = "certificate-host-mismatch"
	ResultExpired         = "certificate-expired"
	ResultNotTrusted      = "certificate-not-trusted"
	ResultValidationError = "validation-failure"
)

// Error is a DANE failure with its RFC 8460 result type.
type Error struct {
	Result string // one of the Result constants
	Err    error
}

func (e *Error) Error() string { return "DANE: " + e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Records is what a TLSA lookup found for one MX host.
type Records struct {
	// Secure is true when the answer was authenticated and non-empty:
	// DANE applies and STARTTLS is mandatory.
	Secure bool
	// Usable are the records Verify can check; when Secure but none is
	// usable, TLS is still mandatory but the certificate is not checked.
	Usable []*dns.TLSA
	// All are every record of a secure answer, for reports.
	All []*dns.TLSA
}

// Lookup looks up the TLSA records of host's port over TCP (RFC 7672
// 2.2.1: "_25._tcp.<MX host>"). An unauthenticated answer, NXDOMAIN and
// NODATA give Records{} and no error; any other failure is an *Error of
// type dnssec-invalid, for the caller to treat as a temporary failure of
// that host (a validating resolver fails this way on bogus signatures),
// unless the resolver says the host's address records are not
// authenticated (AddrAuthenticator): DANE cannot apply to such a host,
// and name servers of unsigned zones that answer TLSA queries badly
// (SERVFAIL, a timeout) would otherwise make it undeliverable.
func Lookup(ctx context.Context, r Resolver, host string, port int) (Records, error) {
	recs, ad, err := r.LookupTLSA(ctx, port, "tcp", strings.TrimSuffix(host, "."))
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			return Records{}, nil
		}
		if aa, ok := r.(AddrAuthenticator); ok {
			if secure, aerr := aa.AddrAuthenticated(ctx, strings.TrimSuffix(host, ".")); aerr == nil && !secure {
				return Records{}, nil
			}
		}
		return Records{}, &Error{Result: ResultDNSSECInvalid, Err: fmt.Errorf("TLSA lookup for %s port %d: %w", host, port, err)}
	}
	if !ad || len(recs) == 0 {
		return Records{}, nil
	}
	return Records{Secure: true, Usable: Usable(recs), All: recs}, nil
}

// Usable returns the records of recs that Verify can check: usage
// DANE-TA or DANE-EE, a known selector and matching type, and well-formed
// association data.
func Usable(recs []*dns.TLSA) []*dns.TLSA {
	var out []*dns.TLSA
	for _, r := range recs {
		if r == nil || (r.Usage != UsageDANETA && r.Usage != UsageDANEEE) || r.Selector > SelectorSPKI {
			continue
		}
		data, err := hex.DecodeString(r.Certificate)
		if err != nil || len(data) == 0 {
			continue
		}
		switch r.MatchingType {
		case MatchFull:
		case MatchSHA256:
			if len(data) != sha256.Size {
				continue
			}
		case MatchSHA512:
			if len(data) != sha512.Size {
				continue
			}
		default:
			continue
		}
		out = append(out, r)
	}
	return out
}

// Matches says whether cert matches the association data of r.
func Matches(r *dns.TLSA, cert *x509.Certificate) bool {
	want, err := hex.DecodeString(r.Certificate)
	if err != nil {
		return false
	}
	var sel []byte
	switch r.Selector {
	case SelectorCert:
		sel = cert.Raw
	case SelectorSPKI:
		sel = cert.RawSubjectPublicKeyInfo
	default:
		return false
	}
	switch r.MatchingType {
	case MatchFull:
		return bytes.Equal(sel, want)
	case MatchSHA256:
		sum := sha256.Sum256(sel)
		return bytes.Equal(sum[:], want)
	case MatchSHA512:
		sum := sha512.Sum512(sel)
		return bytes.Equal(sum[:], want)
	}
	return false
}

// Verify checks a server's certificates (leaf first, as sent) against the
// usable records: it succeeds when a DANE-EE record matches the leaf, or
// a DANE-TA record matches a certificate the server sent after the leaf
// and the leaf chains up to it, valid at now, for one of names (the MX
// host name first; RFC 7672 3.2.2 also allows the destination domain).
func Verify(certs []*x509.Certificate, usable []*dns.TLSA, names []string, now time.Time) error {
	if len(certs) == 0 {
		return &Error{Result: ResultValidationError, Err: errors.New("the server sent no certificate")}
	}
	if len(usable) == 0 {
		return &Error{Result: ResultTLSAInvalid, Err: errors.New("no usable TLSA record")}
	}
	leaf := certs[0]
	// DANE-EE first: it needs nothing but the leaf (3.1.1: names and
	// dates do not matter).
	for _, r := range usable {
		if r.Usage == UsageDANEEE && Matches(r, leaf) {
			return nil
		}
	}
	var taErr error
	for _, r := range usable {
		if r.Usage != UsageDANETA {
			continue
		}
		for i := 1; i < len(certs); i++ {
			if !Matches(r, certs[i]) {
				continue
			}
			if err := verifyToAnchor(certs, i, names, now); err != nil {
				taErr = err
				continue
			}
			return nil
		}
	}
	if taErr != nil {
		return taErr
	}
	return &Error{Result: ResultTLSAInvalid, Err: fmt.Errorf("no TLSA record matches the certificate of %s (%d usable records)", first(names), len(usable))}
}

// verifyToAnchor verifies the leaf up to certs[ta], which a DANE-TA record
// matched, as a trust anchor, and the leaf's name.
func verifyToAnchor(certs []*x509.Certificate, ta int, names []string, now time.Time) error {
	roots := x509.NewCertPool()
	roots.AddCert(certs[ta])
	inter := x509.NewCertPool()
	for _, c := range certs[1:ta] {
		inter.AddCert(c)
	}
	leaf := certs[0]
	_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	if err != nil {
		var inv x509.CertificateInvalidError
		if errors.As(err, &inv) && inv.Reason == x509.Expired {
			return &Error{Result: ResultExpired, Err: fmt.Errorf("certificate of %s: %w", first(names), err)}
		}
		return &Error{Result: ResultNotTrusted, Err: fmt.Errorf("certificate of %s does not chain to the DANE-TA anchor: %w", first(names), err)}
	}
	for _, n := range names {
		if leaf.VerifyHostname(n) == nil {
			return nil
		}
	}
	return &Error{Result: ResultHostMismatch, Err: fmt.Errorf("certificate chains to the DANE-TA anchor but names none of %s", strings.Join(names, ", "))}
}

// VerifyConnection returns a function for tls.Config.VerifyConnection
// (with InsecureSkipVerify set, since the WebPKI check does not apply)
// that runs Verify on the server's certificates.
func VerifyConnection(usable []*dns.TLSA, names []string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		return Verify(cs.PeerCertificates, usable, names, time.Now())
	}
}

// Strings renders records in presentation form ("3 1 1 ab12…"), for TLS
// reports' policy-string (RFC 8460 4.4).
func Strings(recs []*dns.TLSA) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		out = append(out, fmt.Sprintf("%d %d %d %s", r.Usage, r.Selector, r.MatchingType, strings.ToLower(r.Certificate)))
	}
	return out
}

func first(names []string) string {
	if len(names) == 0 {
		return "the server"
	}
	return names[0]
}
