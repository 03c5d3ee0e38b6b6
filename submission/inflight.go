package submission

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/membudget"
)

// The bound on the memory of the message bodies being received.
//
// A body is held whole while it is read, checked and stored: in the
// chunks it is read into (body.go), and at its end also in the frame they
// are copied into, which the queue then publishes while nats.go and the
// embedded server take copies of their own. Nothing else bounded how
// many bodies are held at once (MaxConnections counts connections, not
// bytes): 20 connections part-way through 23 MiB bodies held 457 MiB of
// heap, and one tenant's 250 connections (MaxClientConnections) could
// have held some 6 GB and had the daemon killed for want of memory. So
// each transaction is charged bodyFactor times the body octets it holds,
// against a process-wide budget (Config.MaxInflightBytes) and its
// tenant's share of it (Config.TenantInflightBytes), a membudget.Budget:
// one read chunk (bodyChunk, 32 KiB) at a time, before the chunk is
// taken, so that what a transaction is charged is what its chunks hold,
// never more than one chunk ahead of what its client sent. A transaction
// that has sent nothing of its body holds nothing but its first chunk.
//
// The size a client declares with SIZE (RFC 1870) is not charged: it
// costs nothing to declare, and charged at MAIL FROM it let two accounts
// that declared 25 MiB on three sessions each and sent nothing hold the
// whole budget for as long as they cared to send NOOPs, every other
// tenant's mail refused meanwhile. It is looked at: a MAIL FROM whose
// declared body could not be charged now waits up to Config.InflightWait
// for room, and then is refused with 452 4.3.1, before any of the body is
// sent (RFC 1870 section 6.1; Postfix, too, only checks its free space at
// MAIL and reserves none of it). With room, the body is still charged as
// it arrives, and may find none later.
//
// A body whose next chunk finds no room after InflightWait (each chunk
// waits afresh) is refused with 452 4.3.1 (RFC 5321 section 4.3.2 lists
// 452 after the data; RFC 3463 X.3.1, mail system full), and nothing of
// it is queued. What it held goes back at once, and the rest of it is
// read into one chunk and dropped: SMTP has no reply to a DATA body
// before its end-of-data line (RFC 5321 section 4.1.1.4), so a 421
// written in the middle of the body is not read by a client still writing
// it; the client sees its connection cut, which some client libraries
// report as an error their applications give up on, where a 4xx reply to
// the transaction is a plain "keep the message and send it again later"
// (RFC 5321 section 4.2.5), and its connection stays usable for its other
// messages. Reading the rest costs its transfer (at most MaxMessageBytes,
// within DataTimeout) and no memory. BDAT chunks are drained the same
// way, as for the body's other faults: a reply to the chunk at hand would
// be allowed (RFC 3030 section 2), but go-smtp then discards the rest of
// the chunk itself, outside the body's read timeouts.
//
// The charge is given back at the end of Data, whatever the end: the body
// stored or refused, the client gone or timed out in the middle of it,
// a BDAT transfer reset, a panic. Waiting transactions hold what they
// had: when the bodies part-way through hold the whole budget, each waits
// for its next chunk until the first gives up, and its charge lets the
// others go on.
const (
	// DefaultMaxInflightBytes is the process-wide budget: at bodyFactor,
	// some 4,000 messages under 32 KiB at once (more than
	// DefaultMaxConnections can send), some 128 of 1 MiB, or five of
	// the largest (DefaultMaxMessageBytes, 25 MiB), two of one tenant.
	DefaultMaxInflightBytes = 256 << 20
	// DefaultInflightWait is how long a chunk of a body (or a MAIL FROM
	// with SIZE) waits for room in the budget before it is refused: the
	// HTTP API's wait. A client waits minutes for a block of its body to
	// be taken (RFC 5321 section 4.5.3.2.5), so a pause of seconds costs
	// it nothing, and a message ahead of it can be stored meanwhile.
	DefaultInflightWait = 2 * time.Second

	// bodyFactor is how many times its octets a body is charged: the
	// chunks it is read into and the frame they are copied into at its
	// end are both held at that moment (readBody), and while the queue
	// stores the frame nats.go and the server take copies of their own.
	// Charged as the chunks are taken, not when the frame is: a body that
	// has arrived whole cannot then be refused for room for its copy.
	bodyFactor = 2
)

// reasonInsufficientStorage: a transaction refused for want of room under
// Config.MaxInflightBytes (the rejections' reason label).
const reasonInsufficientStorage = "insufficient_storage"

// The inflight_refused_total reason labels, as the HTTP API's.
const (
	inflightBudget      = "budget"
	inflightTenantShare = "tenant-share"
)

