package sender

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
)

// client is one SMTP connection to one server address. It is used by one
// Send at a time (the pool hands it out exclusively).
//
// Why not go-smtp's Client: in v0.25.1 it sends "EHLO localhost" before
// STARTTLS (its StartTLS is only reachable through NewClientStartTLS, which
// greets before we can name ourselves), matches extension keywords as the
// server spelled them ("starttls" is missed), re-sends EHLO after every
// RSET, has no context support, no write deadline on the body and no
// PIPELINING. Each of those would need a wrapper that reaches into its
// wire traffic; the conversation below is short enough to own outright.
type client struct {
	cfg *Config
	log zerolog.Logger
	raw net.Conn // the TCP connection; deadlines set here reach TLS too
	nc  net.Conn // raw, or the *tls.Conn on top of it
	// sys, peekFn, peeked and peekBuf are unsolicited's, made at its
	// first look at the connection.
	sys     syscall.RawConn
	peekFn  func(uintptr) bool
	peeked  bool
	peekBuf [1]byte
	br      *bufio.Reader
	bw      *bufio.Writer
	host    string  // MX host name or relay host: TLS server name, logs
	addr    string  // ip:port (or relay host:port) dialled
	key     string  // pool key
	src     *Source // egress address, nil for the default
	// dest is the destination domain (lower case) of the Send using it
	// last, "" through the relay: the pool notes its host as one of that
	// domain's when it is put back (pool.noteDest, Sender.CloseIdle).
	dest string

	tls         bool
	tlsVerified bool
	verifyErr   error             // why the certificate did not verify; nil when it did or TLS is off
	ext         map[string]string // EHLO keywords, upper-cased, → parameters
	rbuf        []byte            // readReply's scratch: the reply's lines
	rends       []int             // readReply's scratch: where each line ends in rbuf
	wbuf        []byte            // transaction's scratch: the pipelined commands
	seen        [4]string         // the last short replies, for replyString
	seenNext    int               // where replyString puts the next one
	sizeMax     int64             // SIZE fixed maximum; 0 = none declared
	rcptMax     int               // LIMITS RCPTMAX, or learned from a 452; 0 = unknown
	mailMax     int               // LIMITS MAILMAX; 0 = unknown
	limit       int               // lowest destination max-msgs-per-conn seen on it; 0 = none
	txs         int               // transactions started on this connection
	chunkSent   bool              // a BDAT chunk of the transaction has left (readReplyStep)
	idleSince   time.Time
	idleSeq     uint64 // the pool's count at its last put (pool.order)
	pooled      bool   // idle in the pool
	broken      bool   // the conversation is out of step; never reuse
	// spent: the session failed before any recipient was accepted
	// (softSessionFailure); QUIT rather than pool it.
	spent bool
	// rcptAccepted: a recipient of the current transaction was accepted.
	rcptAccepted bool
}

// stepErr is a failed step: the classify.Input to report and the cause.
type stepErr struct {
	in  classify.Input
	err error
}

func (e *stepErr) Error() string {
	if e.err != nil {
		return fmt.Sprintf("stage %d: %s: %v", e.in.Stage, e.in.Text, e.err)
	}
	return fmt.Sprintf("stage %d: %d %s %s", e.in.Stage, e.in.Code, e.in.Enhanced, e.in.Text)
}

func (e *stepErr) Unwrap() error { return e.err }

// reply is one SMTP reply as received.
type reply struct {
	code     int
	enhanced string // "4.7.28", "" when absent
	text     string // lines without code and enhanced code, joined by "\n"
	raw      string // lines exactly as received, joined by "\r\n"
}

func (r *reply) input(stage classify.Stage) classify.Input {
	return classify.Input{Stage: stage, Code: r.code, Enhanced: r.enhanced, Text: r.text, Raw: r.raw}
}

// synthetic builds an outcome outflow made up itself (no server said it);
// the text says so, so that nobody mistakes it for a remote reply.
func synthetic(stage classify.Stage, code int, enhanced, text string) classify.Input {
	return classify.Input{Stage: stage, Code: code, Enhanced: enhanced, Text: "outflow (synthetic, no server reply): " + text}
}

const (
	// maxReplyLine is far above the 512 octets RFC 5321 4.5.3.1.5 allows
	// a reply line, and keeps a hostile server from growing our buffer.
	maxReplyLine = 4096
	// maxReplyLines bounds a multi-line reply (an EHLO lists ~20).
	maxReplyLines = 200
	// maxSeenReply is the longest reply replyString remembers.
	maxSeenReply = 128
	// dataBlock is the size of one body write; each has its own
	// DataBlockTimeout (RFC 5321 4.5.3.2.5 times each "TCP SEND" of a
	// block).
	dataBlock = 64 << 10
)

