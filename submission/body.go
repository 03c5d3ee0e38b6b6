package submission

import (
	"bytes"
	"errors"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
)

// bodyChunk is the read size for message bodies.
const bodyChunk = 32 << 10

// bodyBuf is a message's scratch space while its body is read: the read
// chunks and the Received header.
type bodyBuf struct {
	read []byte    // the first bodyChunk octets of the body
	more []*[]byte // further chunks, from bodyChunks, for a larger body
	hdr  []byte
}

// bodyBufs recycles bodyBufs: a read buffer per message was a tenth of the
// daemon's allocations in the end-to-end benchmark. The body never aliases
// a bodyBuf (it is copied).
var bodyBufs = sync.Pool{New: func() any { return &bodyBuf{read: make([]byte, bodyChunk)} }}

// bodyChunks recycles the chunks of bodies over bodyChunk octets.
var bodyChunks = sync.Pool{New: func() any { b := make([]byte, bodyChunk); return &b }}

// putBodyBuf returns bb and its extra chunks to their pools.
func putBodyBuf(bb *bodyBuf) {
	for i, c := range bb.more {
		bodyChunks.Put(c)
		bb.more[i] = nil
	}
	bb.more = bb.more[:0]
	bodyBufs.Put(bb)
}

// frameClasses are the capacities of the frames readBody reads bodies
// into, each class with a pool: after a successful Enqueue nothing holds
// a frame (the Enqueuer contract), so the session gives it back for a
// later message, and a body is not allocated (and zeroed) anew each time.
// A frame over the largest class is left to the collector.
var frameClasses = [...]int{4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10}

var framePools [len(frameClasses)]sync.Pool

// getFrame returns a frame of n octets, from the pool of the smallest
// class that holds n when it has one. Its octets are not zeroed: readBody
// writes all of the body, and the queue writes the envelope into the end
// of the free octets in front of it and uses nothing before that.
func getFrame(n int) []byte {
	for i, c := range frameClasses {
		if n <= c {
			if p, ok := framePools[i].Get().(*[]byte); ok {
				return (*p)[:n]
			}
			return make([]byte, n, c)
		}
	}
	return make([]byte, n)
}

// recycleFrame is putFrame; a test replaces it to see which frames come back.
var recycleFrame = putFrame

// putFrame gives a frame back to its class's pool. Only a frame nothing
// refers to any more may be given back.
func putFrame(b []byte) {
	for i, c := range frameClasses {
		if cap(b) == c {
			framePools[i].Put(&b)
			return
		}
	}
}

