package fakemx

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// Stage names the point of the conversation a Hook is asked about.
type Stage string

const (
	// StageMail is MAIL FROM; the hook's arg is the reverse path.
	StageMail Stage = "MAIL"
	// StageRcpt is RCPT TO; the hook's arg is the recipient.
	StageRcpt Stage = "RCPT"
	// StageBody is right after the 354, before the server reads a byte of
	// the body: a hook that blocks here stalls the client's body write.
	StageBody Stage = "BODY"
	// StageDot is after the whole body has been read, before the reply to
	// the final dot; the hook's arg is the accepted recipients, comma
	// separated. A hook that blocks here makes the client time out waiting
	// for that reply; its error becomes the reply to the dot.
	StageDot Stage = "DOT"
)

// Drop is a sentinel a Hook returns to make the server close the
// connection at once without replying (a connection lost mid-command, or
// after the final dot when returned at StageDot).
var Drop = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 4, 2}, Message: "fakemx: dropping the connection"}

// Hook scripts the server's reply: it is called at each Stage with the
// stage's argument and returns nil to accept, a *smtp.SMTPError to reply
// with that error, or Drop to hang up. It may block (to simulate a stalled
// server) but must return once the channel from Server.Done is closed.
// It is called from the server's connection goroutines, concurrently.
type Hook func(stage Stage, arg string) *smtp.SMTPError

// Options configures a Server. The zero value is a plain ESMTP server that
// accepts everything.
type Options struct {
	// Domain is the name in the greeting. Default "fakemx.test".
	Domain string
	// STARTTLS offers STARTTLS with a throw-away certificate from a root
	// of the server's own (see Server.CertPool).
	STARTTLS bool
	// ImplicitTLS wraps the listener in TLS (port-465 style) with the same
	// certificate.
	ImplicitTLS bool
	// BrokenTLS makes every TLS handshake fail on the server side (the
	// server still offers STARTTLS), to exercise a client's fallback.
	BrokenTLS bool
	// MaxTLSVersion, when set, caps the TLS versions the server speaks
	// (tls.VersionTLS10: a server too old for TLS 1.2).
	MaxTLSVersion uint16
	// CertHosts are extra DNS names for the certificate's SANs; it always
	// covers "localhost" and 127.0.0.1.
	CertHosts []string
	// Certificate, when set, is served instead of the throw-away one
	// (CertHosts is then ignored and CertPool is nil): a chain from a
	// test CA, or one a DANE test publishes TLSA records for.
	Certificate *tls.Certificate
	// Users enables AUTH PLAIN and LOGIN with these username → password
	// pairs. AUTH is offered in plaintext too (the tests are loopback
	// only). A wrong password gets 535 5.7.8.
	Users map[string]string
	// AuthMechs are the mechanisms offered when Users is set; default
	// PLAIN and LOGIN.
	AuthMechs []string
	// RequireAuth rejects MAIL with 530 5.7.0 until the client has
	// authenticated.
	RequireAuth bool
	// MaxRecipients is advertised as LIMITS RCPTMAX and enforced with
	// 452 4.5.3 on the RCPT past it. 0 means no limit.
	MaxRecipients int
	// MaxMessageBytes is advertised in SIZE and enforced. 0 means no limit.
	MaxMessageBytes int64
	// SMTPUTF8 advertises SMTPUTF8 (RFC 6531).
	SMTPUTF8 bool
	// DSN advertises DSN (RFC 3461); the parameters a client sends are
	// recorded in Message.Mail and Message.RcptOpts.
	DSN bool
	// LowercaseExtensions spells the EHLO extension keywords in lower
	// case ("starttls"), as a few receivers do. Only the plaintext part of
	// the conversation is mangled.
	LowercaseExtensions bool
	// ExtraExtensions are added to the plaintext EHLO reply verbatim
	// (e.g. "LIMITS RCPTMAX=2 MAILMAX=5").
	ExtraExtensions []string
	// HideExtensions removes these keywords (upper case) from the
	// plaintext EHLO reply, e.g. "8BITMIME", "PIPELINING" or "LIMITS". A
	// hidden last line is replaced by "250 X-FAKEMX", since the lines
	// before it have already gone out.
	HideExtensions []string
	// Greeting, when set, is sent instead of the 220 banner (for example
	// "421 4.3.2 Too busy") and the connection is then closed.
	Greeting string
	// Hook scripts replies; nil accepts everything.
	Hook Hook
	// SourceHook is Hook told the client's IP address too (to script a
	// receiver that throttles or blocks one sending address); it is asked
	// first, and Hook only when it returns nil.
	SourceHook func(source string, stage Stage, arg string) *smtp.SMTPError
	// Addr is the host:port to listen on. Default "127.0.0.1:0" (a random
	// port); tests that need MX hosts on several loopback addresses and
	// one port set it.
	Addr string
	// ReadBuffer, when > 0, shrinks each accepted TCP connection's
	// receive buffer (bytes), so that a stalled body fills up quickly.
	ReadBuffer int
	// MaxMsgsPerConn, when > 0, is how many messages one connection may
	// carry: the MAIL after them gets MaxMsgsReply (default Yahoo's "421
	// Max message per connection reached, closing transmission
	// channel"), and the connection is closed.
	MaxMsgsPerConn int
	MaxMsgsReply   string
}

