package sender

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/ascii"
)

// defaultBatch is the number of recipients per transaction when the server
// states no RCPTMAX: RFC 5321 4.5.3.1.8 obliges every server to take 100.
const defaultBatch = 100

// msgInfo is what Send works out once about a message.
type msgInfo struct {
	wire      []byte // dot-stuffed body ending in CRLF, once dataWire made it
	stuffed   bool   // dataWire has run
	size      int64  // len(Body), declared with SIZE=
	eightBit  bool   // the body has octets above 127
	needsUTF8 bool   // UTF-8 in an envelope address or a header field
	// utf8Why says what needsUTF8 was set by, for the refusal's text:
	// an 8-bit header may well not be UTF-8 (Latin-1), and an address
	// is the sender's to fix, not the message's.
	utf8Why string
	// dsnRelayed lists the recipients (indexes into Message.Rcpts)
	// accepted by a server that offers DSN.
	dsnRelayed []int
	// pooled is the wirePool buffer a dot-stuffed copy of a body of up
	// to maxPooledWire octets goes into; release gives it back.
	pooled *[]byte
	copied bool // wire is a copy, not Message.Body
}

// maxPooledWire is the largest body whose dot-stuffed copy is made in a
// pooled buffer rather than allocated per Send.
const maxPooledWire = 64 << 10

var wirePool = sync.Pool{New: func() any { return new([]byte) }}

// release gives the pooled buffer back once nothing reads info.wire any
// more (Send has returned from every write).
func (info *msgInfo) release() {
	if info.pooled == nil {
		return
	}
	if info.copied && cap(info.wire) <= 2*maxPooledWire {
		*info.pooled = info.wire[:0] // keep the array, perhaps grown
	}
	wirePool.Put(info.pooled)
	info.pooled, info.wire = nil, nil
}

// dataWire returns body dot-stuffed for DATA, made at the first call: a
// message that only ever goes as a BDAT chunk is not stuffed at all.
func (info *msgInfo) dataWire(body []byte) []byte {
	if info.stuffed {
		return info.wire
	}
	info.stuffed = true
	if len(body) <= maxPooledWire {
		info.pooled = wirePool.Get().(*[]byte)
		info.wire = dotStuffTo(*info.pooled, body)
		info.copied = len(body) > 0 && &info.wire[0] != &body[0]
	} else {
		info.wire = dotStuff(body)
	}
	return info.wire
}

func inspect(m *Message) *msgInfo {
	// SIZE= declares what goes over the wire: the final line ending that
	// bdatChunk and dotStuffTo add where the body lacks one counts.
	info := &msgInfo{size: int64(len(m.Body))}
	if len(m.Body) > 0 && !bytes.HasSuffix(m.Body, crlf) {
		info.size += int64(len(crlf))
	}
	info.eightBit = !ascii.Is(m.Body)
	hdrEnd := bytes.Index(m.Body, []byte("\r\n\r\n"))
	if hdrEnd < 0 {
		hdrEnd = len(m.Body)
	}
	// RFC 6531 3.2/3.4: SMTPUTF8 is needed when an envelope address or a
	// header field carries UTF-8; 8-bit bytes in the body alone only need
	// 8BITMIME.
	switch {
	case !ascii.IsString(m.From):
		info.utf8Why = "a non-ASCII envelope sender"
	case !ascii.Is(m.Body[:hdrEnd]):
		info.utf8Why = "8-bit octets in the header section (UTF-8 or another charset; RFC 2047 encoded words need none)"
	}
	for _, r := range m.Rcpts {
		if info.utf8Why == "" && !ascii.IsString(r) {
			info.utf8Why = "a non-ASCII recipient address"
		}
	}
	info.needsUTF8 = info.utf8Why != ""
	return info
}

// bdatChunk returns the message as BDAT sends it: the body as it is,
// ending in CRLF as the DATA path's does, not dot-stuffed.
func bdatChunk(body []byte) []byte {
	if len(body) == 0 || bytes.HasSuffix(body, crlf) {
		return body
	}
	return append(body[:len(body):len(body)], crlf...)
}

