package sender

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
)

// Message is one message for the recipients of one destination.
type Message struct {
	ID     string   // outflow's message id, for logs
	From   string   // envelope sender (MAIL FROM), "" for a bounce
	Rcpts  []string // envelope recipients, all at Domain
	Domain string   // destination domain: the MX lookup and TLS policy key
	Body   []byte   // the exact bytes to send, CRLF line ends, already DKIM-signed
	// MaxMsgsPerConn, when > 0, lowers Config.MaxMsgsPerConn for the
	// connection this message goes out on: the destination's own limit
	// (the throttle file's [destinations.X] max-msgs-per-conn).
	MaxMsgsPerConn int
	// DSN holds the submitter's RFC 3461 parameters, passed on to a server
	// that offers DSN (transaction.go); nil passes none.
	DSN *DSNParams
	// Source, when set, is the egress address to connect from and the
	// EHLO name to use (Config.Hostname when its EHLO is empty); nil
	// connects from the address the system picks.
	Source *Source
}

// RcptResult is the outcome for one recipient.
type RcptResult struct {
	Rcpt    string
	Outcome classify.Input
	// DSNRelayed is set when the server that accepted the recipient
	// offered DSN: notices about it are now that server's to send
	// (RFC 3461 §6.2.2).
	DSNRelayed bool
}

// Result is what one Send did.
type Result struct {
	// Rcpts has one entry per Message.Rcpts, in the same order.
	Rcpts []RcptResult
	// Host is the MX host (or relay host) of the last connection used;
	// "" when none was reached.
	Host string
	// Addr is the ip:port (or relay host:port) of that connection.
	Addr string
	// TLS tells whether that connection was encrypted, and TLSVerified
	// whether its certificate verified for Host.
	TLS         bool
	TLSVerified bool
	// Reused is true when the first connection came from the pool.
	Reused bool
	// Transactions is the number of MAIL transactions used (more than one
	// when the recipients were split by the server's limit).
	Transactions int
	// WrongFamily says that nothing was sent because no MX host of the
	// domain has an address of Message.Source's family (an IPv6 source
	// and hosts with only A records, or the reverse): a source of the
	// other family may reach them. The recipients' outcome is then a DNS
	// failure naming the last host tried.
	WrongFamily bool
	// HeldUntil, when set, says that nothing was dialled because every
	// address of every MX host tried failed to connect lately and is held
	// (deadaddr.go): the attempt reached no server, and the first hold
	// ends then. The recipients' outcome is the held addresses' connect
	// failure.
	HeldUntil time.Time
	// MXFamilies, for a Send from Message.Source that did not deliver
	// every recipient, is which address families the destination's MX
	// hosts have (mx.go, Families): with Complete, a source of a family
	// not set cannot reach them. Zero (nothing known) otherwise, and
	// through the relay.
	MXFamilies Families
	// Unreached says, for a Send from Message.Source, that no server was
	// reached: every MX address of the source's family failed to connect
	// (timed out, refused, unreachable) or is held after such a failure,
	// and none answered (egress.go, unreached). When MXFamilies has the
	// other family, a source of it may reach the hosts' other addresses.
	Unreached bool
}

// Sender delivers messages over SMTP. It is safe for concurrent use; each
// Send holds one connection at a time.
type Sender struct {
	cfg  Config
	log  zerolog.Logger
	pool *pool
	// dead holds the MX addresses that failed to connect lately
	// (deadaddr.go); nil when off.
	dead *deadAddrs

	authMu     sync.Mutex
	authUntil  time.Time // relay AUTH refused: answer from cache until then
	authRefuse classify.Input
	// authGates lets one login at a time through to the relay, per pool
	// key (relay and source), until one succeeds (loginTurn).
	authGates map[string]*authGate

	stop      chan struct{}
	reaperEnd chan struct{}
	closeOnce sync.Once
}

// New checks cfg, fills in defaults and starts the idle-connection reaper
// (stopped by Close).
func New(cfg Config) (*Sender, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Sender{
		cfg:       c,
		log:       c.Logger.With().Str("component", "sender").Logger(),
		pool:      newPool(c.MaxConnsPerHost, c.MaxIdleConns, c.IdleTimeout),
		dead:      newDeadAddrs(&c),
		stop:      make(chan struct{}),
		reaperEnd: make(chan struct{}),
	}
	go s.reaper()
	return s, nil
}

