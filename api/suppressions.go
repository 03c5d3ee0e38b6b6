package api

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// ProblemSuppressed is the 422 of a message with a recipient on the
// tenant's suppression list; its errors name each such recipient.
const ProblemSuppressed = typePrefix + "recipient-suppressed"

// Suppressions is the suppression list as the API uses it:
// *queue.Suppressions.
type Suppressions interface {
	submission.Suppressor
	Add(ctx context.Context, s queue.Suppression) error
	Remove(ctx context.Context, tenant, addr string) error
	Page(ctx context.Context, tenant string, from uint64, limit, scan int, keep func(*queue.Suppression) bool) ([]queue.Suppression, uint64, error)
}

// SuppressionRequest is the body of POST /v1/suppressions.
type SuppressionRequest struct {
	Address string `json:"address"`
	Reason  string `json:"reason,omitempty"`
	// Tenant defaults to the key's; only an admin key may name another.
	Tenant string `json:"tenant,omitempty"`
	// Expires, when set, is when the entry stops applying (RFC 3339).
	Expires *time.Time `json:"expires,omitempty"`
}

// SuppressionList is the answer of GET /v1/suppressions.
type SuppressionList struct {
	// Suppressions are at most limit entries, in the order they were
	// written (an entry replaced moves to the end).
	Suppressions []queue.Suppression `json:"suppressions"`
	// NextCursor, when present, is the cursor of the next page: more
	// entries follow (or may: a page that read suppressionsScan entries
	// without filling stops there). Absent on the last page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// Limits of GET /v1/suppressions.
const (
	defaultSuppressionsLimit = 100
	maxSuppressionsLimit     = 1000
	// suppressionsScan is how many entries one page reads at most: a
	// source or since that few entries match gives a short (even empty)
	// page with a next_cursor rather than one request reading the whole
	// list.
	suppressionsScan = 10000
)

// suppressionCursor is the opaque cursor of the page that starts at the
// list's stream sequence seq: base64url of "s" and seq.
func suppressionCursor(seq uint64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("s" + strconv.FormatUint(seq, 10)))
}

// parseSuppressionCursor is the sequence of a cursor suppressionCursor
// made; ok is false for anything else.
func parseSuppressionCursor(c string) (seq uint64, ok bool) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) < 2 || b[0] != 's' {
		return 0, false
	}
	seq, err = strconv.ParseUint(string(b[1:]), 10, 64)
	return seq, err == nil && seq > 0
}

// checkSuppressed refuses a message with any recipient on the tenant's
// list: 422 naming every one, and a suppressed event each. Nothing is
// stored, so the client can send again without them; storing the others
// would make the one 202 mean two things.
func (s *Server) checkSuppressed(ctx context.Context, tenant string, rcpts []string, fields map[string]string) *Problem {
	l := s.cfg.Suppressions
	if l == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.EnqueueTimeout)
	defer cancel()
	var bad []FieldError
	for _, a := range rcpts {
		sup, err := l.Suppressed(ctx, tenant, a)
		if err != nil {
			s.log.Error().Err(err).Msg("suppression look-up")
			return unavailable("the suppression list cannot be read")
		}
		if sup == nil {
			continue
		}
		field := fields[strings.ToLower(a)]
		if field == "" {
			field = "to"
		}
		bad = append(bad, FieldError{Field: field, Value: a, Reason: "suppressed"})
	}
	if len(bad) == 0 {
		return nil
	}
	for _, fe := range bad {
		l.Refused(tenant, fe.Value, "api")
	}
	p := problem(http.StatusUnprocessableEntity, ProblemSuppressed, "recipient suppressed",
		fmt.Sprintf("%s is on the suppression list; nothing was stored: send again without the suppressed recipient(s)", bad[0].Value))
	p.Errors = bad
	return p
}

// postSuppression is POST /v1/suppressions: 201 with the stored entry.
func (s *Server) postSuppression(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	var req SuppressionRequest
	if p := decodeJSON(w, r, &req, "a suppression"); p != nil {
		return p
	}
	tenant, p := s.tenantOf(key, req.Tenant)
	if p != nil {
		return p
	}
	if req.Address == "" {
		return fieldProblem(ProblemMissingField, "missing field", "address", "the address to suppress is required")
	}
	if _, err := submission.ParseAddress(req.Address); err != nil {
		// The reason alone, as for a message's addresses.
		reason := err.Error()
		var ae *submission.AddressError
		if errors.As(err, &ae) {
			reason = ae.Reason
		}
		p := fieldProblem(ProblemBadAddress, "bad address", "address", reason)
		if len(req.Address) <= 254 && !strings.ContainsAny(req.Address, "\r\n\x00") {
			p.Errors[0].Value = req.Address
		}
		return p
	}
	sup := queue.Suppression{Tenant: tenant, Address: req.Address, Reason: req.Reason, Source: queue.SuppressAPI}
	if tenant != key.Tenant {
		// An admin key's entry for another tenant is the operator's, as
		// `outflow suppress add` is: the tenant can tell it from its own.
		sup.Source = queue.SuppressAdmin
	}
	if req.Expires != nil {
		// An entry that has already stopped applying would be answered
		// 201 and then suppress nothing: most likely a wrong year or zone.
		if !req.Expires.After(time.Now()) {
			return fieldProblem(ProblemBadExpires, "expires in the past", "expires",
				req.Expires.UTC().Format(time.RFC3339)+" has passed: the entry would never apply (omit expires for one that does not end)")
		}
		sup.Expires = req.Expires.UTC()
	}
	if err := s.cfg.Suppressions.Add(r.Context(), sup); err != nil {
		s.log.Error().Err(err).Msg("add suppression")
		return unavailable("the suppression list cannot be written")
	}
	sup.Address = queue.NormalizeAddress(sup.Address)
	sup.Created = time.Now().UTC().Truncate(time.Second)
	writeJSON(w, http.StatusCreated, sup)
	return nil
}

