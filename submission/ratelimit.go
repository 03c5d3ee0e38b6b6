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
// addresses would give it 2^64 tries). Failures are counted over a fixed
// window from the first one; a success does not clear them, so one valid
// account cannot be used to reset guesses at another.
type authLimiter struct {
	limit  int
	window time.Duration
	now    func() time.Time

	mu      sync.Mutex
	clients map[netip.Prefix]*failures
}

type failures struct {
	first   time.Time
	count   int
	pending int // attempts under way (begin without end)
}

func newAuthLimiter(limit int, window time.Duration) *authLimiter {
	return &authLimiter{limit: limit, window: window, now: time.Now,
		clients: make(map[netip.Prefix]*failures)}
}

// blocked reports whether addr has used up its failures in this window.
func (l *authLimiter) blocked(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.clients[clientaddr.Prefix(addr)]
	if f == nil {
		return false
	}
	if l.now().Sub(f.first) >= l.window {
		delete(l.clients, clientaddr.Prefix(addr))
		return false
	}
	return f.count >= l.limit
}

// fail records one failure for addr and reports whether addr is now
// blocked.
func (l *authLimiter) fail(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entry(addr)
	f.count++
	return f.count >= l.limit
}

// begin reserves a password check for addr: false when its failures so far
// and the checks under way reach the limit. The check at AUTH alone let
// any number of connections from one address past it at once, each
// failing only after its bcrypt: 40 parallel guesses where 5 were allowed.
// Each begin is followed by one end.
func (l *authLimiter) begin(addr netip.Addr) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entry(addr)
	if f.count+f.pending >= l.limit {
		return false
	}
	f.pending++
	return true
}

// end releases begin's reservation, counting a failure when failed, and
// reports whether addr is now blocked.
func (l *authLimiter) end(addr netip.Addr, failed bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.entry(addr)
	f.pending = max(0, f.pending-1)
	if failed {
		f.count++
	}
	return f.count >= l.limit
}

// entry is addr's record, made afresh when it has none or its window has
// passed (the attempts under way carried over). l.mu is held.
func (l *authLimiter) entry(addr netip.Addr) *failures {
	now := l.now()
	k := clientaddr.Prefix(addr)
	f := l.clients[k]
	if f == nil || now.Sub(f.first) >= l.window {
		if f == nil && len(l.clients) >= maxTrackedClients {
			l.sweep(now)
		}
		pending := 0
		if f != nil {
			pending = f.pending
		}
		f = &failures{first: now, pending: pending}
		l.clients[k] = f
	}
	return f
}

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