// Message is one message the server accepted with 250 after the final dot.
type Message struct {
	From     string   // the reverse path from MAIL FROM
	Rcpts    []string // the accepted recipients, in order
	Data     []byte   // the body as received, dot-unstuffed, CRLF line ends
	Hostname string   // the EHLO name of the session that sent it
	TLS      bool     // whether the session was under TLS
	Conn     int      // 1-based number of the connection it came on
	Body     smtp.BodyType
	UTF8     bool  // the client sent SMTPUTF8 on MAIL
	Size     int64 // the SIZE= the client declared, 0 if none
	AuthUser string
	// Ret and EnvID are MAIL FROM's RET and ENVID (with Options.DSN).
	Ret   smtp.DSNReturn
	EnvID string
	// RcptOpts holds each accepted recipient's RCPT options (NOTIFY,
	// ORCPT), in the order of Rcpts.
	RcptOpts []smtp.RcptOptions
	Source   string // the client's IP address
}

// Server is a running fake MX. Its methods are safe for concurrent use.
type Server struct {
	opts     Options
	srv      *smtp.Server
	ln       net.Listener
	addr     string
	certPool *x509.CertPool
	done     chan struct{}
	serveErr chan error
	wg       sync.WaitGroup // the greeting-reject goroutines we start ourselves

	mu    sync.Mutex
	msgs  []Message
	ehlos []string
	conns int
	// perConnRefused counts the MAILs refused past MaxMsgsPerConn.
	perConnRefused int
	txs            int
	resets         int
	authOK         int
	authFail       int
	notify         chan struct{} // closed and replaced whenever msgs grows
	closed         bool
	live           map[net.Conn]struct{} // accepted TCP connections not yet closed
	rawLn          net.Listener
}

// Start starts a Server and registers its Close with tb.Cleanup; it fails
// the test if the server cannot start.
func Start(tb testing.TB, opts Options) *Server {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatalf("fakemx: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}

// New starts a Server listening on 127.0.0.1 on a random port.
func New(opts Options) (*Server, error) {
	if opts.Domain == "" {
		opts.Domain = "fakemx.test"
	}
	s := &Server{
		opts:     opts,
		done:     make(chan struct{}),
		serveErr: make(chan error, 1),
		notify:   make(chan struct{}),
		live:     map[net.Conn]struct{}{},
	}
	var tlsConf *tls.Config
	if opts.STARTTLS || opts.ImplicitTLS || opts.BrokenTLS {
		cert, pool, err := throwAwayCert(append([]string{"localhost", opts.Domain}, opts.CertHosts...))
		if err != nil {
			return nil, fmt.Errorf("fakemx: certificate: %w", err)
		}
		s.certPool = pool
		if opts.Certificate != nil {
			cert, s.certPool = *opts.Certificate, nil
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if opts.MaxTLSVersion != 0 {
			tlsConf.MinVersion, tlsConf.MaxVersion = tls.VersionTLS10, opts.MaxTLSVersion
		}
		if opts.BrokenTLS {
			tlsConf = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
				return nil, errors.New("fakemx: handshake broken on purpose")
			}}
		}
	}

	srv := smtp.NewServer(smtp.BackendFunc(s.newSession))
	srv.Domain = opts.Domain
	srv.MaxRecipients = opts.MaxRecipients
	srv.MaxMessageBytes = opts.MaxMessageBytes
	srv.EnableSMTPUTF8 = opts.SMTPUTF8
	srv.EnableDSN = opts.DSN
	srv.AllowInsecureAuth = true
	srv.ErrorLog = log.New(io.Discard, "", 0)
	// Generous: a test's own deadlines are what should fire, not ours.
	srv.ReadTimeout = time.Minute
	srv.WriteTimeout = time.Minute
	if opts.STARTTLS || opts.BrokenTLS {
		srv.TLSConfig = tlsConf
	}
	s.srv = srv

	addr := opts.Addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("fakemx: listen: %w", err)
	}
	s.addr = ln.Addr().String()
	s.rawLn = ln
	var l net.Listener = &listener{Listener: ln, s: s}
	if opts.ImplicitTLS {
		l = tls.NewListener(l, tlsConf)
	}
	s.ln = l
	go func() { s.serveErr <- srv.Serve(l) }()
	return s, nil
}