// reaper closes idle connections past IdleTimeout. It is owned by the
// Sender: it ends when Close is called, and a panic is logged rather than
// taking the process down.
func (s *Sender) reaper() {
	defer close(s.reaperEnd)
	defer func() {
		if r := recover(); r != nil {
			s.log.Error().Interface("panic", r).Msg("idle connection reaper panicked; idle connections now expire on use only")
		}
	}()
	t := time.NewTicker(max(s.cfg.IdleTimeout/2, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case now := <-t.C:
			for _, c := range s.pool.reap(now) {
				c.quit()
			}
		}
	}
}

// Close stops the reaper and closes every idle pooled connection (with a
// QUIT). Connections busy in a Send are closed when that Send ends.
func (s *Sender) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.reaperEnd
		var wg sync.WaitGroup
		for _, c := range s.pool.closeAll() {
			wg.Go(c.quit)
		}
		wg.Wait()
	})
	return nil
}

// CloseIdle closes the idle pooled connections to the MX hosts that
// domain's messages were sent to lately (within IdleTimeout), whichever
// domain each last carried, and returns how many it took out of the pool;
// connections busy in a Send are left alone. Each is sent QUIT in the
// background, as the idle cap's eviction does, not on the caller's time.
//
// It is for a caller that may not open another connection to the
// destination now (the throttle refused "conns": this worker's deliveries
// in flight to it are at or over its share of the fleet's connection
// limit): an idle socket is then surplus, and holds one of the
// provider's per-client connection slots that the worker holding the
// share needs. Through a relay it does nothing and returns 0: every
// destination shares the relay's connections, which hold no slot of the
// destination's provider.
func (s *Sender) CloseIdle(domain string) int {
	if s.cfg.Relay != "" {
		return 0
	}
	cs := s.pool.closeIdle(destName(domain))
	for _, c := range cs {
		go c.quit()
	}
	return len(cs)
}

// destName is a destination domain as the TLS plan (tlsPlan.domain) and
// the pool (client.dest) know it: lower case, without a trailing dot.
func destName(domain string) string {
	return strings.ToLower(strings.TrimSuffix(domain, "."))
}

