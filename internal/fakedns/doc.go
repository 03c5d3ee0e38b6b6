// Package fakedns is in charge of pretending to be the authoritative DNS of
// test domains: a miekg/dns server on a random 127.0.0.1 port, over UDP and
// TCP on the same port, that answers from zones a test gives as records in
// presentation format ("mx.example.test. 300 IN A 127.0.0.2").
//
// Unknown names get NXDOMAIN (with the zone's SOA in the authority section
// when the name lies inside a zone, RFC 2308 3), known names without records
// of the asked type get NODATA with the SOA, and a CNAME inside a zone is
// followed. A test can make a name (and every name beneath it) never answer
// (Timeout), answer SERVFAIL (ServFail), answer only after a delay (Delay),
// or always set TC over UDP (Truncate) so that a client must retry over TCP.
// Each zone has a switch for the AD bit (Zone.SetAD), so DANE tests can say
// whether an answer counts as DNSSEC-validated. UDP answers are truncated to
// the client's EDNS0 size (512 bytes without EDNS0), as a real server does.
//
// Only tests import it; it never listens anywhere but loopback.
package fakedns
