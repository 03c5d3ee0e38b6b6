package submission

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// session is one client's SMTP state between EHLO (or STARTTLS) and the end
// of the connection. go-smtp calls its methods from the connection's
// goroutine, except Data for BDAT, which runs in a goroutine of its own
// while the connection goroutine waits; the fields are never touched
// concurrently except as noted on mu.
type session struct {
	srv       *Server
	conn      *smtp.Conn
	tc        *trackedConn // nil only if go-smtp was handed a foreign conn
	remote    netip.Addr   // unmapped; invalid if the peer is not TCP
	remoteStr string
	tls       bool
	trusted   bool

	user string // authenticated user, "" before AUTH
	// userHash is user's hash in the users file at AUTH: a reload that
	// changes it ends the session's right to send (Server.SetUsers).
	userHash []byte

	// mu guards the transaction: with BDAT, go-smtp runs Data in its own
	// goroutine and may call Reset (RSET, connection end) meanwhile.
	mu sync.Mutex
	// The mail transaction, cleared by Reset.
	hasFrom bool
	from    string
	rcpts   []string
	seen    map[string]struct{} // local@lower(domain) of rcpts from rcptMapMin on (storedRcpt)
	dsn     *queue.DSNParams    // RFC 3461 parameters of MAIL and RCPT, nil if none (dsn.go)
	// quotaTaken counts the recipients of this transaction taken from the
	// tenant's sending limit (quota.go) and not yet sent.
	quotaTaken int
}

var (
	_ smtp.Session     = (*session)(nil)
	_ smtp.AuthSession = (*session)(nil)
)

// isTrusted reports whether addr is in one of Config.TrustedNetworks.
func (s *Server) isTrusted(addr netip.Addr) bool {
	// A prefix has no zone and Contains refuses a zoned address, so a
	// link-local client (fe80::2%eth0) matched no network.
	addr = addr.WithZone("")
	for _, p := range s.cfg.TrustedNetworks {
		if addr.IsValid() && p.Contains(addr) {
			return true
		}
	}
	return false
}

func (s *Server) newSession(c *smtp.Conn) *session {
	nc := c.Conn()
	_, isTLS := c.TLSConnectionState()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	tc, _ := nc.(*trackedConn)
	remoteStr, remote := remoteAddr(c.Conn().RemoteAddr())
	trusted := s.isTrusted(remote)
	ss := &session{
		srv:       s,
		conn:      c,
		tc:        tc,
		remote:    remote,
		remoteStr: remoteStr,
		tls:       isTLS,
		trusted:   trusted,
	}
	if tc != nil && !trusted && s.cfg.Users != nil && s.cfg.AuthTimeout > 0 {
		tc.requireAuth(time.Now().Add(s.cfg.AuthTimeout))
	}
	switch {
	case tc != nil && isTLS:
		// Both done at STARTTLS's 220 already (trackedConn.Write).
		tc.setTLS()
		tc.setCommandReader(nil, nil) // the plaintext reader go-smtp dropped at STARTTLS
	case tc != nil:
		tc.setCommandReader(commandReader(c), ss.authMalformed)
	}
	if isTLS {
		// The writer put in at STARTTLS (joinTLS) may hold a reply to a
		// command pipelined before this greeting: it stays, and replacing
		// it would lose that reply.
		switch {
		case tc == nil:
			joinTLSReplies(c, ss.authMalformed, nil)
		case tc.tlsWriter(ss.authMalformed) == nil:
			// STARTTLS came before any greeting: no session saw it.
			tc.tlsOut = joinTLSReplies(c, ss.authMalformed, tc.greeted)
		}
	}
	ss.logLine(s.log.Debug()).Str("helo", c.Hostname()).Bool("trusted", trusted).Msg("session started")
	return ss
}

