package api

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/clientaddr"
	"github.com/outflow/outflow/submission"
)

// The limit on failed authentications per client address, on the API
// listener: the SMTP listener's (submission.DefaultAuthFailLimit and
// DefaultAuthFailWindow), so that one rule holds on both listeners.
const (
	DefaultAuthFailLimit  = submission.DefaultAuthFailLimit
	DefaultAuthFailWindow = submission.DefaultAuthFailWindow
)

// AuthLimiter counts failed authentications per client address (an IPv4
// address or an IPv6 /64, package clientaddr) over a fixed window from
// the first, as the SMTP listener counts failed AUTH: an address that
// failed Limit times in its window has its further failures answered 429,
// until the window ends. A valid key from it is still served (Server.route
// says why). A success does not clear the count, so one valid key cannot
// be used to reset guesses at others. The API and the console's sign-in
// share one (Server.AuthLimiter), so that guesses cannot be split between
// them.
//
// A client is its TCP peer: behind a reverse proxy every client is the
// proxy's address, and the limit counts their failures together.
type AuthLimiter struct {
	f *clientaddr.Failures[netip.Prefix]
	// refused counts the failures answered 429 (Refusing).
	refused atomic.Uint64
}

// NewAuthLimiter returns a limiter of limit failures per window. Zero
// values take DefaultAuthFailLimit and DefaultAuthFailWindow; now nil is
// time.Now.
func NewAuthLimiter(limit int, window time.Duration, now func() time.Time) *AuthLimiter {
	if limit <= 0 {
		limit = DefaultAuthFailLimit
	}
	if window <= 0 {
		window = DefaultAuthFailWindow
	}
	f := clientaddr.NewFailures[netip.Prefix](limit, window)
	if now != nil {
		f.Now = now
	}
	return &AuthLimiter{f: f}
}

// Limit is the failures an address may make within Window.
func (l *AuthLimiter) Limit() int { return l.f.Limit() }

// Window is the period failures are counted over, from the first.
func (l *AuthLimiter) Window() time.Duration { return l.f.Window() }

// Refused is how many failures were answered 429 (Refusing); for the
// metrics.
func (l *AuthLimiter) Refused() uint64 { return l.refused.Load() }

// Refusing counts a failure answered 429 because its address was at its
// limit (Check).
func (l *AuthLimiter) Refusing() { l.refused.Add(1) }

// Check reports how long addr's failures are refused yet: 0 when it is
// under its limit.
func (l *AuthLimiter) Check(addr netip.Addr) time.Duration {
	return l.f.Wait(clientaddr.Prefix(addr))
}

// Fail records a failed authentication from addr and returns how many it
// made in its window, this one included: 1 opens a window, Limit closes
// the address until the window ends.
func (l *AuthLimiter) Fail(addr netip.Addr) int {
	return l.f.Fail(clientaddr.Prefix(addr))
}

// Failed records a failed authentication of r, for reason (a fixed word,
// never the key), and logs it without letting a guesser flood the log:
// the address's first failure in its window at warn, with its address and
// reason, and the one that brings it to the limit, with the count; the
// others at debug only (they are counted in the metrics, and those
// answered 429 after the limit in Refused too).
func (l *AuthLimiter) Failed(log zerolog.Logger, r *http.Request, reason string) {
	n := l.Fail(ClientAddr(r))
	ev := log.Debug()
	if n == 1 || n == l.Limit() {
		ev = log.Warn()
	}
	ev = ev.Str("remote", r.RemoteAddr).Str("reason", reason).Int("failures", n).Int("limit", l.Limit())
	if n == l.Limit() {
		ev.Dur("window", l.Window()).Msg("authentication failures at the limit: the address's failures are answered 429 until the window ends")
		return
	}
	ev.Msg("authentication failed")
}

// RetryAfter is wait as the seconds of a Retry-After header: rounded up,
// so that a client that waits them finds the window ended, and at least 1.
func RetryAfter(wait time.Duration) int {
	return max(1, int(math.Ceil(wait.Seconds())))
}

// ClientAddr is the address of r's client, its TCP peer (unmapped); the
// zero Addr when RemoteAddr holds none, which AuthLimiter counts as one
// client.
func ClientAddr(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr().Unmap()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a.Unmap()
}

// The reasons a failed authentication is counted under (cmd/outflow
// exports them as outflow_api_auth_failures_total{reason}): a fixed set,
// never the key.
const (
	// AuthMissing: no Authorization header.
	AuthMissing = "missing"
	// AuthMalformed: not the Bearer scheme, or no token.
	AuthMalformed = "malformed"
	// AuthUnknown: a key that does not exist or was revoked.
	AuthUnknown = "unknown"
)

// AuthFailureReasons lists the reasons in the order AuthFailures returns
// them.
var AuthFailureReasons = [numAuthReasons]string{AuthMissing, AuthMalformed, AuthUnknown}

// Indexes in AuthFailureReasons.
const (
	authMissing = iota
	authMalformed
	authUnknown
	numAuthReasons
)

// AuthFailures returns how many requests this process refused 401, by
// reason, in the order of AuthFailureReasons; for the metrics.
func (s *Server) AuthFailures() [numAuthReasons]uint64 {
	var n [numAuthReasons]uint64
	for i := range n {
		n[i] = s.authFailures[i].Load()
	}
	return n
}

// authFailed counts a failed authentication of r, by reason and against
// its client address.
func (s *Server) authFailed(r *http.Request, reason int) {
	s.authFailures[reason].Add(1)
	s.auth.Failed(s.log, r, AuthFailureReasons[reason])
}

// authBlocked is the 429 for a failed authentication from a client
// address at its limit of them, nil when it is under its limit. It is
// rate-limited, as a key over its rate is: a client that honours
// Retry-After needs no other branch.
func (s *Server) authBlocked(r *http.Request) *Problem {
	wait := s.auth.Check(ClientAddr(r))
	if wait <= 0 {
		return nil
	}
	p := problem(http.StatusTooManyRequests, ProblemRateLimited, "too many failed authentications",
		fmt.Sprintf("this address made %d failed authentications within %g minutes: its requests are refused until retry_after has passed; check the API key",
			s.auth.Limit(), s.auth.Window().Minutes()))
	p.RetryAfter = RetryAfter(wait)
	return p
}