// readBody reads the whole body from r (dotReader or go-smtp's reader for
// DATA, a pipe for BDAT) and validates it, and returns it after a copy of
// prefix, in a slice of its own allocated once at its size: the body is
// read into bb's chunks (the first is bb.read, further ones come from a
// pool) and copied out at the end, so a large body is not regrown and
// copied as it arrives. The slice is the tail of frame, whose first
// headroom octets are left free for the envelope (queue.Submission.Frame).
// It always reads to the end of the body, even after finding a fault, so
// the connection stays in step and the client gets its reply; only a
// timeout, a read error or go-smtp's size limit stop it early. On a fault
// it returns the reason label and the reply.
//
// ch is charged for each chunk before it is taken (inflight.go); a body
// that finds no room is refused as for a fault. From a fault on, nothing
// more is stored, and nothing is kept of what was: the extra chunks and
// the charge go back at once, and the rest of the body passes through the
// first chunk.
func (s *session) readBody(r io.Reader, bb *bodyBuf, ch *bodyCharge, prefix []byte, headroom int, start time.Time) (frame, body []byte, reason string, rerr *smtp.SMTPError) {
	// For DATA the session owns the socket's read deadline: go-smtp set it
	// once, at the DATA command, which would make the whole body fit into
	// one ReadTimeout. Each read gets ReadTimeout instead, and the body as a
	// whole DataTimeout. For BDAT go-smtp reads the socket itself, one
	// command and chunk at a time, and set the deadline once per command,
	// so a chunk had to arrive whole within one ReadTimeout: the
	// connection arms each read of the socket for it too.
	_, chunked := r.(*io.PipeReader)
	hard := start.Add(s.srv.cfg.DataTimeout)
	nc := s.conn.Conn()
	if s.tc != nil {
		// A Read below may wait for many reads of the socket (it returns
		// when its buffer is full): the connection arms each of those.
		s.tc.dataTimeouts(s.srv.cfg.ReadTimeout, hard)
	}

	v := bodyValidator{maxLine: s.srv.cfg.MaxLineLength, lineTooLong: s.srv.errLineTooLong}
	cur, filled, total := bb.read, 0, 0 // the chunk being filled; octets stored
	if err := ch.cover(s.srv.baseCtx, bodyChunk); err != nil {
		v.fail(s.refuseInflight(err, s.tenant(), 0, 0))
	}
	dropped := false // what the body held is given back
	for {
		if v.err != nil && !dropped {
			dropped = true
			ch.release()
			for i, c := range bb.more {
				bodyChunks.Put(c)
				bb.more[i] = nil
			}
			bb.more = bb.more[:0]
			cur, filled = bb.read, 0
		}
		if !chunked {
			_ = nc.SetReadDeadline(minTime(time.Now().Add(s.srv.cfg.ReadTimeout), hard))
		}
		n, err := r.Read(cur[filled:])
		if n > 0 && v.err == nil {
			v.scan(cur[filled : filled+n])
		}
		if v.err == nil {
			filled += n
			total += n
			if filled == len(cur) {
				if err := ch.cover(s.srv.baseCtx, int64(total+bodyChunk)); err != nil {
					v.fail(s.refuseInflight(err, s.tenant(), 0, total))
				} else {
					c := bodyChunks.Get().(*[]byte)
					bb.more = append(bb.more, c)
					cur, filled = *c, 0
				}
			}
		} // else keep draining into the same octets, storing nothing
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			break
		}
		var ne net.Error
		switch {
		case errors.Is(err, smtp.ErrDataTooLarge):
			// go-smtp stops handing us data and drains the rest itself,
			// under the deadline set here: give it what is left of
			// DataTimeout. If even that runs out, the read timeout closes
			// the connection (trackedConn.idleTimeout) rather than let the
			// rest of the body be read as commands.
			if !chunked {
				_ = nc.SetReadDeadline(hard)
			}
			return nil, nil, reasonTooBig, smtp.ErrDataTooLarge
		case errors.Is(err, smtp.ErrTooLongLine):
			// Past go-smtp's hard limit (twice MaxLineLength): it closes
			// the connection after this reply.
			return nil, nil, reasonLineTooLong, s.srv.errLineTooLong
		case errors.Is(err, errDataTimeout) || errors.As(err, &ne) && ne.Timeout():
			if s.tc != nil {
				s.tc.hangup("")
			}
			return nil, nil, reasonTimeout, errDataTimeout
		default:
			return nil, nil, reasonAborted, errDataAborted
		}
	}
	v.finish()
	if v.err != nil {
		return nil, nil, v.reason, v.err
	}
	frame = getFrame(headroom + len(prefix) + total)
	body = frame[headroom:]
	at := copy(body, prefix)
	at += copy(body[at:], bb.read)
	for _, c := range bb.more {
		at += copy(body[at:], *c)
	}
	return frame, body, "", nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// bodyValidator checks a body as it streams past, across read boundaries.
// The first fault wins.
type bodyValidator struct {
	maxLine     int // octets including CRLF
	lineTooLong *smtp.SMTPError

	lineLen int  // octets of the current line so far
	prevCR  bool // the previous octet was CR

	err    *smtp.SMTPError
	reason string
}

func (v *bodyValidator) fail(e *smtp.SMTPError, reason string) {
	v.err, v.reason = e, reason
}

