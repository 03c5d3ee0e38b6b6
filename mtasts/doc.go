// Package mtasts is in charge of SMTP MTA Strict Transport Security
// (RFC 8461) for the sending side: it discovers a recipient domain's
// policy through the "_mta-sts" TXT record, fetches the policy over HTTPS
// from "mta-sts.<domain>" with a verified certificate and the RFC's limits
// (no redirects, a text/plain body of at most 64 KiB, a one-minute
// timeout), parses it strictly, matches MX host names against its
// patterns, and caches it for its max_age.
//
// Cache semantics (RFC 8461 5.1). A policy is used until max_age after it
// was fetched. Each lookup checks the TXT record; a new id triggers a
// fetch, and a fetch that fails keeps the cached, unexpired policy. A
// domain whose TXT record disappears keeps its cached policy until it
// expires, so that an attacker who blocks DNS cannot strip it. A failed
// fetch without a cached policy means "no policy" (delivery goes on as if
// the domain had none, 3.3), and is not retried for FailureHold, so that
// a broken policy host costs one fetch per hold instead of one per
// message. A fetch runs on its own, bounded by FetchTimeout, whoever
// waits for it.
//
// Refresh (10.2). A policy in force is fetched again in the background
// once half its max_age (at most a day) has passed, by the lookup that
// finds it due or by Refresh, which the daemon calls hourly for domains
// not mailed meanwhile; a failed refresh keeps the cached policy. A full
// cache drops the entries without a policy in force before any policy.
//
// Lookup never blocks delivery on its own: it answers with the policy (or
// none) and, for TLS reporting (RFC 8460), the reason a policy could not
// be had. What to do with the policy is the sender's business.
package mtasts
