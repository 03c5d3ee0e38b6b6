package submission

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/netip"
	"net/textproto"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/clientaddr"
)

// go-smtp v0.25.1 has no connection limit and no way to end an idle
// connection politely on shutdown, so the listener and each connection are
// wrapped here: limitListener counts connections and refuses the excess,
// trackedConn lets the server hang up on a connection between commands
// without ever cutting a message in flight.

// tooManyConnsReply is sent to a connection over Config.MaxConnections
// before it is closed; 421 tells the client to try again later
// (RFC 5321 section 3.8), 4.7.0 is RFC 3463's "other security or policy".
const tooManyConnsReply = "421 4.7.0 Too many connections, try again later\r\n"

// tooManyClientConnsReply refuses a connection over
// Config.MaxClientConnections, as Postfix answers one over
// smtpd_client_connection_count_limit.
const tooManyClientConnsReply = "421 4.7.0 Too many connections from your address, try again later\r\n"

// rejectWriteTimeout bounds the one-line reply to a refused connection, so a
// client that does not read cannot stall the accept loop.
const rejectWriteTimeout = time.Second

// limitListener refuses connections beyond Config.MaxConnections, and any
// connection accepted while the server shuts down.
type limitListener struct {
	net.Listener
	srv *Server
}

// Accept returns the next connection the server has room for. Refused ones
// are answered and closed here, inline: a single short write to a fresh
// socket does not block, and the write deadline caps it anyway.
func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc, reply := l.srv.admit(c)
		if tc != nil {
			return tc, nil
		}
		_ = c.SetWriteDeadline(time.Now().Add(rejectWriteTimeout))
		_, _ = io.WriteString(c, reply)
		_ = c.Close()
	}
}

// admit registers c as a tracked connection, or returns the reply that
// refuses it.
func (s *Server) admit(c net.Conn) (*trackedConn, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return nil, shutdownReply
	}
	if len(s.conns) >= s.cfg.MaxConnections {
		s.metrics.connRejected.Inc()
		s.log.Warn().Str("remote", c.RemoteAddr().String()).Int("max_connections", s.cfg.MaxConnections).
			Str("reason", "too_many_connections").Msg("connection refused")
		return nil, tooManyConnsReply
	}
	tc := &trackedConn{Conn: c, srv: s}
	addr := connAddr(c)
	if !s.isTrusted(addr) && s.cfg.Users != nil && s.cfg.AuthTimeout > 0 {
		// From the connection's start, not the session's: go-smtp starts
		// a session at EHLO, and a client that sends nothing at all must
		// meet the limit too (SetReadDeadline).
		limit := s.cfg.AuthTimeout
		if len(s.conns) >= s.cfg.MaxConnections*stressPercent/100 {
			// Under stress, as Postfix's smtpd under its stress
			// parameter: a client that must authenticate gets a few
			// seconds to, so that silent connections from a few
			// addresses cannot keep every slot for AuthTimeout each.
			limit = min(limit, s.stressAuth)
		}
		tc.authBy = time.Now().Add(limit)
	}
	if s.cfg.MaxClientConnections > 0 && !s.isTrusted(addr) {
		key := clientaddr.Prefix(addr)
		if s.perClient[key] >= s.cfg.MaxClientConnections {
			s.metrics.connRejected.Inc()
			s.log.Warn().Str("remote", c.RemoteAddr().String()).Int("max_client_connections", s.cfg.MaxClientConnections).
				Str("reason", "too_many_client_connections").Msg("connection refused")
			return nil, tooManyClientConnsReply
		}
		s.perClient[key]++
		tc.client, tc.counted = key, true
	}
	s.conns[tc] = struct{}{}
	s.metrics.connections.Set(float64(len(s.conns)))
	return tc, ""
}

