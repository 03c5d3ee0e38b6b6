package worker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"

	"github.com/outflow/outflow/dsn"
	"github.com/outflow/outflow/queue"
)

// Notices for what comes back later.
//
// An attempt that goes out with a return path (Config.ReturnPath) no longer
// carries the application's sender in MAIL FROM: a recipient's server that
// accepts the message and reports on it afterwards mails its report to
// outflow's bounce listener, not to the sender. That is a bounce (a mailbox
// that turns out not to exist), or, from a server that offers DSN and was
// handed the submitter's NOTIFY, a delay warning or a success report. The
// sender is still owed the notice it would have had (RFC 5321 §6.1, RFC
// 3461 §4.1), so the delivered event keeps what that notice needs
// (queue.Event.Notify, laterNotify), and the listener hands each report it
// reads to ReportedLater, which queues the notice as an attempt's would be:
// same rules (NOTIFY, the tenant's setting and address, the suppression
// list, the hourly allowance per address), same form, with the remote
// server's status, diagnostic and the header it returned (a header only,
// whatever RET asked: the body is gone with the envelope).

// laterNotify is the Notify of an attempt's delivered event: what a notice
// about its delivered recipients needs when a report on them comes back to
// the return path. Nil when the attempt kept the envelope's own sender
// (reports go there directly), when the sender gets no notices (a null
// sender, a report, a tenant with notices off, a process without them) or
// when no delivered recipient can be owed one (NOTIFY=NEVER, or a success
// only, which the relayed notice at delivery already gave).
func (w *deliverer) laterNotify(e *queue.Envelope, o *outcome) *queue.Notify {
	if !o.returnPath || w.dsn == nil || w.dsn.ineligible(e) != "" || o.body != nil && dsn.IsReport(o.body) {
		return nil
	}
	var rcpts []queue.NotifyRcpt
	for _, r := range o.delivered {
		// The kinds a later report can still owe, written out (none given
		// is failures and delays): a success only from a server that was
		// handed NOTIFY, since one that was not got its relayed notice now.
		var kinds []string
		for _, k := range laterKinds {
			if e.DSN.Wants(r, k) && (k != queue.NotifySuccess || o.dsnRelayed[r]) {
				kinds = append(kinds, k)
			}
		}
		if len(kinds) == 0 {
			continue
		}
		p := e.DSN.Rcpt(r)
		rcpts = append(rcpts, queue.NotifyRcpt{Rcpt: r, Notify: kinds, ORcpt: p.ORcpt, ORcptType: p.ORcptType})
	}
	if len(rcpts) == 0 {
		return nil
	}
	n := &queue.Notify{Sender: e.From, Submitted: e.SubmittedAt, Source: e.Source, MessageID: e.MessageID, Rcpts: rcpts}
	if e.DSN != nil {
		n.EnvID = e.DSN.EnvID
	}
	return n
}

// laterKinds are the notices a report that comes later can owe.
var laterKinds = []string{queue.NotifyFailure, queue.NotifyDelay, queue.NotifySuccess}

// laterActions are the actions a report's block can give, in the order
// their notices go, each with the NOTIFY keyword that asks for it: a
// failure, a delay, or a success (delivered, relayed onwards to a system
// without DSN, expanded by a list). Any other action word is no notice.
var laterActions = []struct {
	action dsn.Action
	kind   string
}{
	{dsn.Failed, queue.NotifyFailure},
	{dsn.Delayed, queue.NotifyDelay},
	{dsn.Delivered, queue.NotifySuccess},
	{dsn.Relayed, queue.NotifySuccess},
	{dsn.Expanded, queue.NotifySuccess},
}

