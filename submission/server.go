package submission

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/internal/membudget"
	"github.com/outflow/outflow/queue"
)

// Defaults applied by New to zero-valued Config fields.
const (
	DefaultAddr            = "127.0.0.1:2525"
	DefaultMaxMessageBytes = 25 << 20 // 25 MiB
	DefaultMaxRecipients   = 1000
	DefaultMaxConnections  = 1000
	// DefaultMaxClientConnections is a quarter of DefaultMaxConnections:
	// one address cannot take every connection, and a cluster of
	// applications behind one NAT address still has room. Postfix's
	// smtpd_client_connection_count_limit is 50, for strangers on port 25.
	DefaultMaxClientConnections = 250
	// DefaultMaxLineLength is RFC 5321 section 4.5.3.1.6: a text line is at
	// most 1000 octets including the CRLF.
	DefaultMaxLineLength = 1000
	// DefaultReadTimeout is RFC 5321 section 4.5.3.2.7: a server should wait
	// at least 5 minutes for the next command.
	DefaultReadTimeout = 5 * time.Minute
	// DefaultAuthTimeout: a submission client authenticates at once
	// (RFC 6409 4.3); two minutes leave room for a slow TLS handshake.
	DefaultAuthTimeout  = 2 * time.Minute
	DefaultWriteTimeout = time.Minute
	// DefaultDataTimeout bounds the whole DATA body, whatever the pace of the
	// client; 10 minutes mirrors RFC 5321 section 4.5.3.2.6.
	DefaultDataTimeout    = 10 * time.Minute
	DefaultAuthFailLimit  = 5
	DefaultAuthFailWindow = 10 * time.Minute
	DefaultEnqueueTimeout = 30 * time.Second
)

// TrustedTenant is the tenant of messages submitted without AUTH from one of
// Config.TrustedNetworks.
const TrustedTenant = "trusted"

// ErrServerClosed is returned by Serve and Shutdown when the server was
// already shut down.
var ErrServerClosed = errors.New("submission: server closed")

// Enqueuer stores an accepted submission. Enqueue returns nil only once the
// submission is durably stored (JetStream acknowledged it); the listener
// answers 250 only then, and 451 on any error. The context carries
// Config.EnqueueTimeout. Once Enqueue has returned nil, nothing it started
// may still refer to s.Body or s.Frame: the listener reuses that buffer
// for a later message.
type Enqueuer interface {
	Enqueue(ctx context.Context, s *queue.Submission) (ids []string, err error)
}