// Under stress: from stressPercent of MaxConnections in use, a new
// connection that must authenticate has stressAuthTimeout to (Postfix's
// smtpd_timeout under stress is 10 s; Server.stressAuth, for tests).
const (
	stressPercent     = 80
	stressAuthTimeout = 10 * time.Second
)

// connAddr is c's remote IP address (an IPv4-mapped one unmapped), or the
// zero Addr, without remoteAddr's string.
func connAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return ta.AddrPort().Addr().Unmap()
	}
	_, a := remoteAddr(c.RemoteAddr())
	return a
}

// release forgets a closed connection.
func (s *Server) release(tc *trackedConn) {
	s.mu.Lock()
	if _, ok := s.conns[tc]; ok && tc.counted {
		if s.perClient[tc.client]--; s.perClient[tc.client] <= 0 {
			delete(s.perClient, tc.client)
		}
	}
	delete(s.conns, tc)
	s.metrics.connections.Set(float64(len(s.conns)))
	s.mu.Unlock()
}

// pastDeadline makes a blocked Read return at once.
var pastDeadline = time.Unix(1, 0)

// trackedConn is the net.Conn go-smtp sees (under TLS after STARTTLS).
//
// Once hung up, the next read between commands returns io.EOF, which go-smtp
// treats as the client leaving: it closes the connection without another
// reply. Reads of a message body (between beginData and endData) are never
// interrupted, so a DATA in flight always gets its reply.
type trackedConn struct {
	net.Conn
	srv *Server
	// client is the connection's key in the server's per-client count
	// (clientaddr.Prefix), counted says it was counted; both set once, in admit.
	client  netip.Prefix
	counted bool

	mu     sync.Mutex
	inData bool // the session is reading or enqueueing a body
	// cut says the client's side ended (or the connection was ended
	// under it) while a body was read: go-smtp takes the end of the
	// socket inside a BDAT chunk for the chunk's end, so without it a
	// chunk cut short was a whole message.
	cut bool
	// authBy is when a client that must authenticate has to have done
	// so (Config.AuthTimeout), zero for none; authed says it did.
	authBy    time.Time
	authed    bool
	hung      bool   // end the connection at the next command read
	hangupMsg string // one reply line to send before that (sendHangup)
	// tls says STARTTLS's 220 went out (Write): from then on the client
	// speaks TLS on the socket, handshake first (RFC 3207 section 4), so
	// nothing is ever written there in plaintext any more.
	tls bool
	// bodyIdle, while a DATA body is read, is how long each read of the
	// socket may wait (ReadTimeout), and never past bodyEnd (DataTimeout).
	bodyIdle time.Duration
	bodyEnd  time.Time

	// cmdIn is go-smtp's buffered reader of this connection's commands,
	// once a session has found it (commandReader); nil before, or when
	// go-smtp's layout is not the known one. Write looks at what it holds.
	cmdIn *bufio.Reader
	// badAuth counts an AUTH response that go-smtp could not decode
	// (amendReply), as the session counts any malformed one; nil under TLS,
	// where tlsReplies has its own.
	badAuth func()
	// greeting is the greeting go-smtp last answered on this connection
	// (greetingReply): greetNone before one, or after STARTTLS until the
	// next; set by the reply writers, read by a session's Data.
	greeting atomic.Int32

	// wmu guards pending, served and switched. go-smtp's connection
	// goroutine is the only one that writes and reads, but go-smtp's Close
	// (a shutdown that ran out of time) may close the connection from
	// another.
	wmu sync.Mutex
	// pending holds reply lines not yet written (see Write).
	pending []byte
	// served says go-smtp's 220 greeting went out; switched, that a later
	// 220, STARTTLS's go-ahead, did (Write).
	served, switched bool
	// tlsOut is the writer under go-smtp's on the TLS connection, put in
	// place when STARTTLS succeeded (joinTLS) or, after a STARTTLS before
	// any greeting, at the first greeting inside TLS (newSession); nil
	// before, or if go-smtp's layout is not the known one. The connection
	// goroutine alone uses it.
	tlsOut *tlsReplies
	// ahead holds octets of a body read from the socket and not yet passed
	// up (see readConn); the same goroutine alone uses it.
	ahead *readAhead

	closeOnce sync.Once
}

