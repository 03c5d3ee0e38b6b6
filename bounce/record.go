package bounce

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/internal/mailhdr"
	"github.com/outflow/outflow/queue"
)

// Store is where received reports are recorded: *queue.Queue.
type Store interface {
	// History returns the events of envelope id stored since since.
	History(ctx context.Context, id string, since time.Time) ([]queue.Event, error)
	// PublishEvent stores an event and returns once it is stored.
	PublishEvent(ctx context.Context, typ string, ev *queue.Event) error
	// SyncOutcomes returns once the events and suppressions stored are
	// on disk.
	SyncOutcomes(ctx context.Context) error
}

// Notifier queues the notices a delivered envelope's sender is owed when a
// report on its recipients (a bounce, a delay, a success) comes back
// later: *worker.Pool. ev is the envelope as its delivered events describe
// it, with their Notify; rcpts are the report's blocks (Final the
// delivered address); original is the header the reporting server
// returned. An error means a notice was not queued.
type Notifier interface {
	ReportedLater(ctx context.Context, ev *queue.Event, rcpts []dsn.Recipient, original []byte) error
}

// Suppressor is the suppression list: *queue.Suppressions.
type Suppressor interface {
	// AddFirst puts s on the list unless an entry that never expires is
	// there already (queue.Suppressions.AddFirst).
	AddFirst(ctx context.Context, s queue.Suppression) (bool, error)
}

// Results of a received message, the result label of
// outflow_bounces_received_total.
const (
	ResultBounced    = "bounced"    // a DSN with at least one failed recipient recorded
	ResultComplaint  = "complaint"  // an ARF report recorded
	ResultNoFailure  = "no-failure" // a DSN that reports only delays, deliveries or relays
	ResultUnparsed   = "unparsed"   // not a DSN or an ARF report (a free-text bounce, an auto-reply): refused, 550 5.6.0
	ResultMalformed  = "malformed"  // a report that cannot be read: refused, 550 5.6.0
	ResultUnknownMsg = "unknown"    // no events of the envelope (older than the events stream keeps)
	ResultUnmatched  = "unmatched"  // the report names no recipient the envelope was delivered to
	ResultRefused    = "refused"    // RCPT to an address that is not a return path (550 at RCPT)
	ResultForwarded  = "forwarded"  // mail to postmaster@ or abuse@ a return-path domain, forwarded to Config.Postmaster
	ResultLoop       = "loop"       // mail to postmaster@ or abuse@ with more than maxHops Received fields: refused, 554
)

// envelope is what the events say about one delivered envelope.
type envelope struct {
	id, msgID, tenant, dest string
	delivered               []string // the recipients its delivered events name, in order, lower-cased
	// notify is what its sender's notice needs (the delivered events'
	// Notify, their recipients joined); nil when none is owed.
	notify *queue.Notify
}

// envelopeOf reads the envelope's tenant, destination and delivered
// recipients from its events; ok is false when no event names a tenant.
func envelopeOf(id string, hist []queue.Event) (envelope, bool) {
	e := envelope{id: id}
	seen := map[string]bool{}
	for _, ev := range hist {
		if ev.ID != id {
			continue
		}
		if e.tenant == "" && ev.Tenant != "" {
			e.tenant, e.dest, e.msgID = ev.Tenant, ev.Dest, ev.MsgID
		}
		if ev.Type != queue.EventDelivered {
			continue
		}
		e.addNotify(ev.Notify)
		for _, r := range ev.Recipients {
			r = queue.NormalizeAddress(r)
			if !seen[r] {
				seen[r] = true
				e.delivered = append(e.delivered, r)
			}
		}
	}
	return e, e.tenant != ""
}

// addNotify joins a delivered event's Notify into e's: one envelope
// delivered over several attempts has one per attempt, each naming that
// attempt's recipients.
func (e *envelope) addNotify(n *queue.Notify) {
	if n == nil {
		return
	}
	if e.notify == nil {
		c := *n
		c.Rcpts = nil
		e.notify = &c
	}
	for _, r := range n.Rcpts {
		if !slices.ContainsFunc(e.notify.Rcpts, func(x queue.NotifyRcpt) bool { return x.Rcpt == r.Rcpt }) {
			e.notify.Rcpts = append(e.notify.Rcpts, r)
		}
	}
}

