package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/outflow/outflow/internal/membudget"
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
// is charged, against a process-wide budget (Config.MaxInflightBytes) and
// its tenant's share of it (Config.TenantInflightBytes), a
// membudget.Budget (the SMTP listener's bodies have one of their own),
// inflightOverhead plus inflightFactor times the body octets it has read,
// as it reads them: each read of the body that brings octets is charged
// for them, and the charge is kept until the answer is written.
//
// The Content-Length is not charged: it costs nothing to declare, and
// charged before the body was read it let two connections that declared
// 40 MB and sent 25 octets hold the whole budget for as long as the
// server's read timeout, every other tenant's message refused meanwhile.
// It is looked at: a request whose declared body could not be charged now
// waits up to Config.InflightWait for room and is then refused, unread (a
// client that sent Expect: 100-continue has sent none of it). With room,
// it is still charged as it is read, and may find none later.
//
// A read whose charge finds no room after InflightWait (each read waits
// afresh) ends the body: the request is refused, nothing stored, 503 when
// the budget is full, 429 when its tenant holds its share, with
// Retry-After. Requests part-way through their bodies that hold the whole
// budget each wait until the first gives up; what it held lets the others
// go on.
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
	// inflightOverhead is the fixed part of a request's charge, taken
	// with its first octets: what a small message request allocates
	// whatever its size (its headers, the MIME writer, the idempotency
	// and store round trips).
	inflightOverhead = 64 << 10
)

// fullProblem is the answer to a request refused for e: 429 for a tenant
// at its share, 503 for a full budget; never stored, so safe to send
// again.
func fullProblem(e *membudget.Full) *Problem {
	var p *Problem
	if e.TenantFull {
		p = problem(http.StatusTooManyRequests, ProblemInflight, "too much in flight",
			fmt.Sprintf("tenant %s has its share of the message bytes this server holds at once (%d bytes): nothing was stored; send fewer large messages at once, or again after retry_after",
				e.Tenant, e.Limit))
	} else {
		p = problem(http.StatusServiceUnavailable, ProblemInflight, "server busy",
			fmt.Sprintf("the server holds as many message bytes at once as it may (%d bytes, --api-max-inflight-bytes): nothing was stored; send it again after retry_after",
				e.Limit))
	}
	p.RetryAfter = max(1, int(math.Ceil(e.Wait.Seconds())))
	return p
}

// inflightCost is the charge on l for a request body of n octets, at
// most a tenant's share: a request larger than that runs alone for its
// tenant rather than never.
func inflightCost(l *membudget.Budget, n int64) int64 {
	if n < 0 {
		n = 0
	}
	if n > (math.MaxInt64-inflightOverhead)/inflightFactor {
		return l.Share()
	}
	return min(l.Share(), inflightOverhead+n*inflightFactor)
}

// Inflight reports the bytes the message requests in flight are charged
// now, and how many requests were refused so far for a full budget (503)
// and for a tenant at its share (429); zeros without a bound.
func (s *Server) Inflight() (bytes int64, refusedFull, refusedShare uint64) {
	used, _ := s.inflight.InUse()
	full, share := s.inflight.Refused()
	return used, full, share
}

// inflightCharge is one request's hold on the budget, and the reader of
// its body that charges for what it reads.
type inflightCharge struct {
	l      *membudget.Budget
	ctx    context.Context
	tenant string
	wait   time.Duration
	r      io.Reader
	held   int64 // bytes charged
	read   int64 // body octets read
}

// chargeBody starts the charge of a request of tenant with a body of
// length octets (-1: unknown) and returns it, its Read reading body. When
// the length is known, it first waits, up to InflightWait, until a body of
// that length could be charged, charging nothing: it returns a Problem
// when there was no room (the body unread), or when the request was
// canceled while it waited. Release the charge when the request is done
// with its body and all made from it.
func (s *Server) chargeBody(ctx context.Context, tenant string, length int64, body io.Reader) (*inflightCharge, *Problem) {
	c := &inflightCharge{l: s.inflight, ctx: ctx, tenant: tenant, wait: s.cfg.InflightWait, r: body}
	if c.l == nil || length < 0 {
		return c, nil
	}
	if err := c.l.Wait(ctx, tenant, inflightCost(c.l, length), c.wait); err != nil {
		return nil, inflightProblem(err)
	}
	return c, nil
}

// Read reads the body and charges for what it read: a read that finds no
// room for it returns the *membudget.Full (or the request's context
// error), and none of the octets.
func (c *inflightCharge) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 && c.l != nil {
		c.read += int64(n)
		if want := inflightCost(c.l, c.read); want > c.held {
			if aerr := c.l.Acquire(c.ctx, c.tenant, want-c.held, c.wait); aerr != nil {
				return 0, aerr
			}
			c.held = want
		}
	}
	return n, err
}

// release gives the charge back.
func (c *inflightCharge) release() {
	if c != nil && c.l != nil {
		c.l.Release(c.tenant, c.held)
		c.held = 0
	}
}

// refusedInflight logs a message request refused for want of room:
// operators see the budget met (a 503) or a tenant at its share (a 429).
// read is how many body octets it had read (0: refused unread).
func (s *Server) refusedInflight(key *KeyInfo, length, read int64, p *Problem) {
	s.log.Warn().Str("tenant", key.Tenant).Str("key_id", key.ID).Int64("content_length", length).Int64("read", read).Int("status", p.Status).
		Str("detail", p.Detail).Msg("api message refused: too much in flight")
}

// inflightProblem is the answer to a charge refused with err.
func inflightProblem(err error) *Problem {
	var full *membudget.Full
	if errors.As(err, &full) {
		return fullProblem(full)
	}
	// The client went away while it waited: it reads no answer.
	p := problem(http.StatusServiceUnavailable, ProblemInflight, "server busy", "the request was canceled while it waited for room")
	p.RetryAfter = 1
	return p
}
