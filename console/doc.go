// Package console is in charge of the operator's console: the web pages
// served at /ui/ on the HTTP API's listener (--api-addr) that show the
// queue's lanes, the destinations' shared throttle state, one message's
// whole story, the mail to one address (its events, found by recipient),
// the dead letters and suppression list, and that run the
// same operations as `outflow queue …`, `outflow dest …` and `outflow
// suppress …`, through the same functions of packages queue and throttle.
//
// Everything it shows is read from NATS (streams, key-value buckets, the
// workers' status answers), never from this process's memory, so any
// daemon's console shows the whole fleet. The per-minute charts of the
// overview come from the events stream: the console follows it from an
// hour back and keeps one count per event type and minute.
//
// Sign-in takes an admin API key (`outflow apikey create --admin`). A
// session lives in this process's memory, for SessionTTL (8 hours by
// default) from sign-in or until sign-out; its cookie is HttpOnly,
// SameSite=Strict and, under TLS (its own or a proxy's that sets
// X-Forwarded-Proto), Secure, and holds only a random token.
// The key is looked up again on every request, so revoking it ends its
// sessions at once; a restart ends them all (sign in again). Every request
// but the sign-in page and the stylesheet needs a session, and every
// request that changes state is a POST that carries the session's CSRF
// token. Pages are html/template, the stylesheet and the one small script
// (the live refresh, a poll every few seconds) are embedded in the binary,
// and the Content-Security-Policy allows nothing from elsewhere.
package console