// scan checks p, the next bytes of the body. It goes a line at a time:
// a line that is plainly clean (no NUL, CR only right before its LF, short
// enough) is passed over with a few vectorised byte searches; anything else
// goes through scanBytes, which finds the first fault octet by octet: an
// octet loop over every body would cost the daemon a noticeable share of
// its CPU on large bodies (docs/benchmarks.md, BenchmarkBodyValidator).
func (v *bodyValidator) scan(p []byte) {
	if v.err == nil && v.cleanChunk(p) {
		return
	}
	for len(p) > 0 && v.err == nil {
		seg := p
		lf := bytes.IndexByte(p, '\n')
		if lf >= 0 {
			seg = p[:lf+1]
		}
		if v.clean(seg, lf >= 0) {
			if lf >= 0 {
				v.lineLen, v.prevCR = 0, false
			} else {
				v.lineLen += len(seg)
				v.prevCR = seg[len(seg)-1] == '\r'
			}
		} else {
			v.scanBytes(seg)
		}
		p = p[len(seg):]
	}
}

// crOctet is what cleanChunk counts.
var crOctet = []byte{'\r'}

// cleanChunk is scan's fast path for a read with no fault in it, the
// common case: one byte search per line (for its LF), where the line-at-
// a-time path makes three, and two over the whole read (for a NUL, and a
// count of its CRs). Every LF must follow a CR (the one carried over from
// the previous read included) and every line fit maxLine; then a CR that
// precedes no LF can only be the read's last octet, carried over to the
// next, and if the count finds no others, no CR is bare. It moves v past
// p, as scanBytes would, and reports true only then; otherwise v is
// unchanged, and the line-at-a-time path finds the fault.
func (v *bodyValidator) cleanChunk(p []byte) bool {
	if len(p) == 0 || bytes.IndexByte(p, 0) >= 0 || (v.prevCR && p[0] != '\n') {
		return false
	}
	lineLen, lfs, rest := v.lineLen, 0, p
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		if lineLen+i+1 > v.maxLine {
			return false
		}
		if i > 0 && rest[i-1] != '\r' || i == 0 && (lfs > 0 || !v.prevCR) {
			return false // a bare LF
		}
		lfs++
		lineLen, rest = 0, rest[i+1:]
	}
	if lineLen += len(rest); lineLen > v.maxLine {
		return false
	}
	crs := lfs // one before each LF, but the first's when it was carried over
	if v.prevCR {
		crs--
	}
	last := p[len(p)-1] == '\r'
	if last {
		crs++
	}
	if bytes.Count(p, crOctet) != crs {
		return false // a bare CR
	}
	v.lineLen, v.prevCR = lineLen, last
	return true
}

// clean reports whether seg (a whole rest-of-line ending in LF when endsLF,
// else a line's continuation without one) holds none of scanBytes' faults,
// so that skipping it leaves the validator where scanBytes would.
func (v *bodyValidator) clean(seg []byte, endsLF bool) bool {
	if v.lineLen+len(seg) > v.maxLine || bytes.IndexByte(seg, 0) >= 0 {
		return false
	}
	text := seg
	if endsLF {
		text = seg[:len(seg)-1]
		if len(text) == 0 {
			return v.prevCR // the LF completes a CRLF split across reads
		}
		if text[len(text)-1] != '\r' {
			return false // bare LF
		}
	}
	// A CR carried over must be followed by LF, which seg does not start
	// with here; a CR inside text is bare. A CR that ends a segment
	// without LF is carried over to the next.
	return !v.prevCR && bytes.IndexByte(text[:len(text)-1], '\r') < 0
}

// scanBytes checks p octet by octet; scan's fallback for a line with a
// fault in it, and the definition of what scan accepts.
func (v *bodyValidator) scanBytes(p []byte) {
	for _, c := range p {
		v.lineLen++
		switch {
		case c == 0:
			v.fail(errNUL, reasonNUL)
		case v.prevCR && c != '\n':
			// RFC 5321 section 2.3.8: CR only as part of CRLF.
			v.fail(errBareCR, reasonBareCR)
		case c == '\n' && !v.prevCR:
			// RFC 5321 section 2.3.8: LF only as part of CRLF. Rejected,
			// not repaired: repairing would change what the client signed
			// (DKIM) and hide a broken client.
			v.fail(errBareLF, reasonBareLF)
		case v.lineLen > v.maxLine:
			// RFC 5321 section 4.5.3.1.6. The count is of the unstuffed
			// line, as the RFC says (the transparency dot is not counted).
			v.fail(v.lineTooLong, reasonLineTooLong)
		}
		if v.err != nil {
			return
		}
		if c == '\n' {
			v.lineLen = 0
		}
		v.prevCR = c == '\r'
	}
}

