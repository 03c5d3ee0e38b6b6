package bounce

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"iter"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/nats-io/nuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/ascii"
	"github.com/outflow/outflow/internal/clientaddr"
	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/queue"
)

// Defaults of Config's numeric settings.
const (
	// DefaultMaxMessageBytes is how much of a received message is kept
	// and read: a DSN or an ARF report puts its status part before the
	// copy of the original it may carry, and this is plenty for those.
	// A longer report is taken (up to acceptBytes), its tail discarded.
	DefaultMaxMessageBytes = 2 << 20
	// acceptBytes is the largest message taken at all: a report that
	// returns a whole original (RET=FULL, a feedback loop's copy) can be as
	// large as the mail outflow sends, and refusing it with 552 lost the
	// bounce or the complaint for good.
	acceptBytes = 64 << 20
	// DefaultMaxConnections bounds concurrent connections; more are
	// answered 421.
	DefaultMaxConnections = 100
	// DefaultMaxClientConnections bounds concurrent connections from one
	// client (an IPv4 address or an IPv6 /64), so that one host holding
	// connections open cannot keep every other reporting server out.
	DefaultMaxClientConnections = 10
	// DefaultMaxRecipients bounds RCPT commands per transaction: a report
	// goes to one return path.
	DefaultMaxRecipients = 10
	// DefaultTimeout is the idle time allowed between commands and for
	// the message's data.
	DefaultTimeout = 5 * time.Minute
	// DefaultRecordTimeout bounds recording one message (reading the
	// envelopes' events, storing the outcomes); past it the sender is
	// answered 451.
	DefaultRecordTimeout = 30 * time.Second
)

// Config configures a Server.
type Config struct {
	// Addr is the listening address, e.g. ":25" behind the return-path
	// domains' MX record. Required.
	Addr string
	// Hostname is the name in the greeting and in EHLO's reply.
	Hostname string
	// ID names the listener in the events it records (their worker_id).
	ID string
	// ReturnPath recognises the addresses bounces come back to. Required.
	ReturnPath *ReturnPath
	// Store reads envelopes' events and records outcomes. Required.
	Store Store
	// Suppressions receives recipients that hard-bounced or complained;
	// nil keeps no list.
	Suppressions Suppressor
	// Postmaster, when set, is the address that mail to postmaster@ and
	// abuse@ the return-path domains is forwarded to (RoleLocals), through
	// Forwarder, from the null sender; unset, those are refused like any
	// address that is not a return path.
	Postmaster string
	// Forwarder stores a forwarded message for delivery (serve's enqueue
	// path); required with Postmaster.
	Forwarder Forwarder
	// Notifier, when set, tells the senders of delivered envelopes about
	// their recipients' later bounces (a failure notice through the
	// queue, stored before the 250) where the delivered events say one
	// is owed (queue.Event.Notify); nil records bounces only.
	Notifier Notifier
	// Classifier judges a bounce's diagnostic (default classify.Default()).
	Classifier *classify.Classifier
	// TLSConfig, when set, offers STARTTLS.
	TLSConfig *tls.Config
	// The limits, each defaulting to its Default constant.
	MaxMessageBytes      int64
	MaxConnections       int
	MaxClientConnections int
	MaxRecipients        int
	Timeout              time.Duration
	RecordTimeout        time.Duration
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	Logger     zerolog.Logger
}

// Forwarder stores a message for delivery: the queue, through serve's
// enqueue path.
type Forwarder interface {
	Enqueue(ctx context.Context, s *queue.Submission) ([]string, error)
}

// ForwardTenant is the tenant forwarded postmaster and abuse mail is
// accounted to, a name reserved from accounts and API keys.
const ForwardTenant = queue.PostmasterTenant

// maxHops bounds the Received fields of a message forwarded to the
// postmaster: more mean a loop (RFC 5321 6.3), refused with 554 5.4.6.
const maxHops = 50

// Server is the bounce listener: an SMTP server that takes mail for the
// return-path addresses only and records what the reports in it say.
type Server struct {
	cfg     Config
	srv     *smtp.Server
	log     zerolog.Logger
	results *prometheus.CounterVec // outflow_bounces_received_total{result}

	mu      sync.Mutex
	conns   int
	clients map[netip.Prefix]int // open connections per client
}

// ref is one return path a message was addressed to.
type ref struct {
	id string
	at time.Time
}