// tooManyRcpts reports whether a RCPT reply is the server's recipient limit
// rather than a problem with the recipient: a 452 (RFC 5321 4.5.3.1.10)
// after at least one recipient of this transaction was accepted, with no
// enhanced code or 4.5.3 ("too many recipients", RFC 3463). The recipient
// then goes into the next transaction.
func tooManyRcpts(r reply, acceptedSoFar int) bool {
	return r.code == 452 && acceptedSoFar > 0 && (r.enhanced == "" || r.enhanced == "4.5.3")
}

// transaction runs one mail transaction (MAIL, RCPT for each index in
// batch, DATA, body, final dot) and records each decided recipient's
// outcome in out/decided. It returns the recipients that go in a later
// transaction (carry: those the server deferred for its recipient limit
// and, when the transaction failed, those it never offered) and, for a
// failure that ends the transaction, an error carrying that outcome. The
// failure is the outcome of the recipients of batch neither decided nor
// carried, and of no one else (deliver).
//
// With PIPELINING (RFC 2920) MAIL, every RCPT and DATA go out in one write
// and the replies are read back in order; RFC 2920 3.1 has the client check
// every one of them.
//
// With CHUNKING (RFC 3030) the message goes as one "BDAT n LAST" chunk
// instead of DATA, the body as it is, not dot-stuffed. With PIPELINING as
// well, MAIL, every RCPT, the BDAT command and the message leave in one
// write: a message costs one round trip instead of two (the 354 and the
// final dot's reply), which on a link of tens of milliseconds is most of
// its time on a kept connection. A server that refuses MAIL or every
// recipient still reads the chunk (its size is declared), and its reply to
// BDAT is then noise, as the empty DATA's is.
func (c *client) transaction(ctx context.Context, m *Message, info *msgInfo, batch []int, out []classify.Input, decided []bool) (carry []int, err error) {
	if info.needsUTF8 && !c.has("SMTPUTF8") {
		// RFC 6531: without SMTPUTF8 offered, UTF-8 addresses or headers
		// must not be sent; no later attempt to this host will differ.
		return nil, &stepErr{in: synthetic(classify.StageMail, 553, "5.6.7",
			fmt.Sprintf("the message needs SMTPUTF8 (%s) but %s does not offer it", info.utf8Why, c.host))}
	}
	if c.sizeMax > 0 && info.size > c.sizeMax {
		// RFC 1870: don't send what the server's fixed maximum refuses.
		return nil, &stepErr{in: synthetic(classify.StageMail, 552, "5.3.4",
			fmt.Sprintf("message of %d bytes exceeds %s's SIZE limit of %d bytes", info.size, c.host, c.sizeMax))}
	}
	c.rcptAccepted = false
	dsn := c.has("DSN")
	// writeChunk marks the transaction's chunk as gone; the next starts
	// without.
	defer func() { c.chunkSent = false }()
	// mailCmd and rcptCmd append a command line, without its CRLF.
	mailCmd := func(b []byte) []byte {
		b = append(append(append(b, "MAIL FROM:<"...), m.From...), '>')
		if info.eightBit && c.has("8BITMIME") {
			b = append(b, " BODY=8BITMIME"...) // RFC 6152
		}
		if info.needsUTF8 {
			b = append(b, " SMTPUTF8"...) // RFC 6531 3.4
		}
		if c.has("SIZE") {
			b = strconv.AppendInt(append(b, " SIZE="...), info.size, 10) // RFC 1870
		}
		if dsn {
			b = append(b, m.DSN.mailParams()...)
		}
		return b
	}
	rcptCmd := func(b []byte, i int) []byte {
		b = append(append(append(b, "RCPT TO:<"...), m.Rcpts[i]...), '>')
		if dsn {
			b = append(b, m.DSN.rcptParams(i)...)
		}
		return b
	}

	pipelined := c.has("PIPELINING")
	chunking := c.has("CHUNKING") && c.cfg.chunkingFor(m.Domain, c.host)
	var chunk []byte // the whole message for BDAT: the body ending in CRLF
	if chunking {
		chunk = bdatChunk(m.Body)
	}
	// A reused connection starts with RSET: it clears whatever the last
	// transaction left open and proves the connection still works. With
	// PIPELINING it goes out in the same write as MAIL, RCPT and DATA
	// (RFC 2920 3.1 lets RSET lead a group), which saves a round trip per
	// message; without, deliver sent it on its own.
	resetFirst := pipelined && c.txs > 0
	if pipelined {
		if err := c.deadline(ctx, c.cfg.CommandTimeout); err != nil {
			return nil, c.netFail(ctx, classify.StageMail, "before MAIL", err)
		}
		b := c.wbuf[:0]
		if resetFirst {
			b = append(b, "RSET\r\n"...)
		}
		b = append(mailCmd(b), "\r\n"...)
		for _, i := range batch {
			b = append(rcptCmd(b, i), "\r\n"...)
		}
		var err error
		if chunking {
			b = appendBDAT(b, len(chunk))
			c.wbuf = b
			err = c.writeChunk(ctx, b, chunk)
		} else {
			b = append(b, "DATA\r\n"...)
			c.wbuf = b
			_, _ = c.bw.Write(b)
			if err = c.bw.Flush(); err != nil {
				err = c.netFail(ctx, classify.StageMail, "writing MAIL/RCPT/DATA", err)
			}
		}
		if err != nil {
			if resetFirst {
				c.broken = true
				return nil, errStale
			}
			return nil, err
		}
		if resetFirst {
			// The RSET's own timeout, short: a pooled connection the
			// server went quiet on is given up in seconds. Not with a
			// chunk in the same write: a server may hold its replies to
			// the group until it has taken the message, as long as a
			// final dot's reply may take.
			timeout := c.cfg.ResetTimeout
			if chunking {
				timeout = c.cfg.FinalDotTimeout
			}
			r, err := c.readReplyStep(ctx, classify.StageMail, timeout, "RSET")
			switch {
			case err == nil && r.code == 250:
			case chunking && err == nil && r.code != 421:
				// The server is there and goes on to MAIL, RCPT and the
				// chunk that left with the RSET: their replies decide.
			case chunking && err != nil && !connClosed(err):
				return nil, err // the chunk may have been taken: StageDataEnd
			default:
				// No good answer to RSET: the pooled connection went
				// stale (closed, 421, or confused). A server that closed
				// or said 421 takes nothing after the RSET; without
				// CHUNKING, closing it before the body sends nothing.
				// The recipients go to a fresh connection.
				c.broken = true
				return nil, errStale
			}
		}
	}
	// Counted from here: the checks above send nothing, so they need no
	// RSET afterwards and do not use up the connection.
	c.txs++

	// MAIL
	var mailErr error
	if pipelined {
		mailErr = c.readStep(ctx, classify.StageMail, c.cfg.CommandTimeout, 2, "MAIL")
	} else {
		_, mailErr = c.cmd(ctx, classify.StageMail, c.cfg.CommandTimeout, 2, string(mailCmd(nil)))
	}
	if mailErr != nil && (c.broken || !pipelined) {
		return nil, mailErr
	}

	// RCPT, one reply per recipient.
	var accepted []int
	for k, i := range batch {
		var r reply
		var err error
		if pipelined {
			r, err = c.readReplyStep(ctx, classify.StageRcpt, c.cfg.CommandTimeout, "RCPT")
		} else {
			if len(carry) > 0 {
				// The server hit its limit; the rest waits for the
				// next transaction without asking.
				carry = append(carry, batch[k:]...)
				break
			}
			r, err = c.cmd(ctx, classify.StageRcpt, c.cfg.CommandTimeout, 0, string(rcptCmd(nil, i)))
		}
		if err != nil {
			if mailErr != nil {
				// Pipelined after a refused MAIL: the server had no
				// transaction, so the refusal stays the outcome.
				return nil, mailErr
			}
			if !pipelined {
				// Without PIPELINING the RCPTs after this one were
				// never sent: nothing of this transaction is theirs.
				carry = append(carry, batch[k+1:]...)
			}
			return carry, err
		}
		switch {
		case mailErr != nil:
			// Pipelined after a refused MAIL: these replies are noise.
		case r.code/100 == 2:
			accepted = append(accepted, i)
			c.rcptAccepted = true
		case r.code < 400:
			// A 1xx or 3xx to RCPT: the replies are out of step, and
			// nothing of this transaction can be read right.
			return carry, c.outOfStep(classify.StageRcpt, "RCPT", r)
		case tooManyRcpts(r, len(accepted)):
			carry = append(carry, i)
			// Learn the limit so the next transactions fit it.
			if c.rcptMax == 0 || len(accepted) < c.rcptMax {
				c.rcptMax = len(accepted)
			}
		default:
			out[i], decided[i] = r.input(classify.StageRcpt), true
		}
	}

	if chunking {
		return c.chunkReply(ctx, m, info, pipelined, chunk, mailErr, accepted, carry, out, decided)
	}

	// DATA
	var dataReply reply
	if pipelined {
		r, err := c.readReplyStep(ctx, classify.StageData, c.cfg.DataInitTimeout, "DATA")
		if err != nil {
			if mailErr != nil {
				return nil, mailErr // as for RCPT above
			}
			return carry, err
		}
		dataReply = r
		if mailErr != nil || len(accepted) == 0 {
			if r.code == 354 {
				// RFC 2920 3.1: DATA was accepted with nobody to
				// deliver to; send an empty message's final dot and
				// ignore its (failed) reply. A failure here (the
				// connection is then broken) delivered nothing: after
				// a refused MAIL the refusal stays the outcome, and
				// otherwise every recipient was decided at RCPT.
				err := c.writeBody(ctx, nil)
				if err == nil {
					_, err = c.readReplyStep(ctx, classify.StageDataEnd, c.cfg.FinalDotTimeout, "final dot")
				}
				if err != nil && mailErr == nil {
					return carry, err
				}
			}
			if mailErr != nil {
				return nil, mailErr
			}
			return carry, nil
		}
	} else {
		if len(accepted) == 0 {
			// Nobody accepted: skip DATA; the open transaction is
			// cleared by the RSET before the next one.
			return carry, nil
		}
		r, err := c.cmd(ctx, classify.StageData, c.cfg.DataInitTimeout, 0, "DATA")
		if err != nil {
			return carry, err
		}
		dataReply = r
	}
	if dataReply.code != 354 {
		if dataReply.code < 400 {
			return carry, c.outOfStep(classify.StageData, "DATA", dataReply)
		}
		return carry, &stepErr{in: dataReply.input(classify.StageData)}
	}

	// Body and final dot.
	if err := c.writeBody(ctx, info.dataWire(m.Body)); err != nil {
		return carry, err
	}
	r, err := c.readReplyStep(ctx, classify.StageDataEnd, c.cfg.FinalDotTimeout, "final dot")
	if err != nil {
		return carry, err
	}
	in := r.input(classify.StageDataEnd)
	for _, i := range accepted {
		out[i], decided[i] = in, true
	}
	if dsn && r.code/100 == 2 {
		info.dsnRelayed = append(info.dsnRelayed, accepted...)
	}
	return carry, nil
}

