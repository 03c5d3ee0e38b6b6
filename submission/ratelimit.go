package submission

import (
	"net/netip"
	"sync"
	"time"

	"github.com/outflow/outflow/internal/clientaddr"
)

// maxTrackedClients bounds the failure table so that a flood of addresses
// cannot grow it without limit. Past it, expired entries are swept, then
// arbitrary ones dropped (losing some counts beats running out of memory).
const maxTrackedClients = 1 << 16

// authLimiter counts failed AUTH attempts per client: an IPv4 address, or an
// IPv6 /64 (one host usually owns a whole /64, so counting single IPv6
// addresses would give it 2^64 tries), and for a trusted network's client
// per client and account (authKey). Failures are counted over a fixed
// window from the first one; a success does not clear them, so one valid
// account cannot be used to reset guesses at another.
type authLimiter struct {
	limit  int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	clients map[authKey]*failures
}

// authKey is what failures are counted against: a client (clientaddr's
// prefix), and for a trusted network's client also the account tried
// (session.authKey says why).
type authKey struct {
	client  netip.Prefix
	account string
}

type failures struct {
	first time.Time
	count int
}

func newAuthLimiter(limit int, window time.Duration) *authLimiter {
	return &authLimiter{limit: limit, window: window, now: time.Now,
		clients: make(map[authKey]*failures)}
}

// blocked reports whether k has used up its failures in this window.
func (l *authLimiter) blocked(k authKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.clients[k]
	if f == nil {
		return false
	}
	if l.now().Sub(f.first) >= l.window {
		delete(l.clients, k)
		return false
	}
	return f.count >= l.limit
}

// fail records one failure for k and reports whether k is now blocked.
func (l *authLimiter) fail(k authKey) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entry(k)
	f.count++
	return f.count >= l.limit
}

// entry is k's record, made afresh when it has none or its window has
// passed. l.mu is held.
func (l *authLimiter) entry(k authKey) *failures {
	now := l.now()
	f := l.clients[k]
	if f == nil || now.Sub(f.first) >= l.window {
		if f == nil && len(l.clients) >= maxTrackedClients {
			l.sweep(now)
		}
		f = &failures{first: now}
		l.clients[k] = f
	}
	return f
}

// clientKey is the key of addr's client, for failures not tied to an
// account.
func clientKey(addr netip.Addr) authKey { return authKey{client: clientaddr.Prefix(addr)} }

// sweep drops expired entries, then arbitrary ones until there is room.
func (l *authLimiter) sweep(now time.Time) {
	for k, f := range l.clients {
		if now.Sub(f.first) >= l.window {
			delete(l.clients, k)
		}
	}
	for k := range l.clients {
		if len(l.clients) < maxTrackedClients {
			break
		}
		delete(l.clients, k)
	}
}