// New checks cfg and returns a Server; Listen and Serve start it.
func New(cfg Config) (*Server, error) {
	if cfg.Addr == "" || cfg.ReturnPath == nil || cfg.Store == nil {
		return nil, errors.New("bounce: address, return path and store are required")
	}
	if cfg.Postmaster != "" && cfg.Forwarder == nil {
		return nil, errors.New("bounce: a postmaster address needs a forwarder")
	}
	if at := strings.LastIndexByte(cfg.Postmaster, '@'); at >= 0 && cfg.ReturnPath.HasDomain(cfg.Postmaster[at+1:]) {
		return nil, fmt.Errorf("bounce: postmaster address %s is at a return-path domain, whose mail this listener takes (a loop, or a refusal); name a mailbox elsewhere", cfg.Postmaster)
	}
	defaults.Set(&cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	defaults.Set(&cfg.MaxConnections, DefaultMaxConnections)
	defaults.Set(&cfg.MaxClientConnections, DefaultMaxClientConnections)
	defaults.Set(&cfg.MaxRecipients, DefaultMaxRecipients)
	defaults.Set(&cfg.Timeout, DefaultTimeout)
	defaults.Set(&cfg.RecordTimeout, DefaultRecordTimeout)
	if cfg.Classifier == nil {
		cfg.Classifier = classify.Default()
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With().Str("component", "bounce").Logger(), clients: map[netip.Prefix]int{}}
	s.results = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outflow_bounces_received_total",
		Help: "Messages received at the return path, by what became of them; refused counts RCPTs to other addresses.",
	}, []string{"result"})
	for _, r := range []string{ResultBounced, ResultComplaint, ResultNoFailure, ResultUnparsed, ResultMalformed,
		ResultUnknownMsg, ResultUnmatched, ResultRefused, ResultForwarded, ResultLoop} {
		s.results.WithLabelValues(r)
	}
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(s.results); err != nil {
			return nil, err
		}
	}
	srv := smtp.NewServer(backend{s})
	srv.Addr = cfg.Addr
	srv.Domain = cfg.Hostname
	srv.ReadTimeout, srv.WriteTimeout = cfg.Timeout, cfg.Timeout
	srv.MaxMessageBytes = max(acceptBytes, cfg.MaxMessageBytes)
	srv.MaxRecipients = cfg.MaxRecipients
	// A returned original's header lines can be longer than RFC 5322's
	// 998 (go-smtp's 2,000 was a 554 to the reporting server, a permanent
	// refusal of the report); a command line as long only costs memory.
	srv.MaxLineLength = 64 << 10
	srv.TLSConfig = cfg.TLSConfig
	srv.EnableSMTPUTF8 = true // RFC 6533 reports come from servers that speak it
	// A relaying server may pass a report on with its DSN parameters
	// (ENVID, RET); without DSN go-smtp refuses them with 504. They are
	// read and ignored: nothing is ever sent back.
	srv.EnableDSN = true
	s.srv = srv
	return s, nil
}

// Listen opens the listening socket, so that serve can report a taken
// port before it starts anything else.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, err
	}
	return &limitListener{Listener: ln, s: s}, nil
}

// Serve answers connections on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	err := s.srv.Serve(ln)
	if errors.Is(err, smtp.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown stops accepting connections and waits for those open to end
// (or ctx).
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.Shutdown(ctx) }

// limitListener answers connections beyond MaxConnections, or beyond
// MaxClientConnections from one client, with 421: the reporting server
// tries again later.
type limitListener struct {
	net.Listener
	s *Server
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client := clientaddr.Of(c.RemoteAddr())
		l.s.mu.Lock()
		reply := ""
		switch {
		case l.s.conns >= l.s.cfg.MaxConnections:
			reply = "421 4.7.0 Too many connections, try again later\r\n"
		case l.s.clients[client] >= l.s.cfg.MaxClientConnections:
			reply = "421 4.7.0 Too many connections from your address, try again later\r\n"
		default:
			l.s.conns++
			l.s.clients[client]++
		}
		l.s.mu.Unlock()
		if reply == "" {
			return &countedConn{Conn: c, s: l.s, client: client}, nil
		}
		_ = c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c, reply)
		_ = c.Close()
	}
}

type countedConn struct {
	net.Conn
	s      *Server
	client netip.Prefix
	once   sync.Once
}