// match is the delivered recipient a report's recipient stands for: its
// Final-Recipient or its Original-Recipient when the envelope was
// delivered to it, else the envelope's only delivered recipient (a
// forwarding mailbox reports the address it forwarded to), else "".
// The Original-Recipient is tried as written (decoded, as RFC 3461 §4.2
// has it and outflow writes it), then xtext-decoded: some MTAs copy the
// ORCPT parameter's xtext into the field ("ann+2Bnews@..." for
// "ann+news@..."), and which form a report holds cannot be told from it
// alone, so dsn.ParseDSN leaves it as written.
func (e *envelope) match(final, original string) string {
	candidates := []string{final, original}
	if d := dsn.XTextDecode(original); d != original {
		candidates = append(candidates, d)
	}
	for _, a := range candidates {
		a = queue.NormalizeAddress(a)
		for _, d := range e.delivered {
			if a != "" && a == d {
				return d
			}
		}
	}
	if len(e.delivered) == 1 {
		return e.delivered[0]
	}
	return ""
}

// unreadable is a message refused for what it is: the listener takes only
// what it can record, so that its 250 means the report was read, and the
// sending server learns at once that this address reads no free text.
type unreadable struct {
	result string
	err    error
}

func (u *unreadable) Error() string { return u.err.Error() }

// record handles one received message addressed to the return paths refs
// and, with fbl, to a feedback-loop address: it reads msg as a DSN or an
// ARF report and records what it says about each envelope; sent to a
// feedback-loop address alone, it reads a message that is neither as a
// complaint without a report (attached). An *unreadable error refuses a
// message that is none of these, or a report that cannot be read. Any
// other error means nothing may be taken as recorded (the sender is
// answered 451 and sends again; what was recorded before the error is
// recorded again, which costs a repeated event, never a lost one).
func (s *Server) record(ctx context.Context, refs []ref, fbl bool, msg []byte) (string, error) {
	result, err := s.read(ctx, refs, fbl, msg)
	if err == nil && (result == ResultBounced || result == ResultComplaint) {
		// What was recorded is on disk before the 250, which the
		// reporting server takes as the end of its duty to tell.
		if err = s.cfg.Store.SyncOutcomes(ctx); err != nil {
			err = fmt.Errorf("sync the recorded outcomes: %w", err)
		}
	}
	return result, err
}

// read is record before the sync: it reads msg and stores what it says.
func (s *Server) read(ctx context.Context, refs []ref, fbl bool, msg []byte) (string, error) {
	rep, err := dsn.ParseDSN(msg)
	if errors.Is(err, dsn.ErrNotReport) {
		fb, ferr := dsn.ParseFeedback(msg)
		switch {
		case errors.Is(ferr, dsn.ErrNotReport):
			if fbl && len(refs) == 0 {
				if afb, arefs := s.attached(msg); len(arefs) > 0 {
					return s.recordFeedback(ctx, arefs, afb)
				}
			}
			return "", &unreadable{ResultUnparsed, errors.New("neither a delivery status notification (RFC 3464) nor a feedback report (RFC 5965)")}
		case ferr != nil:
			return "", &unreadable{ResultMalformed, ferr}
		}
		return s.recordFeedback(ctx, s.withOriginal(refs, fb.OriginalMailFrom, fb.OriginalHeader), fb)
	}
	if err != nil {
		return "", &unreadable{ResultMalformed, err}
	}
	return s.recordDSN(ctx, s.withOriginal(refs, "", rep.OriginalHeader), rep)
}

