package api

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/queue"
)

// EventList is the answer of GET /v1/events.
type EventList struct {
	// Events are the newest events that name the recipient, oldest first.
	Events []queue.Event `json:"events"`
	// Scanned is how many events were read to find them: the events are
	// not indexed by recipient, so a narrower since or type reads fewer.
	Scanned int `json:"scanned"`
}

// Limits of GET /v1/events.
const (
	defaultEventsSince = 24 * time.Hour
	maxEventsLimit     = 1000
	// maxSearches is how many look-ups run at once in this process, each
	// reading through the events on the NATS server every tenant shares;
	// a key runs one at a time.
	maxSearches = 4
)

// startSearch admits one look-up of key's, or says why not (429): the
// key has one running, or the process has maxSearches. release ends it.
func (s *Server) startSearch(key string) (release func(), p *Problem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	busy := ""
	switch {
	case s.searching[key]:
		busy = "this key has a look-up running; one at a time"
	case len(s.searching) >= maxSearches:
		busy = "too many look-ups running at once"
	}
	if busy != "" {
		p := problem(http.StatusTooManyRequests, ProblemRateLimited, "rate limited", busy)
		p.RetryAfter = 1
		return nil, p
	}
	s.searching[key] = true
	return func() {
		s.mu.Lock()
		delete(s.searching, key)
		s.mu.Unlock()
	}, nil
}

// listEvents is GET /v1/events?recipient=ADDR[&type=T,T][&since=TIME]
// [&limit=N][&tenant=T]: what became of the tenant's mail to one address,
// as `outflow queue find` answers an operator. A key reads its tenant's
// events only (an admin key names another tenant with tenant=).
func (s *Server) listEvents(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	q := r.URL.Query()
	tenant, p := s.tenantOf(key, q.Get("tenant"))
	if p != nil {
		return p
	}
	fq := queue.EventQuery{Tenant: tenant, Rcpt: strings.TrimSpace(q.Get("recipient")), Limit: queue.DefaultFindLimit}
	if fq.Rcpt == "" || len(fq.Rcpt) > 320 {
		return queryProblem("recipient", fq.Rcpt, "the address whose mail to look for")
	}
	if v := q.Get("type"); v != "" {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); queue.CheckEventTypes([]string{t}) != nil {
				return queryProblem("type", v, "event types separated by commas, some of "+strings.Join(queue.EventTypes, ","))
			}
			fq.Types = append(fq.Types, t)
		}
	}
	if fq.Since, p = sinceQuery(q, time.Now().Add(-defaultEventsSince)); p != nil {
		return p
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxEventsLimit {
			return queryProblem("limit", v, "a number from 1 to "+strconv.Itoa(maxEventsLimit))
		}
		fq.Limit = n
	}
	release, p := s.startSearch(key.ID)
	if p != nil {
		return p
	}
	defer release()
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.SearchTimeout)
	defer cancel()
	evs, scanned, err := s.cfg.Queue.FindEvents(ctx, fq)
	switch {
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		return problem(http.StatusUnprocessableEntity, ProblemQueryTooBroad, "query too broad",
			"read "+strconv.Itoa(scanned)+" events in "+s.cfg.SearchTimeout.String()+" without reaching the end: ask for a later since or fewer types")
	case err != nil:
		s.log.Error().Err(err).Msg("api find events")
		return unavailable("the events cannot be read")
	}
	if evs == nil {
		evs = []queue.Event{}
	}
	writeJSON(w, http.StatusOK, EventList{Events: evs, Scanned: scanned})
	return nil
}