// maxHeld bounds the reply octets Write holds back: replies to one
// buffer of pipelined commands stay well under it.
const maxHeld = 4 << 10

// Write holds plaintext reply lines back so that one write(2) carries
// several. go-smtp writes and flushes every reply line on its own
// (textproto's PrintfLine), and each write on a loopback or LAN socket is
// a segment and a wakeup of the client:
//
//   - a continuation line ("250-...") goes out with its reply's last line,
//     which go-smtp always writes in the same call: an EHLO answer of ten
//     lines is one write, not ten;
//   - a reply's last line is held too while go-smtp's buffer holds more
//     of the client's commands, which only a client using PIPELINING
//     sends (RFC 2920): the replies to MAIL, RCPT and DATA of one group
//     leave together, as Postfix's smtpd sends them, once the buffer is
//     used up. Read writes whatever is held before it waits for the
//     client, and Close before it closes, so a reply is only ever delayed
//     by the commands that were already there.
//
// Only plaintext lines are held: a TLS record starts with a content type
// below 0x20, never with a digit, and after STARTTLS nothing is held at all.
//
// Write also corrects the go-smtp replies that amendReply knows, notes
// which greeting go-smtp answers (greetingReply), and sees STARTTLS's
// go-ahead (startsTLS), after which it writes TLS records only.
func (c *trackedConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.switched && len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		// A plaintext reply after the go-ahead: go-smtp writes one there
		// only when the handshake failed ("550 5.0.0 Handshake error"),
		// also when a hangup cut it short. The client is in TLS or gone,
		// and would read the reply as a broken record: it is dropped, and
		// the connection ends at go-smtp's next read instead of serving
		// plaintext commands on a socket the client speaks TLS on.
		c.hangup("")
		return len(b), nil
	}
	if a, ok := amendReply(b); ok {
		if a.badAuth && c.badAuth != nil {
			c.badAuth()
		}
		return writeAmended(c.Conn, &c.pending, b, a.line)
	}
	if greeting, ehlo := greetingReply(b); greeting {
		c.greeted(ehlo)
	}
	if c.startsTLS(b) {
		// Written at once, with anything held before it: the client
		// starts its handshake on reading it.
		c.switched = true
		c.setTLS()
		c.cmdIn, c.badAuth = nil, nil // the plaintext reader go-smtp drops now
	}
	if c.holds(b) {
		c.pending = append(c.pending, b...)
		return len(b), nil
	}
	if len(c.pending) == 0 {
		return c.Conn.Write(b)
	}
	return c.writePending(b)
}

// startsTLS reports whether b, a line go-smtp writes, is STARTTLS's
// go-ahead: a 220 reply after the greeting's. 220 is only ever the
// greeting (RFC 5321 section 4.2.2) or the answer to STARTTLS (RFC 3207
// section 4), after which go-smtp starts the TLS handshake on the socket
// at once. Called with wmu held.
func (c *trackedConn) startsTLS(b []byte) bool {
	if len(b) < 5 || b[0] != '2' || b[1] != '2' || b[2] != '0' {
		return false // the common case, not parsed further
	}
	if last, ok := replyLine(b); !ok || !last {
		return false
	}
	if !c.served {
		c.served = true
		return false
	}
	return !c.switched
}

// writeAmended writes *held and then r, in place of b, to w in one write,
// and reports b as written whole when r was (writeHeld).
func writeAmended(w io.Writer, held *[]byte, b, r []byte) (int, error) {
	if _, err := writeHeld(w, held, r); err != nil {
		return 0, err
	}
	return len(b), nil
}