func (c *countedConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		c.s.conns--
		if c.s.clients[c.client]--; c.s.clients[c.client] <= 0 {
			delete(c.s.clients, c.client)
		}
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}

type backend struct{ s *Server }

func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return &session{s: b.s, conn: c}, nil
}

// session is one connection's transaction: the return paths its RCPTs
// named.
type session struct {
	s    *Server
	conn *smtp.Conn
	refs []ref
	fbl  bool     // addressed to a feedback-loop address
	role []string // the postmaster and abuse addresses it was addressed to
	from string   // its MAIL FROM, for a forward's trace
	// truncated: the message was longer than MaxMessageBytes and only
	// its start was kept (Data).
	truncated bool
}

func (ss *session) Reset() {
	ss.refs, ss.fbl, ss.role, ss.from, ss.truncated = nil, false, nil, "", false
}
func (ss *session) Logout() error { return nil }

// Mail takes any reverse path: reports come from the null sender or from
// a postmaster, and nothing is ever sent back to it.
func (ss *session) Mail(from string, _ *smtp.MailOptions) error {
	ss.from = from
	return nil
}

var errNoSuchUser = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1},
	Message: "No such user here: this server takes bounces for outflow's return paths only"}

// Rcpt takes a return-path address of this fleet, and the feedback-loop
// address of a return-path domain, and refuses any other: the listener
// relays nothing and has no mailboxes.
func (ss *session) Rcpt(to string, _ *smtp.RcptOptions) error {
	if ss.s.cfg.Postmaster != "" && ss.s.cfg.ReturnPath.IsRoleAddress(to) {
		ss.role = append(ss.role, to)
		return nil
	}
	if ss.s.cfg.ReturnPath.IsFeedbackAddress(to) {
		ss.fbl = true
		return nil
	}
	id, at, ok := ss.s.cfg.ReturnPath.Check(to)
	if !ok {
		ss.s.results.WithLabelValues(ResultRefused).Inc()
		return errNoSuchUser
	}
	for _, r := range ss.refs {
		if r.id == id {
			return nil
		}
	}
	ss.refs = append(ss.refs, ref{id: id, at: at})
	return nil
}

var errTooBig = &smtp.SMTPError{Code: 552, EnhancedCode: smtp.EnhancedCode{5, 3, 4}, Message: "Report too big"}

// Data reads the message and records it before the 250: a report
// answered 250 is not asked for again. A failure to record is a 451, and
// the reporting server sends it again later.
func (ss *session) Data(r io.Reader) error {
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(r, ss.s.cfg.MaxMessageBytes+1))
	if err == nil && n > ss.s.cfg.MaxMessageBytes {
		// The report's tail, the copy of the original, is not read: only
		// a message for postmaster@ or abuse@ alone, forwarded whole or
		// not at all, is refused for its size.
		buf.Truncate(int(ss.s.cfg.MaxMessageBytes))
		_, err = io.Copy(io.Discard, r)
		if err == nil && len(ss.refs) == 0 && !ss.fbl {
			return errTooBig
		}
		ss.truncated = true
	}
	if err != nil {
		var se *smtp.SMTPError
		if errors.As(err, &se) {
			return se
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), ss.s.cfg.RecordTimeout)
	defer cancel()
	if len(ss.role) > 0 && !ss.truncated {
		if err := ss.forward(ctx, buf.Bytes()); err != nil {
			return err
		}
		if len(ss.refs) == 0 && !ss.fbl {
			return nil
		}
	} else if len(ss.role) > 0 {
		ss.s.log.Warn().Strs("rcpts", ss.role).Int64("bytes_kept", ss.s.cfg.MaxMessageBytes).
			Msg("a report over the size kept, also addressed to postmaster or abuse: recorded, not forwarded")
	}
	result, err := ss.s.record(ctx, ss.refs, ss.fbl, buf.Bytes())
	var u *unreadable
	if errors.As(err, &u) && len(ss.role) > 0 {
		return nil // not a report, but a person's mail the postmaster has
	}
	if errors.As(err, &u) {
		ss.s.results.WithLabelValues(u.result).Inc()
		ss.s.log.Info().Err(u.err).Int("bytes", buf.Len()).Str("result", u.result).Msg("message at the return path refused")
		return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 6, 0},
			Message: "Not accepted: " + oneLine(u.err.Error(), 200) + "; this address takes bounce reports only"}
	}
	if err != nil {
		ss.s.log.Warn().Err(err).Msg("received report not recorded; answered 451")
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Cannot record the report now, try again later"}
	}
	ss.s.results.WithLabelValues(result).Inc()
	return nil
}