// attached reads msg, sent to a feedback-loop address and to no return
// path, as a complaint without a report: Microsoft's JMRP in its older
// format sends the message complained about attached (message/rfc822,
// dsn.ParseAttached) and nothing else. It is an abuse complaint about the
// envelope whose return path the original's header names (withOriginal),
// by the original's X-HmXmrOriginalRecipient when it has one, else by the
// envelope's only delivered recipient (as an ARF report without
// Original-Rcpt-To). refs is empty for any other message, which is refused
// like any that is no report: at a return path itself, where auto-replies
// come with the original attached, this is never called.
func (s *Server) attached(msg []byte) (*dsn.Feedback, []ref) {
	h, err := dsn.ParseAttached(msg)
	if err != nil {
		return nil, nil
	}
	refs := s.withOriginal(nil, "", h)
	if len(refs) == 0 {
		return nil, nil
	}
	fb := &dsn.Feedback{Type: "abuse", OriginalHeader: h}
	for _, v := range mailhdr.Values(h, "X-HmXmrOriginalRecipient") {
		if a := queue.NormalizeAddress(v); a != "" {
			fb.OriginalRcptTo = append(fb.OriginalRcptTo, a)
		}
	}
	return fb, refs
}

// withOriginal is refs, or, for a report sent to the feedback-loop
// address (no return path among its recipients), the return paths that
// name its envelope, from the first of these that names one that
// verifies: the report's Original-Mail-From (mailFrom; RFC 5965 §3.5: the
// original's envelope sender); the Return-Path fields of the original's
// header, where a receiving system writes the envelope sender; any other
// field of that header (Authentication-Results' smtp.mailfrom=,
// Received-SPF's envelope-from=, a Received field's "for"), as
// ReturnPath.Find reads them. Only a return path whose MAC verifies
// counts.
func (s *Server) withOriginal(refs []ref, mailFrom string, header []byte) []ref {
	if len(refs) > 0 {
		return refs
	}
	if id, at, ok := s.cfg.ReturnPath.Check(mailFrom); ok {
		return []ref{{id: id, at: at}}
	}
	if len(header) == 0 {
		return nil
	}
	for _, text := range [][]byte{[]byte(strings.Join(mailhdr.Values(header, "Return-Path"), "\n")), header} {
		for _, a := range s.cfg.ReturnPath.Find(text, s.cfg.MaxRecipients) {
			// Each envelope once, however its return path is spelt (as
			// Rcpt does): one complaint is one event.
			if id, at, ok := s.cfg.ReturnPath.Check(a); ok && !slices.ContainsFunc(refs, func(r ref) bool { return r.id == id }) {
				refs = append(refs, ref{id: id, at: at})
			}
		}
		if len(refs) > 0 {
			break
		}
	}
	return refs
}

// lookUp reads the envelope a return path names.
func (s *Server) lookUp(ctx context.Context, r ref) (envelope, bool, error) {
	// The address was written at the attempt; the envelope's events
	// before it (queued, deferrals) are not needed, and clocks differ.
	hist, err := s.cfg.Store.History(ctx, r.id, r.at.Add(-time.Hour))
	if errors.Is(err, queue.ErrNotFound) {
		return envelope{}, false, nil
	}
	if err != nil {
		return envelope{}, false, fmt.Errorf("history of %s: %w", r.id, err)
	}
	e, ok := envelopeOf(r.id, hist)
	return e, ok, nil
}

