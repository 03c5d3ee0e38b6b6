package api

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/outflow/outflow/quota"
)

// takeQuota counts n recipients against tenant's sending limit: nil when
// they may be sent, a 429 quota-exceeded saying when more can be sent (a
// 422 for more than the whole limit), or a 503 when the limit cannot be
// checked (as for the suppression list: a limit is not skipped).
func (s *Server) takeQuota(ctx context.Context, tenant string, n int) *Problem {
	if s.cfg.Quota == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.EnqueueTimeout)
	defer cancel()
	err := s.cfg.Quota.Take(ctx, tenant, n)
	if err == nil {
		return nil
	}
	if errors.Is(err, quota.ErrOverLimit) {
		// No wait makes room: a 422, not a 429 to retry.
		return problem(http.StatusUnprocessableEntity, ProblemQuotaExceeded, "more recipients than the sending limit", err.Error())
	}
	var ex *quota.Exceeded
	if errors.As(err, &ex) {
		p := problem(http.StatusTooManyRequests, ProblemQuotaExceeded, "sending limit reached",
			fmt.Sprintf("tenant %s may send to %d recipients per 24 hours; more can be sent from %s", tenant, ex.Limit,
				ex.Until.UTC().Format(time.RFC3339)))
		p.RetryAfter = max(1, int(math.Ceil(time.Until(ex.Until).Seconds())))
		return p
	}
	s.log.Error().Err(err).Str("tenant", tenant).Msg("sending limit not checked")
	return unavailable("the sending limit cannot be checked")
}