// forward stores msg for delivery to the postmaster, stored before the
// 250 like any submission (a failure is a 451). It goes as an attachment
// (message/rfc822) of a message outflow writes, not as itself: the
// original's From is anybody's, and sent as it came it would be signed
// with the key of whatever domain it names. It goes from the null sender,
// so a postmaster address that bounces cannot start a loop, and under an
// idempotency key of its bytes, so the sender's retry of a transaction
// answered 451 after the forward was stored forwards nothing twice.
func (ss *session) forward(ctx context.Context, msg []byte) error {
	if hops := countReceived(msg); hops > maxHops {
		ss.s.results.WithLabelValues(ResultLoop).Inc()
		ss.s.log.Warn().Int("hops", hops).Strs("rcpts", ss.role).Msg("mail to the postmaster refused: a loop")
		return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 4, 6}, Message: "Too many hops: a mail loop"}
	}
	helo, from, lit := "unknown", "unknown", "unknown"
	if ss.conn != nil {
		helo = ss.conn.Hostname()
		from = ss.conn.Conn().RemoteAddr().String()
		lit = traceAddr(ss.conn.Conn().RemoteAddr())
	}
	now := time.Now()
	body := wrapForward(forwardInfo{hostname: ss.s.cfg.Hostname, postmaster: ss.s.cfg.Postmaster, to: ss.role,
		envFrom: ss.from, helo: helo, client: lit, at: now}, msg)
	sum := sha256.Sum256(msg)
	ids, err := ss.s.cfg.Forwarder.Enqueue(ctx, &queue.Submission{Tenant: ForwardTenant, Rcpts: []string{ss.s.cfg.Postmaster},
		Body: body, ReceivedAt: now, RemoteAddr: from, Source: queue.SourceSMTP, IsReport: true,
		IdempotencyKey: "forward:" + hex.EncodeToString(sum[:])})
	if err != nil {
		ss.s.log.Warn().Err(err).Strs("rcpts", ss.role).Msg("mail to the postmaster not stored; answered 451")
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Cannot take the message now, try again later"}
	}
	ss.s.results.WithLabelValues(ResultForwarded).Inc()
	ss.s.log.Info().Strs("rcpts", ss.role).Str("postmaster", ss.s.cfg.Postmaster).Strs("ids", ids).Str("client", from).
		Str("mail_from", ss.from).Int("bytes", len(msg)).Msg("mail to the postmaster forwarded")
	return nil
}

// forwardInfo is what the forwarding message says of the forwarded one.
type forwardInfo struct {
	hostname, postmaster string
	to                   []string // the role addresses it was sent to
	envFrom, helo        string   // its MAIL FROM and the client's EHLO name
	client               string   // the client's address, as traceAddr writes it
	at                   time.Time
}

// traceAddr is the client's address as the Received field of a submission
// gives it (submission's appendReceived; RFC 5321 4.4 TCP-info, an address
// literal of 4.1.3): [192.0.2.1] or [IPv6:2001:db8::1], an IPv4-mapped
// address unmapped, without the port or a zone; "unknown" when a holds no
// address. RemoteAddr().String() wrote "[::1]:32908", a port and no tag.
func traceAddr(a net.Addr) string {
	var ip netip.Addr
	if ta, ok := a.(*net.TCPAddr); ok {
		ip = ta.AddrPort().Addr()
	} else if a != nil {
		if ap, err := netip.ParseAddrPort(a.String()); err == nil {
			ip = ap.Addr()
		}
	}
	switch ip = ip.Unmap().WithZone(""); {
	case !ip.IsValid():
		return "unknown"
	case ip.Is4():
		return "[" + ip.String() + "]"
	}
	return "[IPv6:" + ip.String() + "]"
}

