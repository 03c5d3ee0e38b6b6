package api

import (
	"context"
	"errors"
	"fmt"
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
	// tenantSearches is how many of them the keys of one tenant run at
	// once: half. A look-up can take SearchTimeout (30 s), and a tenant
	// with four keys once held all four and refused every other tenant's
	// for as long as its own slow ones ran; at half, however slow its
	// look-ups, two are left to the other tenants.
	tenantSearches = maxSearches / 2
	// searchRetryAfter is the Retry-After of a refused look-up, in
	// seconds: nothing was read for it, so asking again is cheap, and
	// most look-ups end within a second or two.
	searchRetryAfter = 1
)

// searches counts the GET /v1/events running, under Server.mu.
type searches struct {
	keys    map[string]bool // key ids with a look-up running
	tenants map[string]int  // look-ups running by the tenant of their key, only those with some
	running int
}

// startSearch admits one look-up of key's, or refuses it with
// too-many-searches: 429 when the key runs one or its tenant's keys run
// tenantSearches (the client's own look-ups are in the way), 503 when the
// process runs maxSearches (other tenants' are). The look-up is charged
// to the tenant of the key, not to the tenant it names: an admin key
// reading a tenant's events on an operator's behalf does not take that
// tenant's share. release ends it.
func (s *Server) startSearch(key *KeyInfo) (release func(), p *Problem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sr := &s.searches
	switch {
	case sr.keys[key.ID]:
		p = problem(http.StatusTooManyRequests, ProblemSearchBusy, "too many look-ups",
			"this key has a look-up running; a key runs one at a time")
	case sr.tenants[key.Tenant] >= tenantSearches:
		p = problem(http.StatusTooManyRequests, ProblemSearchBusy, "too many look-ups",
			fmt.Sprintf("tenant %s has %d look-ups running, its share of the %d this server runs at once", key.Tenant, tenantSearches, maxSearches))
	case sr.running >= maxSearches:
		p = problem(http.StatusServiceUnavailable, ProblemSearchBusy, "server busy",
			fmt.Sprintf("this server runs %d look-ups at once, and runs as many now", maxSearches))
	}
	if p != nil {
		p.RetryAfter = searchRetryAfter
		return nil, p
	}
	sr.keys[key.ID] = true
	sr.tenants[key.Tenant]++
	sr.running++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(sr.keys, key.ID)
		sr.tenants[key.Tenant]--
		if sr.tenants[key.Tenant] <= 0 {
			delete(sr.tenants, key.Tenant)
		}
		sr.running--
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
	release, p := s.startSearch(key)
	if p != nil {
		// Operators see which tenant's look-ups fill the server.
		s.log.Warn().Str("tenant", key.Tenant).Str("key_id", key.ID).Int("status", p.Status).Str("detail", p.Detail).
			Msg("api look-up refused: too many running")
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
	if !key.Admin {
		evs = queue.EventsForTenant(evs)
	}
	writeJSON(w, http.StatusOK, EventList{Events: evs, Scanned: scanned})
	return nil
}