// Send delivers m and reports one outcome per recipient. It does not
// retry: what to do with each outcome is the caller's (and package
// classify's) business. ctx bounds the whole attempt on top of the
// per-step timeouts.
func (s *Sender) Send(ctx context.Context, m *Message) Result {
	res := Result{Rcpts: make([]RcptResult, len(m.Rcpts))}
	for i, r := range m.Rcpts {
		res.Rcpts[i].Rcpt = r
	}
	out := make([]classify.Input, len(m.Rcpts))
	decided := make([]bool, len(m.Rcpts))
	var info *msgInfo
	pending := make([]int, len(m.Rcpts))
	for i := range pending {
		pending[i] = i
	}
	log := &msgLog{base: &s.log, id: m.ID, dest: m.Domain}
	fill := func(idx []int, in classify.Input) {
		for _, i := range idx {
			if !decided[i] {
				out[i], decided[i] = in, true
			}
		}
	}
	defer func() {
		for i := range res.Rcpts {
			res.Rcpts[i].Outcome = out[i]
		}
		if info != nil {
			for _, i := range info.dsnRelayed {
				res.Rcpts[i].DSNRelayed = true
			}
			info.release()
		}
	}()
	if len(m.Rcpts) == 0 {
		return res
	}

	var hosts []string
	relay := s.cfg.Relay != ""
	if relay {
		if in, held := s.authHeld(); held {
			fill(pending, in)
			return res
		}
		host, _, _ := net.SplitHostPort(s.cfg.Relay)
		hosts = []string{host}
	} else {
		var dnsOut *classify.Input
		hosts, dnsOut = s.mxHosts(ctx, log, m.Domain)
		if dnsOut != nil {
			log.Debug().Str("event", "dns").Str("text", dnsOut.Text).Msg("no route to destination")
			fill(pending, *dnsOut)
			return res
		}
	}
	info = inspect(m)
	plan := s.planTLS(ctx, log, m.Domain)

	// The source rides on ctx down to dial, the pool key and the address
	// order, so that the steps between need not know about it.
	ctx = withSource(ctx, m.Source)
	t := &tries{hosts: hosts, relay: relay, addrs: map[string]bool{}, wrongFamily: true, allHeld: true}
	first := true
	// carried: the recipients pending were left over by a transaction
	// that failed and took its connection with it, and nothing has been
	// tried for them since.
	carried := false
	freshTries := 0 // fresh connections after a limit of messages per connection (perconn.go)
	for len(pending) > 0 {
		if carried && ctxOver(ctx) {
			why := "the attempt ran out of time"
			if errors.Is(ctx.Err(), context.Canceled) {
				why = "the attempt was cancelled"
			}
			fill(pending, notAttempted(why))
			break
		}
		c, reused, err := s.acquire(ctx, log, t, plan)
		if err != nil {
			in := inputOf(err)
			if carried && t.last == nil {
				// No connection was even tried for them (an MX
				// limit): the failure of the transaction before is
				// not theirs to report.
				in = notAttempted(t.stopped)
			}
			fill(pending, in)
			res.WrongFamily = first && errors.Is(err, errWrongFamily)
			res.Unreached = first && unreached(ctx)
			if first && t.allHeld && errors.Is(err, errAddrHeld) {
				res.HeldUntil = t.heldUntil
			}
			break
		}
		carried = false
		s.applyLearned(c)
		res.Host, res.Addr, res.TLS, res.TLSVerified = c.host, c.addr, c.tls, c.tlsVerified
		if first {
			res.Reused, first = reused, false
		}
		txBefore := c.txs
		var txErr error
		var soft bool
		pending, soft, txErr = s.deliver(ctx, c, m, info, pending, out, decided)
		res.Transactions += c.txs - txBefore
		if m.MaxMsgsPerConn > 0 && (c.limit == 0 || m.MaxMsgsPerConn < c.limit) {
			c.limit = m.MaxMsgsPerConn
		}
		broke := txErr != nil && c.broken
		if soft {
			// Never pooled: the next Send would meet the same state.
			c.spent = true
		}
		s.giveBack(c, ctx)
		if soft && freshTries < perConnRetries && s.connLimited(c, txErr, log) {
			// The server's limit of messages per connection
			// (perconn.go): a fresh connection to the same host.
			freshTries++
			continue
		}
		if soft {
			// Nothing of the pending recipients was accepted: they go
			// to the next host, as Postfix keeps soft-failed recipients
			// for the next MX (within MXSessionLimit; the relay is the
			// only host, so its failure is the outcome).
			log.Warn().Str("mx", c.host).Str("addr", c.addr).Int("code", inputOf(txErr).Code).Str("error", inputOf(txErr).Text).
				Msg("MX session failed before any recipient was accepted; trying the next MX host")
			t.failSession(txErr)
			continue
		}
		if broke && len(pending) > 0 {
			// The failure was given to its own transaction's
			// recipients (deliver); the others, never offered, go on
			// another connection, to the same host first. The session
			// counts as failed (MXSessionLimit), which bounds how
			// often a host that breaks every transaction is tried.
			log.Warn().Str("mx", c.host).Str("addr", c.addr).Int("code", inputOf(txErr).Code).Str("error", inputOf(txErr).Text).
				Int("left", len(pending)).Msg("transaction failed and ended the connection; recipients not yet offered go on another connection")
			t.failTransaction()
			carried = true
		}
	}
	res.MXFamilies = s.mxFamilies(ctx, hosts, out)
	log.Debug().Str("mx", res.Host).Str("addr", res.Addr).Bool("tls", res.TLS).
		Bool("reused", res.Reused).Int("transactions", res.Transactions).Msg("send finished")
	return res
}