// bodyCharge is one body's hold on the budget, owned by Data's goroutine
// (it lives in Data's frame: charging a message allocates nothing). A nil
// *bodyCharge, or a zero one (no budget), charges nothing.
type bodyCharge struct {
	b      *membudget.Budget
	tenant string
	wait   time.Duration
	held   int64 // bytes charged
	// room is the body octets held covers; math.MaxInt64 once held is the
	// tenant's whole share.
	room int64
}

// emptyCharge is an empty charge to tenant on the server's budget.
func (s *Server) emptyCharge(tenant string) bodyCharge {
	return bodyCharge{b: s.inflight, tenant: tenant, wait: s.cfg.InflightWait}
}

// inflightCost is what a body of n octets is charged on b: bodyFactor
// times n, and a tenant's whole share when that is more (math.MaxInt64
// for room then), so that a body larger than that runs alone for its
// tenant rather than never (a budget set below twice MaxMessageBytes).
func inflightCost(b *membudget.Budget, n int64) (charge, room int64) {
	if share := b.Share(); n > share/bodyFactor {
		return share, math.MaxInt64
	}
	return n * bodyFactor, n
}

// cover makes the charge cover a body of n octets, the chunks it holds
// (readBody asks for one more chunk at a time), waiting up to the
// configured time for room. It returns a *membudget.Full when there was
// none, or ctx's error.
func (c *bodyCharge) cover(ctx context.Context, n int64) error {
	if c == nil || c.b == nil || n <= c.room {
		return nil
	}
	want, room := inflightCost(c.b, n)
	if want > c.held {
		if err := c.b.Acquire(ctx, c.tenant, want-c.held, c.wait); err != nil {
			return err
		}
		c.held = want
	}
	c.room = room
	return nil
}

// release gives the charge back; the charge is empty after it.
func (c *bodyCharge) release() {
	if c != nil && c.held > 0 {
		c.b.Release(c.tenant, c.held)
		c.held, c.room = 0, 0
	}
}

// checkSize looks at the size a client declared at MAIL FROM (SIZE=, RFC
// 1870), at most MaxMessageBytes (go-smtp refuses more with 552): it
// returns nil when a body of that size could be charged now, or after
// waiting up to InflightWait for room, and the reply that refuses the
// MAIL otherwise. It charges nothing: the body is charged as it arrives.
func (s *session) checkSize(tenant string, size int64) error {
	if s.srv.inflight == nil || size <= 0 {
		return nil
	}
	want, _ := inflightCost(s.srv.inflight, size)
	if err := s.srv.inflight.Wait(s.srv.baseCtx, tenant, want, s.srv.cfg.InflightWait); err != nil {
		reply, reason := s.refuseInflight(err, tenant, size, 0)
		return s.reject(reply, reason, true, s.tenantField(tenant))
	}
	return nil
}

// refuseInflight counts and logs a transaction refused for want of room
// (err from cover or checkSize), of tenant, declaring size (0: none) and
// with read body octets stored, and returns its reply and reason label.
func (s *session) refuseInflight(err error, tenant string, size int64, read int) (*smtp.SMTPError, string) {
	var full *membudget.Full
	if !errors.As(err, &full) {
		// baseCtx ended: a Shutdown ran out of time and closes every
		// connection.
		return errShuttingDown, reasonShuttingDown
	}
	label := inflightBudget
	if full.TenantFull {
		label = inflightTenantShare
	}
	s.srv.metrics.inflightRefused.WithLabelValues(label).Inc()
	e := s.logLine(s.srv.log.Warn())
	if e != nil {
		e.Func(s.tenantField(tenant)).Str("reason", label).Int64("limit", full.Limit).Dur("waited", full.Wait).
			Int64("declared_size", size).Int("read", read).Msg("submission refused: too much in flight")
	}
	return inflightReply(full), reasonInsufficientStorage
}

// inflightReply is the refusal of a transaction for want of room: 452
// 4.3.1, "insufficient system storage" (RFC 5321 section 4.2.3, RFC 3463
// X.3.1, RFC 1870 section 6.1), transient, the message not queued.
func inflightReply(f *membudget.Full) *smtp.SMTPError {
	msg := "Insufficient system storage: the server holds as many messages in transfer as its memory allows; nothing was queued, try again later"
	if f.TenantFull {
		msg = fmt.Sprintf("Insufficient system storage: this account's messages in transfer hold their share of the server's memory (%d bytes); nothing was queued, send fewer large messages at once or try again later",
			f.Limit)
	}
	return &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 3, 1}, Message: msg}
}

// Inflight reports the bytes the transactions in flight are charged now
// against Config.MaxInflightBytes, and how many transactions were refused
// so far for a full budget and for a tenant at its share; zeros without a
// bound.
func (s *Server) Inflight() (bytes int64, refusedFull, refusedShare uint64) {
	used, _ := s.inflight.InUse()
	full, share := s.inflight.Refused()
	return used, full, share
}