// holds reports whether Write keeps b back. Called with wmu held.
func (c *trackedConn) holds(b []byte) bool {
	last, ok := replyLine(b)
	if !ok || len(c.pending)+len(b) > maxHeld || c.switched {
		return false
	}
	return !last || (c.cmdIn != nil && c.cmdIn.Buffered() > 0)
}

// flushHeld writes what Write holds back, if anything.
func (c *trackedConn) flushHeld() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if len(c.pending) == 0 {
		return nil
	}
	_, err := c.writePending(nil)
	return err
}

// writePending writes the held lines and then b in one write, reporting
// only b's part as written. Called with wmu held.
func (c *trackedConn) writePending(b []byte) (int, error) {
	return writeHeld(c.Conn, &c.pending, b)
}

// writeHeld writes *held and then b to w in one write, empties *held and
// reports only b's part as written.
func writeHeld(w io.Writer, held *[]byte, b []byte) (int, error) {
	before := len(*held)
	*held = append(*held, b...)
	n, err := w.Write(*held)
	*held = (*held)[:0]
	if n -= before; n < 0 {
		n = 0
	}
	return n, err
}

// replyLine reports whether b is one whole reply line (three digits, a
// hyphen or a space, CRLF at the end) and whether it is its reply's last.
func replyLine(b []byte) (last, ok bool) {
	if len(b) < 5 || b[0] < '0' || b[0] > '9' || b[1] < '0' || b[1] > '9' || b[2] < '0' || b[2] > '9' ||
		b[len(b)-2] != '\r' || b[len(b)-1] != '\n' {
		return false, false
	}
	switch {
	case b[3] == '-' && len(b) >= 6:
		return false, true
	case b[3] == ' ' || len(b) == 5: // "250\r\n" is a last line too
		return true, true
	}
	return false, false
}

// textConn returns go-smtp's private textproto.Conn of c, through which
// it reads commands and writes replies, or nil when go-smtp's Conn does
// not have that field at the pinned release's type. The field is found
// once, by name and type, as dotReader finds its own (dotreader.go).
func textConn(c *smtp.Conn) *textproto.Conn {
	textOnce.Do(func() {
		f, ok := reflect.TypeFor[smtp.Conn]().FieldByName("text")
		if ok && len(f.Index) == 1 && f.Type == reflect.TypeFor[*textproto.Conn]() {
			textOffset, textKnown = f.Offset, true
		}
	})
	if !textKnown || c == nil {
		return nil
	}
	return *(**textproto.Conn)(unsafe.Add(unsafe.Pointer(c), textOffset))
}

// commandReader returns go-smtp's buffered reader of c's commands, or nil.
func commandReader(c *smtp.Conn) *bufio.Reader {
	if tp := textConn(c); tp != nil {
		return tp.R
	}
	return nil
}

var (
	textOnce   sync.Once
	textOffset uintptr
	textKnown  bool
)

// joinTLSReplies puts a tlsReplies under go-smtp's replies on c, a TLS
// connection, so they too leave in fewer writes, each a TLS record. It
// leaves c alone if go-smtp's writer is not of the known layout or holds
// unwritten octets (go-smtp flushes every line, so it never does).
//
// badAuth is called for each AUTH response go-smtp could not decode,
// greeted with each greeting go-smtp answers (nil: none). It returns the
// writer it put in place, or nil.
func joinTLSReplies(c *smtp.Conn, badAuth func(), greeted func(ehlo bool)) *tlsReplies {
	if _, ok := c.Conn().(*tls.Conn); !ok {
		return nil // first: a plaintext connection's Logout comes here too
	}
	tp := textConn(c)
	if tp == nil || tp.R == nil || tp.W == nil || tp.W.Buffered() > 0 {
		return nil
	}
	t := &tlsReplies{w: c.Conn(), cmdIn: tp.R, badAuth: badAuth, greeted: greeted}
	tp.W.Reset(t)
	return t
}