// Config configures a Server. Zero values take the documented default.
type Config struct {
	// Addr is the TCP address Listen binds.
	// Default "127.0.0.1:2525".
	Addr string
	// Hostname is the name in the greeting and in the Received header.
	// Default: os.Hostname(), or "localhost" if that fails.
	Hostname string
	// Users holds the accounts AUTH checks. Nil disables AUTH; then only
	// TrustedNetworks can submit, and New fails if that is empty too.
	Users *Users
	// TrustedNetworks are client networks that may submit without AUTH,
	// like Postfix's mynetworks; their tenant is TrustedTenant. Default none.
	// An IPv4-mapped prefix (::ffff:127.0.0.0/104) is the IPv4 prefix it
	// maps (127.0.0.0/8), as clients are compared by their IPv4 address.
	TrustedNetworks []netip.Prefix
	// TLSConfig enables STARTTLS (RFC 3207). Without it, AUTH is offered
	// only to loopback clients, because the password would cross the
	// network in clear text. Default nil.
	TLSConfig *tls.Config
	// MaxMessageBytes is the largest message body accepted, in bytes, as
	// sent by the client (the Received header we add is not counted).
	// Advertised with SIZE (RFC 1870). Default DefaultMaxMessageBytes.
	MaxMessageBytes int64
	// MaxRecipients is the most RCPT TO accepted per message; RFC 5321
	// section 4.5.3.1.8 asks for at least 100. Default DefaultMaxRecipients.
	MaxRecipients int
	// MaxConnections is the most simultaneous client connections; the next
	// one is told 421 and closed. Default DefaultMaxConnections.
	MaxConnections int
	// MaxClientConnections is the most simultaneous connections from one
	// client (an IPv4 address, or an IPv6 /64), so that one client cannot
	// take every connection; the next one is told 421 and closed. Trusted
	// networks' clients are not limited. Default
	// DefaultMaxClientConnections; negative: no limit.
	MaxClientConnections int
	// MaxLineLength is the longest message line accepted, in octets
	// including the CRLF. Default DefaultMaxLineLength (RFC 5321 section
	// 4.5.3.1.6).
	// Command lines, and body lines longer than twice this, close the
	// connection (go-smtp's own limit, set to twice this value).
	MaxLineLength int
	// ReadTimeout is how long the server waits for each command line, and
	// for each read of the message body. Default DefaultReadTimeout.
	ReadTimeout time.Duration
	// WriteTimeout bounds each reply write. Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// DataTimeout bounds the whole message body after DATA, so a client
	// that trickles bytes cannot hold a connection forever. Default
	// DefaultDataTimeout.
	DataTimeout time.Duration
	// AuthFailLimit is how many failed AUTH attempts one client address
	// (an IPv4 address or an IPv6 /64) may make within AuthFailWindow;
	// after that every AUTH from it gets 421 4.7.0 and its connection is
	// closed until the window ends. A client of TrustedNetworks has the
	// limit per account it tries: an AUTH as that account gets the 421
	// (session.authKey). Default DefaultAuthFailLimit.
	AuthFailLimit int
	// AuthFailWindow is the period over which AUTH failures are counted,
	// from the first failure. Default DefaultAuthFailWindow.
	AuthFailWindow time.Duration
	// AuthTimeout is how long a client that must authenticate (not of
	// TrustedNetworks) may stay connected without doing so; then, at its
	// next command, 421 4.7.0 and the connection ends. Default
	// DefaultAuthTimeout; negative: no limit.
	AuthTimeout time.Duration
	// EnqueueTimeout bounds Enqueuer.Enqueue; past it the client gets 451.
	// Default DefaultEnqueueTimeout.
	EnqueueTimeout time.Duration
	// MaxInflightBytes bounds, process-wide, the memory the message
	// bodies being received and stored may hold: each transaction is
	// charged twice the body octets it holds, a read chunk at a time as
	// the body arrives (a declared SIZE is checked at MAIL FROM, not
	// charged), and one that finds no room within InflightWait is refused
	// with 452 4.3.1, nothing queued (inflight.go). Default
	// DefaultMaxInflightBytes; negative: no bound.
	MaxInflightBytes int64
	// TenantInflightBytes is the most of MaxInflightBytes one tenant's
	// transactions may hold, so that one tenant's large messages cannot
	// take it all. Default half of MaxInflightBytes.
	TenantInflightBytes int64
	// InflightWait is how long a transaction waits for room under
	// MaxInflightBytes before it is refused. Default DefaultInflightWait.
	InflightWait time.Duration
	// Suppressions, when set, refuses recipients on their tenant's
	// suppression list at RCPT (550 5.7.1). Default nil: no list.
	Suppressions Suppressor
	// Quota, when set, counts each accepted recipient against its
	// tenant's sending limit at RCPT (452 4.4.5 past it). Default nil: no
	// limits.
	Quota Quota
	// SenderDomains limits the domains a tenant may send as: MAIL FROM
	// (553 5.7.1) and the From field (550 5.7.1 after DATA). Nil, or a
	// tenant it does not name: any domain.
	SenderDomains SenderDomains
	// Registerer receives the Prometheus collectors (see metrics.go).
	// Nil: metrics are kept but not registered.
	Registerer prometheus.Registerer
	// Logger receives one JSON line per accepted message, per rejection and
	// per AUTH outcome. Credentials are never logged.
	Logger zerolog.Logger
}