// chunkReply ends a transaction whose message goes as one BDAT LAST
// chunk: pipelined, the chunk has left with MAIL and RCPT and its reply is
// read here; otherwise it is sent now, to the recipients accepted.
func (c *client) chunkReply(ctx context.Context, m *Message, info *msgInfo, pipelined bool, chunk []byte,
	mailErr error, accepted, carry []int, out []classify.Input, decided []bool) ([]int, error) {
	if !pipelined {
		if len(accepted) == 0 {
			// Nobody accepted: no BDAT; the open transaction is
			// cleared by the RSET before the next one.
			return carry, nil
		}
		if err := c.writeChunk(ctx, appendBDAT(c.wbuf[:0], len(chunk)), chunk); err != nil {
			return carry, err
		}
	}
	r, err := c.readReplyStep(ctx, classify.StageDataEnd, c.cfg.FinalDotTimeout, "BDAT")
	if mailErr != nil {
		// MAIL was refused: the server had no transaction to put the
		// chunk in, so whatever became of its reply, the refusal is the
		// outcome (a lost reply is not an unknown one here).
		return nil, mailErr
	}
	if err != nil {
		return carry, err
	}
	if len(accepted) == 0 {
		return carry, nil // the server's "no valid recipients" to the chunk
	}
	if r.code == 500 || r.code == 502 || r.code == 504 {
		// BDAT refused as a command the server does not know, though it
		// offered CHUNKING: no refusal of the message, which it never
		// took (and whose octets it may have read as commands). Read as
		// the message's reply, it bounced every message sent to the host.
		// The host gets DATA from now on, the connection is closed, and
		// the attempt is retried.
		c.broken = true
		c.cfg.bdatRefused.Store(nameKey(c.host), true)
		c.log.Warn().Str("mx", c.host).Str("reply", shortRaw(r.raw)).
			Msg("server offers CHUNKING but refused BDAT as unknown; DATA to it from now on")
		return carry, &stepErr{in: classify.Input{Stage: classify.StageData, Event: classify.EventConnLost,
			Text: fmt.Sprintf("%s (%s): BDAT refused as unknown though CHUNKING was offered, DATA next time: %q", c.host, c.addr, shortRaw(r.raw))}}
	}
	in := r.input(classify.StageDataEnd)
	for _, i := range accepted {
		out[i], decided[i] = in, true
	}
	if r.code/100 == 2 && c.has("DSN") {
		info.dsnRelayed = append(info.dsnRelayed, accepted...)
	}
	return carry, nil
}