// CheckBody checks a whole message as the listener checks a body it
// receives: no NUL, CR and LF only as CRLF, no line longer than maxLine
// octets including its CRLF (0: DefaultMaxLineLength). The error, if
// any, is the SMTP reply the listener would give, for the paths into the
// queue that have no SMTP session of their own (outflow submit), so that
// what they queue is what an SMTP client could have: mail a receiver will
// refuse is refused before it is accepted, not bounced after.
func CheckBody(body []byte, maxLine int) error {
	if maxLine <= 0 {
		maxLine = DefaultMaxLineLength
	}
	v := bodyValidator{maxLine: maxLine, lineTooLong: lineTooLongError(maxLine)}
	v.scan(body)
	v.finish()
	if v.err != nil {
		return v.err
	}
	return nil
}

// finish checks the end of the body: a trailing CR is a bare CR.
func (v *bodyValidator) finish() {
	if v.err == nil && v.prevCR {
		v.fail(errBareCR, reasonBareCR)
	}
}

// appendReceived appends the trace line of RFC 5321 section 4.4 to dst:
//
//	Received: from <helo> (<address-literal>)
//		by <hostname> (outflow) with <protocol>;
//		<date-time>
//
// with the protocol names of RFC 3848 for a client that said EHLO (esmtp):
// ESMTP, plus S for STARTTLS, plus A for AUTH; and SMTP for one that said
// HELO (RFC 5321 section 4.4 and the IANA mail transmission types, which
// have no SMTP with S or A: TLS and AUTH are service extensions, which a
// HELO client does not negotiate). The "for" clause is left out: it
// would disclose the other recipients of the message. The client's HELO
// name is untrusted input and is reduced to safe characters.
func appendReceived(dst []byte, helo string, remote netip.Addr, hostname string, esmtp, isTLS, auth bool, t time.Time) []byte {
	dst = append(dst, "Received: from "...)
	dst = appendTraceToken(dst, helo)
	dst = append(dst, " ("...)
	switch {
	case !remote.IsValid():
		dst = append(dst, "unknown"...)
	case remote.Is4():
		// RFC 5321 section 4.1.3 address literals.
		dst = append(dst, '[')
		dst = remote.AppendTo(dst)
		dst = append(dst, ']')
	default:
		dst = append(dst, "[IPv6:"...)
		dst = remote.AppendTo(dst)
		dst = append(dst, ']')
	}
	dst = append(dst, ")\r\n\tby "...)
	dst = appendTraceToken(dst, hostname)
	if !esmtp {
		dst = append(dst, " (outflow) with SMTP"...)
	} else {
		dst = append(dst, " (outflow) with ESMTP"...)
		if isTLS {
			dst = append(dst, 'S')
		}
		if auth {
			dst = append(dst, 'A')
		}
	}
	dst = append(dst, ";\r\n\t"...)
	// RFC 5322 section 3.3 date-time.
	dst = t.AppendFormat(dst, time.RFC1123Z)
	return append(dst, "\r\n"...)
}

// maxTraceToken bounds a name in the Received header (a domain is at most
// 255 octets, RFC 5321 section 4.5.3.1.2).
const maxTraceToken = 255

// appendTraceToken appends s kept to letters, digits and ".-:[]_",
// replacing anything else with "_", so a hostile HELO cannot add header
// lines or comments; "unknown" if s is empty.
func appendTraceToken(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "unknown"...)
	}
	if len(s) > maxTraceToken {
		s = s[:maxTraceToken]
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
			dst = append(dst, c)
		case strings.IndexByte(".-:[]_", c) >= 0:
			dst = append(dst, c)
		default:
			dst = append(dst, '_')
		}
	}
	return dst
}