var errMalformed = errors.New("malformed SMTP reply")

// malformedError is errMalformed with what was read of the reply, exactly
// as received (lines joined by CRLF), kept as evidence.
type malformedError struct {
	detail string
	raw    string
}

func (e *malformedError) Error() string { return errMalformed.Error() + ": " + e.detail }
func (e *malformedError) Unwrap() error { return errMalformed }

// outOfStep is the error of a positive or intermediate reply (below 400)
// that is not the one the step asked for: a 250 greeting, a 250 to DATA, a
// 354 to MAIL, a second answer to a command the server had answered. The
// conversation is out of step, and the reply is the answer to something
// else: it is no outcome of this step. Taken for one, a 2xx anywhere read
// as delivered a message the server never got. The connection is broken,
// and the attempt ends as a lost connection (transient before the final
// dot), the reply quoted in the text only: in Raw, classify would read its
// code again.
func (c *client) outOfStep(stage classify.Stage, what string, r reply) error {
	c.broken = true
	return &stepErr{in: classify.Input{Stage: stage, Event: classify.EventConnLost,
		Text: fmt.Sprintf("%s (%s): reply to %s out of step, the session is confused: %q", c.host, c.addr, what, shortRaw(r.raw))}}
}

// shortRaw is at most 200 octets of a reply's lines, for a message.
func shortRaw(raw string) string {
	if len(raw) > 200 {
		return raw[:200] + "…"
	}
	return raw
}

// unsolicited reports whether a pooled connection has something to read
// before anything was asked on it: a reply nobody asked for (a server that
// answered twice) or the server's close. Taken up, its next command would
// read that reply as its own, and each after it the one before: a BDAT
// read the RCPT's 250 as the message's, and the server's refusal of the
// message was never seen. The look does not wait: bytes in the reader's
// buffer, or a peek at the socket that does not block.
func (c *client) unsolicited() bool {
	if c.br.Buffered() > 0 {
		return true
	}
	if c.sys == nil {
		sc, ok := c.raw.(syscall.Conn)
		if !ok {
			return false
		}
		rc, err := sc.SyscallConn()
		if err != nil {
			return false
		}
		c.sys, c.peekFn = rc, c.peek
	}
	c.peeked = false
	if c.sys.Read(c.peekFn) != nil {
		// The last command's deadline has passed, and fails the read
		// before the peek: cleared (the next command sets its own).
		_ = c.raw.SetReadDeadline(time.Time{})
		_ = c.sys.Read(c.peekFn)
	}
	return c.peeked
}

