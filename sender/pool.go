package sender

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// errClosed is returned by pool.get once the Sender is closed.
var errClosed = errors.New("sender: closed")

// pool keeps idle SMTP connections per destination host (MX host name, or
// the relay) and caps how many are open per host, and how many are idle
// in all.
//
// The idle cap is for direct delivery to many domains: every MX host
// contacted keeps a socket for idleFor, so a relay reaching a few hundred
// new hosts a second would hold thousands of sockets that will mostly
// never carry a second message, each also taking one of its receiver's
// per-client connection slots. Past maxIdle the connection idle longest
// is closed, whichever its host: a busy host's connections are used again
// at once and are never the oldest.
type pool struct {
	maxPerHost int // 0 = no cap
	maxIdle    int // idle connections of all hosts; 0 = no cap
	idleFor    time.Duration

	mu     sync.Mutex
	hosts  map[string]*hostPool
	closed bool
	// order has the idle connections oldest first, by their idleSeq when
	// they were put; an entry whose connection was taken since (its
	// idleSeq changed, or it is no longer idle) is skipped and dropped
	// when met. idle counts the idle connections of all hosts.
	order []idleRef
	seq   uint64
	idle  int
	// dests are the keys each destination domain put connections back
	// on lately (put, client.dest), so that closeIdle can find that
	// domain's hosts: a key is an MX host (with a TLS mode and a source
	// address), and one host may serve many domains. An entry unused for
	// idleFor goes at the next reap, when every connection its domain put
	// back has expired; past maxDests the stale ones go at once, then any
	// (pruneDests).
	dests map[string]*destKeys
}

// destKeys are the pool keys a domain's connections were put back on,
// most recent last, and when last.
type destKeys struct {
	keys []string
	used time.Time
}

const (
	// maxDests bounds pool.dests: the domains sent to within an idle
	// timeout, a few hundred a second at most in direct delivery.
	maxDests = 10000
	// maxDestKeys bounds the keys kept per domain: its MX hosts, each
	// with a TLS mode and a source address, the most recent kept.
	maxDestKeys = 16
)

// idleRef is one put of an idle connection, in pool.order.
type idleRef struct {
	c   *client
	seq uint64
}

type hostPool struct {
	idle []*client // most recently used last
	open int       // idle + busy + being dialled
	// changed is made by the first caller to wait for a connection or a
	// slot, and closed (and cleared) when one is given back, waking
	// everyone waiting; nil while nobody waits.
	changed chan struct{}
}

func newPool(maxPerHost, maxIdle int, idleFor time.Duration) *pool {
	return &pool{maxPerHost: maxPerHost, maxIdle: maxIdle, idleFor: idleFor, hosts: map[string]*hostPool{}, dests: map[string]*destKeys{}}
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
			c.pooled = false
			p.idle--
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
// it (outside any lock: a QUIT can take a while). Keeping it may put the
// pool over maxIdle: the connection idle longest is then taken out and
// returned in evicted, for the caller to close the same way. A connection
// kept notes its host as one of c.dest's (noteDest), for closeIdle.
func (p *pool) put(c *client, reuse bool) (keep bool, evicted *client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	hp := p.host(c.key)
	defer hp.signal()
	if reuse && !p.closed {
		c.idleSince = time.Now()
		if c.dest != "" {
			p.noteDest(c.dest, c.key, c.idleSince)
		}
		p.seq++
		c.idleSeq, c.pooled = p.seq, true
		hp.idle = append(hp.idle, c)
		p.idle++
		p.order = append(p.order, idleRef{c, p.seq})
		if p.maxIdle > 0 && p.idle > p.maxIdle {
			evicted = p.evictOldest()
		}
		p.compactOrder()
		return true, evicted
	}
	hp.open--
	return false, nil
}

// evictOldest takes the connection idle longest out of the pool and
// returns it, or nil when none is idle.
func (p *pool) evictOldest() *client {
	for len(p.order) > 0 {
		ref := p.order[0]
		p.order[0] = idleRef{}
		p.order = p.order[1:]
		c := ref.c
		if !c.pooled || c.idleSeq != ref.seq {
			continue // taken since, or put again later (a newer entry)
		}
		hp := p.hosts[c.key]
		if i := slices.Index(hp.idle, c); i >= 0 {
			hp.idle = slices.Delete(hp.idle, i, i+1)
		}
		c.pooled = false
		p.idle--
		hp.open--
		hp.signal()
		return c
	}
	return nil
}

// noteDest records that a connection of dest's was put back on key at
// now. p.mu held.
func (p *pool) noteDest(dest, key string, now time.Time) {
	dk := p.dests[dest]
	if dk == nil {
		if len(p.dests) >= maxDests {
			p.pruneDests(now)
		}
		dk = &destKeys{}
		p.dests[dest] = dk
	}
	dk.used = now
	if slices.Contains(dk.keys, key) {
		return
	}
	if len(dk.keys) == maxDestKeys {
		dk.keys = slices.Delete(dk.keys, 0, 1)
	}
	dk.keys = append(dk.keys, key)
}

// pruneDests forgets the domains unused for idleFor and, when that leaves
// maxDests or more, any others down to three quarters of it: a domain
// forgotten early only has its idle connections wait for their timeout
// again, as they did before closeIdle. p.mu held.
func (p *pool) pruneDests(now time.Time) {
	for d, dk := range p.dests {
		if now.Sub(dk.used) >= p.idleFor {
			delete(p.dests, d)
		}
	}
	if len(p.dests) < maxDests {
		return
	}
	for d := range p.dests {
		if len(p.dests) <= maxDests*3/4 {
			break
		}
		delete(p.dests, d)
	}
}

// closeIdle takes out of the pool every idle connection to the hosts dest
// used lately (noteDest), whichever domain each last carried, and returns
// them for the caller to close outside the lock. Busy connections are
// left alone.
func (p *pool) closeIdle(dest string) []*client {
	p.mu.Lock()
	defer p.mu.Unlock()
	dk := p.dests[dest]
	if p.closed || dk == nil {
		return nil
	}
	var out []*client
	for _, key := range dk.keys {
		hp := p.hosts[key]
		if hp == nil || len(hp.idle) == 0 {
			continue
		}
		for _, c := range hp.idle {
			c.pooled = false
		}
		out = append(out, hp.idle...)
		p.idle -= len(hp.idle)
		hp.open -= len(hp.idle)
		clear(hp.idle)
		hp.idle = hp.idle[:0]
		hp.signal()
	}
	p.compactOrder()
	return out
}

// compactOrder drops the stale entries of order once they outnumber the
// idle connections, so that it stays in proportion to them.
func (p *pool) compactOrder() {
	if len(p.order) < 2*p.idle+64 {
		return
	}
	kept := p.order[:0]
	for _, ref := range p.order {
		if ref.c.pooled && ref.c.idleSeq == ref.seq {
			kept = append(kept, ref)
		}
	}
	clear(p.order[len(kept):]) // no connection kept reachable from the tail
	p.order = kept
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
				c.pooled = false
				p.idle--
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
	p.compactOrder()
	for d, dk := range p.dests {
		if now.Sub(dk.used) >= p.idleFor {
			delete(p.dests, d)
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
		for _, c := range hp.idle {
			c.pooled = false
		}
		out = append(out, hp.idle...)
		hp.open -= len(hp.idle)
		hp.idle = nil
		hp.signal()
	}
	p.order, p.idle = nil, 0
	return out
}
