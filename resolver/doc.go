// Package resolver is in charge of outflow's DNS: the MX, A, AAAA, TXT and
// TLSA lookups that direct delivery, MTA-STS and DANE make. It asks the
// configured servers (--dns), or the ones in /etc/resolv.conf, itself with
// github.com/miekg/dns, so that it sees what the standard library hides:
// the AD bit of an answer (RFC 4035 3.2.3; DANE trusts TLSA records only
// from a validating resolver that sets it, as Postfix's
// smtp_dns_support_level=dnssec does), the SOA of a negative answer, and
// TLSA records at all. It also keeps where a CNAME chain the server
// followed ends (CanonicalName), which DANE needs to look for TLSA records
// at an MX alias's expanded name (RFC 7672 2.2.2).
//
// Answers are cached by their TTL (capped by Config.MaxTTL), in a cache
// bounded in entries that drops the least recently used. NXDOMAIN and
// NODATA answers are cached too, for the TTL of the SOA in their authority
// section or its minimum field, whichever is lower (RFC 2308 5); a negative
// answer without an SOA is not cached. Failures (timeouts, SERVFAIL,
// REFUSED) are never cached. Concurrent lookups of one name and type share
// one query.
//
// Each query tries the servers in order, Config.Attempts rounds, each try
// bounded by Config.Timeout; a SERVFAIL, REFUSED or timeout moves on to the
// next server, and a truncated UDP answer is asked again over TCP (RFC 7766).
//
// Errors are *net.DNSError, the way net.Resolver reports them, so callers
// tell the cases apart the same way: IsNotFound for NXDOMAIN and NODATA
// (the name or record does not exist: permanent), IsTemporary (and
// IsTimeout for a timeout) for everything else. LookupTLSA is the
// exception: "no TLSA records" is not an error there (nil records), since
// it only means the host does not publish DANE.
//
// Without servers in the configuration or in /etc/resolv.conf, lookups go
// to net.DefaultResolver (no cache of ours, no AD bit), and LookupTLSA
// answers "no records, not authenticated".
//
// docs/delivery.md describes the resolver and its configuration.
package resolver