// peek is unsolicited's look at the socket, for syscall.RawConn.Read.
func (c *client) peek(fd uintptr) bool {
	n, _, err := syscall.Recvfrom(int(fd), c.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	c.peeked = n > 0 || (n == 0 && err == nil) // a byte, or the end of the stream
	return true
}

// malformedRaw returns the reply lines err carries, or its text.
func malformedRaw(err error) string {
	var me *malformedError
	if errors.As(err, &me) {
		return me.raw
	}
	return err.Error()
}

// deadline sets the I/O deadline to now+d, or the context's deadline when
// that is sooner, and then reports the context's error: set first, check
// after, so a concurrent cancellation (which sets a past deadline) is never
// overwritten unnoticed.
func (c *client) deadline(ctx context.Context, d time.Duration) error {
	t := time.Now().Add(d)
	if dl, ok := ctx.Deadline(); ok && dl.Before(t) {
		t = dl
	}
	_ = c.raw.SetDeadline(t)
	return ctx.Err()
}

// netFail turns an I/O error at stage into a step error and marks the
// connection unusable.
func (c *client) netFail(ctx context.Context, stage classify.Stage, what string, err error) error {
	c.broken = true
	ev := classify.EventConnLost
	var ne net.Error
	// One look at ctx: the socket's deadline is ctx's when that is sooner
	// (deadline), and the read it cuts can return a moment before ctx's
	// own timer marks ctx done. Looked at twice, ctx could be live at the
	// first look and past its deadline at the second, and a timeout was
	// reported as a lost connection.
	cerr := ctx.Err()
	switch {
	case errors.Is(cerr, context.DeadlineExceeded):
		ev = classify.EventTimeout
	case cerr != nil:
		ev = classify.EventConnLost
		err = fmt.Errorf("%w (%v)", err, context.Cause(ctx))
	case errors.As(err, &ne) && ne.Timeout():
		ev = classify.EventTimeout
	case errors.Is(err, errMalformed) && stage == classify.StageDataEnd:
		// After the final dot (or the whole BDAT chunk) a reply we cannot
		// read is no refusal: the server may well have taken the message
		// ("250-2.0.0 queued as X" followed by a line of another code).
		// As for no reply at all, the outcome is unknown (RFC 5321 6.1:
		// a retry may deliver it twice, which the unknown policy
		// decides), so it is reported as a lost connection, which
		// classify calls unknown at StageDataEnd; the reply stays in Raw
		// and in the text as evidence. The connection is out of step.
		return &stepErr{in: classify.Input{Stage: stage, Event: classify.EventConnLost, Raw: malformedRaw(err),
			Text: fmt.Sprintf("%s (%s): %s: unreadable reply, the message may have been delivered: %v", c.host, c.addr, what, err)}, err: err}
	case errors.Is(err, errMalformed):
		// Keep the evidence: classify parses Raw when Code is 0.
		return &stepErr{in: classify.Input{Stage: stage, Raw: err.Error(), Text: fmt.Sprintf("%s: %s: %v", c.host, what, err)}, err: err}
	}
	return &stepErr{in: classify.Input{Stage: stage, Event: ev, Text: fmt.Sprintf("%s (%s): %s: %v", c.host, c.addr, what, err)}, err: err}
}

// setConn installs nc (the raw or TLS connection) with fresh buffers.
func (c *client) setConn(nc net.Conn) {
	c.nc = nc
	c.br = bufio.NewReaderSize(nc, 4096)
	c.bw = bufio.NewWriterSize(nc, 4096)
}

// readReply reads one possibly multi-line reply (RFC 5321 4.2.1). The
// lines are gathered in the client's scratch buffer and become one string,
// raw; code, enhanced code and, for a one-line reply, text are parts of it.
func (c *client) readReply() (reply, error) {
	buf, ends := c.rbuf[:0], c.rends[:0]
	code := 0
	for n := 0; ; n++ {
		if n == maxReplyLines {
			return reply{}, &malformedError{detail: fmt.Sprintf("more than %d lines", maxReplyLines), raw: string(buf)}
		}
		line, err := c.br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) || len(line) > maxReplyLine {
			// The evidence keeps the long line's first 512 octets, the
			// longest reply line RFC 5321 4.5.3.1.5 allows.
			if n > 0 {
				buf = append(buf, '\r', '\n')
			}
			buf = append(buf, line[:min(len(line), 512)]...)
			return reply{}, &malformedError{detail: fmt.Sprintf("line longer than %d bytes", maxReplyLine), raw: string(buf)}
		}
		if err != nil {
			return reply{}, err
		}
		line = bytes.TrimRight(line, "\r\n")
		if n > 0 {
			buf = append(buf, '\r', '\n')
		}
		buf = append(buf, line...)
		ends = append(ends, len(buf))
		lc, ok := replyCode(line)
		if !ok || (code != 0 && lc != code) || (len(line) > 3 && line[3] != '-' && line[3] != ' ') {
			return reply{}, &malformedError{detail: fmt.Sprintf("%q", buf), raw: string(buf)}
		}
		code = lc
		if len(line) == 3 || line[3] != '-' {
			break
		}
	}
	c.rbuf, c.rends = buf, ends
	r := reply{code: code, raw: c.replyString(buf)}
	var texts strings.Builder
	start := 0
	for n, end := range ends {
		text := ""
		if end-start > 4 {
			text = r.raw[start+4 : end]
		}
		// RFC 2034 3: the enhanced code prefixes every line of the reply.
		if n == 0 {
			r.enhanced = enhancedPrefix(code, text)
		}
		if r.enhanced != "" {
			text = strings.TrimPrefix(strings.TrimPrefix(text, r.enhanced), " ")
		}
		switch {
		case len(ends) == 1:
			r.text = text
		case n > 0:
			texts.WriteByte('\n')
			fallthrough
		default:
			texts.WriteString(text)
		}
		start = end + 2
	}
	if len(ends) > 1 {
		r.text = texts.String()
	}
	return r, nil
}

