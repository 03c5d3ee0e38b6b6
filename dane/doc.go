// Package dane is in charge of SMTP security through DNS-based
// Authentication of Named Entities (RFC 7672) on the sending side: it
// looks up an MX host's TLSA records, keeps only those it can use, and
// verifies a TLS server's certificate chain against them.
//
// Trust model. TLSA records count only when the resolver says it
// validated them (the AD bit): like Postfix's "smtp_dns_support_level =
// dnssec", outflow does not validate DNSSEC itself and relies on the
// operator's validating resolver. An answer without AD is treated as no
// records at all (RFC 7672 2.2: an insecure TLSA RRset means no DANE).
//
// Usages and matching. DANE-EE(3) records match the server's own
// certificate and ignore its names and validity dates (RFC 7672 3.1.1);
// DANE-TA(2) records match a trust anchor among the certificates the
// server sends, and the chain from the leaf up to it must verify, dates
// and the reference identifiers included (3.1.2, 3.2.2). Selectors full
// certificate (0) and SubjectPublicKeyInfo (1), matching types exact (0),
// SHA-256 (1) and SHA-512 (2) are supported; PKIX-TA(0) and PKIX-EE(1)
// records are unusable for SMTP (3.1.3) and ignored, as are unknown
// parameters. A secure RRset without a usable record still makes TLS
// mandatory, unauthenticated (RFC 7672 2.2).
package dane
