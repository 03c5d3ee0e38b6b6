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

// Failure notices for bounces that come back later.
//
// An attempt that goes out with a return path (Config.ReturnPath) no longer
// carries the application's sender in MAIL FROM: a recipient's server that
// accepts the message and bounces it afterwards mails its report to
// outflow's bounce listener, not to the sender. The sender is still owed
// the failure notice it would have had (RFC 5321 §6.1), so the delivered
// event keeps what that notice needs (queue.Event.Notify, laterNotify), and
// the listener hands each report it records to BouncedLater, which queues
// the notice as an attempt's bounce would: same rules (NOTIFY, the tenant's
// setting and address, the suppression list, the hourly allowance per
// address), same form, with the remote server's diagnostic and the header
// it returned.

// laterNotify is the Notify of an attempt's delivered event: what a failure
// notice about its delivered recipients needs when their bounce comes back
// to the return path. Nil when the attempt kept the envelope's own sender
// (its bounces go there directly), when the sender gets no notices (a null
// sender, a report, a tenant with notices off, a process without them) or
// when no delivered recipient's NOTIFY asks for failures.
func (w *deliverer) laterNotify(e *queue.Envelope, o *outcome) *queue.Notify {
	if !o.returnPath || w.dsn == nil || w.dsn.ineligible(e) != "" || o.body != nil && dsn.IsReport(o.body) {
		return nil
	}
	var rcpts []queue.NotifyRcpt
	for _, r := range o.delivered {
		if !e.DSN.Wants(r, queue.NotifyFailure) {
			continue
		}
		p := e.DSN.Rcpt(r)
		rcpts = append(rcpts, queue.NotifyRcpt{Rcpt: r, ORcpt: p.ORcpt, ORcptType: p.ORcptType})
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

// BouncedLater queues the failure notice owed to the sender of a delivered
// envelope whose recipients bounced later, at the return path; package
// bounce calls it for each report it records, before its 250.
//
// ev is the envelope as its delivered events describe it (ID, MsgID,
// Tenant, Dest) with the Notify they carry; rcpts are the report's failed
// blocks, each Final the address outflow delivered to, with the remote
// server's Status, Diagnostic and Remote-MTA; original is the header of
// the message as that server returned it (nil when it returned none).
// Only the recipients ev.Notify lists are reported, under their submitted
// ORCPT.
//
// The notice's idempotency key is the envelope and the recipients, so a
// report sent again (after a 451, or twice by its server) queues one
// notice. An error means the enqueue failed: the listener answers 451 and
// the report comes again. A notice not sent by rule (notices off in this
// process, the sender suppressed or past its hourly allowance) is no
// error.
func (p *Pool) BouncedLater(ctx context.Context, ev *queue.Event, rcpts []dsn.Recipient, original []byte) error {
	n := ev.Notify
	if n == nil || n.Sender == "" {
		return nil
	}
	if p.dsn == nil {
		p.log.Info().Str("msg_id", ev.ID).Str("tenant", ev.Tenant).Str("to", n.Sender).
			Msg("later bounce: no notice sent, this process sends none (--dsn=false)")
		return nil
	}
	var picked []dsn.Recipient
	for _, rc := range rcpts {
		addr := queue.NormalizeAddress(rc.Final)
		i := slices.IndexFunc(n.Rcpts, func(r queue.NotifyRcpt) bool { return queue.NormalizeAddress(r.Rcpt) == addr })
		if i < 0 || slices.ContainsFunc(picked, func(r dsn.Recipient) bool { return r.Final == n.Rcpts[i].Rcpt }) {
			continue
		}
		rc.Final, rc.Original, rc.OriginalType = n.Rcpts[i].Rcpt, n.Rcpts[i].ORcpt, n.Rcpts[i].ORcptType
		rc.Action = dsn.Failed
		picked = append(picked, rc)
	}
	if len(picked) == 0 {
		p.dsn.skip(skipNotify)
		return nil
	}
	e := &queue.Envelope{ID: ev.ID, MsgID: ev.MsgID, Tenant: ev.Tenant, Dest: ev.Dest, From: n.Sender, Source: n.Source,
		SubmittedAt: n.Submitted, MessageID: n.MessageID, DSN: &queue.DSNParams{EnvID: n.EnvID}}
	// The tenant's setting as it is now: notices turned off since the
	// delivery send none.
	if !p.dsn.eligible(e) {
		return nil
	}
	w := &deliverer{Pool: p, id: p.cfg.WorkerID + "/bounce"}
	reason, err := w.sendNotice(ctx, e, noticeInput{action: dsn.Failed, kind: queue.NotifyFailure,
		key: laterKey(ev.ID, picked), rcpts: picked, body: original, later: true})
	if reason != "" {
		w.event(queue.EventDSN, e, 0, finals(picked), reason, nil)
	}
	return err
}

// laterKey names a later failure notice: the envelope and its recipients,
// in any order.
func laterKey(id string, rcpts []dsn.Recipient) string {
	addrs := make([]string, len(rcpts))
	for i, r := range rcpts {
		addrs[i] = strings.ToLower(r.Final)
	}
	slices.Sort(addrs)
	sum := sha256.Sum256([]byte(strings.Join(addrs, "\n")))
	return "dsn." + id + ".later." + hex.EncodeToString(sum[:8])
}
