package submission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/quota"
)

// Quota is the tenants' sending limits as the listener sees them:
// *quota.Limiter.
type Quota interface {
	// Take counts n recipients against tenant's limit: nil, a
	// *quota.Exceeded, or an error when the limit cannot be checked.
	Take(ctx context.Context, tenant string, n int) error
	// Return gives back n recipients taken and not sent.
	Return(tenant string, n int)
}

// reasonQuota: the tenant's sending limit is reached.
const reasonQuota = "quota"

// reasonQuotaError: the sending limit could not be checked.
const reasonQuotaError = "quota_error"

// errQuotaUnavailable: refuse for now rather than send past a limit that
// cannot be read (RFC 3463 X.3.0: mail system failure).
var errQuotaUnavailable = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
	Message: "Cannot check the account's sending limit, try again later"}

// takeQuota counts one recipient against the tenant's sending limit (the
// listener has one: Config.Quota is set), at
// RCPT: past the limit the recipient is deferred (452, RFC 5321 4.5.3.1.10:
// the client sends it later) with when part of the limit comes free.
// X.4.5 (mail system congestion) is what large providers answer for a
// sending limit.
func (s *session) takeQuota(rcpt string) error {
	q := s.srv.cfg.Quota
	ctx, cancel := context.WithTimeout(s.srv.baseCtx, s.srv.cfg.EnqueueTimeout)
	defer cancel()
	err := q.Take(ctx, s.tenant(), 1)
	if err == nil {
		return nil
	}
	var ex *quota.Exceeded
	if errors.As(err, &ex) {
		reply := &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 4, 5},
			Message: fmt.Sprintf("Sending limit of %d recipients per 24 hours reached for this account; more can be sent from %s",
				ex.Limit, ex.Until.UTC().Format(time.RFC3339))}
		return s.reject(reply, reasonQuota, false, func(e *zerolog.Event) { e.Str("rcpt", rcpt).Int("limit", ex.Limit) })
	}
	return s.reject(errQuotaUnavailable, reasonQuotaError, false, func(e *zerolog.Event) { e.Str("rcpt", rcpt).Err(err) })
}