// connClosed reports whether err is the server closing the connection
// (end of stream, reset), not a timeout or a cancelled context.
func connClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// appendBDAT appends the command that sends the whole message of n octets
// as the last (and only) chunk.
func appendBDAT(b []byte, n int) []byte {
	return append(strconv.AppendInt(append(b, "BDAT "...), int64(n), 10), " LAST\r\n"...)
}

// readReplyStep reads one reply within timeout; transport failures become
// step errors, any reply code is returned to the caller.
func (c *client) readReplyStep(ctx context.Context, stage classify.Stage, timeout time.Duration, what string) (reply, error) {
	failStage := stage
	if c.chunkSent {
		// The whole message has left (BDAT): a transport failure now
		// may come after the server took it, as after a final dot.
		failStage = classify.StageDataEnd
	}
	if err := c.deadline(ctx, timeout); err != nil {
		return reply{}, c.netFail(ctx, failStage, "before reply to "+what, err)
	}
	r, err := c.readReply()
	if err != nil {
		return reply{}, c.netFail(ctx, failStage, "reading reply to "+what, err)
	}
	if r.code == 421 {
		// RFC 5321 3.8: 421 means the server is closing the channel.
		c.broken = true
	}
	return r, nil
}

// readStep is readReplyStep that also checks the code class.
func (c *client) readStep(ctx context.Context, stage classify.Stage, timeout time.Duration, want int, what string) error {
	r, err := c.readReplyStep(ctx, stage, timeout, what)
	if err != nil {
		return err
	}
	if !codeIs(r.code, want) {
		if r.code < 400 {
			return c.outOfStep(stage, what, r)
		}
		return &stepErr{in: r.input(stage)}
	}
	return nil
}