// Server is the submission listener. Create it with New.
type Server struct {
	cfg Config
	q   Enqueuer
	// accounts is what AUTH checks: cfg.Users, or the file read again
	// since (SetUsers). Nil when AUTH is off.
	accounts atomic.Pointer[Users]
	log      zerolog.Logger
	metrics  *metrics
	smtp     *smtp.Server
	limiter  *authLimiter
	// stressAuth is a new connection's limit to authenticate by while
	// the listener is under stress (stressAuthTimeout; tests shorten it).
	// Read under mu (admit).
	stressAuth time.Duration
	// inflight bounds the memory of the bodies in flight; nil: no bound
	// (inflight.go).
	inflight *membudget.Budget

	errLineTooLong *smtp.SMTPError // names the configured limit

	// bcryptSem bounds concurrent bcrypt comparisons (each ~50 ms of CPU at
	// the default cost) so AUTH floods cannot starve the process.
	bcryptSem chan struct{}

	// isLoopback decides whether a client address is local; tests replace
	// it to exercise the non-loopback rules over 127.0.0.1.
	isLoopback func(netip.Addr) bool

	// baseCtx is the parent of every Enqueue context; cancelled when a
	// Shutdown runs out of time.
	baseCtx context.Context
	cancel  context.CancelFunc

	mu        sync.Mutex
	draining  bool // guarded by mu; set once by Shutdown
	addr      net.Addr
	conns     map[*trackedConn]struct{}
	perClient map[netip.Prefix]int // connections by clientaddr.Prefix, untrusted clients only
	// listeners are those Serve is serving, closed by Shutdown itself:
	// go-smtp closes only the listeners its Serve had registered when its
	// Shutdown ran, and a Serve that registers one after that accepts on
	// it for ever.
	listeners map[net.Listener]struct{}

	closing atomic.Bool // fast path for sessions; mirrors draining

	// plainData reads DATA bodies through go-smtp's own reader instead of
	// dotReader; tests set it to compare the two.
	plainData bool

	// serving, when set, is called by Serve between taking its listener
	// on and handing it to go-smtp; tests hold Serve there to race it
	// with Shutdown.
	serving func()
	// listenersClosed, when set, is called by Shutdown after it closed the
	// listeners and before go-smtp's own Shutdown; tests run a Serve to
	// its end there.
	listenersClosed func()
}

