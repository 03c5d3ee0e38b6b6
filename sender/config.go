package sender

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dane"
	"github.com/outflow/outflow/internal/defaults"
)

// TLSPolicy says how hard the sender insists on TLS with a destination.
type TLSPolicy string

const (
	// TLSOpportunistic uses STARTTLS whenever the server offers it and
	// falls back to plaintext when it does not, or when the handshake
	// fails (logged). Certificates are checked but a failed check does not
	// stop delivery: opportunistic TLS to MX hosts protects against passive
	// listeners only (RFC 7435). This is the default.
	TLSOpportunistic TLSPolicy = "opportunistic"
	// TLSRequired refuses to deliver unless STARTTLS is offered, the
	// handshake succeeds and the certificate verifies for the MX host name.
	TLSRequired TLSPolicy = "required"
	// TLSNone never starts TLS.
	TLSNone TLSPolicy = "none"
)

// RelayTLS says how the sender protects the connection to a smarthost.
type RelayTLS string

const (
	// RelaySTARTTLS requires STARTTLS with a verified certificate
	// (port 587 style). This is the default.
	RelaySTARTTLS RelayTLS = "starttls"
	// RelayImplicitTLS starts TLS right after connecting (port 465 style,
	// RFC 8314 3.3).
	RelayImplicitTLS RelayTLS = "tls"
	// RelayNoTLS talks plaintext to the relay, AUTH included; only for a
	// relay on a trusted network.
	RelayNoTLS RelayTLS = "none"
)

