package sender

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errClosed is returned by pool.get once the Sender is closed.
var errClosed = errors.New("sender: closed")

// pool keeps idle SMTP connections per destination host (MX host name, or
// the relay) and caps how many are open per host.
type pool struct {
	maxPerHost int // 0 = no cap
	idleFor    time.Duration

	mu     sync.Mutex
	hosts  map[string]*hostPool
	closed bool
}

type hostPool struct {
	idle []*client // most recently used last
	open int       // idle + busy + being dialled
	// changed is made by the first caller to wait for a connection or a
	// slot, and closed (and cleared) when one is given back, waking
	// everyone waiting; nil while nobody waits.
	changed chan struct{}
}

func newPool(maxPerHost int, idleFor time.Duration) *pool {
	return &pool{maxPerHost: maxPerHost, idleFor: idleFor, hosts: map[string]*hostPool{}}
}

func (p *pool) host(key string) *hostPool {
	hp := p.hosts[key]
	if hp == nil {
		hp = &hostPool{}
		p.hosts[key] = hp
	}
	return hp
}

func (hp *hostPool) signal() {
	if hp.changed != nil {
		close(hp.changed)
		hp.changed = nil
	}
}

// get returns an idle connection for key (most recently used first), or
// slot=true when the caller may dial a new one (and must then hand the
// slot back through put or release). It waits while the host is at its
// cap. Expired idle connections it meets are returned in stale for the
// caller to close outside the lock.
func (p *pool) get(ctx context.Context, key string) (c *client, slot bool, stale []*client, err error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, false, stale, errClosed
		}
		hp := p.host(key)
		for len(hp.idle) > 0 {
			c = hp.idle[len(hp.idle)-1]
			hp.idle = hp.idle[:len(hp.idle)-1]
			if time.Since(c.idleSince) < p.idleFor {
				p.mu.Unlock()
				return c, false, stale, nil
			}
			hp.open--
			stale = append(stale, c)
		}
		if p.maxPerHost == 0 || hp.open < p.maxPerHost {
			hp.open++
			p.mu.Unlock()
			return nil, true, stale, nil
		}
		if hp.changed == nil {
			hp.changed = make(chan struct{})
		}
		ch := hp.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, false, stale, context.Cause(ctx)
		}
	}
}

// release gives back a slot that did not become a connection.
func (p *pool) release(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hp := p.host(key)
	hp.open--
	hp.signal()
}

// put returns a connection after use. It keeps it idle when reuse is true
// and the pool is open, and otherwise reports that the caller must close
// it (outside any lock: a QUIT can take a while).
func (p *pool) put(c *client, reuse bool) (keep bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hp := p.host(c.key)
	defer hp.signal()
	if reuse && !p.closed {
		c.idleSince = time.Now()
		hp.idle = append(hp.idle, c)
		return true
	}
	hp.open--
	return false
}

// reap removes the idle connections older than the idle timeout and
// returns them for closing.
func (p *pool) reap(now time.Time) []*client {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*client
	for key, hp := range p.hosts {
		kept := hp.idle[:0]
		for _, c := range hp.idle {
			if now.Sub(c.idleSince) >= p.idleFor {
				out = append(out, c)
				hp.open--
			} else {
				kept = append(kept, c)
			}
		}
		clear(hp.idle[len(kept):])
		hp.idle = kept
		if len(out) > 0 {
			hp.signal()
		}
		if hp.open == 0 && len(hp.idle) == 0 {
			delete(p.hosts, key)
		}
	}
	return out
}

// closeAll marks the pool closed and returns every idle connection for
// closing. Busy connections are closed when they are put back.
func (p *pool) closeAll() []*client {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	var out []*client
	for _, hp := range p.hosts {
		out = append(out, hp.idle...)
		hp.open -= len(hp.idle)
		hp.idle = nil
		hp.signal()
	}
	return out
}