// joinTLS puts a tlsReplies under go-smtp's replies on sc as soon as
// STARTTLS succeeded, not at the client's first greeting inside TLS:
// RFC 3207 section 4.2 has the client greet again, and until it does
// go-smtp answers the commands out of sequence itself (502 where
// amendReply writes 503), with no session yet to put the writer in place
// (newSession). go-smtp calls the plaintext session's Logout, whence this
// is called, after it moved its reader and writer onto the TLS
// connection and before it reads the next command. On that session's
// other Logout, at the end of a plaintext connection, sc.Conn() is not a
// TLS connection, and this does nothing.
func (c *trackedConn) joinTLS(sc *smtp.Conn) {
	if c.tlsOut == nil {
		c.tlsOut = joinTLSReplies(sc, nil, c.greeted)
	}
}

// tlsWriter returns the writer joinTLS put under go-smtp's, now
// counting malformed AUTH responses with badAuth; nil if there is none.
func (c *trackedConn) tlsWriter(badAuth func()) *tlsReplies {
	if c.tlsOut != nil {
		c.tlsOut.badAuth = badAuth
	}
	return c.tlsOut
}

// tlsReplies joins reply lines above TLS, where trackedConn sees records.
// It holds less than trackedConn does, because it cannot write what it
// holds when go-smtp closes the TLS connection or waits for the client:
// a continuation line, which go-smtp always follows with its reply's last
// line in the same call; and a 250 while go-smtp's buffer holds a whole
// next command of a pipelining client, which go-smtp then reads from the
// buffer and answers, with no wait and no close in between. Every other
// reply (354, 334, a 221 or an error before a close) writes what is held
// with it.
type tlsReplies struct {
	w       io.Writer // the *tls.Conn
	cmdIn   *bufio.Reader
	pending []byte
	badAuth func()          // see trackedConn.badAuth
	greeted func(ehlo bool) // see trackedConn.greeting
}

func (t *tlsReplies) Write(b []byte) (int, error) {
	if a, ok := amendReply(b); ok {
		if a.badAuth && t.badAuth != nil {
			t.badAuth()
		}
		return writeAmended(t.w, &t.pending, b, a.line)
	}
	if greeting, ehlo := greetingReply(b); greeting && t.greeted != nil {
		t.greeted(ehlo)
	}
	last, ok := replyLine(b)
	if ok && len(t.pending)+len(b) <= maxHeld && (!last || (string(b[:4]) == "250 " && hasCommand(t.cmdIn))) {
		t.pending = append(t.pending, b...)
		return len(b), nil
	}
	if len(t.pending) == 0 {
		return t.w.Write(b)
	}
	return writeHeld(t.w, &t.pending, b)
}

// hasCommand reports whether r holds a whole line, read and not yet used.
func hasCommand(r *bufio.Reader) bool {
	n := r.Buffered()
	if n == 0 {
		return false
	}
	buf, _ := r.Peek(n) // never reads: n octets are buffered
	return bytes.IndexByte(buf, '\n') >= 0
}

// setCommandReader lets Write see the client's pipelined commands, and
// gives it the session's count of malformed AUTH responses.
func (c *trackedConn) setCommandReader(r *bufio.Reader, badAuth func()) {
	c.wmu.Lock()
	c.cmdIn = r
	c.badAuth = badAuth
	c.wmu.Unlock()
}

// idleTimeoutReply ends a connection whose command read timed out.
const idleTimeoutReply = "421 4.4.2 Idle timeout, closing connection\r\n"