// remoteAddr returns a client's address as a.String() spells it, and its
// IP address, unmapped (invalid if a is not an IP address and port).
// For TCP it formats the address itself: String and a parse of its result
// were three allocations per connection.
func remoteAddr(a net.Addr) (string, netip.Addr) {
	if ta, ok := a.(*net.TCPAddr); ok {
		ap := ta.AddrPort()
		if ip := ap.Addr().Unmap(); ip.IsValid() {
			return netip.AddrPortFrom(ip, ap.Port()).String(), ip
		}
	}
	str := a.String()
	ap, err := netip.ParseAddrPort(str)
	if err != nil {
		return str, netip.Addr{}
	}
	return str, ap.Addr().Unmap()
}

// logLine adds the session's fields to e, a line of the server's logger:
// the client's address, whether the connection uses TLS, and the tenant
// once authenticated. They are added per line rather than kept in a
// logger of the session's own: zerolog's With copies the server logger's
// fields into a new 500-octet buffer, once per connection.
func (s *session) logLine(e *zerolog.Event) *zerolog.Event {
	if e == nil { // level disabled
		return nil
	}
	e = e.Str("remote", s.remoteStr).Bool("tls", s.tls)
	if s.user != "" {
		e = e.Str("tenant", s.user)
	}
	return e
}

// plainAuthOK applies plaintextAuthAllowed to this connection.
func (s *session) plainAuthOK() bool {
	return plaintextAuthAllowed(s.tls, s.remote, s.srv.isLoopback)
}

// authorized reports whether this client may start a mail transaction.
func (s *session) authorized() bool { return s.user != "" || s.trusted }

// tenant is the submitter recorded with each message.
func (s *session) tenant() string {
	if s.user != "" {
		return s.user
	}
	return TrustedTenant
}

// tenantField adds the tenant to a line of a session without AUTH (a
// trusted network's); after AUTH logLine adds it already.
func (s *session) tenantField(tenant string) func(*zerolog.Event) {
	return func(e *zerolog.Event) {
		if s.user == "" {
			e.Str("tenant", tenant)
		}
	}
}

// reject logs and counts a refused command and returns its reply. final
// marks a refusal that ends the transaction (MAIL FROM, DATA).
func (s *session) reject(e *smtp.SMTPError, reason string, final bool, ev func(*zerolog.Event)) error {
	s.srv.metrics.reject(reason, e.Code, final)
	l := s.logLine(s.srv.log.Info()).Str("reason", reason).Int("code", e.Code).
		Str("enhanced_code", fmt.Sprintf("%d.%d.%d", e.EnhancedCode[0], e.EnhancedCode[1], e.EnhancedCode[2]))
	if ev != nil {
		ev(l)
	}
	l.Msg("submission rejected")
	return e
}

// AuthMechanisms implements smtp.AuthSession. An empty list hides AUTH from
// the EHLO reply.
func (s *session) AuthMechanisms() []string {
	if s.srv.cfg.Users == nil || !s.plainAuthOK() {
		return nil
	}
	return []string{mechPlain, mechLogin}
}

// Auth implements smtp.AuthSession.
func (s *session) Auth(mech string) (sasl.Server, error) {
	if s.srv.cfg.Users == nil {
		return nil, smtp.ErrAuthUnsupported
	}
	if !s.plainAuthOK() {
		s.logLine(s.srv.log.Info()).Str("reason", "encryption_required").Msg("auth refused")
		return nil, errEncryptionRequired
	}
	if s.hasFrom {
		return nil, errAuthInTransaction
	}
	if !s.trusted && s.srv.limiter.blocked(clientKey(s.remote)) {
		// A trusted client's failures are the account's: checked once
		// its name is known (authenticate).
		return nil, s.authRateLimited()
	}
	switch strings.ToUpper(mech) {
	case mechPlain:
		return &plainServer{auth: s.authenticate, failed: s.authMalformed}, nil
	case mechLogin:
		return &loginServer{auth: s.authenticate, fails: s.authMalformed}, nil
	}
	return nil, smtp.ErrAuthUnknownMechanism
}

