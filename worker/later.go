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
// when every delivered recipient's NOTIFY is NEVER.
func (w *deliverer) laterNotify(e *queue.Envelope, o *outcome) *queue.Notify {
	if !o.returnPath || w.dsn == nil || w.dsn.ineligible(e) != "" || o.body != nil && dsn.IsReport(o.body) {
		return nil
	}
	var rcpts []queue.NotifyRcpt
	for _, r := range o.delivered {
		if !slices.ContainsFunc(laterKinds, func(k string) bool { return e.DSN.Wants(r, k) }) {
			continue
		}
		p := e.DSN.Rcpt(r)
		rcpts = append(rcpts, queue.NotifyRcpt{Rcpt: r, Notify: p.Notify, ORcpt: p.ORcpt, ORcptType: p.ORcptType})
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

// laterKind is the NOTIFY keyword that asks for a notice of what a report
// says of a recipient, and the action the notice gives: a failure, a delay,
// or a success (delivered, relayed onwards, expanded by a list).
func laterKind(a dsn.Action) (kind string, action dsn.Action) {
	switch a {
	case dsn.Failed:
		return queue.NotifyFailure, dsn.Failed
	case dsn.Delayed:
		return queue.NotifyDelay, dsn.Delayed
	case dsn.Relayed:
		return queue.NotifySuccess, dsn.Relayed
	}
	return queue.NotifySuccess, dsn.Delivered
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
// notice goes per kind (failure, delay, success), for the recipients
// ev.Notify lists whose NOTIFY asks for it, under their submitted ORCPT.
//
// A notice's idempotency key is the envelope, the kind and the
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
	for _, kind := range laterKinds {
		var group []dsn.Recipient
		var action dsn.Action
		for _, rc := range rcpts {
			k, a := laterKind(rc.Action)
			addr := queue.NormalizeAddress(rc.Final)
			i := slices.IndexFunc(n.Rcpts, func(r queue.NotifyRcpt) bool { return queue.NormalizeAddress(r.Rcpt) == addr })
			if k != kind || i < 0 || slices.ContainsFunc(group, func(r dsn.Recipient) bool { return r.Final == n.Rcpts[i].Rcpt }) {
				continue
			}
			rc.Final, rc.Action, action = n.Rcpts[i].Rcpt, a, a
			group = append(group, rc)
		}
		if len(group) == 0 {
			continue
		}
		// Those whose NOTIFY asks for kind, with their ORCPT.
		if group = p.dsn.wanted(e, kind, group); len(group) == 0 {
			continue
		}
		reason, err := w.sendNotice(ctx, e, noticeInput{action: action, kind: kind,
			key: laterKey(ev.ID, kind, group), rcpts: group, body: original, later: true})
		if reason != "" {
			w.event(queue.EventDSN, e, 0, finals(group), reason, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// laterKey names a later notice: the envelope, its kind and its
// recipients, in any order.
func laterKey(id, kind string, rcpts []dsn.Recipient) string {
	addrs := make([]string, len(rcpts))
	for i, r := range rcpts {
		addrs[i] = strings.ToLower(r.Final)
	}
	slices.Sort(addrs)
	sum := sha256.Sum256([]byte(strings.Join(addrs, "\n")))
	return "dsn." + id + ".later." + strings.ToLower(kind) + "." + hex.EncodeToString(sum[:8])
}