// Read passes reads through unless the connection has been hung up.
func (c *trackedConn) Read(b []byte) (n int, err error) {
	defer func() {
		if err == io.EOF {
			c.noteCut()
		}
	}()
	// Never wait for the client with a reply held back.
	if err := c.flushHeld(); err != nil {
		return 0, err
	}
	c.authOverdue()
	msg, stop, body, idle, end := c.readState()
	if stop {
		c.sendHangup(msg)
		return 0, io.EOF
	}
	if idle > 0 && c.ahead == nil {
		// A wait for more of a DATA body: the session's deadline was set
		// when its reader asked for octets, and that reader may wait for
		// many reads of the socket before it returns.
		_ = c.Conn.SetReadDeadline(minTime(time.Now().Add(idle), end))
	}
	n, err = c.readConn(b, body)
	if err == nil {
		return n, nil
	}
	if msg, stop := c.stopped(); stop {
		c.sendHangup(msg)
		return n, io.EOF
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		if c.idleTimeout() {
			return n, io.EOF
		}
		// Inside a body. go-smtp reads a BDAT chunk itself, and would
		// answer a read error with a permanent 554 naming both
		// addresses: the reply is the timeout's own 421 instead, and
		// the connection ends after it.
		c.hangup("")
		return n, errDataTimeout
	}
	return n, err
}

// idleTimeout ends the connection after a read timeout outside a message
// body (which the session handles itself). The connection is closed here,
// not left to go-smtp: bufio drops a read error when part of a line was
// read, so go-smtp would run the half-sent command and answer it after the
// timeout. Closing first makes the 421 the last thing the client hears
// (RFC 5321 section 4.5.3.2.7 allows closing an idle connection).
func (c *trackedConn) idleTimeout() bool {
	c.mu.Lock()
	if c.inData {
		c.mu.Unlock()
		return false
	}
	c.hung = true
	overdue := c.mustAuth() && !time.Now().Before(c.authBy)
	c.mu.Unlock()
	reason, msg, reply := reasonTimeout, "idle timeout, closing connection", idleTimeoutReply
	if overdue {
		// The deadline was the limit to authenticate (SetReadDeadline).
		reason, msg, reply = reasonAuthRequired, "no authentication within the limit, closing connection", authRequiredReply
	}
	c.srv.metrics.rejections.WithLabelValues(reason).Inc()
	c.srv.log.Info().Str("remote", c.RemoteAddr().String()).Str("reason", reason).Msg(msg)
	c.sendHangup(reply)
	_ = c.Conn.Close()
	return true
}

// stopped reports whether reads must end now, and takes the pending hangup
// reply if there is one.
func (c *trackedConn) stopped() (string, bool) {
	msg, stop, _, _, _ := c.readState()
	return msg, stop
}

// readState is stopped, whether a body is being read, and the read
// timeouts of a DATA body (bodyIdle, bodyEnd), under one lock.
func (c *trackedConn) readState() (msg string, stop, body bool, idle time.Duration, end time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.hung || c.inData {
		return "", false, c.inData, c.bodyIdle, c.bodyEnd
	}
	msg = c.hangupMsg
	c.hangupMsg = ""
	return msg, true, false, 0, time.Time{}
}

// readAheadSize is how much of a body one read(2) may take. go-smtp reads
// through textproto's 4 KiB bufio.Reader, so a 100 KiB body was at least
// 25 reads of the socket, each a system call costing more than the copy
// of its octets; a client that writes faster than the body is checked
// leaves more than that in the socket, and one read takes up to 32 KiB.
// That is the size of the body's own read chunk (bodyChunk), so a
// connection blocked in the middle of a body holds two such buffers, not
// one; 64 KiB saved no more (BenchmarkDataBody at 100 KiB: 0.76 of the
// old CPU against 0.78).
const readAheadSize = bodyChunk

// readAhead is a pooled buffer of octets read from the socket and not yet
// passed up, and the error their read returned with them.
type readAhead struct {
	buf  []byte
	r, w int
	err  error
}

var readAheads = sync.Pool{New: func() any { return &readAhead{buf: make([]byte, readAheadSize)} }}