// recordDSN records each failed recipient of rep as an asynchronous
// bounce of the envelope it came back for, and suppresses it when its
// diagnostic classifies as a permanent refusal of the recipient, the rule
// a bounce at delivery follows (worker.suppressBounce). What the report
// says of each recipient, failed or not (a delay, a success from a server
// that was handed NOTIFY), goes to the sender's notices (notify).
func (s *Server) recordDSN(ctx context.Context, refs []ref, rep *dsn.Received) (string, error) {
	result := ResultNoFailure
	var failed, other []dsn.Recipient
	for _, rc := range rep.Recipients {
		if rc.Action == dsn.Failed {
			failed = append(failed, rc)
		} else {
			other = append(other, rc)
		}
	}
	for _, r := range refs {
		if len(failed) == 0 && (s.cfg.Notifier == nil || len(other) == 0) {
			continue
		}
		e, ok, err := s.lookUp(ctx, r)
		if err != nil {
			return "", err
		}
		if !ok {
			if len(failed) > 0 {
				s.log.Info().Str("msg_id", r.id).Msg("bounce for a message whose events are gone")
				if result != ResultBounced {
					result = ResultUnknownMsg
				}
			}
			continue
		}
		recorded := false
		var later []dsn.Recipient // for the sender's notices
		// reached: the addresses some block of this report says the
		// message reached, through them (an alias or a list whose other
		// members got it: the address works).
		reached := map[string]bool{}
		for _, rc := range other {
			if rcpt := e.match(rc.Final, rc.Original); rcpt != "" {
				if rc.Action == dsn.Delivered || rc.Action == dsn.Relayed || rc.Action == dsn.Expanded {
					reached[rcpt] = true
				}
				rc.Final, rc.RemoteMTA = rcpt, cmp.Or(rc.RemoteMTA, rep.ReportingMTA)
				later = append(later, rc)
			}
		}
		// bounced: the addresses recorded bounced by this report, once
		// each: a server that expanded an alias reports each member that
		// failed, all standing for the one address delivered to.
		bounced := map[string]bool{}
		for _, rc := range failed {
			rcpt := e.match(rc.Final, rc.Original)
			if rcpt == "" {
				s.log.Info().Str("msg_id", e.id).Str("tenant", e.tenant).Str("final_recipient", rc.Final).
					Msg("bounce names a recipient the message was not delivered to")
				continue
			}
			if bounced[rcpt] {
				continue
			}
			bounced[rcpt] = true
			in, reason := diagnosticInput(rc)
			res := s.cfg.Classifier.Classify(in)
			ev := &queue.Event{ID: e.id, MsgID: e.msgID, Tenant: e.tenant, Dest: e.dest, Worker: s.cfg.ID,
				Recipients: []string{rcpt}, Reason: reason, Async: true}
			if err := s.cfg.Store.PublishEvent(ctx, queue.EventBounced, ev); err != nil {
				return "", err
			}
			recorded = true
			rc.Final, rc.RemoteMTA = rcpt, cmp.Or(rc.RemoteMTA, rep.ReportingMTA)
			later = append(later, rc)
			suppressed := false
			if s.cfg.Suppressions != nil && res.AddressGone(in.Stage) && !reached[rcpt] {
				if _, err := s.cfg.Suppressions.AddFirst(ctx, queue.Suppression{Tenant: e.tenant, Address: rcpt,
					Reason: shorten(reason, 512), Source: queue.SuppressBounce}); err != nil {
					return "", err
				}
				suppressed = true
			}
			s.log.Info().Str("msg_id", e.id).Str("tenant", e.tenant).Str("dest", e.dest).Str("rcpt", rcpt).
				Str("status", rc.Status).Str("reason", reason).Str("class", res.Class.String()).
				Str("scope", res.Scope.String()).Str("rule", res.Rule).Str("reporting_mta", rep.ReportingMTA).
				Bool("suppressed", suppressed).Msg("asynchronous bounce recorded")
		}
		if err := s.notify(ctx, &e, later, rep.OriginalHeader); err != nil {
			return "", err
		}
		switch {
		case recorded:
			result = ResultBounced
		case len(failed) > 0 && result != ResultBounced:
			result = ResultUnmatched
		}
	}
	return result, nil
}

// notify queues the notices e's sender is owed for what the report says of
// the recipients in later (Config.Notifier), when its delivered events
// say one is.
func (s *Server) notify(ctx context.Context, e *envelope, later []dsn.Recipient, original []byte) error {
	if s.cfg.Notifier == nil || e.notify == nil || len(later) == 0 {
		return nil
	}
	ev := &queue.Event{ID: e.id, MsgID: e.msgID, Tenant: e.tenant, Dest: e.dest, Notify: e.notify}
	if err := s.cfg.Notifier.ReportedLater(ctx, ev, later, original); err != nil {
		return fmt.Errorf("queue the notice to %s: %w", e.notify.Sender, err)
	}
	return nil
}