// replyString returns raw as a string, the same string as the last time
// when a server repeats a short reply: most replies in a transaction
// (RSET, MAIL, RCPT, DATA) are the same words every time.
func (c *client) replyString(raw []byte) string {
	if len(raw) > maxSeenReply {
		return string(raw)
	}
	for _, s := range c.seen {
		if s == string(raw) { // compared without a copy
			return s
		}
	}
	s := string(raw)
	c.seen[c.seenNext] = s
	c.seenNext = (c.seenNext + 1) % len(c.seen)
	return s
}

// replyCode reads a reply line's code: three digits from 200 to 599.
func replyCode(line []byte) (int, bool) {
	if len(line) < 3 {
		return 0, false
	}
	code := 0
	for _, ch := range line[:3] {
		if ch < '0' || ch > '9' {
			return 0, false
		}
		code = code*10 + int(ch-'0')
	}
	return code, code >= 200 && code <= 599
}

// enhancedPrefix returns the RFC 3463 status code starting text (class
// "d", then subject and detail of 1-3 digits each) when its class matches
// the basic code's first digit, else "".
func enhancedPrefix(code int, text string) string {
	tok, _, _ := strings.Cut(text, " ")
	if len(tok) < 2 || int(tok[0]) != '0'+code/100 || tok[1] != '.' {
		return ""
	}
	subject, detail, ok := strings.Cut(tok[2:], ".")
	if !ok || !statusDigits(subject) || !statusDigits(detail) {
		return ""
	}
	return tok
}

// statusDigits says whether p is the 1-3 digits of an enhanced status
// code's subject or detail.
func statusDigits(p string) bool {
	if p == "" || len(p) > 3 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// cmd writes one command line and reads its reply within timeout. A reply
// whose code does not match want (see codeIs) is returned together with a
// stepErr carrying it.
func (c *client) cmd(ctx context.Context, stage classify.Stage, timeout time.Duration, want int, line string) (reply, error) {
	if err := c.deadline(ctx, timeout); err != nil {
		return reply{}, c.netFail(ctx, stage, "before "+verb(line), err)
	}
	if _, err := c.bw.WriteString(line + "\r\n"); err != nil {
		return reply{}, c.netFail(ctx, stage, "writing "+verb(line), err)
	}
	if err := c.bw.Flush(); err != nil {
		return reply{}, c.netFail(ctx, stage, "writing "+verb(line), err)
	}
	return c.expect(ctx, stage, want, verb(line))
}

// expect reads one reply (the caller has set the deadline) and checks its
// code against want.
func (c *client) expect(ctx context.Context, stage classify.Stage, want int, what string) (reply, error) {
	r, err := c.readReply()
	if err != nil {
		return reply{}, c.netFail(ctx, stage, "reading reply to "+what, err)
	}
	if r.code == 421 {
		// RFC 5321 3.8: 421 means the server is closing the channel.
		c.broken = true
	}
	if !codeIs(r.code, want) {
		if r.code < 400 {
			return r, c.outOfStep(stage, what, r)
		}
		return r, &stepErr{in: r.input(stage)}
	}
	return r, nil
}

// codeIs checks code against want: 0 accepts any code, 1-9 a class, else
// the exact code.
func codeIs(code, want int) bool {
	if want == 0 {
		return true
	}
	if want < 10 {
		return code/100 == want
	}
	return code == want
}

// verb is the command name of line, for messages. Only known verbs are
// returned, never arguments: an AUTH continuation line is base64 of a
// username or password and must not reach an error text or a log.
func verb(line string) string {
	v, _, _ := strings.Cut(line, " ")
	switch v {
	case "EHLO", "HELO", "STARTTLS", "AUTH", "MAIL", "RCPT", "DATA", "RSET", "QUIT", "NOOP":
		return v
	}
	return "AUTH response"
}

// dial connects to addr and reads the greeting. host is the name the
// certificate must match (MX host or relay host).
func dial(ctx context.Context, cfg *Config, log zerolog.Logger, host, addr, key string, implicitTLS bool) (*client, error) {
	src := sourceFrom(ctx)
	c := &client{cfg: cfg, log: log, host: host, addr: addr, key: key, src: src}
	dctx, cancel := context.WithTimeout(ctx, cfg.ConnectTimeout)
	defer cancel()
	raw, err := cfg.dialFrom(dctx, src, addr)
	if err != nil {
		ev := classify.EventConnRefused
		var ne net.Error
		if errors.Is(dctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			ev = classify.EventTimeout
		}
		return nil, &stepErr{in: classify.Input{Stage: classify.StageConnect, Event: ev, Text: fmt.Sprintf("%s (%s): connect: %v", host, addr, err)}, err: err}
	}
	c.raw = raw
	c.setConn(raw)
	if implicitTLS {
		// RFC 8314 3.3: TLS first, then the SMTP greeting.
		if err := c.handshake(dctx, true, nil, tls.VersionTLS12); err != nil {
			_ = raw.Close()
			return nil, err
		}
	}
	if err := c.deadline(ctx, cfg.GreetingTimeout); err != nil {
		_ = raw.Close()
		return nil, c.netFail(ctx, classify.StageGreeting, "before greeting", err)
	}
	if _, err := c.expect(ctx, classify.StageGreeting, 220, "greeting"); err != nil {
		_ = raw.Close()
		return nil, err
	}
	return c, nil
}

// hello sends EHLO with our configured name, falling back to HELO when the
// server does not know EHLO (RFC 5321 3.2), and records the extensions.
func (c *client) hello(ctx context.Context) error {
	c.ext = map[string]string{}
	c.sizeMax, c.rcptMax, c.mailMax = 0, 0, 0
	r, err := c.cmd(ctx, classify.StageEHLO, c.cfg.CommandTimeout, 250, "EHLO "+c.ehlo())
	if err != nil {
		var se *stepErr
		if r.code != 0 && errors.As(err, &se) && (r.code == 500 || r.code == 502) {
			_, err = c.cmd(ctx, classify.StageEHLO, c.cfg.CommandTimeout, 250, "HELO "+c.ehlo())
		}
		return err
	}
	lines := strings.Split(r.text, "\n")
	for _, l := range lines[1:] {
		kw, param, _ := strings.Cut(strings.TrimSpace(l), " ")
		// RFC 5321 2.4: extension keywords are not case sensitive;
		// some servers send "starttls".
		c.ext[strings.ToUpper(kw)] = strings.TrimSpace(param)
	}
	if v, ok := c.ext["SIZE"]; ok && v != "" {
		// RFC 1870: a fixed maximum message size in octets; 0 = none.
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
			c.sizeMax = n
		}
	}
	if v, ok := c.ext["LIMITS"]; ok {
		// RFC 9422 LIMITS: "RCPTMAX=n MAILMAX=n ...", names case-insensitive.
		for _, f := range strings.Fields(v) {
			name, val, _ := strings.Cut(f, "=")
			n, err := strconv.Atoi(val)
			if err != nil || n <= 0 {
				continue
			}
			switch strings.ToUpper(name) {
			case "RCPTMAX":
				c.rcptMax = n
			case "MAILMAX":
				c.mailMax = n
			}
		}
	}
	return nil
}