// readConn reads the socket into b. While a body is read (body) and b is
// smaller than a read-ahead buffer, it reads into one and keeps what b has
// no room for, to pass up, in order, on the next calls whatever the state
// then. The stream the layers above see is the socket's octets in the
// same order: octets go-smtp's buffer drops at STARTTLS are dropped as
// before, and what follows them still reaches the TLS handshake first.
// Commands are not read ahead, so a connection between messages holds no
// buffer. A 2 KiB body pays one copy of its octets (tens of nanoseconds);
// reading only after a read has filled b would spare that, but measured
// 12 µs more per 100 KiB body, whose first reads often come short while
// the client is still writing.
func (c *trackedConn) readConn(b []byte, body bool) (int, error) {
	if a := c.ahead; a != nil {
		n := copy(b, a.buf[a.r:a.w])
		a.r += n
		if a.r < a.w {
			return n, nil
		}
		err := a.err
		c.ahead = nil
		a.err = nil
		readAheads.Put(a)
		return n, err
	}
	if !body || len(b) >= readAheadSize {
		return c.Conn.Read(b)
	}
	a := readAheads.Get().(*readAhead)
	m, err := c.Conn.Read(a.buf)
	n := copy(b, a.buf[:m])
	if n == m {
		readAheads.Put(a)
		return n, err
	}
	a.r, a.w, a.err = n, m, err
	c.ahead = a
	return n, nil
}

// sendHangup writes msg, a reply of the connection's own before it ends,
// where the client reads replies: on the socket before STARTTLS's 220,
// inside TLS after it (RFC 3207 section 4.2), through the writer under
// go-smtp's that joinTLS put in place once the handshake succeeded. In
// between, while the handshake runs, and when that writer is missing
// (STARTTLS before any greeting, or go-smtp's layout not the known
// one), the connection is closed without it: a plaintext line there
// reaches the client as a broken TLS record, not as a reply. Called on
// the connection goroutine, from Read.
func (c *trackedConn) sendHangup(msg string) {
	if msg == "" {
		return
	}
	c.mu.Lock()
	isTLS := c.tls
	c.mu.Unlock()
	_ = c.Conn.SetWriteDeadline(time.Now().Add(rejectWriteTimeout))
	switch {
	case !isTLS:
		_, _ = io.WriteString(c.Conn, msg)
	case c.tlsOut != nil:
		// Inside the tls.Conn whose Read called this one: its Write takes
		// only the output side's lock, and the handshake is complete.
		_, _ = c.tlsOut.Write([]byte(msg))
	}
}

// SetReadDeadline keeps a hung-up connection's deadline in the past, so
// go-smtp resetting its idle timeout cannot undo a hangup; and a command
// read's no later than the client's limit to authenticate (requireAuth),
// so that a client that sends nothing at all is ended then, not after
// ReadTimeout (idleTimeout answers it as authOverdue does).
func (c *trackedConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.hung && !c.inData:
		t = pastDeadline
	case c.mustAuth() && !t.IsZero() && t.After(c.authBy):
		t = c.authBy
	}
	return c.Conn.SetReadDeadline(t)
}

// mustAuth reports whether the client has a limit to authenticate by and
// has not yet, outside a body. c.mu is held.
func (c *trackedConn) mustAuth() bool {
	return !c.authed && !c.authBy.IsZero() && !c.inData
}