// deliver runs transactions on c until every pending recipient is decided
// or c may carry no more, and returns the recipients still pending.
//
// A failed transaction's outcome goes to the recipients of that
// transaction alone (after the final dot, to those accepted): recipients
// in later batches, those a 452 put off (RFC 5321 4.5.3.1.10) and, without
// PIPELINING, those whose RCPT was never sent were offered nothing, and a
// 554 to DATA or a lost reply to the final dot says nothing about them.
// They stay pending, for the next transaction on c when it is still in
// step, else for another connection. err is the failure that left c unable
// to carry more, if one did. soft says it was a soft session failure
// (softSessionFailure): nothing of it was recorded, and its recipients are
// among those pending, for the next host.
func (s *Sender) deliver(ctx context.Context, c *client, m *Message, info *msgInfo, pending []int, out []classify.Input, decided []bool) (left []int, soft bool, err error) {
	stop := context.AfterFunc(ctx, func() {
		// Wake any blocked read or write now; deadlines set later
		// check ctx first.
		_ = c.raw.SetDeadline(time.Unix(1, 0))
	})
	defer func() {
		if !stop() {
			c.broken = true
		}
	}()
	for len(pending) > 0 && c.usable() {
		if c.txs > 0 && !c.has("PIPELINING") {
			// (With PIPELINING, transaction sends RSET with MAIL.)
			if err := c.reset(ctx); err != nil {
				if ctx.Err() != nil {
					return pending, false, err
				}
				// Nothing of this transaction was sent: try a fresh
				// connection.
				return pending, false, nil
			}
		}
		n := defaultBatch
		if c.rcptMax > 0 {
			n = c.rcptMax
		}
		batch := pending[:min(n, len(pending))]
		rest := pending[len(batch):]
		carry, err := c.transaction(ctx, m, info, batch, out, decided)
		if errors.Is(err, errStale) {
			if ctx.Err() != nil {
				return pending, false, c.netFail(ctx, classify.StageMail, "RSET", ctx.Err())
			}
			return pending, false, nil // nothing was taken: a fresh connection
		}
		if err != nil && softSessionFailure(ctx, c, err) {
			return undecided(pending, decided), true, err
		}
		if err != nil {
			in := inputOf(err)
			for _, i := range batch {
				if !decided[i] && !slices.Contains(carry, i) {
					out[i], decided[i] = in, true
				}
			}
		}
		pending = append(carry, rest...)
		if err != nil && !c.usable() {
			return pending, false, err
		}
	}
	return pending, false, nil
}

// softSessionFailure says whether err, which ended a transaction on c for
// every recipient still pending, leaves them free for the next MX host: a
// 4xx reply to MAIL (421 or another temporary refusal of the session,
// RFC 5321 4.2.5), or the connection lost or timed out before the server
// accepted any recipient of the transaction and before the message left
// (StageDataEnd never counts: the message may have been delivered). A
// 5xx to MAIL, and any reply to RCPT, stay the recipients' outcome.
func softSessionFailure(ctx context.Context, c *client, err error) bool {
	var se *stepErr
	if ctx.Err() != nil || c.rcptAccepted || !errors.As(err, &se) {
		return false
	}
	in := se.in
	lost := in.Code == 0 && (in.Event == classify.EventConnLost || in.Event == classify.EventTimeout)
	switch in.Stage {
	case classify.StageMail:
		return lost || in.Code/100 == 4
	case classify.StageRcpt, classify.StageData:
		return lost
	}
	return false
}

// errStale says a reused connection did not answer its leading RSET: it
// was closed, or said 421, or (without BDAT, the message not yet sent)
// answered something else, so the server took nothing of the transaction.
var errStale = errors.New("pooled connection is stale")

func undecided(idx []int, decided []bool) []int {
	var out []int
	for _, i := range idx {
		if !decided[i] {
			out = append(out, i)
		}
	}
	return out
}