// authenticate checks credentials. The password is never logged, and the
// user name only when it is a known account (an unknown one may well be a
// password typed into the wrong field).
//
// The client's failure limit is tested again once the check's turn for
// bcrypt comes (bcryptSem), not only at AUTH: attempts from one address
// made at once on many connections all passed the test at AUTH and were
// counted only after their bcrypt, so 40 parallel guesses were all checked
// where 5 were allowed. Queued behind the semaphore, those past the limit
// are refused unchecked; clients that do not fail are never held back,
// however many authenticate at once. A trusted network's client is
// counted per account (authKey).
func (s *session) authenticate(identity, user, password string) error {
	ok := false
	var hash []byte
	if identity == "" || identity == user {
		// Acting for another identity (RFC 4616 authzid) is not
		// supported; such attempts fail like a wrong password.
		s.srv.bcryptSem <- struct{}{}
		if s.srv.limiter.blocked(s.authKey(user)) {
			<-s.srv.bcryptSem
			return s.authRateLimited()
		}
		us := s.srv.users()
		if ok = us.Verify(user, password); ok {
			hash = us.hash(user)
		}
		<-s.srv.bcryptSem
	}
	if !ok {
		s.authFailure(user, s.srv.limiter.fail(s.authKey(user)))
		return authFailed
	}
	s.user, s.userHash = user, hash
	if s.tc != nil {
		s.tc.authDone()
	}
	s.logLine(s.srv.log.Info()).Msg("authenticated")
	return nil
}

func (s *session) authMalformed() {
	s.authFailure("", s.srv.limiter.fail(s.authKey("")))
}

// authKey is what the client's failed AUTH for account counts against:
// the client, or for a trusted network's client the client and the
// account. Postfix exempts $mynetworks from its client limits, and so did
// outflow; but a trusted network is often one address (a NAT, a shared
// application host) for many applications of many tenants, and unlimited,
// one of them could guess every other's password. Counted per client,
// one application retrying a wrong password would lock every other on
// its address out; per account, it locks out only its own account, and
// each other account still gets AuthFailLimit guesses a window.
func (s *session) authKey(account string) authKey {
	k := clientKey(s.remote)
	if s.trusted {
		k.account = account
	}
	return k
}

// authRateLimited refuses an AUTH from a client at its failure limit and
// ends the connection after the reply.
func (s *session) authRateLimited() error {
	s.srv.metrics.authBlocked.Inc()
	s.logLine(s.srv.log.Warn()).Str("reason", "auth_rate_limited").Int("limit", s.srv.cfg.AuthFailLimit).Bool("trusted", s.trusted).
		Dur("window", s.srv.cfg.AuthFailWindow).Msg("auth refused, closing connection")
	if s.tc != nil {
		s.tc.hangup("")
	}
	return errAuthRateLimited
}

// authFailure logs and counts a failed AUTH, counted against the client's
// limit already (blocked: it is now at it).
func (s *session) authFailure(user string, blocked bool) {
	s.srv.metrics.authFailures.Inc()
	us := s.srv.users()
	ev := s.logLine(s.srv.log.Warn()).Bool("user_known", us.Has(user)).Bool("now_blocked", blocked)
	if us.Has(user) {
		ev = ev.Str("user", user)
	}
	ev.Msg("authentication failed")
}

