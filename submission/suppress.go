package submission

import (
	"context"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// Suppressor is the suppression list as the listener sees it:
// *queue.Suppressions.
type Suppressor interface {
	// Suppressed returns tenant's entry for addr if one applies, or nil.
	Suppressed(ctx context.Context, tenant, addr string) (*queue.Suppression, error)
	// Refused records (as a suppressed event) that addr was refused.
	Refused(tenant, addr, via string)
}

// reasonSuppressed: the recipient is on its tenant's suppression list.
const reasonSuppressed = "suppressed"

// reasonSuppressionError: the list could not be read.
const reasonSuppressionError = "suppression_error"

var (
	// A suppressed recipient is refused for good (RFC 3463 X.7.1: delivery
	// not authorized); the other recipients of the transaction go on.
	errSuppressed = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 7, 1},
		Message: "Recipient address is suppressed (it bounced or was reported); not sending to it"}
	// The list could not be read: refuse for now rather than mail an
	// address that may be on it (RFC 3463 X.3.0: mail system failure).
	errSuppressionUnavailable = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
		Message: "Cannot check the recipient against the suppression list, try again later"}
)

// checkSuppressed returns the reply for a recipient on the tenant's
// suppression list, or nil if it may be mailed. It is called at RCPT, so
// the client learns which recipient was refused and why.
func (s *session) checkSuppressed(addr string) error {
	l := s.srv.cfg.Suppressions
	if l == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.srv.baseCtx, s.srv.cfg.EnqueueTimeout)
	defer cancel()
	tenant := s.tenant()
	sup, err := l.Suppressed(ctx, tenant, addr)
	if err != nil {
		return s.reject(errSuppressionUnavailable, reasonSuppressionError, false,
			func(e *zerolog.Event) { e.Str("rcpt", addr).Err(err) })
	}
	if sup == nil {
		return nil
	}
	l.Refused(tenant, addr, "smtp")
	return s.reject(errSuppressed, reasonSuppressed, false,
		func(e *zerolog.Event) { e.Str("rcpt", addr).Str("suppression_reason", sup.Reason) })
}