// New checks cfg, applies defaults and returns a Server that hands accepted
// messages to q.
func New(cfg Config, q Enqueuer) (*Server, error) {
	if q == nil {
		return nil, errors.New("submission: nil Enqueuer")
	}
	if cfg.Users == nil && len(cfg.TrustedNetworks) == 0 {
		return nil, errors.New("submission: no Users and no TrustedNetworks: nobody could submit")
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Hostname == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "localhost"
		}
		cfg.Hostname = h
	}
	defaults.Set(&cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	defaults.Set(&cfg.MaxRecipients, DefaultMaxRecipients)
	defaults.Set(&cfg.MaxConnections, DefaultMaxConnections)
	if cfg.MaxClientConnections == 0 { // negative: no limit
		cfg.MaxClientConnections = DefaultMaxClientConnections
	}
	defaults.Set(&cfg.MaxLineLength, DefaultMaxLineLength)
	defaults.Set(&cfg.ReadTimeout, DefaultReadTimeout)
	defaults.Set(&cfg.WriteTimeout, DefaultWriteTimeout)
	defaults.Set(&cfg.DataTimeout, DefaultDataTimeout)
	defaults.Set(&cfg.AuthFailLimit, DefaultAuthFailLimit)
	defaults.Set(&cfg.AuthFailWindow, DefaultAuthFailWindow)
	if cfg.AuthTimeout == 0 {
		cfg.AuthTimeout = DefaultAuthTimeout // negative: no limit
	}
	defaults.Set(&cfg.EnqueueTimeout, DefaultEnqueueTimeout)
	if cfg.MaxInflightBytes == 0 { // negative: no bound
		cfg.MaxInflightBytes = DefaultMaxInflightBytes
	}
	defaults.Set(&cfg.TenantInflightBytes, max(1, cfg.MaxInflightBytes/2))
	defaults.Set(&cfg.InflightWait, DefaultInflightWait)
	trusted := make([]netip.Prefix, 0, len(cfg.TrustedNetworks))
	for i, p := range cfg.TrustedNetworks {
		if !p.IsValid() {
			return nil, fmt.Errorf("submission: trusted network %d is not a valid prefix", i)
		}
		// A client's address is unmapped before the check (remoteAddr),
		// so an IPv4-mapped network (::ffff:127.0.0.0/104) is taken as
		// the IPv4 network it maps (127.0.0.0/8); as written it matched
		// no client.
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		trusted = append(trusted, p.Masked())
	}
	cfg.TrustedNetworks = trusted
	for tenant, list := range cfg.SenderDomains {
		for _, d := range list {
			if err := CheckSenderDomain(d); err != nil {
				return nil, fmt.Errorf("submission: tenant %s: %w", tenant, err)
			}
		}
	}

	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("submission: metrics: %w", err)
	}

	inflight := membudget.New(cfg.MaxInflightBytes, cfg.TenantInflightBytes)
	if inflight != nil {
		inflight.OnChange = func(used int64) { m.inflightBytes.Set(float64(used)) }
	}

	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:        cfg,
		q:          q,
		log:        cfg.Logger.With().Str("component", "submission").Logger(),
		metrics:    m,
		limiter:    newAuthLimiter(cfg.AuthFailLimit, cfg.AuthFailWindow),
		inflight:   inflight,
		bcryptSem:  make(chan struct{}, max(1, runtime.GOMAXPROCS(0))),
		isLoopback: func(a netip.Addr) bool { return a.Unmap().IsLoopback() },
		stressAuth: stressAuthTimeout,
		baseCtx:    ctx,
		cancel:     cancel,
		conns:      make(map[*trackedConn]struct{}),
		listeners:  make(map[net.Listener]struct{}),
		perClient:  make(map[netip.Prefix]int),

		errLineTooLong: lineTooLongError(cfg.MaxLineLength),
	}
	s.accounts.Store(cfg.Users)

	ss := smtp.NewServer(backend{s})
	ss.Addr = cfg.Addr
	ss.Domain = cfg.Hostname
	ss.TLSConfig = cfg.TLSConfig
	ss.MaxMessageBytes = cfg.MaxMessageBytes
	// go-smtp answers 452 4.5.3 itself past this count (RFC 5321 4.5.3.1.10).
	ss.MaxRecipients = cfg.MaxRecipients
	// go-smtp's limit is the hard stop that bounds memory and closes the
	// connection; the configured limit is enforced on the body with a clean
	// reply (body.go), so it sits below this one.
	ss.MaxLineLength = 2 * cfg.MaxLineLength
	// go-smtp can only allow plaintext AUTH for the whole server; the
	// per-connection rule (TLS or loopback client) is applied in the
	// session, which hides AUTH from EHLO and refuses it when not allowed.
	ss.AllowInsecureAuth = true
	ss.ReadTimeout = cfg.ReadTimeout
	ss.WriteTimeout = cfg.WriteTimeout
	// SMTPUTF8 (RFC 6531) is not offered: the delivery side does not carry
	// the flag, so non-ASCII addresses are refused with 553 5.6.7.
	ss.EnableSMTPUTF8 = false
	// DSN (RFC 3461): RET, ENVID, NOTIFY and ORCPT are kept with each
	// envelope and honoured (dsn.go).
	ss.EnableDSN = true
	// Never set ss.Debug: it would copy AUTH exchanges into a log.
	ss.ErrorLog = errorLog{s.log}
	s.smtp = ss
	return s, nil
}

// Listen binds Config.Addr. Pass the listener to Serve; Addr reports it from
// now on.
//
// Its connections have no TCP keep-alive, which Go's default listener turns
// on with four setsockopt(2) calls per accepted connection (smtp-source and
// many applications open one connection per message): a client that
// vanishes is found by ReadTimeout and WriteTimeout, which no connection
// outlives, where keep-alive would need 15 s of idleness and then 9 probes.
func (s *Server) Listen() (net.Listener, error) {
	lc := net.ListenConfig{KeepAlive: -1}
	l, err := lc.Listen(context.Background(), "tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("submission: listen %s: %w", s.cfg.Addr, err)
	}
	s.mu.Lock()
	if s.addr == nil {
		s.addr = l.Addr()
	}
	s.mu.Unlock()
	return l, nil
}