// Mail implements smtp.Session: MAIL FROM.
func (s *session) Mail(from string, opts *smtp.MailOptions) error {
	if s.srv.closing.Load() {
		if s.tc != nil {
			s.tc.hangup("")
		}
		return s.reject(errShuttingDown, reasonShuttingDown, true, nil)
	}
	if s.hasFrom {
		return s.reject(errNestedMail, reasonProtocolOrder, false, nil)
	}
	if s.user != "" && !bytes.Equal(s.srv.users().hash(s.user), s.userHash) {
		// The users file was read again (a reload) without this
		// account, or with a new password for it: a session that
		// authenticated with the old one sends no more as it, as a
		// new session could not. go-smtp allows one AUTH a
		// connection, so the session ends; the client connects again
		// with the new credentials.
		user := s.user
		s.user, s.userHash = "", nil
		if s.tc != nil {
			s.tc.hangup("")
		}
		return s.reject(errCredentialsChanged, reasonAuthRevoked, true, func(e *zerolog.Event) { e.Str("user", user) })
	}
	if !s.authorized() {
		// No AUTH, no mail: this is what keeps outflow from ever being an
		// open relay.
		e := errAuthRequired
		if s.srv.cfg.TLSConfig != nil && !s.tls && !s.plainAuthOK() {
			e = errStartTLSFirst
		}
		return s.reject(e, reasonAuthRequired, true, nil)
	}
	// "<>" is the null reverse-path (RFC 5321 section 4.5.5), allowed.
	if from != "" {
		if _, err := ParseAddress(from); err != nil {
			return s.reject(addressError(err, true), reasonBadSender, true,
				func(e *zerolog.Event) { e.Str("from", from) })
		}
	}
	if tenant := s.tenant(); !s.srv.cfg.SenderDomains.Allows(tenant, from) {
		return s.reject(errSenderNotOwned, reasonNotOwned, false, func(e *zerolog.Event) {
			e.Str("from", from)
			s.tenantField(tenant)(e)
		})
	}
	dsn, derr := mailDSN(opts)
	if derr != nil {
		return s.reject(derr, reasonBadDSN, true, nil)
	}
	if opts != nil && opts.Size > 0 {
		// Last: a MAIL refused for another reason does not wait. The
		// declared size is checked, not charged (inflight.go).
		if err := s.checkSize(s.tenant(), opts.Size); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.hasFrom, s.from, s.dsn = true, from, dsn
	s.mu.Unlock()
	return nil
}

// Rcpt implements smtp.Session: RCPT TO.
func (s *session) Rcpt(to string, opts *smtp.RcptOptions) error {
	if !s.authorized() {
		return s.reject(errAuthRequired, reasonAuthRequired, false, nil)
	}
	if !s.hasFrom {
		return s.reject(errNeedMail, reasonProtocolOrder, false, nil)
	}
	// go-smtp already refuses past MaxRecipients; this guards the count of
	// stored (deduplicated) recipients the same way.
	if len(s.rcpts) >= s.srv.cfg.MaxRecipients {
		return s.reject(errTooManyRcpts, reasonTooManyRcpts, false, nil)
	}
	a, err := ParseAddress(to)
	if err != nil {
		return s.reject(addressError(err, false), reasonBadRecipient, false,
			func(e *zerolog.Event) { e.Str("rcpt", to) })
	}
	// The same mailbox twice is accepted but stored once: domains are
	// case-insensitive, local parts are not (RFC 5321 section 2.4).
	if err := s.checkSuppressed(to); err != nil {
		return err
	}
	rd, hasDSN, derr := rcptDSN(opts)
	if derr != nil {
		return s.reject(derr, reasonBadDSN, false, nil)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.storedRcpt(a) {
		return nil
	}
	if s.srv.cfg.Quota != nil {
		// A new recipient counts against the tenant's sending limit once,
		// when it is accepted; a refused one is not kept. The count is
		// taken with mu released: it may wait on the bucket.
		s.mu.Unlock()
		err := s.takeQuota(to)
		s.mu.Lock()
		if err != nil {
			if s.seen != nil {
				delete(s.seen, mailboxKey(a.Local, a.Domain))
			}
			return err
		}
		s.quotaTaken++
	}
	s.rcpts = append(s.rcpts, to)
	if hasDSN {
		s.dsn = AddRcptDSN(s.dsn, to, rd)
	}
	return nil
}

// rcptMapMin is the number of stored recipients from which storedRcpt
// keeps them in a map; below it, a scan of the list is cheaper than
// building one.
const rcptMapMin = 16

// storedRcpt reports whether the transaction stores a recipient already
// that is the same mailbox as a, and if not counts a as stored (the caller
// appends it to rcpts). Domains are compared case-insensitively, local
// parts exactly (RFC 5321 section 2.4); the addresses passed ParseAddress,
// so they are ASCII. Called with mu held.
func (s *session) storedRcpt(a Address) bool {
	if len(s.rcpts) < rcptMapMin {
		for _, r := range s.rcpts {
			at := strings.LastIndexByte(r, '@')
			if r[:at] == a.Local && strings.EqualFold(r[at+1:], a.Domain) {
				return true
			}
		}
		if len(s.rcpts)+1 < rcptMapMin {
			return false
		}
	}
	if s.seen == nil {
		s.seen = make(map[string]struct{}, 2*rcptMapMin)
		for _, r := range s.rcpts {
			at := strings.LastIndexByte(r, '@')
			s.seen[mailboxKey(r[:at], r[at+1:])] = struct{}{}
		}
	}
	key := mailboxKey(a.Local, a.Domain)
	if _, dup := s.seen[key]; dup {
		return true
	}
	s.seen[key] = struct{}{}
	return false
}

// mailboxKey is storedRcpt's map key for a mailbox.
func mailboxKey(local, domain string) string { return local + "@" + strings.ToLower(domain) }

// Data implements smtp.Session: the message body, after DATA or BDAT. The
// body is read to its end whatever happens, so the connection stays in
// step; then it is validated, stamped with a Received header, and handed to
// the queue. Only a nil Enqueue earns the 250.
func (s *session) Data(r io.Reader) error {
	if s.tc != nil {
		s.tc.beginData()
		defer s.tc.endData()
	}
	s.mu.Lock()
	hasFrom, from, rcpts, dsn := s.hasFrom, s.from, slices.Clone(s.rcpts), s.dsn
	s.mu.Unlock()
	// The body is charged as it arrives, and whatever its end, what it
	// was charged goes back once nothing here holds it (inflight.go).
	own := s.srv.emptyCharge(s.tenant())
	ch := &own
	defer ch.release()
	if !s.authorized() {
		return s.reject(errAuthRequired, reasonAuthRequired, true, nil)
	}
	if !hasFrom {
		return s.reject(errNeedMail, reasonProtocolOrder, true, nil)
	}
	if len(rcpts) == 0 {
		return s.reject(errNeedRcpt, reasonProtocolOrder, true, nil)
	}

	start := time.Now()
	// RFC 5321 section 4.4: an SMTP server adds a Received line at the top
	// of the message it accepts.
	bb := bodyBufs.Get().(*bodyBuf)
	bb.hdr = appendReceived(bb.hdr[:0], s.conn.Hostname(), s.remote, s.srv.cfg.Hostname, !s.tc.saidHELO(), s.tls, s.user != "", start)
	hdrLen := len(bb.hdr)
	if !s.srv.plainData {
		if d := newDotReader(r, s.conn); d != nil {
			defer d.release() // before go-smtp reads on
			r = d
		}
	}
	frame, body, reason, rerr := s.readBody(r, bb, ch, bb.hdr, queue.FrameHeadroom(from, rcpts, dsn != nil)+maxAddedHeaders, start)
	putBodyBuf(bb)
	if rerr == nil && s.tc != nil && s.tc.bodyCut() {
		// A BDAT chunk the client cut short: go-smtp ended the chunk at
		// the end of the socket, and the body looked whole.
		recycleFrame(frame)
		rerr, reason = errDataAborted, reasonAborted
	}
	if rerr != nil {
		return s.reject(rerr, reason, true, func(e *zerolog.Event) { e.Int("rcpt_count", len(rcpts)) })
	}
	size := len(body) - hdrLen
	if why := s.srv.cfg.SenderDomains.CheckFrom(s.tenant(), body[hdrLen:]); why != "" {
		recycleFrame(frame)
		return s.reject(&smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "From header rejected: " + why},
			reasonNotOwned, true, s.tenantField(s.tenant()))
	}
	body = completeHeadersInFrame(frame, body, hdrLen, s.srv.cfg.Hostname, start)

	sub := &queue.Submission{
		Tenant:     s.tenant(),
		From:       from,
		Rcpts:      rcpts,
		Body:       body,
		Frame:      frame,
		ReceivedAt: time.Now().UTC(),
		RemoteAddr: s.remoteStr,
		Source:     queue.SourceSMTP,
		DSN:        dsn,
	}
	ctx, cancel := context.WithTimeout(s.srv.baseCtx, s.srv.cfg.EnqueueTimeout)
	ids, err := s.enqueue(ctx, sub)
	cancel()
	if err == nil {
		// Stored, and nothing holds the body any more (the Enqueuer
		// contract); after a failure a publish may still be pending
		// (a timeout), so the frame is left to the collector then.
		recycleFrame(frame)
		sub.Body, sub.Frame = nil, nil
	}
	if err == nil || errors.Is(err, queue.ErrMaybeStored) {
		// Sent, or perhaps sent: an envelope handed to the server before
		// the failure is delivered, so its recipients stay counted.
		s.mu.Lock()
		s.quotaTaken = 0
		s.mu.Unlock()
	}
	if err != nil {
		reply, reason := errQueueFailed, reasonQueueError
		switch {
		case errors.Is(err, queue.ErrNoRoom):
			// Nothing was written: the store keeps its last room for
			// the mail already queued (queue.StoreReserve).
			reply, reason = errStoreFull, reasonInsufficientStorage
		case errors.Is(err, context.DeadlineExceeded):
			reply = errQueueTimeout
		}
		s.srv.metrics.reject(reason, reply.Code, true)
		s.logLine(s.srv.log.Error()).Err(err).Func(s.tenantField(sub.Tenant)).Int("size", size).Int("rcpt_count", len(sub.Rcpts)).
			Str("reason", reason).Int("code", reply.Code).Msg("submission not queued")
		return reply
	}
	s.srv.metrics.accepted.Inc()
	s.srv.metrics.acceptedBytes.Add(float64(size))
	s.logLine(s.srv.log.Info()).Strs("ids", ids).Func(s.tenantField(sub.Tenant)).Str("from", sub.From).Int("size", size).
		Int("rcpt_count", len(sub.Rcpts)).Dur("took", time.Since(start)).Msg("submission accepted")
	return queuedReply(ids)
}

// enqueue calls the Enqueuer, turning a panic into an error so that a bug
// there costs one 451, not the connection.
func (s *session) enqueue(ctx context.Context, sub *queue.Submission) (ids []string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("submission: enqueue panicked: %v", p)
		}
	}()
	return s.srv.q.Enqueue(ctx, sub)
}