// Resolver is the DNS the sender needs. *net.Resolver satisfies it, and so
// does *mockdns.Resolver in tests.
type Resolver interface {
	LookupMX(ctx context.Context, name string) ([]*net.MX, error)
	LookupHost(ctx context.Context, host string) ([]string, error)
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// DialFunc opens a TCP connection; it has the shape of
// (*net.Dialer).DialContext.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Default timeouts. The SMTP ones are RFC 5321 4.5.3.2's minimums, which
// the RFC asks clients to honour so slow but working servers are not cut off.
const (
	DefaultConnectTimeout   = 30 * time.Second // not in the RFC; Postfix's smtp_connect_timeout
	DefaultGreetingTimeout  = 5 * time.Minute  // RFC 5321 4.5.3.2.1 initial 220 message
	DefaultCommandTimeout   = 5 * time.Minute  // RFC 5321 4.5.3.2.2 MAIL, 4.5.3.2.3 RCPT (also EHLO, STARTTLS, AUTH)
	DefaultResetTimeout     = 20 * time.Second // not in the RFC; Postfix's smtp_rset_timeout: a pooled connection's RSET
	DefaultDataInitTimeout  = 2 * time.Minute  // RFC 5321 4.5.3.2.4 DATA initiation (the 354)
	DefaultDataBlockTimeout = 3 * time.Minute  // RFC 5321 4.5.3.2.5 each data block write
	DefaultFinalDotTimeout  = 10 * time.Minute // RFC 5321 4.5.3.2.6 DATA termination (the reply to ".")

	DefaultMaxMsgsPerConn  = 100              // transactions per connection
	DefaultIdleTimeout     = 30 * time.Second // idle pooled connection lifetime
	DefaultMaxIdleConns    = 1000             // idle pooled connections of all hosts
	DefaultAuthFailureHold = 5 * time.Minute  // relay AUTH 5xx answered from cache
	DefaultPort            = 25               // SMTP port of MX hosts

	// Per Send, as Postfix's smtp_mx_address_limit and
	// smtp_mx_session_limit.
	DefaultMXAddressLimit = 5 // MX host addresses tried
	DefaultMXSessionLimit = 2 // MX sessions that failed before giving up
)

// Config configures a Sender. Zero values take the defaults noted on each
// field; docs/delivery.md lists them all.
type Config struct {
	// Hostname is the name given in every EHLO (before and after
	// STARTTLS). It should be the sending host's FQDN with matching
	// forward and reverse DNS. Default: os.Hostname().
	Hostname string

	// Relay, as host:port, sends everything through that smarthost
	// instead of looking up MX records. Empty means direct MX delivery.
	Relay string
	// RelayUsername and RelayPassword, when the username is set, are used
	// for SASL AUTH PLAIN (or LOGIN when PLAIN is not offered) to the
	// relay. The password is never logged.
	RelayUsername string
	RelayPassword string
	// RelayTLS is how the relay connection is protected: "starttls"
	// (default), "tls" (implicit) or "none".
	RelayTLS RelayTLS

	// TLS is the policy for direct MX delivery: "opportunistic" (default),
	// "required" or "none".
	TLS TLSPolicy
	// TLSPerDestination overrides TLS per destination domain (lower case,
	// the Message.Domain), e.g. {"bank.example": "required"}.
	TLSPerDestination map[string]TLSPolicy
	// InsecureSkipVerify turns certificate verification off where it
	// would otherwise stop delivery (policy "required" and the relay).
	// Opportunistic TLS never stops on a certificate anyway. Default false.
	InsecureSkipVerify bool
	// RootCAs verifies server certificates (the relay's, MX hosts' and,
	// for MTA-STS, policy hosts'); nil means the system pool. `outflow
	// serve` sets it to the system pool plus --tls-ca-file's roots; tests
	// set it to the fake server's certificate.
	RootCAs *x509.CertPool
	// MTASTS, when set, applies recipient domains' MTA-STS policies
	// (RFC 8461) to direct MX delivery: in enforce mode only listed MX
	// hosts are used, over STARTTLS with a certificate RootCAs verifies.
	// nil turns MTA-STS off. A TLS policy of "none" for the destination
	// turns it off too.
	MTASTS MTASTSLookup
	// DANE, when set, looks up each MX host's TLSA records (RFC 7672)
	// and, when the answer is DNSSEC-authenticated, requires STARTTLS
	// verified against them; DANE takes precedence over MTA-STS and the
	// "required" policy. nil turns DANE off.
	DANE dane.Resolver
	// TLSReport receives the TLS outcomes of domains with an MTA-STS or
	// DANE policy, for RFC 8460 reports. nil: none are kept.
	TLSReport TLSReporter

	// ConnectTimeout bounds the TCP connect (and, for implicit TLS, the
	// handshake). Default DefaultConnectTimeout.
	ConnectTimeout time.Duration
	// GreetingTimeout bounds the wait for the 220 banner. Default
	// DefaultGreetingTimeout.
	GreetingTimeout time.Duration
	// CommandTimeout bounds each command's reply: EHLO, STARTTLS and its
	// handshake, AUTH, MAIL, RCPT, QUIT. Default DefaultCommandTimeout.
	CommandTimeout time.Duration
	// ResetTimeout bounds the reply to the RSET that starts each
	// transaction on a reused connection: a pooled connection the
	// server has gone quiet on costs this, not CommandTimeout, before
	// the message goes to a fresh one (Postfix's smtp_rset_timeout).
	// Default DefaultResetTimeout.
	ResetTimeout time.Duration
	// DataInitTimeout bounds the wait for the 354 after DATA. Default
	// DefaultDataInitTimeout.
	DataInitTimeout time.Duration
	// DataBlockTimeout bounds each write of a block (up to 64 KiB) of the
	// message body; a server that stops reading trips it. Default
	// DefaultDataBlockTimeout.
	DataBlockTimeout time.Duration
	// FinalDotTimeout bounds the wait for the reply to the final dot.
	// When it fires the message may or may not have been delivered.
	// Default DefaultFinalDotTimeout.
	FinalDotTimeout time.Duration

	// NoChunking keeps to DATA when a server offers CHUNKING. By default
	// the sender uses BDAT there (RFC 3030): with PIPELINING a message
	// then costs one round trip instead of two. For a receiver whose BDAT
	// is broken.
	NoChunking bool
	// NoChunkingFor are names (any case, a trailing dot ignored) sent
	// DATA even when their servers offer CHUNKING: NoChunking for one
	// receiver. A name is a destination domain (the Message.Domain) or a
	// server's host name (an MX host, or the relay host), so that one
	// broken server can be named whatever domains it receives for.
	NoChunkingFor map[string]bool
	// bdatRefused holds the hosts (nameKey) whose server refused BDAT as
	// a command it does not know, though it offered CHUNKING: sent DATA
	// from then on, by every connection of the Sender (chunkReply).
	bdatRefused *sync.Map

	// MaxMsgsPerConn is how many transactions one connection carries
	// before it is closed; a server's LIMITS MAILMAX lowers it, and so
	// does a limit learned from the server's refusal (perconn.go).
	// Default DefaultMaxMsgsPerConn.
	MaxMsgsPerConn int
	// Classifier reads a refusal to MAIL on a connection that carried
	// messages before, to learn a server's limit of messages per
	// connection (perconn.go). Default classify.Default(); serve gives
	// the one with the operator's rules.
	Classifier *classify.Classifier
	// perConn holds the limits of messages per connection learned from
	// servers' refusals, by pool key (perconn.go).
	perConn *sync.Map
	// IdleTimeout is how long an idle pooled connection is kept; it must
	// stay well below a server's own 5 minute timeout (RFC 5321
	// 4.5.3.2.7). Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxIdleConns caps the idle pooled connections of all hosts
	// together; past it the one idle longest is closed. Default
	// DefaultMaxIdleConns; negative: no cap.
	MaxIdleConns int
	// MaxConnsPerHost caps the open connections (busy and idle) to one
	// MX host or relay; Send waits for a free one. 0 means no cap here
	// (package throttle limits connections per destination).
	MaxConnsPerHost int
	// AuthFailureHold is how long, after the relay refuses our
	// credentials with a 5xx, Send answers every message with that same
	// outcome without connecting, so that a bad password does not cost a
	// login attempt per message. Default DefaultAuthFailureHold; negative
	// disables. Either way, until a login is known to work, one Send at a
	// time logs in (loginTurn).
	AuthFailureHold time.Duration

	// MXAllowLoopback lets MX delivery connect to loopback addresses
	// (127.0.0.0/8, ::1), which it refuses by default, as it refuses the
	// unspecified address, link-local and multicast ones (mx.go,
	// refusal): a recipient domain could otherwise steer outflow's SMTP at
	// services of this host. For tests and labs whose MX hosts run on
	// 127.0.0.x; the relay is never checked.
	MXAllowLoopback bool
	// MXAddressLimit caps the MX host addresses one Send connects to
	// (distinct addresses, over every MX host, best first). Default
	// DefaultMXAddressLimit; negative: no limit. Not for the relay.
	MXAddressLimit int
	// MXSessionLimit caps the MX sessions that may fail in one Send
	// before it gives up: a session counts once its TCP connection was
	// made and it then failed (greeting, EHLO, TLS policy, a 4xx to MAIL,
	// a connection lost before any recipient was accepted, a failed
	// transaction that ended the connection while recipients were left
	// for another). A refused connection does not count (MXAddressLimit
	// does). Default
	// DefaultMXSessionLimit; negative: no limit. Not for the relay.
	MXSessionLimit int
	// DeadAddrHold is how long an MX address is not dialled after a
	// connection to it timed out or was refused or unreachable (a reply
	// from the server never counts): Sends try the host's other
	// addresses and the next MX hosts instead, and a Send with none left
	// fails at once, transiently (deadaddr.go). Each failure in a row
	// doubles it, up to DeadAddrHoldMax; a connection clears it. The
	// memory is the Sender's, shared by every Send. Default
	// DefaultDeadAddrHold; negative disables. Not for the relay.
	DeadAddrHold time.Duration
	// DeadAddrHoldMax caps DeadAddrHold's growth. Default
	// DefaultDeadAddrHoldMax (never below DeadAddrHold).
	DeadAddrHoldMax time.Duration

	// Port is the SMTP port for MX hosts. Default DefaultPort. Tests set
	// it.
	Port int
	// Resolver looks up MX and address records. Default
	// net.DefaultResolver.
	Resolver Resolver
	// Dial opens connections. Default a net.Dialer. Tests redirect MX
	// addresses to loopback fake servers with it.
	Dial DialFunc
	// DialSource opens connections for a Message with a Source, from
	// that address. Default a net.Dialer with LocalAddr set.
	DialSource func(ctx context.Context, source netip.Addr, network, addr string) (net.Conn, error)
	// Logger receives connection-level events (TLS fallbacks, AUTH
	// failures, pool activity at debug). Default: no logging.
	Logger zerolog.Logger
}

// withDefaults returns a copy of c with every zero field set to its
// default, or an error for values that cannot work.
func (c Config) withDefaults() (Config, error) {
	if c.bdatRefused == nil {
		c.bdatRefused = new(sync.Map)
	}
	if c.perConn == nil {
		c.perConn = new(sync.Map)
	}
	if c.Classifier == nil {
		c.Classifier = classify.Default()
	}
	if c.Hostname == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return c, fmt.Errorf("sender: no Hostname configured and os.Hostname failed: %w", err)
		}
		c.Hostname = h
	}
	if strings.ContainsAny(c.Hostname, " \r\n\t") {
		return c, errors.New("sender: Hostname must be a single domain name")
	}
	if c.RelayTLS == "" {
		c.RelayTLS = RelaySTARTTLS
	}
	switch c.RelayTLS {
	case RelaySTARTTLS, RelayImplicitTLS, RelayNoTLS:
	default:
		return c, fmt.Errorf("sender: RelayTLS %q: want starttls, tls or none", c.RelayTLS)
	}
	if c.Relay != "" {
		if _, _, err := net.SplitHostPort(c.Relay); err != nil {
			return c, fmt.Errorf("sender: Relay %q: %w", c.Relay, err)
		}
	}
	if c.TLS == "" {
		c.TLS = TLSOpportunistic
	}
	valid := func(p TLSPolicy) bool { return p == TLSOpportunistic || p == TLSRequired || p == TLSNone }
	if !valid(c.TLS) {
		return c, fmt.Errorf("sender: TLS policy %q: want opportunistic, required or none", c.TLS)
	}
	per := make(map[string]TLSPolicy, len(c.TLSPerDestination))
	for d, p := range c.TLSPerDestination {
		if !valid(p) {
			return c, fmt.Errorf("sender: TLS policy %q for %s: want opportunistic, required or none", p, d)
		}
		per[nameKey(d)] = p
	}
	c.TLSPerDestination = per
	if len(c.NoChunkingFor) > 0 {
		off := make(map[string]bool, len(c.NoChunkingFor))
		for name, v := range c.NoChunkingFor {
			off[nameKey(strings.TrimSpace(name))] = v
		}
		c.NoChunkingFor = off
	}
	defaults.Set(&c.ConnectTimeout, DefaultConnectTimeout)
	defaults.Set(&c.GreetingTimeout, DefaultGreetingTimeout)
	defaults.Set(&c.CommandTimeout, DefaultCommandTimeout)
	defaults.Set(&c.ResetTimeout, DefaultResetTimeout)
	defaults.Set(&c.DataInitTimeout, DefaultDataInitTimeout)
	defaults.Set(&c.DataBlockTimeout, DefaultDataBlockTimeout)
	defaults.Set(&c.FinalDotTimeout, DefaultFinalDotTimeout)
	defaults.Set(&c.IdleTimeout, DefaultIdleTimeout)
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = DefaultMaxIdleConns // negative stays: no cap
	}
	if c.AuthFailureHold == 0 {
		c.AuthFailureHold = DefaultAuthFailureHold
	}
	defaults.Set(&c.MaxMsgsPerConn, DefaultMaxMsgsPerConn)
	if c.MaxConnsPerHost < 0 {
		c.MaxConnsPerHost = 0
	}
	if c.MXAddressLimit == 0 {
		c.MXAddressLimit = DefaultMXAddressLimit
	}
	if c.MXSessionLimit == 0 {
		c.MXSessionLimit = DefaultMXSessionLimit
	}
	if c.DeadAddrHold == 0 {
		c.DeadAddrHold = DefaultDeadAddrHold // negative stays: off
	}
	defaults.Set(&c.DeadAddrHoldMax, DefaultDeadAddrHoldMax)
	defaults.Set(&c.Port, DefaultPort)
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.Dial == nil {
		d := &net.Dialer{}
		c.Dial = d.DialContext
	}
	if c.DialSource == nil {
		c.DialSource = dialSource
	}
	return c, nil
}

