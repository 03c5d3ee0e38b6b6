// Package fakemx is in charge of pretending to be a receiving mail server in
// tests: a go-smtp server on a random 127.0.0.1 port that records every
// message it accepts, every EHLO name it hears, how many connections,
// transactions and RSETs it saw, and that lets a test script its replies per
// stage and per recipient (reject, defer, stall, drop the connection).
//
// It can offer STARTTLS or implicit TLS with a throw-away certificate, AUTH
// PLAIN and LOGIN, a recipient limit (advertised as LIMITS RCPTMAX and
// enforced with 452 4.5.3), a SIZE limit, SMTPUTF8 and DSN (recording the
// parameters it is given); it can also mangle its
// EHLO reply (lower-case extension keywords, extra or hidden extensions) and
// answer the greeting with a scripted reply, to imitate receivers in the wild.
//
// Only the sender's own tests and other packages' tests import it; it never
// listens anywhere but loopback.
package fakemx
