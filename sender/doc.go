// Package sender is in charge of handing messages to the mail servers of
// their recipients, the way a trusted MTA does: it finds the destination's
// MX hosts (RFC 5321 5.1, with the implicit MX and RFC 7505 null MX;
// MX records that name an IP address are skipped), or
// uses a configured smarthost with SASL AUTH; it tries a host's addresses
// in RFC 6724 order (IPv6 first where the machine has a route, IPv4 as the
// fallback), never connecting to an MX host's loopback, unspecified,
// link-local or multicast address (MXAllowLoopback allows loopback for
// tests), and at most MXAddressLimit addresses and MXSessionLimit failed
// sessions per Send (Postfix's smtp_mx_address_limit and
// smtp_mx_session_limit); it remembers, for every Send of the process, an
// MX address whose connect timed out, was refused or found no route, and
// dials it no more for a while (DeadAddrHold, deadaddr.go): the host's
// other addresses and the next hosts are tried, and a Send whose every
// address is held fails at once, transiently; it connects from the
// message's egress address (Source, with its EHLO name) when one is
// given; it secures each MX session
// as DANE (RFC 7672, package dane; TLSA records at an alias's expanded
// name first), then MTA-STS (RFC 8461, package mtasts),
// then the destination's configured TLS policy require (tlspolicy.go), and
// hands the TLS outcomes to RFC 8460 reporting (package tlsrpt); it bounds
// every step of the conversation with the RFC 5321 4.5.3.2 timeouts and
// the caller's context; it keeps a pool of connections per host and reuses
// them (RSET between transactions); it pipelines each transaction's
// commands (RFC 2920) and, where the server offers CHUNKING, sends the
// message as one BDAT chunk in the same write (RFC 3030), one round trip a
// message; it splits recipients by the server's limit; and it reports one
// raw outcome per recipient.
//
// Failure semantics. Send never classifies and never retries a message on
// its own (only a failed RSET on a pooled connection is retried on a new
// one, when the server closed it or said 421, so that it took nothing).
// Within one Send it moves on to the next MX host when a host cannot be
// reached or fails before MAIL, and also, as Postfix does, when MAIL gets
// a 4xx or the connection is lost before the server accepted any
// recipient of the transaction (and before the message left); a 5xx to
// MAIL and every reply to RCPT stay the recipients' outcome.
// Each recipient gets exactly one classify.Input: the reply to its RCPT
// when refused there; the reply to the final dot, or to the BDAT chunk,
// when accepted there; the failure of its transaction (MAIL or DATA
// refusal, timeout or lost connection) when that ended it; otherwise the
// outcome that ended the attempt for everyone still waiting (DNS failure,
// connect failure, greeting or EHLO refusal, TLS failure under a
// "required" policy, DANE or MTA-STS, AUTH refusal). A transaction's
// failure is never given to recipients it did not offer (a later batch,
// those a 452 put off): they go in the next transaction, or on another
// connection when it took its own with it (a failed session, for
// MXSessionLimit), and when no connection is left for them they are
// reported as not attempted (EventLocal, transient). When every host
// failed, that outcome is the last 4xx reply a server gave, else the last
// failure that was not a 5xx reply, else the last one; a limit that left
// hosts untried says so at the end of its Text. A timeout or lost
// connection after the final dot (or the whole BDAT chunk) was sent, or a
// reply to it that cannot be read, is reported at StageDataEnd as
// EventTimeout or EventConnLost: the message may have been delivered,
// which package classify calls "unknown".
// Outcomes that outflow invents itself (SMTPUTF8 not offered, SIZE exceeded,
// AUTH not offered, a cached relay AUTH refusal, an MX host refused for its
// addresses, MX records that name addresses, MX addresses all held after
// recent connect failures, recipients not attempted) say
// so in their Text. Until a login to the relay is known to work (at
// start, after a refusal), one Send at a time logs in, per source address,
// and the others wait for its result.
//
// The package also signs messages with DKIM (DKIMSigner); the caller signs
// once at submission, so that every retry sends the same bytes. Fields a
// message has at most once are over-signed, so that one added in transit
// breaks the signature. A domain with several keys (RSA and Ed25519, or
// two selectors during a rotation) gets a signature by each.
//
// docs/delivery.md describes delivery and every configuration field.
package sender