func (c *client) has(ext string) bool {
	_, ok := c.ext[ext]
	return ok
}

// startTLS runs STARTTLS and the second EHLO (RFC 3207 4.2: forget what the
// server said before TLS and ask again). mustVerify makes a certificate
// that does not verify a failure; verify checks it (nil: WebPKI for
// c.host, against Config.RootCAs).
func (c *client) startTLS(ctx context.Context, mustVerify bool, verify func(tls.ConnectionState) error, minVersion uint16) error {
	if _, err := c.cmd(ctx, classify.StageTLS, c.cfg.CommandTimeout, 220, "STARTTLS"); err != nil {
		return err
	}
	// RFC 3207 5 (and CVE-2011-0411): anything already buffered after the
	// 220 was sent in plaintext and must not be read as if under TLS.
	if c.br.Buffered() > 0 {
		c.broken = true
		return &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure,
			Text: fmt.Sprintf("%s: plaintext data after the STARTTLS 220 (injection attempt?)", c.host)}}
	}
	if err := c.deadline(ctx, c.cfg.CommandTimeout); err != nil {
		return c.netFail(ctx, classify.StageTLS, "before TLS handshake", err)
	}
	if err := c.handshake(ctx, mustVerify, verify, minVersion); err != nil {
		return err
	}
	return c.hello(ctx)
}

