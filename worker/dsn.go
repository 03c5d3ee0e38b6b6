package worker

import (
	"context"
	"encoding/json"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// Delivery status notifications (RFC 3464 reports, RFC 3461 parameters).
//
// When a recipient ends permanent, or its envelope's budget is spent (dead
// letters), a "failed" notice goes to the envelope sender; when a message
// has been queued longer than DSNConfig.DelayWarning, one "delayed" notice
// goes for the recipients still deferred; a recipient whose NOTIFY asks for
// SUCCESS gets a "relayed" notice when the server that accepted it does not
// offer DSN (RFC 3461 §6.2.2; one that does received NOTIFY and owes the
// notice itself). One notice per message and event lists every recipient
// that shared the event: the parts of a message split by destination share
// their first pass through a pass record (see recordPass) and their delay
// warning through a delay record (see delayNotice).
//
// A notice is a new message queued through outflow itself: null reverse
// path, one recipient, the original's tenant (so it is DKIM-signed for the
// domain of its From, MAILER-DAEMON@<the original sender's domain>, when
// a key exists), flagged as a report so nothing ever answers it.
//
// Durability: the notice is enqueued (and acknowledged by JetStream)
// before the original's durable step (its SENT marker, reschedule, dead
// letter or final ack). Its queue id is derived from the envelope id, its
// step and the action (a message's pass report: the message id and the
// action), and the work stream's deduplication window (24 h)
// absorbs the second copy when a crash between the two steps makes the
// attempt run again. A failed enqueue fails the attempt's durable step, so
// the original comes back and the notice is tried again with it.
//
// Never a loop, never backscatter: no notice for a null reverse path, for
// an envelope that is itself a report or whose body is one (multipart/
// report; report-type=delivery-status), to an address on the tenant's
// suppression list, for NOTIFY=NEVER, or past DSNConfig.SenderRate notices
// per hour to one address across the fleet (allowNotice). A hard bounce puts its recipient on the
// suppression list (suppress.go) from the same result that lists it in the
// notice, so the tenant hears about it once: its next message to that
// recipient is refused at submission.

// Defaults of DSNConfig.
const (
	// DefaultDelayWarning is Postfix's delay_warning_time when enabled.
	DefaultDelayWarning = 4 * time.Hour
	// DefaultDSNSenderRate is notices per hour to one address.
	DefaultDSNSenderRate = 60
	// DefaultPassTimeout is how long a multi-part message's first-pass
	// report waits for parts that have not reached their pass. A healthy
	// pass takes seconds; a few minutes cover a slow server's greeting
	// (the sender waits 5 min for it) and a short backlog, and a sender
	// still hears of a hard failure within minutes, as from Postfix,
	// rather than when a paused destination resumes.
	DefaultPassTimeout = 5 * time.Minute
)

// DSNConfig turns on delivery status notifications (Config.DSN).
type DSNConfig struct {
	// ReportingMTA is the host name in Reporting-MTA and in the notices'
	// Message-ID. Required.
	ReportingMTA string
	// DelayWarning is how long a message waits in the queue before its
	// still deferred recipients get a delayed notice, one per message
	// (delayNotice). Default DefaultDelayWarning (4 h); negative turns
	// warnings off.
	DelayWarning time.Duration
	// SenderRate is the most notices per hour to one address, across
	// every process sharing the JetStream; past it notices are skipped and
	// counted. Default DefaultDSNSenderRate; negative means no limit.
	SenderRate float64
	// PassTimeout is how long a multi-part message's first-pass report
	// waits for its parts: past it the report goes out with the parts
	// that reached their pass, and the others report on their own. Default
	// DefaultPassTimeout; negative waits for every part.
	PassTimeout time.Duration
	// Tenants holds per-tenant settings; a tenant not listed gets the
	// defaults.
	Tenants map[string]TenantDSN
	// Suppressions is checked for the notice's recipient; nil checks
	// nothing.
	Suppressions SuppressionChecker
	// Metrics counts notices; nil counts nothing.
	Metrics *DSNMetrics
}

// TenantDSN is one tenant's notification settings ([tenants.NAME] in the
// config file).
type TenantDSN struct {
	// Enabled turns notices on or off for the tenant. Nil: on for mail
	// submitted over SMTP (whose clients expect RFC 5321 §6.1 bounces),
	// off for mail from the HTTP API and NATS (whose clients read events
	// and webhooks) and for envelopes that predate the source field.
	Enabled *bool
	// Address receives the tenant's notices instead of the envelope
	// sender; "" sends them to the envelope sender.
	Address string
	// DelayWarning overrides DSNConfig.DelayWarning; 0 (or negative)
	// turns delay warnings off for the tenant; nil keeps the default.
	DelayWarning *time.Duration
}

// SuppressionChecker answers whether a tenant's notices to addr are
// suppressed; *queue.Suppressions implements it.
type SuppressionChecker interface {
	Suppressed(ctx context.Context, tenant, addr string) (*queue.Suppression, error)
}

// Reasons a notice is not sent (outflow_dsn_skipped_total{reason}).
const (
	skipNullSender = "null-sender"
	skipReport     = "report"
	skipTenantOff  = "tenant-off"
	skipNotify     = "notify"
	skipSuppressed = "suppressed"
	skipRate       = "rate-limited"
	skipError      = "error"
)

// dsnState is the pool's notification state.
type dsnState struct {
	cfg    *DSNConfig
	rate   senderRate
	passes passWaits
}

func newDSNState(c *DSNConfig) *dsnState {
	if c == nil {
		return nil
	}
	cfg := *c
	if cfg.DelayWarning == 0 {
		cfg.DelayWarning = DefaultDelayWarning
	}
	if cfg.SenderRate == 0 {
		cfg.SenderRate = DefaultDSNSenderRate
	}
	if cfg.PassTimeout == 0 {
		cfg.PassTimeout = DefaultPassTimeout
	}
	return &dsnState{cfg: &cfg, rate: senderRate{perHour: cfg.SenderRate}}
}

// noticeInput is one event's worth of recipients.
type noticeInput struct {
	action dsn.Action
	kind   string // the NOTIFY keyword that asks for it
	key    string // idempotency key: names the notice's queue id
	rcpts  []dsn.Recipient
	body   []byte // the original as sent; nil to fetch it
	// later: the recipients bounced after their server accepted the
	// message (later.go); body is what that server returned, never
	// fetched (the envelope is gone).
	later bool
}

// tenantOn reports whether e's tenant gets notices.
func (s *dsnState) tenantOn(e *queue.Envelope) bool {
	if t, ok := s.cfg.Tenants[e.Tenant]; ok && t.Enabled != nil {
		return *t.Enabled
	}
	return e.Source == queue.SourceSMTP
}

// delayWarning is e's tenant's delay-warning time, 0 when off.
func (s *dsnState) delayWarning(e *queue.Envelope) time.Duration {
	d := s.cfg.DelayWarning
	if t, ok := s.cfg.Tenants[e.Tenant]; ok && t.DelayWarning != nil {
		d = *t.DelayWarning
	}
	return max(d, 0)
}

func (s *dsnState) skip(reason string) {
	s.cfg.Metrics.skipped(reason)
}

// notice queues one notification about e, unless a rule says not to. It
// returns an error only when the enqueue itself failed: the caller's
// durable step must then fail too, so the attempt (and the notice) runs
// again.
func (w *deliverer) notice(ctx context.Context, e *queue.Envelope, n noticeInput) error {
	if w.dsn == nil || !w.dsn.eligible(e) {
		return nil
	}
	rcpts := w.dsn.wanted(e, n.kind, n.rcpts)
	if len(rcpts) == 0 {
		return nil
	}
	n.rcpts = rcpts
	reason, err := w.sendNotice(ctx, e, n)
	if reason != "" {
		w.event(queue.EventDSN, e, 0, finals(rcpts), reason, nil)
	}
	return err
}

// eligible reports whether e's sender may get notices at all, counting
// the reason when not. Every part of a submission gets the same answer.
func (s *dsnState) eligible(e *queue.Envelope) bool {
	if why := s.ineligible(e); why != "" {
		s.skip(why)
		return false
	}
	return true
}

// ineligible is eligible's reason, "" when e's sender may get notices.
func (s *dsnState) ineligible(e *queue.Envelope) string {
	switch {
	case e.From == "":
		return skipNullSender // RFC 5321 §6.1, RFC 3461 §6.2
	case e.IsReport:
		return skipReport
	case !s.tenantOn(e):
		return skipTenantOff
	}
	return ""
}

// wanted returns the recipients of rcpts whose NOTIFY asks for kind, with
// the ORCPT each was submitted with (counting a skip when none is left).
func (s *dsnState) wanted(e *queue.Envelope, kind string, rcpts []dsn.Recipient) []dsn.Recipient {
	if len(rcpts) == 0 {
		return nil
	}
	out := pick(e, kind, rcpts)
	if len(out) == 0 {
		s.skip(skipNotify)
	}
	return out
}

// pick is wanted without the count: a part's delay note is written at
// deferrals that send nothing.
func pick(e *queue.Envelope, kind string, rcpts []dsn.Recipient) []dsn.Recipient {
	out := rcpts[:0:0]
	for _, r := range rcpts {
		if !e.DSN.Wants(r.Final, kind) {
			continue
		}
		if p := e.DSN.Rcpt(r.Final); p.ORcpt != "" {
			r.Original, r.OriginalType = p.ORcpt, p.ORcptType
		}
		out = append(out, r)
	}
	return out
}

// sendNotice builds and queues the notice n about e: its recipients are
// chosen (n.rcpts), the sender is eligible. It returns the reason of the
// dsn event the caller publishes ("<action> notice <id> to <address>"), ""
// when a rule stopped the notice.
func (w *deliverer) sendNotice(ctx context.Context, e *queue.Envelope, n noticeInput) (string, error) {
	s := w.dsn
	rcpts := n.rcpts
	to := e.From
	if t := s.cfg.Tenants[e.Tenant]; t.Address != "" {
		to = t.Address
	}
	log := w.log.With().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("action", string(n.action)).Logger()
	if s.cfg.Suppressions != nil {
		sup, err := s.cfg.Suppressions.Suppressed(ctx, e.Tenant, to)
		if err != nil {
			// Unknown is not suppressed: a notice owed is sent.
			log.Warn().Err(err).Msg("suppression list unreadable for a notification; sending it")
		} else if sup != nil {
			s.skip(skipSuppressed)
			log.Info().Str("to", to).Msg("notification not sent: its recipient is suppressed")
			return "", nil
		}
	}
	body := n.body
	if body == nil && !n.later {
		b, err := w.cfg.Queue.EnvelopeBody(ctx, e)
		if err != nil {
			log.Warn().Err(err).Msg("original body unavailable; the notification carries no copy of it")
		}
		body = b
	}
	if body != nil && dsn.IsReport(body) {
		s.skip(skipReport)
		return "", nil
	}
	if !w.allowNotice(ctx, to) {
		s.skip(skipRate)
		log.Warn().Str("to", to).Float64("per_hour", s.cfg.SenderRate).Msg("notification not sent: too many to this address")
		return "", nil
	}
	ret := dsn.ReturnHeaders
	if e.DSN != nil && strings.EqualFold(e.DSN.Ret, "FULL") {
		ret = dsn.ReturnFull
	}
	envID := ""
	if e.DSN != nil {
		envID = e.DSN.EnvID
	}
	now := w.now()
	msg, err := dsn.Build(&dsn.Report{
		ReportingMTA: s.cfg.ReportingMTA, From: "MAILER-DAEMON@" + w.noticeDomain(e.From), To: to,
		EnvelopeID: envID, ArrivalDate: e.SubmittedAt, Date: now, ID: n.key,
		OriginalMessageID: e.MessageID, Recipients: rcpts, Original: body, Return: ret, Later: n.later,
	})
	if err != nil {
		s.skip(skipError)
		log.Error().Err(err).Msg("notification not built")
		return "", nil
	}
	ids, err := w.cfg.Queue.Enqueue(ctx, &queue.Submission{
		Tenant: e.Tenant, From: "", Rcpts: []string{to}, Body: msg, ReceivedAt: now.UTC(),
		IdempotencyKey: n.key, Source: queue.SourceDSN, IsReport: true,
	})
	if err != nil {
		return "", err
	}
	final := finals(rcpts)
	id := strings.Join(ids, ",")
	s.cfg.Metrics.sent(string(n.action))
	log.Info().Str("dsn_id", id).Str("to", to).Strs("rcpts", final).Msg("delivery status notification queued")
	return string(n.action) + " notice " + id + " to " + to, nil
}

// finals returns the recipients' Final-Recipient addresses.
func finals(rcpts []dsn.Recipient) []string {
	out := make([]string, len(rcpts))
	for i, r := range rcpts {
		out[i] = r.Final
	}
	return out
}

// noticeKey names a notice: one per envelope, step and event. A delay
// warning has no step: there is one per envelope, ever. An attempt can
// both bounce some recipients and send the rest to dead letters, so the
// two failures have events of their own ("bounced", "dead").
func noticeKey(e *queue.Envelope, event string) string {
	if event == "delayed" {
		return "dsn." + e.ID + ".delayed"
	}
	return "dsn." + e.ID + "." + strconv.Itoa(e.Step) + "." + event
}

// noteDSN keeps what the notices of this attempt need from its result.
func (o *outcome) noteDSN(res sender.Result, body []byte) {
	o.host, o.addr, o.body = res.Host, res.Addr, body
	for _, r := range res.Rcpts {
		if r.DSNRelayed {
			if o.dsnRelayed == nil {
				o.dsnRelayed = map[string]bool{}
			}
			o.dsnRelayed[r.Rcpt] = true
		}
	}
}

// attemptNotices sends the notices an attempt's results owe: failed for
// its bounces, relayed for its delivered NOTIFY=SUCCESS recipients
// (successNotice). In the first pass of a multi-part submission both go
// into the pass record instead, and the part that completes the pass
// sends them for every part (recordPass).
func (w *deliverer) attemptNotices(ctx context.Context, e *queue.Envelope, o *outcome) error {
	if !w.inPass(e) {
		return w.bounceNotice(ctx, e, o)
	}
	if why := w.dsn.ineligible(e); why != "" {
		// Counted as skipped only when the attempt owed a notice, as a
		// one-part message's are: a part delivered in full owed none.
		if len(o.bounced) > 0 || len(w.relayedReports(e, o)) > 0 {
			w.dsn.skip(why)
		}
		return nil
	}
	note := passNote{
		Failed:  w.dsn.wanted(e, queue.NotifyFailure, w.bounceReports(o)),
		Relayed: w.dsn.wanted(e, queue.NotifySuccess, w.relayedReports(e, o)),
	}
	if err := w.recordPass(ctx, e, note, o.body); err != nil {
		return err
	}
	o.passed = true
	return nil
}

// bounceNotice reports the recipients an attempt bounced.
func (w *deliverer) bounceNotice(ctx context.Context, e *queue.Envelope, o *outcome) error {
	if w.dsn == nil || len(o.bounced) == 0 {
		return nil
	}
	return w.notice(ctx, e, noticeInput{action: dsn.Failed, kind: queue.NotifyFailure, key: noticeKey(e, "bounced"), rcpts: w.bounceReports(o), body: o.body})
}

// bounceReports is the failed block of each recipient an attempt bounced.
func (w *deliverer) bounceReports(o *outcome) []dsn.Recipient {
	at := w.now()
	rcpts := make([]dsn.Recipient, 0, len(o.bounced))
	for _, b := range o.bounced {
		rcpts = append(rcpts, rcptReport(b.rcpt, dsn.Failed, b.res, o.host, at))
	}
	return rcpts
}

// deadNotice reports the recipients of an envelope going to dead letters
// (budget spent, max age passed, body lost), with its last reply.
func (w *deliverer) deadNotice(ctx context.Context, e, next *queue.Envelope, reason string) error {
	if w.dsn == nil {
		return nil
	}
	var last classify.Result
	at := lastAttemptAt(next) // RFC 3464 §2.3.7: none without an attempt
	if n := len(next.History); n > 0 {
		h := next.History[n-1]
		last = classify.Result{Code: h.Code, Enhanced: h.Enhanced, Text: h.Reply}
	}
	if last.Text == "" {
		last.Text = reason
	}
	rcpts := make([]dsn.Recipient, 0, len(next.Rcpts))
	for _, r := range next.Rcpts {
		rc := rcptReport(r, dsn.Failed, last, "", at)
		switch {
		case strings.HasPrefix(reason, "body missing"):
			rc.Status = "5.3.0" // outflow's own store failed it
		case last.Code/100 == 4 || last.Code == 0:
			// The last reply was temporary, or there was none (a DNS or
			// connection failure, or no attempt before the deadline):
			// the failure is outflow giving up, RFC 3463 X.4.7,
			// delivery time expired.
			rc.Status = "5.4.7"
		}
		rcpts = append(rcpts, rc)
	}
	if w.inPass(e) {
		// Dead before any attempt (max age, body lost): the part's first
		// pass ends here.
		if !w.dsn.eligible(e) {
			return nil
		}
		if err := w.recordPass(ctx, e, passNote{Failed: w.dsn.wanted(e, queue.NotifyFailure, rcpts)}, nil); err != nil {
			return err
		}
		next.PassNoted = true
		return nil
	}
	return w.notice(ctx, e, noticeInput{action: dsn.Failed, kind: queue.NotifyFailure, key: noticeKey(e, "dead"), rcpts: rcpts})
}

// delayNotice sends the one delay warning of a message being deferred
// once it has waited DelayWarning, and marks next so that it never sends
// another. The decision is made once, sent or not (NOTIFY without DELAY,
// a tenant without notices).
//
// A message of one destination decides on its own. The parts of a
// multi-part message share one warning through the message's delay record
// (queue.NoteDelay), so that the sender hears once about every recipient
// still deferred, whichever process delivers each part: a part deferred
// before the warning time notes its recipients still deferred (again only
// when their number changed, so a part retried for hours writes once), and
// one that ends takes them out (endDelay); the first part deferred past the
// warning time claims the warning and sends it for its own recipients and
// every note in the record, under a queue id derived from the message id
// (a claimer run again after a crash reads the frozen record and queues
// the same id). A part deferred later reads the claim and sends nothing,
// unless the warning did not list it (it was deferred for the first time
// after the claim, or its note did not fit the record): then it warns for
// its own recipients, so no recipient gets two warnings and none is left
// without one.
func (w *deliverer) delayNotice(ctx context.Context, e, next *queue.Envelope, o *outcome) error {
	if w.dsn == nil || e.DelayWarned {
		return nil
	}
	warn := w.dsn.delayWarning(e)
	if warn <= 0 || e.SubmittedAt.IsZero() {
		return nil
	}
	due := w.now().Sub(e.ReadyAt()) >= warn
	if e.Alone() || w.dsn.ineligible(e) != "" {
		if !due {
			return nil
		}
		if err := w.notice(ctx, e, noticeInput{action: dsn.Delayed, kind: queue.NotifyDelay, key: noticeKey(e, "delayed"), rcpts: w.delayReports(e, next, o), body: o.body}); err != nil {
			return err
		}
		next.DelayWarned = true
		return nil
	}
	rcpts := pick(e, queue.NotifyDelay, w.delayReports(e, next, o))
	if !due {
		w.noteDelay(ctx, e, next, rcpts)
		return nil
	}
	d, err := w.cfg.Queue.NoteDelay(ctx, e, nil, true)
	if err != nil {
		return err
	}
	var parts []passNote
	key := "dsn." + e.ID // not listed: its own warning, noticeKey's name
	switch {
	case d.Mine:
		parts, key = w.readNotes(e, d.Notes), "dsn."+e.MsgID
	case d.Listed:
		next.DelayWarned = true
		return nil
	}
	if len(rcpts) > 0 {
		parts = append(parts, passNote{ID: e.ID, Dest: e.Dest, Delayed: rcpts})
	}
	if len(parts) == 0 {
		w.dsn.skip(skipNotify)
	} else if err := w.passNotices(ctx, e, parts, o.body, key); err != nil {
		return err
	}
	next.DelayWarned = true
	return nil
}

// delayReports is the delayed block of each recipient still deferred,
// with its own reply in the attempt (o.results follows e.Rcpts; o.lead for
// one without a result). A multi-part message's deferred parts call it at
// every deferral, so the look-up is by map, not a search per recipient.
func (w *deliverer) delayReports(e, next *queue.Envelope, o *outcome) []dsn.Recipient {
	at := w.now()
	if o.refused {
		at = lastAttemptAt(next) // none now: a refusal holds it
	}
	pos := make(map[string]int, len(e.Rcpts))
	for i, r := range e.Rcpts {
		pos[r] = i
	}
	rcpts := make([]dsn.Recipient, 0, len(next.Rcpts))
	for _, r := range next.Rcpts {
		res := o.lead
		if i, ok := pos[r]; ok && i < len(o.results) {
			res = o.results[i]
		}
		rc := rcptReport(r, dsn.Delayed, res, o.host, at)
		rc.WillRetryUntil = e.Deadline
		if rc.Status == "" || rc.Status[0] != '4' {
			rc.Status = "4.0.0" // RFC 3464 §2.3.4: a delay is a 4.x.x
		}
		rcpts = append(rcpts, rc)
	}
	return rcpts
}

// noteDelay writes a deferred part's recipients still deferred (those
// whose NOTIFY asks for DELAY) into its message's delay record, when their
// number changed since its last note: recipients only ever leave a part,
// so the same number is the same set. A failure is logged, not returned:
// failing the attempt's durable step would send its delivered recipients
// again, and a missing note only leaves them out of a sibling's warning
// (this part then warns on its own).
func (w *deliverer) noteDelay(ctx context.Context, e, next *queue.Envelope, rcpts []dsn.Recipient) {
	if len(rcpts) == e.DelayNoted {
		return
	}
	var raw json.RawMessage
	if len(rcpts) > 0 {
		b, err := json.Marshal(&passNote{ID: e.ID, Dest: e.Dest, Delayed: rcpts})
		if err != nil {
			return
		}
		raw = b
	}
	if _, err := w.cfg.Queue.NoteDelay(ctx, e, raw, false); err != nil {
		w.log.Warn().Err(err).Str("msg_id", e.ID).Msg("delay record not updated; a sibling's delay warning may not list this part")
		return
	}
	next.DelayNoted = len(rcpts)
}

// endDelay takes an ended part (delivered, bounced or dead) out of its
// message's delay record, so that a sibling's warning does not list
// recipients no longer waiting. Only a part that noted recipients pays it.
func (w *deliverer) endDelay(ctx context.Context, e *queue.Envelope) {
	if w.dsn == nil || e.DelayNoted == 0 || e.DelayWarned {
		return
	}
	w.noteDelay(ctx, e, e.Clone(), nil)
}

// readNotes decodes the parts' notes of a per-message record, leaving out
// (and logging) one that cannot be read.
func (w *deliverer) readNotes(e *queue.Envelope, raw []json.RawMessage) []passNote {
	parts := make([]passNote, 0, len(raw)+1)
	for _, n := range raw {
		var pn passNote
		if err := json.Unmarshal(n, &pn); err != nil {
			w.log.Error().Err(err).Str("msg_id", e.ID).Msg("a part's note in a message's record is unreadable; reporting the others")
			continue
		}
		parts = append(parts, pn)
	}
	return parts
}

// successNotice sends a relayed notice for delivered recipients whose
// NOTIFY asks for SUCCESS, when the accepting server did not take the
// DSN parameters (RFC 3461 §6.2.2); one that did owes the notice itself.
// In a submission's first pass attemptNotices recorded them already.
func (w *deliverer) successNotice(ctx context.Context, e *queue.Envelope, o *outcome) error {
	if w.dsn == nil || e.DSN == nil || o.passed {
		return nil
	}
	rcpts := w.relayedReports(e, o)
	if len(rcpts) == 0 {
		return nil
	}
	return w.notice(ctx, e, noticeInput{action: dsn.Relayed, kind: queue.NotifySuccess, key: noticeKey(e, "relayed"), rcpts: rcpts, body: o.body})
}

// relayedReports is the relayed block of each delivered recipient that
// asked for SUCCESS from a server that did not take its NOTIFY.
func (w *deliverer) relayedReports(e *queue.Envelope, o *outcome) []dsn.Recipient {
	if e.DSN == nil {
		return nil
	}
	at := w.now()
	var rcpts []dsn.Recipient
	for _, r := range o.delivered {
		if o.dsnRelayed[r] || !e.DSN.Wants(r, queue.NotifySuccess) {
			continue
		}
		res := classify.Result{Code: 250, Text: "accepted"}
		if d := firstDelivered(o); d != nil {
			res = *d
		}
		rcpts = append(rcpts, rcptReport(r, dsn.Relayed, res, o.host, at))
	}
	return rcpts
}

// A multi-part submission's first pass (queue.RecordPass). Its parts may
// be delivered by different processes; each records, once, the notices its
// first pass owes, and the part whose record completes the pass sends one
// failed notice (and one relayed notice) for all of them. A part's first
// pass ends at its first durable outcome: delivered, bounced or dead (all
// final), deferred, held or refused by the coordinator for a suspension
// or an open breaker (its first deferral; longRefusal). So a deferred part does not hold back its siblings' failures
// longer than its own first attempt; what fails after its pass (a later
// bounce, the budget spent) is a notice of its own, as for a message of one
// destination. A part that is not attempted at all (its destination
// paused, a backlog) holds the report back at most DSNConfig.PassTimeout:
// see passWaits for who sends it then.
//
// Exactly one report: the report's queue id is derived from the
// submission id and the action, so every sender of a complete pass (the
// part that completed it, a process at the pass's deadline, and any part
// run again after a crash between its record and its durable step) queues
// the same id, and the work stream's deduplication absorbs the copies. A
// record written before a crash is found again by the part's next run,
// which counts once.

// passNote is one part's share of its submission's first pass, or of its
// message's delay warning (Delayed).
type passNote struct {
	ID      string          `json:"id"`   // the part's envelope id, whose history names the report
	Dest    string          `json:"dest"` // and its destination
	Failed  []dsn.Recipient `json:"failed,omitempty"`
	Relayed []dsn.Recipient `json:"relayed,omitempty"`
	Delayed []dsn.Recipient `json:"delayed,omitempty"`
}

// inPass reports whether e's notices go into its submission's pass
// record: it is one of several parts that report together (not
// Envelope.Alone), and has not recorded its pass yet.
func (w *deliverer) inPass(e *queue.Envelope) bool {
	return w.dsn != nil && !e.Alone() && !e.PassNoted
}

// recordPass records note as e's first pass and, when that completes the
// submission's pass, sends its notices. It marks e (and so the envelope
// its durable step writes, a clone of e) as having recorded its pass.
func (w *deliverer) recordPass(ctx context.Context, e *queue.Envelope, note passNote, body []byte) error {
	var raw json.RawMessage
	note.ID, note.Dest = e.ID, e.Dest
	if len(note.Failed)+len(note.Relayed) > 0 {
		b, err := json.Marshal(&note)
		if err != nil {
			return err
		}
		raw = b
	}
	p, err := w.cfg.Queue.RecordPass(ctx, e, raw)
	if err != nil {
		return err
	}
	if p.Alone {
		// Not in the record (too large to share it): reported on its own.
		if err := w.passNotices(ctx, e, []passNote{note}, body, noticeKey(e, "pass")); err != nil {
			return err
		}
	}
	switch {
	case p.Complete:
		w.dsn.passes.done(e.MsgID)
		if err := w.passNotices(ctx, e, w.readNotes(e, p.Notes), body, passReportKey(e.MsgID)); err != nil {
			return err
		}
		if len(p.Notes) > 0 {
			// A part that noted something may have recorded a wait.
			w.endPassWait(ctx, e.MsgID)
		}
	case raw != nil && !p.Alone && w.dsn.cfg.PassTimeout > 0:
		// The others may never come: this process sends the report at
		// the pass's deadline if nobody completed it by then, or, if it
		// stops first, whichever process takes up the wait it records
		// (passWaits).
		due := w.now().Add(w.dsn.cfg.PassTimeout)
		c, b := waitCopy(e, body)
		if err := w.cfg.Queue.WaitPass(ctx, c, b, due); err != nil {
			return err
		}
		w.dsn.passes.wait(c, b, due)
	}
	e.PassNoted = true
	return nil
}

// passReportKey names the report of a message's pass (key.failed,
// key.relayed), whoever sends it: the part that completed the pass, or
// a process at its deadline.
func passReportKey(msgID string) string { return "dsn." + msgID + ".pass" }

// passNotices sends one failed, one relayed and one delayed notice for the
// parts' recipients, named key.failed, key.relayed and key.delayed (each
// only when it lists someone), and names each in the history of every part
// it lists, with that part's recipients.
func (w *deliverer) passNotices(ctx context.Context, e *queue.Envelope, parts []passNote, body []byte, key string) error {
	for _, a := range []struct {
		action dsn.Action
		of     func(passNote) []dsn.Recipient
	}{
		{dsn.Failed, func(p passNote) []dsn.Recipient { return p.Failed }},
		{dsn.Relayed, func(p passNote) []dsn.Recipient { return p.Relayed }},
		{dsn.Delayed, func(p passNote) []dsn.Recipient { return p.Delayed }},
	} {
		var rcpts []dsn.Recipient
		for _, p := range parts {
			rcpts = append(rcpts, a.of(p)...)
		}
		if len(rcpts) == 0 {
			continue
		}
		reason, err := w.sendNotice(ctx, e, noticeInput{action: a.action, key: key + "." + string(a.action), rcpts: rcpts, body: body})
		if err != nil {
			return err
		}
		for _, p := range parts {
			if reason == "" {
				break // not sent: no history names it
			}
			if len(a.of(p)) > 0 {
				part := &queue.Envelope{ID: p.ID, MsgID: e.MsgID, Tenant: e.Tenant, Dest: p.Dest}
				w.event(queue.EventDSN, part, 0, finals(a.of(p)), reason, nil)
			}
		}
	}
	return nil
}

// passDeferred ends e's first pass with nothing to report when the
// coordinator refuses it: a part waiting for its destination does not
// hold back its siblings' report.
func (w *deliverer) passDeferred(ctx context.Context, e *queue.Envelope) error {
	if !w.inPass(e) || w.dsn.ineligible(e) != "" {
		return nil
	}
	return w.recordPass(ctx, e, passNote{}, nil)
}

// noticeDomain is the domain of a notice's From: the original sender's
// when a DKIM key signs its mail, so that the notice passes DMARC as the
// tenant's mail does; else this host's (ReportingMTA), as Postfix's
// MAILER-DAEMON@myhostname: a notice from the null sender is checked by
// SPF on the EHLO name, which aligns with that, and a From at a domain
// with DMARC p=reject that nothing here signs would be refused by the
// sender's own mail system, and lost.
func (w *deliverer) noticeDomain(from string) string {
	domain := queue.Domain(from)
	if sf, ok := w.cfg.Signer.(interface{ Signs(string) bool }); ok && sf.Signs(domain) {
		return domain
	}
	if host := strings.ToLower(w.dsn.cfg.ReportingMTA); strings.Contains(strings.Trim(host, "."), ".") && !strings.HasPrefix(host, "localhost.") {
		return host
	}
	return domain // a host name that is no domain (a container's id): the sender's, as before
}

// rcptReport is one recipient's block from a classified reply.
// lastAttemptAt is when e was last tried, zero when never (a notice then
// has no Last-Attempt-Date).
func lastAttemptAt(e *queue.Envelope) time.Time {
	if n := len(e.History); n > 0 {
		return e.History[n-1].At
	}
	return time.Time{}
}

func rcptReport(rcpt string, a dsn.Action, r classify.Result, host string, at time.Time) dsn.Recipient {
	rc := dsn.Recipient{Final: rcpt, Action: a, Status: r.Enhanced, RemoteMTA: remoteMTAName(host), LastAttempt: at}
	if r.Code != 0 {
		rc.Diagnostic = replyLine(r)
	} else if r.Text != "" {
		// Not an SMTP reply (DNS, a connection failure): said as what it is.
		rc.DiagnosticType, rc.Diagnostic = "x-outflow", oneLine(r.Text)
	}
	return rc
}

// remoteMTAName is host as the name in Remote-MTA ("dns; NAME") and in the
// notice's text: a host name as it is, and an IP address (a relay or an
// MX host given as one) as an address literal, [IPv6:::1] or [192.0.2.1],
// as Reporting-MTA writes a --hostname that is one. A bare address is no
// name of the dns type (RFC 3464 2.3.5, RFC 5321 4.1.3); a zone, which
// means something on this host only, is left out.
func remoteMTAName(host string) string {
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if ip = ip.Unmap().WithZone(""); ip.Is4() {
		return "[" + ip.String() + "]"
	}
	return "[IPv6:" + ip.String() + "]"
}

// messageDSN is e's parameters as the sender passes them on.
func messageDSN(e *queue.Envelope) *sender.DSNParams {
	if e.DSN == nil {
		return nil
	}
	d := &sender.DSNParams{Ret: e.DSN.Ret, EnvID: e.DSN.EnvID}
	if len(e.DSN.Rcpts) > 0 {
		d.Rcpts = make([]sender.RcptDSN, len(e.Rcpts))
		for i, r := range e.Rcpts {
			p := e.DSN.Rcpts[r]
			d.Rcpts[i] = sender.RcptDSN{Notify: p.Notify, ORcpt: p.ORcpt, ORcptType: p.ORcptType}
		}
	}
	return d
}

// allowNotice takes one from the allowance of notices to addr
// (DSNConfig.SenderRate per hour), shared by every process on the queue's
// JetStream (queue.TakeAllowance), so a fleet sends at most the rate, not
// the rate times its size. When the shared allowance cannot be read this
// process's own bucket decides: a storm is still slowed, and a notice
// owed is not lost to a NATS hiccup.
func (w *deliverer) allowNotice(ctx context.Context, addr string) bool {
	s := w.dsn
	if s.cfg.SenderRate < 0 {
		return true
	}
	addr = strings.ToLower(addr)
	now := w.now()
	ok, err := w.cfg.Queue.TakeAllowance(ctx, "dsn:"+addr, s.cfg.SenderRate, now)
	if err != nil {
		w.log.Warn().Err(err).Msg("shared notification allowance unreadable; this process's own limit applies")
		return s.rate.allow(addr, now)
	}
	return ok
}

// senderRate is allowNotice's fallback: a token bucket per lower-cased
// address holding an hour's allowance, refilled continuously, in this
// process only. Bounded: past maxTracked addresses the map starts again
// from empty (everyone gets a fresh allowance, never fewer).
type senderRate struct {
	perHour float64
	mu      sync.Mutex
	buckets map[string]*rateBucket
}

type rateBucket struct {
	tokens float64
	at     time.Time
}

const maxTracked = 100_000

func (r *senderRate) allow(addr string, now time.Time) bool {
	if r.perHour < 0 {
		return true
	}
	addr = strings.ToLower(addr)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.buckets == nil || len(r.buckets) >= maxTracked {
		r.buckets = map[string]*rateBucket{}
	}
	b, ok := r.buckets[addr]
	if !ok {
		b = &rateBucket{tokens: r.perHour, at: now}
		r.buckets[addr] = b
	}
	b.tokens = min(r.perHour, b.tokens+now.Sub(b.at).Hours()*r.perHour)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