// chunkingFor reports whether BDAT may be used for a message to domain
// over a connection to host (an MX host name or the relay host) whose
// server offers CHUNKING.
func (c *Config) chunkingFor(domain, host string) bool {
	if c.NoChunking {
		return false
	}
	if _, refused := c.bdatRefused.Load(nameKey(host)); refused {
		return false
	}
	return !c.NoChunkingFor[nameKey(domain)] && !c.NoChunkingFor[nameKey(host)]
}

// nameKey is a domain or host name as the per-name maps key it: lower
// case, no trailing dot. An IP address, also in the brackets of
// "[::1]:587", is the address as netip writes it: the relay's host is
// compared bare (net.SplitHostPort), so a name written as the relay was
// (--smtp-chunking-off '[::1]') never matched it, and "0:0:0:0:0:0:0:1"
// is ::1 too.
func nameKey(s string) string {
	ip := s
	if len(ip) > 2 && ip[0] == '[' && ip[len(ip)-1] == ']' {
		ip = ip[1 : len(ip)-1]
	}
	if ip != s || strings.IndexByte(ip, ':') >= 0 {
		if a, err := netip.ParseAddr(ip); err == nil {
			return a.Unmap().String()
		}
	}
	return strings.ToLower(strings.TrimSuffix(s, "."))
}

// policyFor is the TLS policy for a destination domain.
func (c *Config) policyFor(domain string) TLSPolicy {
	if p, ok := c.TLSPerDestination[nameKey(domain)]; ok {
		return p
	}
	return c.TLS
}