// ctxOver says whether ctx is done, or past its deadline by the clock: a
// read cut by the socket's deadline (ctx's, deadline) can end a moment
// before ctx's own timer marks it done.
func ctxOver(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// notAttempted is the outcome of recipients that no server was offered in
// this attempt: left over, in a later batch or put off by a 452, when the
// transaction before them failed and no connection was left to carry them
// (why says what stopped it). It is outflow's own signal (EventLocal,
// which classify calls transient, and which never feeds a breaker or an
// automation rule), not a server's word about the destination; the
// recipients simply go in the next attempt.
func notAttempted(why string) classify.Input {
	if why == "" {
		why = "no connection was left for them"
	}
	in := synthetic(classify.StageMail, 0, "", "recipient not attempted, offered to no server after an earlier transaction of the message failed ("+why+")")
	in.Event = classify.EventLocal
	return in
}

// usable says whether c may start another transaction.
func (c *client) usable() bool {
	limit := c.cfg.MaxMsgsPerConn
	if c.mailMax > 0 {
		limit = min(limit, c.mailMax) // RFC 9422 MAILMAX
	}
	if c.limit > 0 {
		limit = min(limit, c.limit) // the destination's own limit
	}
	return !c.broken && !c.spent && c.txs < limit
}

// giveBack returns c to the pool, or closes it when it is spent or broken.
func (s *Sender) giveBack(c *client, ctx context.Context) {
	if c.br != nil && c.br.Buffered() > 0 {
		// A reply nobody asked for came with the last one: out of step.
		c.broken = true
	}
	reuse := c.usable() && ctx.Err() == nil
	keep, evicted := s.pool.put(c, reuse)
	if evicted != nil {
		// Idle and healthy: QUIT, as at its idle timeout, and not on
		// this Send's time (another host's reply may take seconds).
		go evicted.quit()
	}
	if keep {
		return
	}
	if c.broken {
		c.close()
	} else {
		c.quit()
	}
}

// tries is one Send's walk through its hosts (the MX hosts, best first,
// or the relay): where the next connection is looked for, what the MX
// limits have counted, and the failures to report when no host is left.
type tries struct {
	hosts []string
	relay bool
	next  int // index of the host to try first
	cur   int // index of the host of the connection in use
	// addrs are the MX addresses dialled (MXAddressLimit); failed the
	// MX sessions that failed after connecting (MXSessionLimit).
	addrs  map[string]bool
	failed int
	// stopped says which limit ended the walk while hosts or addresses
	// were left untried; it goes into the outcome's text.
	stopped string
	// The failures so far: the last 4xx reply, the last that was not a
	// 5xx reply, and the last of all.
	lastReply, lastTemp, last error
	// wrongFamily: every host so far had no address of the source's
	// family (and none was reached).
	wrongFamily bool
	// allHeld: every host so far failed with all its addresses held
	// (deadaddr.go), and none was dialled; heldUntil is the first end of
	// their holds.
	allHeld   bool
	heldUntil time.Time
}

func (t *tries) fail(err error) {
	if !errors.Is(err, errWrongFamily) {
		t.wrongFamily = false
	}
	if he := (*heldErr)(nil); errors.As(err, &he) {
		if t.heldUntil.IsZero() || he.until.Before(t.heldUntil) {
			t.heldUntil = he.until
		}
	} else {
		t.allHeld = false
	}
	t.last = err
	in := inputOf(err)
	if in.Code < 500 || in.Code > 599 {
		t.lastTemp = err
	}
	if in.Code >= 400 && in.Code <= 499 {
		t.lastReply = err
	}
}

// failSession records the failure of the session in use, which moves
// the walk on to the next host (softSessionFailure).
func (t *tries) failSession(err error) {
	t.fail(err)
	t.failed++
	t.next = t.cur + 1
}

// failTransaction records that a transaction failed and ended the
// session in use, leaving recipients that no server was offered. The
// session counts as failed (MXSessionLimit), and the failures recorded so
// far are set aside: what is reported for the recipients left is the
// outcome of what is tried for them from here on, or, when nothing is,
// that they were not attempted.
func (t *tries) failTransaction() {
	t.failed++
	t.lastReply, t.lastTemp, t.last = nil, nil, nil
}

// sessionsLeft says whether another MX session may be tried, and
// records that the limit stopped the walk when not.
func (t *tries) sessionsLeft(cfg *Config) bool {
	if t.relay || cfg.MXSessionLimit < 0 || t.failed < cfg.MXSessionLimit {
		return true
	}
	t.stopped = fmt.Sprintf("outflow tried no further MX host after %d failed sessions (session limit, as Postfix's smtp_mx_session_limit)", t.failed)
	return false
}

// dialAllowed says whether addr may be dialled under the MX limits,
// counts it when so, and records which limit stopped the walk when not.
func (t *tries) dialAllowed(cfg *Config, addr string) bool {
	if t.relay {
		return true
	}
	if !t.sessionsLeft(cfg) {
		return false
	}
	if !t.addrs[addr] && cfg.MXAddressLimit >= 0 && len(t.addrs) >= cfg.MXAddressLimit {
		t.stopped = fmt.Sprintf("outflow tried no further MX address after %d (address limit, as Postfix's smtp_mx_address_limit)", len(t.addrs))
		return false
	}
	t.addrs[addr] = true
	return true
}

// outcome is the failure to report when no host is left: the last 4xx
// reply from a server, else the last failure that was not a 5xx reply,
// else the last one. A reply beats a failure to reach a server (a
// primary's 421 is news about the destination, a backup's refused
// connection is not), and a backup MX that greets with 554 while the
// primary cannot be reached is no reason to bounce, since the primary may
// take the message on the next attempt (and the outcome would otherwise
// depend on which host was tried last).
//
// When every host failed for want of an address of the source's family,
// the error wraps errWrongFamily; otherwise such a host's failure is
// reported as a plain DNS failure, and never as errWrongFamily.
func (t *tries) outcome() error {
	err := t.lastReply
	if err == nil {
		err = t.lastTemp
	}
	if err == nil {
		err = t.last
	}
	if err == nil {
		err = &stepErr{in: classify.Input{Stage: classify.StageConnect, Event: classify.EventLocal, Text: "outflow: no MX host could be tried"}}
	}
	var se *stepErr
	if !t.wrongFamily && errors.Is(err, errWrongFamily) && errors.As(err, &se) {
		err = &stepErr{in: se.in} // another host failed otherwise
	}
	if t.stopped != "" {
		in := inputOf(err)
		in.Text += " [" + t.stopped + "]"
		err = &stepErr{in: in, err: errors.Unwrap(err)}
	}
	return err
}

// errLimit says that an MX limit stopped acquireHost before it dialled.
var errLimit = errors.New("MX limit reached")

// acquire gets a connection to the first host that answers, from
// t.next on: a pooled one (checked with RSET by deliver) or a new one,
// trying every address of a host before the next host, within the MX
// limits. When none does, it returns t.outcome().
func (s *Sender) acquire(ctx context.Context, log *msgLog, t *tries, plan *tlsPlan) (*client, bool, error) {
	for i := t.next; i < len(t.hosts); i++ {
		host := t.hosts[i]
		if !t.sessionsLeft(&s.cfg) {
			break
		}
		hp, err := s.hostTLS(ctx, plan, host)
		if err != nil {
			// DANE or MTA-STS rules this host out; the next may do.
			log.Warn().Str("mx", host).Str("error", inputOf(err).Text).Msg("MX host not used")
			t.fail(err)
			continue
		}
		c, reused, err := s.acquireHost(ctx, log, t, host, plan, hp)
		if err == nil {
			if !t.relay {
				c.dest = plan.domain
			}
			// A later connection (the server's limit of messages per
			// connection, a stale pooled one) starts with this host.
			t.next, t.cur = i, i
			t.wrongFamily, t.allHeld = false, false
			return c, reused, nil
		}
		if !errors.Is(err, errLimit) {
			t.fail(err)
		}
		var se *stepErr
		if t.stopped != "" || ctx.Err() != nil || (errors.As(err, &se) && se.in.Stage == classify.StageAuth) {
			break
		}
	}
	if t.stopped != "" {
		log.Warn().Str("stopped_by", t.stopped).Msg("MX hosts left untried")
	}
	return nil, false, t.outcome()
}

func (s *Sender) acquireHost(ctx context.Context, log *msgLog, t *tries, host string, plan *tlsPlan, hp *hostPlan) (*client, bool, error) {
	key := "mx:" + host + hp.mode.poolSuffix()
	if s.cfg.Relay != "" {
		key = "relay:" + s.cfg.Relay
	}
	key = poolKey(key, sourceFrom(ctx))
	c, slot, stale, err := s.pool.get(ctx, key)
	for _, sc := range stale {
		sc.quit()
	}
	for err == nil && !slot && c.unsolicited() {
		// Out of step, or closed by the server while it waited: never
		// taken up (client.unsolicited). Its slot goes to the next.
		log.Debug().Str("mx", host).Str("addr", c.addr).Msg("pooled connection had unread data or was closed; dropped")
		c.broken = true
		s.pool.put(c, false)
		c.close()
		c, slot, stale, err = s.pool.get(ctx, key)
		for _, sc := range stale {
			sc.quit()
		}
	}
	if err != nil {
		if errors.Is(err, errClosed) {
			return nil, false, &stepErr{in: classify.Input{Stage: classify.StageConnect, Event: classify.EventLocal, Text: "outflow: sender is shutting down"}, err: err}
		}
		return nil, false, &stepErr{in: classify.Input{Stage: classify.StageConnect, Event: classify.EventTimeout, Text: fmt.Sprintf("waiting for a free connection to %s: %v", host, err)}, err: err}
	}
	if !slot {
		return c, true, nil
	}
	var addrs []string
	if s.cfg.Relay != "" {
		addrs = []string{s.cfg.Relay}
	} else {
		var err error
		if addrs, err = s.hostAddrs(ctx, log, host, sourceFrom(ctx)); err != nil {
			s.pool.release(key)
			return nil, false, err
		}
	}
	last := errLimit
	var held []deadAddr // addresses not dialled: they failed to connect lately (deadaddr.go)
	for _, addr := range addrs {
		tk, h := s.dead.claim(deadKey(sourceFrom(ctx), addr))
		if h != nil {
			log.Debug().Str("mx", host).Str("addr", addr).Time("held_until", h.until).Msg("MX address not dialled: it failed to connect lately")
			held = append(held, *h)
			continue
		}
		if !t.dialAllowed(&s.cfg, addr) {
			tk.done(dialNeutral, 0, host, addr, "")
			break
		}
		c, err := s.open(ctx, log, host, addr, key, plan, hp)
		s.noteDial(ctx, log, tk, host, addr, err)
		if err == nil {
			return c, false, nil
		}
		last = err
		if inputOf(err).Stage != classify.StageConnect {
			t.failed++ // connected, then failed: a session (MXSessionLimit)
		}
		log.Debug().Str("mx", host).Str("addr", addr).Err(err).Msg("connection attempt failed")
		var se *stepErr
		if ctx.Err() != nil || (errors.As(err, &se) && se.in.Stage == classify.StageAuth) {
			break
		}
	}
	s.pool.release(key)
	if last == errLimit && len(held) > 0 {
		last = heldError(host, held)
	}
	return nil, false, last
}

// open dials addr and brings the session up to the point where MAIL may
// be sent: greeting, EHLO, TLS per policy, AUTH for the relay.
func (s *Sender) open(ctx context.Context, log *msgLog, host, addr, key string, plan *tlsPlan, hp *hostPlan) (*client, error) {
	relay := s.cfg.Relay != ""
	c, err := dial(ctx, &s.cfg, log.logger(), host, addr, key, relay && s.cfg.RelayTLS == RelayImplicitTLS)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (*client, error) {
		c.close()
		return nil, err
	}
	if err := c.hello(ctx); err != nil {
		return fail(err)
	}
	if relay {
		if s.cfg.RelayTLS == RelaySTARTTLS {
			if !c.has("STARTTLS") {
				return fail(&stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure,
					Text: "outflow (synthetic, no server reply): relay " + host + " does not offer STARTTLS and --relay-tls is starttls (a local relay without TLS: --relay-tls none)"}})
			}
			if err := c.startTLS(ctx, true, nil, tls.VersionTLS12); err != nil {
				return fail(err)
			}
		}
		if s.cfg.RelayUsername != "" {
			end, err := s.loginTurn(ctx, key, host)
			if err != nil {
				return fail(err)
			}
			err = c.auth(ctx, s.cfg.RelayUsername, s.cfg.RelayPassword)
			if err != nil {
				// Before end: the Sends it wakes must find the refusal.
				s.noteAuthFailure(log, host, err)
			}
			end(err == nil)
			if err != nil {
				return fail(err)
			}
		}
	} else {
		sc, err := s.secure(ctx, log, c, plan, hp)
		if err != nil {
			return fail(err)
		}
		c = sc
	}
	log.Debug().Str("mx", host).Str("addr", addr).Bool("tls", c.tls).Bool("tls_verified", c.tlsVerified).Msg("connected")
	return c, nil
}