// queuedReply is the 250 after DATA, naming the queue ids so a client's log
// can be matched with ours. go-smtp writes any *SMTPError returned by Data
// as the reply, including a 2xx one; returning nil would give a bare
// "250 2.0.0 OK: queued".
func queuedReply(ids []string) error {
	msg := "OK: queued"
	switch {
	case len(ids) == 0:
	case len(ids) <= 3:
		msg += " as " + strings.Join(ids, " ")
	default:
		msg += fmt.Sprintf(" as %s (+%d more)", strings.Join(ids[:3], " "), len(ids)-3)
	}
	return &smtp.SMTPError{Code: 250, EnhancedCode: smtp.EnhancedCode{2, 0, 0}, Message: msg}
}

// Reset implements smtp.Session: RSET, and the end of every transaction.
func (s *session) Reset() {
	s.mu.Lock()
	s.hasFrom, s.from, s.rcpts, s.seen, s.dsn = false, "", nil, nil, nil
	s.mu.Unlock()
	s.returnQuota()
}

// Logout implements smtp.Session: the connection closed or STARTTLS
// succeeded.
func (s *session) Logout() error {
	s.returnQuota()
	// After STARTTLS go-smtp answers the commands before the next
	// greeting itself: joinTLS puts the reply writer in place for them.
	// Not on a Logout from go-smtp's Close on Shutdown's goroutine, which
	// runs only after baseCtx is cancelled: go-smtp's connection goroutine
	// may be inside STARTTLS then, changing what joinTLS reads.
	if !s.tls && s.tc != nil && s.srv.baseCtx.Err() == nil {
		s.tc.joinTLS(s.conn)
	}
	s.logLine(s.srv.log.Debug()).Msg("session ended")
	return nil
}

// returnQuota gives back to the tenant's sending limit the recipients this
// transaction took and did not send (RSET, a refused or failed DATA, a
// connection gone).
func (s *session) returnQuota() {
	if s.srv.cfg.Quota == nil {
		return
	}
	s.mu.Lock()
	n := s.quotaTaken
	s.quotaTaken = 0
	s.mu.Unlock()
	if n > 0 {
		s.srv.cfg.Quota.Return(s.tenant(), n)
	}
}
