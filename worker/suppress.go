package worker

import (
	"context"
	"strings"

	"github.com/outflow/outflow/queue"
)

// Suppressor is the suppression list: where a hard bounce puts its
// recipient, and where a bulk envelope's recipient is looked up before
// each attempt. *queue.Suppressions.
type Suppressor interface {
	// AddFirst puts s on the list unless an entry that never expires is
	// there already (queue.Suppressions.AddFirst).
	AddFirst(ctx context.Context, s queue.Suppression) (bool, error)
	SuppressionChecker
}

// suppressBounce puts a permanently refused recipient on its tenant's
// suppression list, with the reply as evidence, so that the tenant's next
// mail to it is refused at submission. Only a recipient-scope refusal
// (unknown user, mailbox disabled) says the address itself is bad: a policy
// block of the message or the sender says nothing about the address. A
// failed write is logged, not retried: the bounce itself is recorded all the
// same, and the next bounce adds the address again.
func (w *deliverer) suppressBounce(ctx context.Context, e *queue.Envelope, b rcptResult) {
	l := w.cfg.Suppressions
	if l == nil || !b.res.AddressGone(b.stage) {
		return
	}
	reason := strings.TrimSpace(b.res.Text)
	if len(reason) > 512 {
		reason = reason[:512]
	}
	_, err := l.AddFirst(ctx, queue.Suppression{Tenant: e.Tenant, Address: b.rcpt, Reason: reason, Source: queue.SuppressBounce})
	if err != nil {
		w.log.Warn().Err(err).Str("msg_id", e.ID).Str("rcpt", b.rcpt).Msg("hard bounce not added to the suppression list")
	}
}