// openPlain opens a session that never tries STARTTLS.
func (s *Sender) openPlain(ctx context.Context, log *msgLog, host, addr, key string) (*client, error) {
	c, err := dial(ctx, &s.cfg, log.logger(), host, addr, key, false)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = c.raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := c.hello(ctx); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

// authGate is the login state of one pool key of the relay (the relay,
// and the source address when there is one).
type authGate struct {
	// ok: a login succeeded since the last refusal, so Sends log in
	// at will.
	ok bool
	// busy is closed when the login going on ends; nil when none is.
	busy chan struct{}
}

// loginTurn waits until a Send may log in to the relay on a connection of
// pool key key, and returns end, to be called with the login's result.
//
// Until a login is known to have succeeded since the last refusal (at
// start, after a refusal, once the refusal's hold is over), one login at
// a time goes through per key; the other Sends wait for its result
// (within ctx). A success lets them all log in; a refusal is held
// (noteAuthFailure), and they take the held refusal instead, presenting
// the bad credentials no further; any other end (a 454, a lost
// connection) lets the next one try. Without this, every Send that got
// past the check at its start logged in at once: 20 concurrent Sends with
// a wrong password were 20 failed logins (and as many again each time
// the hold ended), which locks the account or the address out at relays
// that count them (fail2ban, Microsoft 365 smart lockout).
func (s *Sender) loginTurn(ctx context.Context, key, host string) (end func(ok bool), err error) {
	for {
		s.authMu.Lock()
		if in, held := s.authHeldLocked(); held {
			s.authMu.Unlock()
			return nil, &stepErr{in: in}
		}
		if s.authGates == nil {
			s.authGates = map[string]*authGate{}
		}
		g := s.authGates[key]
		if g == nil {
			g = &authGate{}
			s.authGates[key] = g
		}
		if g.ok {
			s.authMu.Unlock()
			return func(bool) {}, nil
		}
		if g.busy == nil {
			busy := make(chan struct{})
			g.busy = busy
			s.authMu.Unlock()
			return func(ok bool) {
				s.authMu.Lock()
				defer s.authMu.Unlock()
				g.ok = g.ok || ok
				g.busy = nil
				close(busy)
			}, nil
		}
		busy := g.busy
		s.authMu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, &stepErr{in: classify.Input{Stage: classify.StageAuth, Event: classify.EventTimeout,
				Text: fmt.Sprintf("waiting for another login to relay %s to end: %v", host, context.Cause(ctx))}, err: context.Cause(ctx)}
		}
	}
}