// wrapForward writes the message that carries msg to the postmaster: a
// trace field, then msg's own trace fields (so that a forward that comes
// back counts every hop it made, and a loop ends at maxHops), its own
// header, a line saying what came from where, and msg itself as a
// message/rfc822 part, unchanged. What the client said of itself (its EHLO
// name, its MAIL FROM) is written in ASCII without parentheses, so that
// it can neither break the trace field's comment nor ask the
// postmaster's server for SMTPUTF8.
func wrapForward(f forwardInfo, msg []byte) []byte {
	boundary := "=_fwd_" + nuid.Next()
	for bytes.Contains(msg, []byte(boundary)) {
		boundary = "=_fwd_" + nuid.Next()
	}
	date := f.at.Format(time.RFC1123Z)
	envFrom := "<" + traceSafe(f.envFrom, 300) + ">"
	helo := traceSafe(f.helo, 100)
	eight := !ascii.Is(msg)
	var b bytes.Buffer
	b.Grow(len(msg) + 2048)
	fmt.Fprintf(&b, "Received: from %s (%s)\r\n\tby %s (outflow bounce listener)\r\n\tfor <%s> (envelope-from %s);\r\n\t%s\r\n",
		helo, f.client, f.hostname, f.to[0], envFrom, date)
	b.Write(traceFields(msg))
	fmt.Fprintf(&b, "From: outflow bounce listener <MAILER-DAEMON@%s>\r\n", f.hostname)
	fmt.Fprintf(&b, "To: <%s>\r\n", f.postmaster)
	fmt.Fprintf(&b, "Subject: Mail to %s\r\n", strings.Join(f.to, ", "))
	fmt.Fprintf(&b, "Date: %s\r\n", date)
	fmt.Fprintf(&b, "Message-ID: <%s.fwd@%s>\r\n", nuid.Next(), f.hostname)
	b.WriteString("Auto-Submitted: auto-forwarded\r\nMIME-Version: 1.0\r\n")
	fmt.Fprintf(&b, "Content-Type: multipart/mixed; boundary=\"%s\"\r\n", boundary)
	if eight {
		// RFC 2045 6.4: a multipart is labelled with the widest
		// encoding of its parts.
		b.WriteString("Content-Transfer-Encoding: 8bit\r\n")
	}
	fmt.Fprintf(&b, "\r\n--%s\r\nContent-Type: text/plain; charset=us-ascii\r\n\r\n", boundary)
	fmt.Fprintf(&b, "The message attached was sent to %s\r\nfrom %s by %s (%s) on %s,\r\nand is forwarded as received.\r\n",
		strings.Join(f.to, ", "), envFrom, helo, f.client, date)
	fmt.Fprintf(&b, "\r\n--%s\r\nContent-Type: message/rfc822\r\n", boundary)
	if eight {
		b.WriteString("Content-Transfer-Encoding: 8bit\r\n")
	}
	b.WriteString("\r\n")
	b.Write(msg)
	if !bytes.HasSuffix(msg, []byte("\r\n")) {
		b.WriteString("\r\n")
	}
	fmt.Fprintf(&b, "\r\n--%s--\r\n", boundary)
	return b.Bytes()
}

// traceSafe is s on one line of at most n bytes, in printable ASCII
// without parentheses: anything else becomes '?'.
func traceSafe(s string, n int) string {
	b := []byte(oneLine(s, n))
	for i, c := range b {
		if c < 0x20 || c >= 0x7f || c == '(' || c == ')' {
			b[i] = '?'
		}
	}
	return string(b)
}

// traceFields is the Received fields of msg's header, with their folded
// lines, in their order, each ending in CRLF.
func traceFields(msg []byte) []byte {
	var out []byte
	in := false
	for line := range headerLines(msg) {
		if line[0] != ' ' && line[0] != '\t' {
			in = isReceived(line)
		}
		if in {
			out = append(append(out, line...), '\r', '\n')
		}
	}
	return out
}

// countReceived counts the Received fields in msg's header.
func countReceived(msg []byte) int {
	n := 0
	for line := range headerLines(msg) {
		if isReceived(line) {
			n++
		}
	}
	return n
}

func isReceived(line []byte) bool {
	return len(line) > 9 && bytes.EqualFold(line[:9], []byte("received:"))
}

// headerLines yields the lines of msg's header, up to the empty line
// that ends it, without their line ends (CRLF or a bare LF).
func headerLines(msg []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for rest := msg; len(rest) > 0; {
			line := rest
			if i := bytes.IndexByte(rest, '\n'); i >= 0 {
				line, rest = rest[:i], rest[i+1:]
			} else {
				rest = nil
			}
			line = bytes.TrimRight(line, "\r")
			if len(line) == 0 || !yield(line) {
				return
			}
		}
	}
}

// oneLine is s on one line of at most n bytes, for a reply's text.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n]
	}
	return s
}
