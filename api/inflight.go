package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The bound on the memory of message requests in flight.
//
// A POST /v1/messages holds its request several times over while it is
// served: the JSON decoder's buffer, the decoded strings (a raw message, an
// attachment's base64), an attachment's decoded bytes, the message built
// from them, and the copies the store makes of it. Nothing else bounded how
// many of them run at once (the per-key rate counts requests, not bytes,
// and http.Server reads any number of bodies at a time): sixteen requests
// with a 17 MB attachment each once took 1.8 GB of heap. So each request
// is charged, before its body is read, its Content-Length times
// inflightFactor (plus inflightOverhead) against a process-wide budget
// (Config.MaxInflightBytes) and its tenant's share of it
// (Config.TenantInflightBytes); a request that finds no room waits up to
// Config.InflightWait for some, then is refused, unread and unstored: 503
// when the budget is full, 429 when its tenant holds its share. A body of
// unknown length (chunked) is charged as it is read, inflightStep at a
// time, and refused the same way when the next step finds no room.
const (
	// DefaultMaxInflightBytes is the process-wide budget: at
	// inflightFactor, some 38 requests with a 1 MiB attachment at once (19
	// of one tenant), or two of the largest messages (25 MiB, each charged
	// a tenant's share), and a live heap for them that stays within it
	// whatever the tenants send.
	DefaultMaxInflightBytes = 256 << 20
	// DefaultInflightWait is how long a request waits for room in the
	// budget before it is refused.
	DefaultInflightWait = 2 * time.Second

	// inflightFactor is how many times its request body a message
	// request holds at its peak, rounded up from what TestInflightFactor
	// measures (the collector run at GOGC 5, the heap sampled as it marks
	// it; docs/api.md, "Large messages"): an 8 MiB attachment 1.8 to 2.9
	// times its 11 MB request (objects not yet swept included, 2.3 to
	// 3.3), a 10 MB raw message 2.6 to 4.6 times (3.6 to 4.9), the most.
	// A raw message costs more: its JSON string has escapes (every line
	// end), which the decoder unquotes into a copy before it makes the
	// string, while its buffer holds the request (up to twice its size,
	// as it doubles). Before the copies taken out with the bound (the
	// decoder now reads the body itself; the Received line is written
	// into the buffer the message is made in; the buffers are sized once;
	// the request's strings are let go once the message is made) the same
	// requests took 3.1 to 4.1 (attachment) and 3.6 to 4.6 times (raw),
	// objects not yet swept 4.1 to 6.6 times, and allocated 12 to 13
	// times their size where they now allocate 8: the decoding of a raw
	// message, the most, is as it was.
	inflightFactor = 5
	// inflightOverhead is the fixed part of a request's charge: what a
	// small message request allocates whatever its size (its headers,
	// the MIME writer, the idempotency and store round trips).
	inflightOverhead = 64 << 10
	// inflightStep is how many body octets a request of unknown length
	// is charged for at a time.
	inflightStep = 1 << 20
)

// inflightLimit is a weighted semaphore over the bytes of message
// requests in flight, with a cap per tenant. A nil *inflightLimit bounds
// nothing.
type inflightLimit struct {
	total, share int64

	mu      sync.Mutex
	used    int64
	tenants map[string]int64 // charged bytes by tenant, only those with some
	// changed is closed, and replaced, whenever bytes are released: the
	// waiters look again.
	changed chan struct{}
	peak    int64 // the most bytes ever charged at once

	refusedFull, refusedShare atomic.Uint64 // requests refused, for the metrics
}

func newInflightLimit(total, share int64) *inflightLimit {
	if total <= 0 {
		return nil
	}
	share = min(max(share, 1), total)
	return &inflightLimit{total: total, share: share, tenants: map[string]int64{}, changed: make(chan struct{})}
}

// inflightFull is why a charge was refused: the budget was full, or the
// tenant held its share.
type inflightFull struct {
	tenant     string
	tenantFull bool
	limit      int64
	wait       time.Duration
}

func (e *inflightFull) Error() string {
	if e.tenantFull {
		return fmt.Sprintf("tenant %s holds its share (%d bytes) of the message requests in flight", e.tenant, e.limit)
	}
	return fmt.Sprintf("message requests in flight hold the whole budget (%d bytes)", e.limit)
}

// problem is the answer to a request refused for e: 429 for a tenant at
// its share, 503 for a full budget; never stored, so safe to send again.
func (e *inflightFull) problem() *Problem {
	var p *Problem
	if e.tenantFull {
		p = problem(http.StatusTooManyRequests, ProblemInflight, "too much in flight",
			fmt.Sprintf("tenant %s has its share of the message bytes this server holds at once (%d bytes): nothing was stored; send fewer large messages at once, or again after retry_after",
				e.tenant, e.limit))
	} else {
		p = problem(http.StatusServiceUnavailable, ProblemInflight, "server busy",
			fmt.Sprintf("the server holds as many message bytes at once as it may (%d bytes, --api-max-inflight-bytes): nothing was stored; send it again after retry_after",
				e.limit))
	}
	p.RetryAfter = max(1, int(math.Ceil(e.wait.Seconds())))
	return p
}

// cost is the charge for a request body of n octets, at most a tenant's
// share: a request larger than that runs alone for its tenant rather than
// never.
func (l *inflightLimit) cost(n int64) int64 {
	if n < 0 {
		n = 0
	}
	if n > (math.MaxInt64-inflightOverhead)/inflightFactor {
		return l.share
	}
	return min(l.share, inflightOverhead+n*inflightFactor)
}