// noteAuthFailure remembers a permanent AUTH refusal from the relay so
// that the next AuthFailureHold of Sends fail at once instead of each
// presenting the same bad credentials again. A refusal, held or not,
// makes logins go one at a time again (loginTurn).
func (s *Sender) noteAuthFailure(log *msgLog, host string, err error) {
	var se *stepErr
	if !errors.As(err, &se) {
		return
	}
	ev := log.Error().Str("relay", s.cfg.Relay).Int("code", se.in.Code).Str("enhanced_code", se.in.Enhanced).Str("reply", se.in.Text)
	if se.in.Code/100 != 5 {
		ev.Msg("relay AUTH failed")
		return
	}
	s.authMu.Lock()
	for _, g := range s.authGates {
		g.ok = false
	}
	if s.cfg.AuthFailureHold < 0 {
		s.authMu.Unlock()
		ev.Msg("relay AUTH failed")
		return
	}
	until := time.Now().Add(s.cfg.AuthFailureHold)
	s.authUntil = until
	s.authRefuse = se.in
	s.authMu.Unlock()
	ev.Time("held_until", until).Msg("relay AUTH refused; holding all relay deliveries without connecting until held_until")
}

func (s *Sender) authHeld() (classify.Input, bool) {
	s.authMu.Lock()
	defer s.authMu.Unlock()
	return s.authHeldLocked()
}