// handshake puts TLS on the connection. Verification is done by hand so
// that opportunistic TLS can encrypt even when the certificate does not
// check out (and say so), while required TLS refuses it. verify is the
// check (nil: WebPKI for c.host); a DANE check is never skipped, since
// InsecureSkipVerify is about the WebPKI. minVersion is the oldest TLS
// version taken: 1.2 where a policy requires TLS, 1.0 for opportunistic
// TLS, where the alternative to an old version is plaintext (RFC 7435;
// Postfix's default takes TLS 1.0 too).
func (c *client) handshake(ctx context.Context, mustVerify bool, verify func(tls.ConnectionState) error, minVersion uint16) error {
	if verify == nil {
		mustVerify = mustVerify && !c.cfg.InsecureSkipVerify
		verify = func(cs tls.ConnectionState) error { return verifyChain(cs, c.host, c.cfg.RootCAs) }
	}
	conf := &tls.Config{
		ServerName:         c.host,
		InsecureSkipVerify: true, // verified below, in VerifyConnection
		MinVersion:         minVersion,
	}
	verified := false
	var verifyErr error
	conf.VerifyConnection = func(cs tls.ConnectionState) error {
		err := verify(cs)
		verified, verifyErr = err == nil, err
		if err != nil && mustVerify {
			return err
		}
		return nil
	}
	tc := tls.Client(c.raw, conf)
	if err := tc.HandshakeContext(ctx); err != nil {
		c.broken = true
		c.verifyErr = verifyErr
		ev := classify.EventTLSFailure
		var ne net.Error
		if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			ev = classify.EventTimeout // the socket's deadline may be ctx's, and come first (netFail)
		}
		return &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: ev, Text: fmt.Sprintf("%s (%s): TLS handshake: %v", c.host, c.addr, err)}, err: err}
	}
	c.setConn(tc)
	c.tls, c.tlsVerified, c.verifyErr = true, verified, verifyErr
	return nil
}

func verifyChain(cs tls.ConnectionState, host string, roots *x509.CertPool) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("no server certificate")
	}
	inter := x509.NewCertPool()
	for _, ic := range cs.PeerCertificates[1:] {
		inter.AddCert(ic)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: inter})
	if err != nil {
		return fmt.Errorf("certificate for %s: %w", host, err)
	}
	return nil
}

// auth authenticates to the relay (RFC 4954) with PLAIN, or LOGIN when
// PLAIN is not offered. Neither the credentials nor the base64 exchange
// ever reach an error text or a log line.
func (c *client) auth(ctx context.Context, user, pass string) error {
	mechs, ok := c.ext["AUTH"]
	if !ok {
		return &stepErr{in: synthetic(classify.StageAuth, 530, "5.7.0", c.host+" does not offer AUTH but credentials are configured")}
	}
	var sc sasl.Client
	for _, m := range strings.Fields(strings.ToUpper(mechs)) {
		if m == sasl.Plain {
			sc = sasl.NewPlainClient("", user, pass)
			break
		}
		if m == sasl.Login {
			sc = &loginClient{user: user, pass: pass}
		}
	}
	if sc == nil {
		return &stepErr{in: synthetic(classify.StageAuth, 504, "5.7.4", fmt.Sprintf("%s offers AUTH %s; outflow speaks PLAIN and LOGIN", c.host, mechs))}
	}
	mech, ir, err := sc.Start()
	if err != nil {
		return &stepErr{in: synthetic(classify.StageAuth, 454, "4.7.0", "SASL start: "+err.Error()), err: err}
	}
	line := "AUTH " + mech
	if ir != nil {
		enc := "=" // RFC 4954 4: an empty initial response is sent as "="
		if len(ir) > 0 {
			enc = base64.StdEncoding.EncodeToString(ir)
		}
		line += " " + enc
	}
	for range 10 {
		r, err := c.cmd(ctx, classify.StageAuth, c.cfg.CommandTimeout, 0, line)
		if err != nil {
			return err
		}
		switch {
		case r.code == 235:
			return nil
		case r.code == 334:
			chal, err := base64.StdEncoding.DecodeString(strings.TrimSpace(r.text))
			if err != nil {
				c.broken = true
				return &stepErr{in: r.input(classify.StageAuth), err: fmt.Errorf("undecodable AUTH challenge: %w", err)}
			}
			resp, err := sc.Next(chal)
			if err != nil {
				// RFC 4954 4: "*" cancels the exchange.
				_, _ = c.cmd(ctx, classify.StageAuth, c.cfg.CommandTimeout, 0, "*")
				return &stepErr{in: r.input(classify.StageAuth), err: err}
			}
			line = base64.StdEncoding.EncodeToString(resp)
		case r.code < 400:
			return c.outOfStep(classify.StageAuth, "AUTH", r)
		default:
			return &stepErr{in: r.input(classify.StageAuth)}
		}
	}
	c.broken = true
	return &stepErr{in: synthetic(classify.StageAuth, 454, "4.7.0", "AUTH exchange did not finish in 10 rounds")}
}