// ReportedLater queues the notices owed to the sender of a delivered
// envelope about what a report received at the return path says of its
// recipients; package bounce calls it for each report it reads, before
// its 250.
//
// ev is the envelope as its delivered events describe it (ID, MsgID,
// Tenant, Dest) with the Notify they carry; rcpts are the report's blocks,
// each Final the address outflow delivered to, with the remote server's
// Action, Status, Diagnostic and Remote-MTA; original is the header of the
// message as that server returned it (nil when it returned none). One
// notice goes per action (failed, delayed, delivered, relayed, expanded),
// for the recipients ev.Notify lists whose NOTIFY asks for its kind, under
// their submitted ORCPT (never the report's Original-Recipient: RFC 3464
// §2.3.1 has that field come from ORCPT only).
//
// A notice's idempotency key is the envelope, the action and the
// recipients, so a report sent again (after a 451, or twice by its server)
// queues one notice. An error means an enqueue failed: the listener
// answers 451 and the report comes again. A notice not sent by rule
// (notices off, NOTIFY, the sender suppressed or past its hourly
// allowance) is no error.
func (p *Pool) ReportedLater(ctx context.Context, ev *queue.Event, rcpts []dsn.Recipient, original []byte) error {
	n := ev.Notify
	if n == nil || n.Sender == "" {
		return nil
	}
	if p.dsn == nil {
		p.log.Info().Str("msg_id", ev.ID).Str("tenant", ev.Tenant).Str("to", n.Sender).
			Msg("report received later: no notice sent, this process sends none (--dsn=false)")
		return nil
	}
	params := &queue.DSNParams{EnvID: n.EnvID, Rcpts: make(map[string]queue.RcptDSN, len(n.Rcpts))}
	for _, r := range n.Rcpts {
		params.Rcpts[r.Rcpt] = queue.RcptDSN{Notify: r.Notify, ORcpt: r.ORcpt, ORcptType: r.ORcptType}
	}
	e := &queue.Envelope{ID: ev.ID, MsgID: ev.MsgID, Tenant: ev.Tenant, Dest: ev.Dest, From: n.Sender, Source: n.Source,
		SubmittedAt: n.Submitted, MessageID: n.MessageID, DSN: params}
	// The tenant's setting as it is now: notices turned off since the
	// delivery send none.
	if !p.dsn.eligible(e) {
		return nil
	}
	w := &deliverer{Pool: p, id: p.cfg.WorkerID + "/bounce"}
	for _, la := range laterActions {
		var group []dsn.Recipient
		for _, rc := range rcpts {
			addr := queue.NormalizeAddress(rc.Final)
			i := slices.IndexFunc(n.Rcpts, func(r queue.NotifyRcpt) bool { return queue.NormalizeAddress(r.Rcpt) == addr })
			if !strings.EqualFold(string(rc.Action), string(la.action)) || i < 0 ||
				slices.ContainsFunc(group, func(r dsn.Recipient) bool { return r.Final == n.Rcpts[i].Rcpt }) {
				continue
			}
			r := n.Rcpts[i]
			rc.Final, rc.Action, rc.Original, rc.OriginalType = r.Rcpt, la.action, r.ORcpt, r.ORcptType
			group = append(group, rc)
		}
		if len(group) == 0 {
			continue
		}
		// Those whose NOTIFY asks for the action's kind.
		if group = p.dsn.wanted(e, la.kind, group); len(group) == 0 {
			continue
		}
		reason, err := w.sendNotice(ctx, e, noticeInput{action: la.action, kind: la.kind,
			key: laterKey(ev.ID, string(la.action), group), rcpts: group, body: original, later: true})
		if reason != "" {
			w.event(queue.EventDSN, e, 0, finals(group), reason, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// laterKey names a later notice: the envelope, its action and its
// recipients, in any order.
func laterKey(id, action string, rcpts []dsn.Recipient) string {
	addrs := make([]string, len(rcpts))
	for i, r := range rcpts {
		addrs[i] = strings.ToLower(r.Final)
	}
	slices.Sort(addrs)
	sum := sha256.Sum256([]byte(strings.Join(addrs, "\n")))
	return "dsn." + id + ".later." + action + "." + hex.EncodeToString(sum[:8])
}