// authHeldLocked is authHeld with authMu held.
func (s *Sender) authHeldLocked() (classify.Input, bool) {
	if time.Now().Before(s.authUntil) {
		in := s.authRefuse
		in.Text = fmt.Sprintf("outflow (cached relay AUTH refusal, not sent again until %s): %s",
			s.authUntil.UTC().Format(time.RFC3339), in.Text)
		return in, true
	}
	return classify.Input{}, false
}

// msgLog is the logger of one Send, with the message's id and destination.
// At the usual levels a Send logs nothing, so the logger with those fields
// (a 500-octet buffer in zerolog) is made on first use only.
type msgLog struct {
	base     *zerolog.Logger
	id, dest string
	l        *zerolog.Logger
}

func (ml *msgLog) logger() zerolog.Logger {
	if ml.l == nil {
		l := ml.base.With().Str("msg_id", ml.id).Str("dest", ml.dest).Logger()
		ml.l = &l
	}
	return *ml.l
}

// enabled says whether an event at level would be written: when not,
// zerolog's own check fails too and the event would be nil.
func (ml *msgLog) enabled(level zerolog.Level) bool {
	return level >= ml.base.GetLevel() && level >= zerolog.GlobalLevel()
}

func (ml *msgLog) event(level zerolog.Level) *zerolog.Event {
	if !ml.enabled(level) {
		return nil
	}
	l := ml.logger()
	return l.WithLevel(level)
}

func (ml *msgLog) Debug() *zerolog.Event { return ml.event(zerolog.DebugLevel) }
func (ml *msgLog) Info() *zerolog.Event  { return ml.event(zerolog.InfoLevel) }
func (ml *msgLog) Warn() *zerolog.Event  { return ml.event(zerolog.WarnLevel) }
func (ml *msgLog) Error() *zerolog.Event { return ml.event(zerolog.ErrorLevel) }

// inputOf extracts the outcome from an error of this package.
func inputOf(err error) classify.Input {
	var se *stepErr
	if errors.As(err, &se) {
		return se.in
	}
	return classify.Input{Stage: classify.StageUnknown, Event: classify.EventConnLost, Text: err.Error()}
}