// Addr is the host:port the server listens on (127.0.0.1 unless
// Options.Addr says otherwise).
func (s *Server) Addr() string { return s.addr }

// CertPool holds the root of the server's throw-away certificate, for a
// client's RootCAs. Nil when the server has no TLS.
func (s *Server) CertPool() *x509.CertPool { return s.certPool }

// Done is closed when Close starts; blocking hooks should select on it.
func (s *Server) Done() <-chan struct{} { return s.done }

// Close stops the server: it stops accepting, closes every connection,
// releases hooks waiting on Done and waits (up to 10 s, for a hook that
// ignores Done) until every connection goroutine has returned. It is safe
// to call twice.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	_ = s.rawLn.Close() // no new connections from here on
	s.mu.Lock()
	for c := range s.live {
		_ = c.Close()
	}
	s.mu.Unlock()
	close(s.done) // after the connections: a released hook's reply goes nowhere
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx) // closes listeners, waits for go-smtp's conn goroutines
	<-s.serveErr
	s.wg.Wait()
	if errors.Is(err, smtp.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		err = nil // we closed the listener ourselves, first
	}
	if err != nil {
		return fmt.Errorf("fakemx: close: %w", err)
	}
	return nil
}

// Messages returns a copy of every message accepted so far, in order.
func (s *Server) Messages() []Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Message(nil), s.msgs...)
}

// EHLONames returns the EHLO/HELO names heard so far, in order, one per
// session: the first greeting of each connection and the one after
// STARTTLS (so a STARTTLS client shows up twice per connection). A repeated
// EHLO within a session is counted by Resets instead.
func (s *Server) EHLONames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ehlos...)
}

// DropConnections closes every open connection from the server's side, as
// a server does with an idle client; the listener keeps accepting.
func (s *Server) DropConnections() {
	s.mu.Lock()
	conns := make([]net.Conn, 0, len(s.live))
	for c := range s.live {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
	}
}

// PerConnRefused is how many MAIL commands MaxMsgsPerConn refused.
func (s *Server) PerConnRefused() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perConnRefused
}

// Connections is the number of TCP connections accepted so far.
func (s *Server) Connections() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.conns
}

// Transactions is the number of MAIL FROM commands accepted so far.
func (s *Server) Transactions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.txs
}

// Resets is the number of RSET commands (or repeated EHLOs) received so far.
func (s *Server) Resets() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resets
}

// AuthAttempts returns how many AUTH exchanges succeeded and failed.
func (s *Server) AuthAttempts() (ok, failed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.authOK, s.authFail
}

// WaitForMessages waits until at least n messages have been accepted, or
// returns an error after timeout.
func (s *Server) WaitForMessages(n int, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		s.mu.Lock()
		got, ch := len(s.msgs), s.notify
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-ch:
		case <-deadline.C:
			return fmt.Errorf("fakemx: %d of %d messages after %v", got, n, timeout)
		case <-s.done:
			return fmt.Errorf("fakemx: closed with %d of %d messages", got, n)
		}
	}
}

// hook asks SourceHook with the client's address, then Hook.
func (se *session) hook(stage Stage, arg string) *smtp.SMTPError {
	if h := se.s.opts.SourceHook; h != nil {
		if e := h(se.source(), stage, arg); e != nil {
			return e
		}
	}
	return se.s.hook(stage, arg)
}

// source is the client's IP address.
func (se *session) source() string {
	host, _, _ := net.SplitHostPort(se.conn.Conn().RemoteAddr().String())
	return host
}

func (s *Server) hook(stage Stage, arg string) *smtp.SMTPError {
	if s.opts.Hook == nil {
		return nil
	}
	return s.opts.Hook(stage, arg)
}

// listener counts connections, applies the scripted greeting and the EHLO
// mangling options.
type listener struct {
	net.Listener
	s *Server
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		s := l.s
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			continue
		}
		s.conns++
		s.live[c] = struct{}{}
		s.mu.Unlock()
		if tc, ok := c.(*net.TCPConn); ok && s.opts.ReadBuffer > 0 {
			_ = tc.SetReadBuffer(s.opts.ReadBuffer)
		}
		if s.opts.Greeting != "" {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				_, _ = io.WriteString(c, s.opts.Greeting+"\r\n")
				s.mu.Lock()
				delete(s.live, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			continue
		}
		s.mu.Lock()
		num := s.conns
		s.mu.Unlock()
		return &mangleConn{Conn: c, s: s, num: num}, nil
	}
}