// SetDeadline applies the same rule to the read side.
func (c *trackedConn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// hangup ends the connection at its next command read; msg (a full reply
// line with CRLF, or "") is written first where it can be (sendHangup).
// A blocked read is woken at once unless a body is being read.
func (c *trackedConn) hangup(msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hung = true
	c.hangupMsg = msg
	if !c.inData {
		_ = c.Conn.SetReadDeadline(pastDeadline)
	}
}

// setTLS records that the client speaks TLS from now on. A hangup reply
// meant for the plaintext connection is dropped: the hangup ends the
// handshake that follows, so there is no TLS to write it in.
func (c *trackedConn) setTLS() {
	c.mu.Lock()
	if !c.tls {
		c.tls = true
		c.hangupMsg = ""
	}
	c.mu.Unlock()
	// The greeting before STARTTLS is void (RFC 3207 section 4.2); the
	// one after it is seen by tlsReplies, when go-smtp's writer is of the
	// known layout.
	c.greeting.Store(greetNone)
}

// The values of trackedConn.greeting.
const (
	greetNone = iota
	greetEHLO
	greetHELO
)

// greeted records the greeting go-smtp answers: EHLO, or HELO.
func (c *trackedConn) greeted(ehlo bool) {
	if ehlo {
		c.greeting.Store(greetEHLO)
	} else {
		c.greeting.Store(greetHELO)
	}
}

// saidHELO reports whether the client's greeting in force is HELO, not
// EHLO: then it speaks SMTP without service extensions (RFC 5321 section
// 4.1.1.1). False when no greeting was seen.
func (c *trackedConn) saidHELO() bool {
	return c != nil && c.greeting.Load() == greetHELO
}

// requireAuth gives a client that must authenticate until by to do so,
// once per connection (a session after STARTTLS keeps the first limit).
func (c *trackedConn) requireAuth(by time.Time) {
	c.mu.Lock()
	if c.authBy.IsZero() && !c.authed {
		c.authBy = by
	}
	c.mu.Unlock()
}

// authDone lifts requireAuth's limit.
func (c *trackedConn) authDone() {
	c.mu.Lock()
	c.authed = true
	c.mu.Unlock()
}

// authOverdue hangs up, at a command read, on a client that has not
// authenticated by its limit: without one, a client that never does could
// hold its connection slot for good with a NOOP or a RSET per ReadTimeout,
// and a few addresses all of them.
func (c *trackedConn) authOverdue() {
	c.mu.Lock()
	overdue := !c.authed && !c.authBy.IsZero() && !c.inData && !c.hung && time.Now().After(c.authBy)
	c.mu.Unlock()
	if overdue {
		c.srv.metrics.rejections.WithLabelValues(reasonAuthRequired).Inc()
		c.hangup(authRequiredReply)
	}
}

// authRequiredReply ends a connection that did not authenticate within
// its limit (Config.AuthTimeout).
const authRequiredReply = "421 4.7.0 Authentication required at the start of the session; closing connection\r\n"

func (c *trackedConn) beginData() {
	c.mu.Lock()
	c.inData, c.cut = true, false
	c.mu.Unlock()
}

// noteCut records an end of the socket while a body is read.
func (c *trackedConn) noteCut() {
	c.mu.Lock()
	if c.inData {
		c.cut = true
	}
	c.mu.Unlock()
}

// bodyCut reports whether the socket ended while the body was read: what
// was read of it is not the message, whatever the reader made of it.
func (c *trackedConn) bodyCut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut
}

// dataTimeouts gives each read of the socket for the DATA body being read
// idle to wait, never past end.
func (c *trackedConn) dataTimeouts(idle time.Duration, end time.Time) {
	c.mu.Lock()
	c.bodyIdle, c.bodyEnd = idle, end
	c.mu.Unlock()
}

func (c *trackedConn) endData() {
	c.mu.Lock()
	c.inData, c.bodyIdle, c.bodyEnd = false, 0, time.Time{}
	c.mu.Unlock()
}

// Close closes the connection and releases its slot, once.
// Replies held back are written first, unless a write is under way on
// the connection goroutine (go-smtp's Close from another, at a shutdown
// that ran out of time): the connection is being cut then anyway.
func (c *trackedConn) Close() error {
	if c.wmu.TryLock() {
		if len(c.pending) > 0 {
			_, _ = c.writePending(nil)
		}
		c.wmu.Unlock()
	}
	err := c.Conn.Close()
	c.closeOnce.Do(func() { c.srv.release(c) })
	return err
}
