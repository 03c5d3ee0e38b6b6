package api

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Problem is an RFC 9457 problem details object. Type is one of the
// Problem* URIs below; a client branches on it, not on Title or Detail.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Errors lists the faults of individual fields (an extension member,
	// RFC 9457 section 3.2), e.g. which recipient is not a valid address.
	Errors []FieldError `json:"errors,omitempty"`
	// RetryAfter, in seconds, is also sent as the Retry-After header (429,
	// 503, and 409 for a request still in progress).
	RetryAfter int `json:"retry_after,omitempty"`
}

// FieldError names one faulty field of a request.
type FieldError struct {
	Field  string `json:"field"`           // JSON path, e.g. "to[2]"
	Value  string `json:"value,omitempty"` // the value refused, when it is short and safe to echo
	Reason string `json:"reason"`          // why
}

// Problem types. They are URNs rather than links: stable names that need no
// server to resolve; docs/api.md and docs/openapi.yaml describe each.
const (
	typePrefix            = "urn:outflow:problem:"
	ProblemBadJSON        = typePrefix + "bad-json"
	ProblemUnknownField   = typePrefix + "unknown-field"
	ProblemMissingField   = typePrefix + "missing-field"
	ProblemBadAddress     = typePrefix + "bad-address"
	ProblemBadHeader      = typePrefix + "bad-header"
	ProblemBadAttachment  = typePrefix + "bad-attachment"
	ProblemBadMessage     = typePrefix + "bad-message"
	ProblemBadDSN         = typePrefix + "bad-dsn"
	ProblemTooLarge       = typePrefix + "too-large"
	ProblemMediaType      = typePrefix + "unsupported-media-type"
	ProblemUnauthorized   = typePrefix + "unauthorized"
	ProblemForbidden      = typePrefix + "forbidden"
	ProblemRateLimited    = typePrefix + "rate-limited"
	ProblemIdemMismatch   = typePrefix + "idempotency-key-reused"
	ProblemIdemInProgress = typePrefix + "idempotency-key-in-progress"
	ProblemBadIdemKey     = typePrefix + "bad-idempotency-key"
	ProblemBadExpires     = typePrefix + "bad-expires"
	// ProblemBadSendAt: send_at is more than MaxSendAhead ahead.
	ProblemBadSendAt = typePrefix + "bad-send-at"
	// ProblemBadQuery: a query parameter is not one the route takes a
	// value of (an unknown source, a time that is not RFC 3339).
	ProblemBadQuery = typePrefix + "bad-query"
	// ProblemNoUnsubscribe: list_unsubscribe asked for links this
	// process cannot make (no --unsubscribe-url).
	ProblemNoUnsubscribe = typePrefix + "list-unsubscribe-unavailable"
	// ProblemSenderNotAllowed: the sender, or an address of the From
	// field, is outside the tenant's sender domains.
	ProblemSenderNotAllowed = typePrefix + "sender-not-allowed"
	// ProblemQuotaExceeded: the tenant's sending limit (recipients per 24
	// hours) leaves fewer than the message's recipients; 429, with when
	// more can be sent.
	ProblemQuotaExceeded = typePrefix + "quota-exceeded"
	ProblemNotFound      = typePrefix + "not-found"
	// ProblemQueryTooBroad: GET /v1/events read for SearchTimeout without
	// reaching the end of what it was asked to read; 422.
	ProblemQueryTooBroad = typePrefix + "query-too-broad"
	// ProblemSearchBusy: GET /v1/events refused before it read anything,
	// for the look-ups running: 429 when they are the key's (one at a
	// time) or its tenant's (its share), 503 when the process runs as
	// many as it may; retry after retry_after (events.go).
	ProblemSearchBusy = typePrefix + "too-many-searches"
	// ProblemAlreadySent: the message to cancel has left the queue
	// (delivered, bounced, dropped, dead); 409.
	ProblemAlreadySent = typePrefix + "already-sent"
	// ProblemInflight: the message requests in flight hold as many bytes
	// as the server may (503), or as the tenant's share of them (429);
	// nothing was stored, retry after retry_after (inflight.go).
	ProblemInflight    = typePrefix + "too-much-in-flight"
	ProblemMethod      = typePrefix + "method-not-allowed"
	ProblemUnavailable = typePrefix + "store-unavailable"
	ProblemInternal    = typePrefix + "internal"
)

// problem builds a Problem of type typ.
func problem(status int, typ, title, detail string) *Problem {
	return &Problem{Type: typ, Title: title, Status: status, Detail: detail}
}

// Error makes a Problem usable as an error inside the handlers.
func (p *Problem) Error() string { return p.Title + ": " + p.Detail }

// writeProblem sends p as application/problem+json (RFC 9457 section 3).
func writeProblem(w http.ResponseWriter, p *Problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(p.RetryAfter))
	}
	if p.Status == http.StatusUnauthorized {
		// RFC 6750 section 3.
		h.Set("WWW-Authenticate", `Bearer realm="outflow"`)
	}
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// writeJSON sends v as application/json with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}
