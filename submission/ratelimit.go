package submission

import (
	"net/netip"
	"time"

	"github.com/outflow/outflow/internal/clientaddr"
)

// authLimiter counts failed AUTH attempts per client: an IPv4 address, or an
// IPv6 /64 (one host usually owns a whole /64, so counting single IPv6
// addresses would give it 2^64 tries), and for a trusted network's client
// per client and account (authKey), over a fixed window from the first
// failure (clientaddr.Failures, as the API counts its failed keys).
type authLimiter struct {
	f *clientaddr.Failures[authKey]
}

// authKey is what failures are counted against: a client (clientaddr's
// prefix), and for a trusted network's client also the account tried
// (session.authKey says why).
type authKey struct {
	client  netip.Prefix
	account string
}

func newAuthLimiter(limit int, window time.Duration) *authLimiter {
	return &authLimiter{f: clientaddr.NewFailures[authKey](limit, window)}
}

// blocked reports whether k has used up its failures in this window.
func (l *authLimiter) blocked(k authKey) bool { return l.f.Wait(k) > 0 }

// fail records one failure for k and reports whether k is now blocked.
func (l *authLimiter) fail(k authKey) bool { return l.f.Fail(k) >= l.f.Limit() }

// clientKey is the key of addr's client, for failures not tied to an
// account.
func clientKey(addr netip.Addr) authKey { return authKey{client: clientaddr.Prefix(addr)} }