// knownExt are the keywords go-smtp's server can advertise; only lines
// starting with one of them are treated as extension lines.
var knownExt = map[string]bool{
	"PIPELINING": true, "8BITMIME": true, "ENHANCEDSTATUSCODES": true, "CHUNKING": true,
	"STARTTLS": true, "AUTH": true, "SMTPUTF8": true, "REQUIRETLS": true, "BINARYMIME": true,
	"DSN": true, "SIZE": true, "LIMITS": true, "RRVS": true, "DELIVERBY": true, "MT-PRIORITY": true,
}

// mangleConn rewrites the server's EHLO reply lines. go-smtp writes (and
// flushes) one reply line per Write, so each Write is inspected alone.
type mangleConn struct {
	net.Conn
	s   *Server
	num int // 1-based connection number
}

// Close forgets the connection in the server's live set.
func (c *mangleConn) Close() error {
	c.s.mu.Lock()
	delete(c.s.live, c.Conn)
	c.s.mu.Unlock()
	return c.Conn.Close()
}

func (c *mangleConn) Write(b []byte) (int, error) {
	o := c.s.opts
	if !o.LowercaseExtensions && len(o.ExtraExtensions) == 0 && len(o.HideExtensions) == 0 {
		return c.Conn.Write(b)
	}
	line := string(b)
	if len(line) < 5 || !strings.HasPrefix(line, "250") || (line[3] != '-' && line[3] != ' ') {
		return c.Conn.Write(b)
	}
	kw, _, _ := strings.Cut(strings.TrimRight(line[4:], "\r\n"), " ")
	if !knownExt[kw] {
		return c.Conn.Write(b)
	}
	out := line
	for _, h := range o.HideExtensions {
		if h == kw {
			out = ""
			if line[3] == ' ' {
				out = "250 X-FAKEMX\r\n"
			}
		}
	}
	if out != "" && o.LowercaseExtensions {
		out = line[:4] + strings.ToLower(line[4:])
	}
	// PIPELINING is always the first extension line go-smtp writes.
	if kw == "PIPELINING" {
		var extra strings.Builder
		for _, e := range o.ExtraExtensions {
			if o.LowercaseExtensions {
				e = strings.ToLower(e)
			}
			extra.WriteString("250-" + e + "\r\n")
		}
		out = extra.String() + out
	}
	if _, err := io.WriteString(c.Conn, out); err != nil {
		return 0, err
	}
	return len(b), nil
}

// session is one go-smtp session: from an EHLO to the next STARTTLS or the
// end of the connection.
type session struct {
	s        *Server
	conn     *smtp.Conn
	connNum  int
	authUser string
	from     string
	mailOpts smtp.MailOptions
	rcpts    []string
	rcptOpts []smtp.RcptOptions
	// afterData is set by Data so that the reset go-smtp runs after every
	// DATA is not counted as an RSET.
	afterData bool
	taken     int // messages accepted on this connection
}

func (s *Server) newSession(c *smtp.Conn) (smtp.Session, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ehlos = append(s.ehlos, c.Hostname())
	return &session{s: s, conn: c, connNum: connNumber(c.Conn())}, nil
}

// connNumber digs our mangleConn out from under any TLS layers.
func connNumber(c net.Conn) int {
	for {
		switch v := c.(type) {
		case *mangleConn:
			return v.num
		case *tls.Conn:
			c = v.NetConn()
		default:
			return 0
		}
	}
}

func (se *session) hangUp() *smtp.SMTPError {
	_ = se.conn.Conn().Close()
	return Drop
}

func (se *session) Mail(from string, opts *smtp.MailOptions) error {
	if se.s.opts.RequireAuth && se.authUser == "" {
		return smtp.ErrAuthRequired
	}
	if e := se.hook(StageMail, from); e != nil {
		if e == Drop {
			return se.hangUp()
		}
		return e
	}
	if n := se.s.opts.MaxMsgsPerConn; n > 0 && se.taken >= n {
		reply := se.s.opts.MaxMsgsReply
		if reply == "" {
			reply = "421 Max message per connection reached, closing transmission channel"
		}
		se.s.mu.Lock()
		se.s.perConnRefused++
		se.s.mu.Unlock()
		_, _ = se.conn.Conn().Write([]byte(reply + "\r\n"))
		return se.hangUp()
	}
	se.from = from
	se.rcpts, se.rcptOpts = nil, nil
	se.mailOpts = smtp.MailOptions{}
	if opts != nil {
		se.mailOpts = *opts
	}
	se.s.mu.Lock()
	se.s.txs++
	se.s.mu.Unlock()
	return nil
}