// Serve accepts connections on l until Shutdown, then returns nil. It
// returns ErrServerClosed if the server was already shut down, or the
// accept error that stopped it.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	if s.addr == nil {
		s.addr = l.Addr()
	}
	s.listeners[l] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
	}()
	s.log.Info().Str("addr", l.Addr().String()).Bool("tls", s.cfg.TLSConfig != nil).
		Int("trusted_networks", len(s.cfg.TrustedNetworks)).Msg("submission listener started")
	if s.serving != nil {
		s.serving()
	}
	err := s.smtp.Serve(&limitListener{Listener: l, srv: s})
	if err != nil && s.closing.Load() && errors.Is(err, net.ErrClosed) {
		// Shutdown closed l before go-smtp's own Shutdown began.
		err = nil
	}
	if err != nil {
		return fmt.Errorf("submission: serve: %w", err)
	}
	return nil
}

// Addr is the address of the first listener bound by Listen or passed to
// Serve, or nil before that.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr
}

// shutdownReply is sent to idle clients when the server shuts down
// (RFC 5321 section 3.8: 421 before closing).
const shutdownReply = "421 4.3.2 Service shutting down, try again later\r\n"

// Shutdown stops accepting connections, closes idle ones with 421 4.3.2,
// and waits for in-flight messages (a DATA being read or enqueued) to get
// their reply. If ctx ends first, the remaining connections are closed, the
// Enqueue contexts cancelled, and ctx's error returned; a client cut off
// that way never saw a 250, so it retries (a possible duplicate, never a
// loss).
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		return ErrServerClosed
	}
	s.draining = true
	s.closing.Store(true)
	for l := range s.listeners {
		_ = l.Close() // see listeners; go-smtp closes it again, harmlessly
	}
	for c := range s.conns {
		c.hangup(shutdownReply)
	}
	s.mu.Unlock()
	s.log.Info().Msg("submission listener shutting down")
	if s.listenersClosed != nil {
		s.listenersClosed()
	}

	err := s.smtp.Shutdown(ctx)
	if ctx.Err() != nil {
		s.cancel()
		_ = s.smtp.Close()
		return fmt.Errorf("submission: shutdown: %w", ctx.Err())
	}
	s.cancel()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("submission: shutdown: %w", err)
	}
	return nil
}

// backend adapts Server to go-smtp's Backend.
type backend struct{ s *Server }

// NewSession is called by go-smtp at the first EHLO/HELO, and again after
// STARTTLS (which drops all earlier state, RFC 3207 section 4.2).
func (b backend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return b.s.newSession(c), nil
}

// errorLog routes go-smtp's internal error messages into zerolog.
type errorLog struct{ l zerolog.Logger }

func (e errorLog) Printf(format string, v ...any) { e.l.Warn().Msgf(format, v...) }
func (e errorLog) Println(v ...any)               { e.l.Warn().Msg(fmt.Sprint(v...)) }

// SetUsers replaces the accounts AUTH checks with u (the users file read
// again, on a reload): new sessions authenticate against it at once, and a
// session authenticated with an account u no longer has, or whose hash
// changed, is answered errCredentialsChanged at its next MAIL and ends
// (go-smtp allows one AUTH a connection). An error when AUTH is off
// (Config.Users nil) or u is nil.
func (s *Server) SetUsers(u *Users) error {
	if u == nil {
		return errors.New("submission: no users")
	}
	if s.cfg.Users == nil {
		return errors.New("submission: AUTH is off (no users file): a users file takes a restart")
	}
	s.accounts.Store(u)
	return nil
}

// users is the accounts AUTH checks now.
func (s *Server) users() *Users { return s.accounts.Load() }