// acquire charges n more bytes to tenant, waiting up to wait for room;
// n is at most l.share. It returns an *inflightFull when there was none,
// or the context's error.
func (l *inflightLimit) acquire(ctx context.Context, tenant string, n int64, wait time.Duration) error {
	var timer *time.Timer
	for {
		l.mu.Lock()
		tenantOK := l.tenants[tenant]+n <= l.share
		if tenantOK && l.used+n <= l.total {
			l.used += n
			l.tenants[tenant] += n
			l.peak = max(l.peak, l.used)
			l.mu.Unlock()
			return nil
		}
		changed := l.changed
		l.mu.Unlock()
		if timer == nil {
			if wait <= 0 {
				return l.full(tenant, !tenantOK, wait)
			}
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-changed:
		case <-timer.C:
			l.mu.Lock()
			tenantFull := l.tenants[tenant]+n > l.share
			l.mu.Unlock()
			return l.full(tenant, tenantFull, wait)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (l *inflightLimit) full(tenant string, tenantFull bool, wait time.Duration) *inflightFull {
	e := &inflightFull{tenant: tenant, tenantFull: tenantFull, limit: l.total, wait: wait}
	if tenantFull {
		e.limit = l.share
		l.refusedShare.Add(1)
	} else {
		l.refusedFull.Add(1)
	}
	return e
}

// Inflight reports the bytes the message requests in flight are charged
// now, and how many requests were refused so far for a full budget (503)
// and for a tenant at its share (429); zeros without a bound.
func (s *Server) Inflight() (bytes int64, refusedFull, refusedShare uint64) {
	l := s.inflight
	if l == nil {
		return 0, 0, 0
	}
	used, _ := l.inUse()
	return used, l.refusedFull.Load(), l.refusedShare.Load()
}

// release gives back n bytes of tenant's.
func (l *inflightLimit) release(tenant string, n int64) {
	if n <= 0 {
		return
	}
	l.mu.Lock()
	l.used -= n
	if left := l.tenants[tenant] - n; left > 0 {
		l.tenants[tenant] = left
	} else {
		delete(l.tenants, tenant)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// inUse returns the bytes charged now and the most ever charged at once.
func (l *inflightLimit) inUse() (used, peak int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used, l.peak
}

// inflightCharge is one request's hold on the budget, and the reader of
// its body that keeps the hold ahead of what is read.
type inflightCharge struct {
	l      *inflightLimit
	ctx    context.Context
	tenant string
	wait   time.Duration
	r      io.Reader
	held   int64 // bytes charged
	read   int64 // body octets read
	paid   int64 // body octets charged for
	// known: the body's length was known and paid for at the start;
	// nothing more is charged (http.Server ends a body at its
	// Content-Length). A body of unknown length is charged as it is read.
	known bool
}

// chargeBody charges a request of tenant with a body of length octets (-1:
// unknown, charged as it is read) and returns the charge, whose Read reads
// body. It returns a Problem when there is no room (the body unread), or
// when the request was canceled while it waited. Release the charge when
// the request is done with its body and all made from it.
func (s *Server) chargeBody(ctx context.Context, tenant string, length int64, body io.Reader) (*inflightCharge, *Problem) {
	c := &inflightCharge{l: s.inflight, ctx: ctx, tenant: tenant, wait: s.cfg.InflightWait, r: body}
	if c.l == nil || length < 0 {
		return c, nil
	}
	if err := c.grow(length); err != nil {
		return nil, inflightProblem(err)
	}
	// All of it, now: a request that held part of its charge while it
	// waited for the rest could wait on another doing the same.
	c.known = true
	return c, nil
}

// grow charges for a body of n octets, if that costs more than is held.
func (c *inflightCharge) grow(n int64) error {
	if c.l == nil {
		return nil
	}
	if want := c.l.cost(n); want > c.held {
		if err := c.l.acquire(c.ctx, c.tenant, want-c.held, c.wait); err != nil {
			return err
		}
		c.held = want
	}
	c.paid = max(c.paid, n)
	return nil
}

// Read reads the body, charging for it first when it is longer than what
// was paid for (a body of unknown length, inflightStep at a time).
func (c *inflightCharge) Read(p []byte) (int, error) {
	if c.l != nil {
		if c.known && c.read >= c.paid {
			return 0, io.EOF // as http.Server ends it
		}
		if c.read >= c.paid {
			if err := c.grow(c.read + inflightStep); err != nil {
				return 0, err
			}
		}
		if left := c.paid - c.read; int64(len(p)) > left {
			p = p[:left]
		}
	}
	n, err := c.r.Read(p)
	c.read += int64(n)
	return n, err
}

// release gives the charge back.
func (c *inflightCharge) release() {
	if c != nil && c.l != nil {
		c.l.release(c.tenant, c.held)
		c.held = 0
	}
}

// refusedInflight logs a message request refused for want of room:
// operators see the budget met (a 503) or a tenant at its share (a 429).
func (s *Server) refusedInflight(key *KeyInfo, length int64, p *Problem) {
	s.log.Warn().Str("tenant", key.Tenant).Str("key_id", key.ID).Int64("content_length", length).Int("status", p.Status).
		Str("detail", p.Detail).Msg("api message refused: too much in flight")
}

// inflightProblem is the answer to a charge refused with err.
func inflightProblem(err error) *Problem {
	var full *inflightFull
	if errors.As(err, &full) {
		return full.problem()
	}
	// The client went away while it waited: it reads no answer.
	p := problem(http.StatusServiceUnavailable, ProblemInflight, "server busy", "the request was canceled while it waited for room")
	p.RetryAfter = 1
	return p
}