// diagnosticInput is the classifier's input for a failed recipient and
// the reason its event gives: the remote server's reply when the report
// carries one (Diagnostic-Code: smtp; ...), else its status code. A reply
// without a basic code takes one from the status's class, so that the
// classifier's code rules apply. The stage is left unknown unless the
// diagnostic names it (Postfix's "in reply to RCPT TO command"): at RCPT
// any refusal is about the recipient, and a report rarely says where the
// refusal came, so only a reply that is itself about the address (5.1.1,
// "user unknown") suppresses.
func diagnosticInput(rc dsn.Recipient) (classify.Input, string) {
	reason := strings.TrimSpace(rc.Diagnostic)
	var in classify.Input
	if reason != "" && (rc.DiagnosticType == "" || strings.EqualFold(rc.DiagnosticType, "smtp")) {
		in = classify.Parse(reason)
	} else {
		in = classify.Input{Text: reason}
	}
	if in.Enhanced == "" {
		in.Enhanced = rc.Status
	}
	if in.Code == 0 && in.Event == 0 {
		switch {
		case strings.HasPrefix(rc.Status, "5."):
			in.Code = 550
		case strings.HasPrefix(rc.Status, "4."):
			in.Code = 450
		default:
			in.Code = 550 // Action: failed with no usable status
		}
		in.Raw = ""
		if in.Text == "" {
			in.Text = reason
		}
	}
	if reason == "" {
		reason = "status " + rc.Status
	}
	return in, reason
}

// complaintTypes are the feedback types that say the recipient does not
// want the mail (RFC 5965 §7.3): a recipient's "this is spam" and a
// phishing report. "not-spam", "virus", "auth-failure" (RFC 6591) and
// "other" are recorded and suppress nobody.
var complaintTypes = map[string]bool{"abuse": true, "fraud": true}

// recordFeedback records an ARF report as a complaint about the envelope
// it came back for, and suppresses the complaining recipient for an abuse
// or fraud report (complaintTypes): a provider counts further mail to a
// complainer against the sender.
func (s *Server) recordFeedback(ctx context.Context, refs []ref, fb *dsn.Feedback) (string, error) {
	result := ResultUnmatched
	for _, r := range refs {
		e, ok, err := s.lookUp(ctx, r)
		if err != nil {
			return "", err
		}
		if !ok {
			if result != ResultComplaint {
				result = ResultUnknownMsg
			}
			continue
		}
		var rcpt string
		for _, o := range fb.OriginalRcptTo {
			if rcpt = e.match(o, ""); rcpt != "" {
				break
			}
		}
		if rcpt == "" && len(fb.OriginalRcptTo) == 0 {
			rcpt = e.match("", "")
		}
		if rcpt == "" {
			s.log.Info().Str("msg_id", e.id).Str("tenant", e.tenant).Strs("original_rcpt_to", fb.OriginalRcptTo).
				Msg("complaint names no recipient the message was delivered to")
			continue
		}
		typ := cmp.Or(fb.Type, "abuse")
		reason := typ
		if fb.UserAgent != "" {
			reason += " (" + fb.UserAgent + ")"
		}
		ev := &queue.Event{ID: e.id, MsgID: e.msgID, Tenant: e.tenant, Dest: e.dest, Worker: s.cfg.ID,
			Recipients: []string{rcpt}, Reason: reason, Async: true}
		if err := s.cfg.Store.PublishEvent(ctx, queue.EventComplained, ev); err != nil {
			return "", err
		}
		suppressed := false
		if s.cfg.Suppressions != nil && complaintTypes[typ] {
			if _, err := s.cfg.Suppressions.AddFirst(ctx, queue.Suppression{Tenant: e.tenant, Address: rcpt,
				Reason: shorten("complaint: "+reason, 512), Source: queue.SuppressComplaint}); err != nil {
				return "", err
			}
			suppressed = true
		}
		s.log.Info().Str("msg_id", e.id).Str("tenant", e.tenant).Str("dest", e.dest).Str("rcpt", rcpt).
			Str("feedback_type", typ).Str("user_agent", fb.UserAgent).Bool("suppressed", suppressed).Msg("complaint recorded")
		result = ResultComplaint
	}
	return result, nil
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