func (se *session) Rcpt(to string, opts *smtp.RcptOptions) error {
	if e := se.hook(StageRcpt, to); e != nil {
		if e == Drop {
			return se.hangUp()
		}
		return e
	}
	se.rcpts = append(se.rcpts, to)
	var o smtp.RcptOptions
	if opts != nil {
		o = *opts
	}
	se.rcptOpts = append(se.rcptOpts, o)
	return nil
}

func (se *session) Data(r io.Reader) error {
	se.afterData = true
	if e := se.hook(StageBody, ""); e != nil {
		if e == Drop {
			return se.hangUp()
		}
		return e
	}
	data, err := io.ReadAll(r)
	if err != nil {
		// go-smtp turns a too-big body into its own SMTPError (552);
		// return it bare so the code survives.
		var se *smtp.SMTPError
		if errors.As(err, &se) {
			return se
		}
		return err
	}
	if e := se.hook(StageDot, strings.Join(se.rcpts, ",")); e != nil {
		if e == Drop {
			return se.hangUp()
		}
		return e
	}
	_, isTLS := se.conn.TLSConnectionState()
	m := Message{
		From: se.from, Rcpts: append([]string(nil), se.rcpts...), Data: data,
		Hostname: se.conn.Hostname(), TLS: isTLS, Conn: se.connNum,
		Body: se.mailOpts.Body, UTF8: se.mailOpts.UTF8, Size: se.mailOpts.Size, AuthUser: se.authUser,
		Ret: se.mailOpts.Return, EnvID: se.mailOpts.EnvelopeID, RcptOpts: append([]smtp.RcptOptions(nil), se.rcptOpts...),
		Source: se.source(),
	}
	se.s.mu.Lock()
	se.s.msgs = append(se.s.msgs, m)
	se.taken++
	close(se.s.notify)
	se.s.notify = make(chan struct{})
	se.s.mu.Unlock()
	return nil
}

func (se *session) Reset() {
	se.from, se.rcpts, se.rcptOpts = "", nil, nil
	if se.afterData {
		se.afterData = false
		return
	}
	se.s.mu.Lock()
	se.s.resets++
	se.s.mu.Unlock()
}

func (se *session) Logout() error { return nil }

// AuthMechanisms implements smtp.AuthSession.
func (se *session) AuthMechanisms() []string {
	if len(se.s.opts.Users) == 0 {
		return nil
	}
	if len(se.s.opts.AuthMechs) > 0 {
		return se.s.opts.AuthMechs
	}
	return []string{sasl.Plain, sasl.Login}
}

// Auth implements smtp.AuthSession. Failures return smtp.ErrAuthFailed
// itself: any other error would reach the client as a temporary 454.
func (se *session) Auth(mech string) (sasl.Server, error) {
	check := func(user, pass string) error {
		want, ok := se.s.opts.Users[user]
		se.s.mu.Lock()
		defer se.s.mu.Unlock()
		if !ok || want != pass {
			se.s.authFail++
			return smtp.ErrAuthFailed
		}
		se.s.authOK++
		se.authUser = user
		return nil
	}
	switch mech {
	case sasl.Plain:
		return sasl.NewPlainServer(func(identity, user, pass string) error {
			if identity != "" && identity != user {
				return smtp.ErrAuthFailed
			}
			return check(user, pass)
		}), nil
	case sasl.Login:
		return &loginServer{check: check}, nil
	}
	return nil, smtp.ErrAuthUnknownMechanism
}

// loginServer is the server side of the obsolete LOGIN mechanism
// (draft-murchison-sasl-login): "Username:" and "Password:" challenges,
// with the username optionally sent as an initial response.
type loginServer struct {
	check func(user, pass string) error
	user  *string
	step  int
}

func (l *loginServer) Next(resp []byte) ([]byte, bool, error) {
	switch {
	case l.user == nil && resp == nil && l.step == 0:
		l.step++
		return []byte("Username:"), false, nil
	case l.user == nil:
		u := string(resp)
		l.user = &u
		return []byte("Password:"), false, nil
	default:
		return nil, true, l.check(*l.user, string(resp))
	}
}