// loginClient speaks the obsolete but common LOGIN mechanism
// (draft-murchison-sasl-login) without an initial response, answering the
// server's "Username:" and "Password:" prompts in whatever case they come.
type loginClient struct {
	user, pass string
}

func (l *loginClient) Start() (string, []byte, error) { return sasl.Login, nil, nil }

func (l *loginClient) Next(chal []byte) ([]byte, error) {
	switch p := strings.ToLower(string(chal)); {
	case strings.HasPrefix(p, "user"):
		return []byte(l.user), nil
	case strings.HasPrefix(p, "pass"):
		return []byte(l.pass), nil
	}
	return nil, sasl.ErrUnexpectedServerChallenge
}

// reset sends RSET (RFC 5321 4.1.1.5) before a transaction on a connection
// that has carried one; it doubles as the liveness check of a pooled
// connection.
func (c *client) reset(ctx context.Context) error {
	_, err := c.cmd(ctx, classify.StageMail, c.cfg.ResetTimeout, 250, "RSET")
	if err != nil {
		c.broken = true
	}
	return err
}

// quit says goodbye politely within a short deadline and closes.
func (c *client) quit() {
	d := min(c.cfg.CommandTimeout, 5*time.Second)
	_ = c.raw.SetDeadline(time.Now().Add(d))
	if !c.broken {
		if _, err := c.bw.WriteString("QUIT\r\n"); err == nil && c.bw.Flush() == nil {
			_, _ = c.readReply()
		}
	}
	_ = c.nc.Close()
}

// close drops the connection without a QUIT.
func (c *client) close() { _ = c.nc.Close() }

// writeBody writes the dot-stuffed body and the final dot. The end of the
// body leaves together with the dot, in one write: a body of up to 64 KiB
// (dataBlock, with the dot) goes out whole in one write, and a larger one
// in 64 KiB blocks whose last one carries the dot. What fits the write
// buffer (about 4 KiB) is copied there; a larger last block is copied with
// the dot into a pooled block buffer. A failure before all of the body has
// left means the server cannot have accepted the message (StageData); once
// the body has left, a failure might not (part of the dot may be out), so it
// is reported at StageDataEnd.
func (c *client) writeBody(ctx context.Context, wire []byte) error {
	if err := c.bw.Flush(); err != nil {
		return c.netFail(ctx, classify.StageData, "writing body", err)
	}
	// Whole blocks go out directly while more than a block is left: the
	// last, up to a block with the dot after it, leaves in one write. (The
	// test was once the rest with the dot over a block, which for a rest
	// of 65,534 or 65,535 octets took a block past the end of the body:
	// a panic, the message stuck, its connection never given back.)
	whole := 0
	for len(wire)-whole > dataBlock {
		whole += dataBlock
	}
	if err := c.writeBlocks(ctx, wire[:whole], "writing body"); err != nil {
		return err
	}
	wire = wire[whole:]
	if err := c.deadline(ctx, c.cfg.DataBlockTimeout); err != nil {
		return c.netFail(ctx, classify.StageData, "writing body", err)
	}
	if len(wire)+len(finalDot) > c.bw.Available() {
		bp := blockPool.Get().(*[]byte)
		defer blockPool.Put(bp)
		last := append(append((*bp)[:0], wire...), finalDot...)
		n, err := c.nc.Write(last)
		if err != nil {
			if n < len(wire) {
				return c.netFail(ctx, classify.StageData, "writing body", err)
			}
			return c.netFail(ctx, classify.StageDataEnd, "writing final dot", err)
		}
		return nil
	}
	_, _ = c.bw.Write(wire)     // fits: no write, no error
	_, _ = c.bw.Write(finalDot) // (the buffer was flushed above)
	queued := c.bw.Buffered()
	if err := c.bw.Flush(); err != nil {
		if queued-c.bw.Buffered() < len(wire) {
			return c.netFail(ctx, classify.StageData, "writing body", err)
		}
		return c.netFail(ctx, classify.StageDataEnd, "writing final dot", err)
	}
	return nil
}