// listSuppressions is GET /v1/suppressions[?tenant=T][&source=S][&since=TIME]
// [&limit=N][&cursor=C]: the key's tenant's entries (an admin key may name
// any tenant), those added by one source, those added since a time, a page
// at a time: limit entries (default 100, at most 1,000) in the order they
// were written, and a next_cursor for the page after while more follow.
// Only the page is read from the store (queue.Suppressions.Page), not the
// list.
func (s *Server) listSuppressions(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	tenant, p := s.tenantOf(key, r.URL.Query().Get("tenant"))
	if p != nil {
		return p
	}
	q := r.URL.Query()
	source := q.Get("source")
	if source != "" && !slices.Contains(queue.SuppressionSources, source) {
		return queryProblem("source", source, "one of "+strings.Join(queue.SuppressionSources, ", "))
	}
	since, p := sinceQuery(q, time.Time{})
	if p != nil {
		return p
	}
	limit := defaultSuppressionsLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxSuppressionsLimit {
			return queryProblem("limit", v, "a number from 1 to "+strconv.Itoa(maxSuppressionsLimit))
		}
		limit = n
	}
	var from uint64
	if v := q.Get("cursor"); v != "" {
		var ok bool
		if from, ok = parseSuppressionCursor(v); !ok {
			return queryProblem("cursor", v, "the next_cursor of a page of this list")
		}
	}
	since = since.Truncate(time.Second)
	keep := func(e *queue.Suppression) bool {
		return (source == "" || e.Source == source) && !e.Created.Before(since)
	}
	list, next, err := s.cfg.Suppressions.Page(r.Context(), tenant, from, limit, suppressionsScan, keep)
	if err != nil {
		s.log.Error().Err(err).Msg("list suppressions")
		return unavailable("the suppression list cannot be read")
	}
	out := SuppressionList{Suppressions: list}
	if next != 0 {
		out.NextCursor = suppressionCursor(next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// sinceQuery is the since parameter of a listing, an RFC 3339 time, or def
// when it is absent.
func sinceQuery(q url.Values, def time.Time) (time.Time, *Problem) {
	v := q.Get("since")
	if v == "" {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return t, queryProblem("since", v, "an RFC 3339 time, such as 2026-12-06T00:00:00Z")
	}
	return t, nil
}

// queryProblem is a 400 for query parameter name's value.
func queryProblem(name, value, want string) *Problem {
	p := problem(http.StatusBadRequest, ProblemBadQuery, "bad query parameter", name+": want "+want)
	if len(value) > 100 {
		value = ""
	}
	p.Errors = []FieldError{{Field: name, Value: value, Reason: "want " + want}}
	return p
}

// deleteSuppression is DELETE /v1/suppressions/{address}[?tenant=T]: 204,
// or 404 for an address not on the list.
func (s *Server) deleteSuppression(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem {
	tenant, p := s.tenantOf(key, r.URL.Query().Get("tenant"))
	if p != nil {
		return p
	}
	addr := r.PathValue("address")
	err := s.cfg.Suppressions.Remove(r.Context(), tenant, addr)
	if errors.Is(err, queue.ErrNotSuppressed) {
		return problem(http.StatusNotFound, ProblemNotFound, "not suppressed", addr+" is not on the suppression list")
	}
	if err != nil {
		s.log.Error().Err(err).Msg("remove suppression")
		return unavailable("the suppression list cannot be written")
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// tenantOf is the tenant a request acts for: the key's, or the one it
// names if the key is an admin key (403 otherwise).
func (s *Server) tenantOf(key *KeyInfo, named string) (string, *Problem) {
	if named == "" || named == key.Tenant {
		return key.Tenant, nil
	}
	if !key.Admin {
		return "", problem(http.StatusForbidden, ProblemForbidden, "forbidden", "only an admin key may act for another tenant")
	}
	if !validTenant(named) {
		return "", fieldProblem(ProblemBadJSON, "bad tenant", "tenant", "want 1 to 64 letters, digits or -_.@+")
	}
	return named, nil
}

// maxSmallRequest bounds the bodies of requests other than messages.
const maxSmallRequest = 64 << 10

// decodeJSON reads a small JSON request body into v strictly, with the
// problems decodeRequest gives for messages (unknown-field naming the
// field, bad-json naming a field of the wrong type); what names v in them.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any, what string) *Problem {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return problem(http.StatusUnsupportedMediaType, ProblemMediaType, "unsupported media type", "send Content-Type: application/json")
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxSmallRequest))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return tooLarge(maxSmallRequest)
		}
		return problem(http.StatusBadRequest, ProblemBadJSON, "unreadable request", err.Error())
	}
	return decodeStrict(b, v, what)
}