// writeChunk writes head, commands ending in a BDAT line, and chunk, the
// octets that line announces. Together up to dataBlock they are one write,
// through a pooled block buffer; a larger chunk follows the head in blocks
// of dataBlock. A failure means the chunk did not all leave, so the server
// cannot have taken the message (StageData). Once it has all left,
// chunkSent makes every later transport failure of the transaction
// StageDataEnd (readReplyStep): the server may have taken it.
func (c *client) writeChunk(ctx context.Context, head, chunk []byte) error {
	if err := c.writeChunkBlocks(ctx, head, chunk); err != nil {
		return err
	}
	c.chunkSent = true
	return nil
}

func (c *client) writeChunkBlocks(ctx context.Context, head, chunk []byte) error {
	if err := c.bw.Flush(); err != nil {
		return c.netFail(ctx, classify.StageData, "writing BDAT", err)
	}
	if err := c.deadline(ctx, c.cfg.DataBlockTimeout); err != nil {
		return c.netFail(ctx, classify.StageData, "writing BDAT", err)
	}
	if len(head)+len(chunk) <= dataBlock {
		bp := blockPool.Get().(*[]byte)
		defer blockPool.Put(bp)
		if _, err := c.nc.Write(append(append((*bp)[:0], head...), chunk...)); err != nil {
			return c.netFail(ctx, classify.StageData, "writing BDAT chunk", err)
		}
		return nil
	}
	if _, err := c.nc.Write(head); err != nil {
		return c.netFail(ctx, classify.StageData, "writing BDAT", err)
	}
	return c.writeBlocks(ctx, chunk, "writing BDAT chunk")
}

// writeBlocks writes p straight to the connection in blocks of dataBlock,
// each within DataBlockTimeout. A failure is StageData: not all of what p
// carries has left, so the server cannot have taken the message.
func (c *client) writeBlocks(ctx context.Context, p []byte, what string) error {
	for len(p) > 0 {
		n := min(len(p), dataBlock)
		if err := c.deadline(ctx, c.cfg.DataBlockTimeout); err != nil {
			return c.netFail(ctx, classify.StageData, what, err)
		}
		if _, err := c.nc.Write(p[:n]); err != nil {
			return c.netFail(ctx, classify.StageData, what, err)
		}
		p = p[n:]
	}
	return nil
}

// blockPool holds the buffers writeBody copies a body's last block and the
// final dot into when they do not fit the write buffer.
var blockPool = sync.Pool{New: func() any { b := make([]byte, 0, dataBlock); return &b }}

// dotStuff returns body made transparent (RFC 5321 4.5.2: a line starting
// with "." gets another one) and ending in CRLF, ready for the final dot.
// It copies only when it has to.
func dotStuff(body []byte) []byte { return dotStuffTo(nil, body) }

// dotStuffTo is dotStuff that, when it has to copy, appends the copy to
// dst[:0] (dst's array reused when it is large enough).
func dotStuffTo(dst, body []byte) []byte {
	leading := len(body) > 0 && body[0] == '.'
	i := indexLFDot(body) // the next line that starts with a dot
	if !leading && i < 0 && (len(body) == 0 || bytes.HasSuffix(body, crlf)) {
		return body
	}
	out := dst[:0]
	if need := len(body) + len(body)/64 + 3; cap(out) < need {
		out = make([]byte, 0, need)
	}
	if leading {
		out = append(out, '.')
	}
	for rest := body; ; i = indexLFDot(rest) {
		if i < 0 {
			out = append(out, rest...)
			break
		}
		out = append(out, rest[:i+1]...)
		out = append(out, '.')
		rest = rest[i+1:]
	}
	if !bytes.HasSuffix(out, crlf) {
		out = append(out, crlf...)
	}
	return out
}

// indexLFDot returns the index of the first "\n." in b, or -1. It looks
// for the dot and then at the octet before it: a dot is rarer than a line
// end in most bodies (a base64 part has none), so this is one vectorised
// search for many lines where bytes.Index makes one per line. Where dots
// come thicker than one in 64 octets it hands over to bytes.Index.
func indexLFDot(b []byte) int {
	for off, fails := 1, 0; off < len(b); {
		j := bytes.IndexByte(b[off:], '.')
		if j < 0 {
			return -1
		}
		j += off
		if b[j-1] == '\n' {
			return j - 1
		}
		off = j + 1
		if fails++; fails > 4+off>>6 {
			if k := bytes.Index(b[off:], lfDot); k >= 0 {
				return off + k
			}
			return -1
		}
	}
	return -1
}

var (
	crlf     = []byte("\r\n")
	lfDot    = []byte("\n.")
	finalDot = []byte(".\r\n")
)
