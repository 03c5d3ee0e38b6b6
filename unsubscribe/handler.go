package unsubscribe

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/queue"
)

// Store records outcomes: *queue.Queue.
type Store interface {
	// PublishEvent stores an event and returns once it is stored.
	PublishEvent(ctx context.Context, typ string, ev *queue.Event) error
	// SyncOutcomes returns once the events and suppressions stored are
	// on disk.
	SyncOutcomes(ctx context.Context) error
}

// Suppressor is the suppression list: *queue.Suppressions.
type Suppressor interface {
	// AddFirst puts s on the list unless an entry that never expires is
	// there already, in one compare-and-set (queue.Suppressions.AddFirst).
	AddFirst(ctx context.Context, s queue.Suppression) (bool, error)
	// Suppressed returns tenant's entry for addr if one applies now, or
	// nil.
	Suppressed(ctx context.Context, tenant, addr string) (*queue.Suppression, error)
}

// DefaultTimeout bounds the stores of one request: past it the request
// is answered 503 and the client tries again.
const DefaultTimeout = 10 * time.Second

// maxBody bounds a POST's body. RFC 8058's is one short form field; the
// bound only keeps a stranger from making the handler read without end.
const maxBody = 64 << 10

// HandlerConfig configures NewHandler.
type HandlerConfig struct {
	// Links opens the tokens. Required.
	Links *Links
	// Store records the unsubscribed events. Required.
	Store Store
	// Suppressions receives the recipients who unsubscribe. Required.
	Suppressions Suppressor
	// ID names who records, in the events' worker_id, such as
	// "host/123/api".
	ID string
	// Timeout bounds one request's stores (default DefaultTimeout).
	Timeout time.Duration
	Log     zerolog.Logger
	// Metrics, when set, counts the requests.
	Metrics *Metrics
}

type handler struct {
	cfg HandlerConfig
	log zerolog.Logger
}

// NewHandler returns the handler of the links' URLs, to be mounted at
// the links' path (such as "/unsubscribe/"): it takes the token from the
// last segment of the request's path. It panics when Links, Store or
// Suppressions is missing, a mistake in the program's wiring.
func NewHandler(cfg HandlerConfig) http.Handler {
	if cfg.Links == nil || cfg.Store == nil || cfg.Suppressions == nil {
		panic("unsubscribe: NewHandler needs Links, Store and Suppressions")
	}
	defaults.Set(&cfg.Timeout, DefaultTimeout)
	return &handler{cfg: cfg, log: cfg.Log.With().Str("component", "unsubscribe").Logger()}
}

// contentSecurity allows the page nothing but its own inline style and a
// form posting back to itself: no script, no image, no frame around it
// (a page that unsubscribes on a click is not to be framed under another
// site's button).
const contentSecurity = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; " +
	"frame-ancestors 'none'; base-uri 'none'"

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	// Nothing is to be kept or indexed: the URL carries a token that
	// unsubscribes whoever posts it, and the page shows an address.
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Robots-Tag", "noindex")
	hd.Set("Referrer-Policy", "no-referrer")
	hd.Set("Content-Security-Policy", contentSecurity)
	hd.Set("X-Content-Type-Options", "nosniff")
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost:
	default:
		hd.Set("Allow", "GET, HEAD, POST")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	t, err := h.cfg.Links.Open(tokenOf(r.URL.Path))
	if err == nil && !usable(t) {
		// Made by this fleet, yet naming no tenant or no address: the
		// list could never take it, and a 503 would be retried for
		// nothing.
		h.log.Warn().Str("tenant", t.Tenant).Str("msg_id", t.ID).Str("rcpt", t.Rcpt).
			Msg("unsubscribe link names no tenant or no address")
		err = ErrInvalid
	}
	if err != nil {
		h.cfg.Metrics.count(ResultInvalid)
		h.log.Debug().Str("method", r.Method).Msg("unsubscribe link not valid")
		write(w, http.StatusNotFound, page{Kind: pageInvalid})
		return
	}
	if r.Method != http.MethodPost {
		// A GET is a person who clicked the link, or a scanner that
		// fetched it to judge the message: only a POST unsubscribes.
		h.cfg.Metrics.count(ResultPage)
		h.log.Debug().Str("tenant", t.Tenant).Str("msg_id", t.ID).Str("rcpt", t.Rcpt).Msg("unsubscribe page shown")
		write(w, http.StatusOK, page{Kind: pageConfirm, Addr: t.Rcpt})
		return
	}
	oneClick, err := readForm(w, r)
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			http.Error(w, "request body too large", http.StatusRequestEntityTooLarge)
			return
		}
		// A body that could not be read to its end: the client went
		// away or sent garbage. Nothing was recorded.
		http.Error(w, "request body not read", http.StatusBadRequest)
		return
	}
	// The stores go on if the client disconnects: a person who closes the
	// tab after clicking is unsubscribed all the same.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), h.cfg.Timeout)
	defer cancel()
	result, err := h.unsubscribe(ctx, t, oneClick)
	ev := h.log.Info()
	if err != nil {
		ev = h.log.Warn().Err(err)
	}
	ev.Str("tenant", t.Tenant).Str("msg_id", t.ID).Str("rcpt", t.Rcpt).Bool("one_click", oneClick).
		Str("result", result).Msg("unsubscribe request")
	h.cfg.Metrics.count(result)
	if err != nil {
		// Nothing was promised: the provider posts again, the person
		// presses again.
		hd.Set("Retry-After", "5")
		write(w, http.StatusServiceUnavailable, page{Kind: pageRetry, Addr: t.Rcpt})
		return
	}
	write(w, http.StatusOK, page{Kind: pageDone, Addr: t.Rcpt})
}

// tokenOf is the last segment of path, a trailing slash ignored (a link
// a mail client or a person completed with one).
func tokenOf(path string) string {
	path = strings.TrimSuffix(path, "/")
	return path[strings.LastIndexByte(path, '/')+1:]
}

// usable reports whether the list can take t.
func usable(t Target) bool {
	return t.Tenant != "" && strings.Contains(queue.NormalizeAddress(t.Rcpt), "@")
}

// readForm reads a POST's body, at most maxBody bytes, and reports
// whether it says List-Unsubscribe=One-Click (RFC 8058 §3.1), in either
// of the encodings the RFC allows. No particular body is required: the
// POST alone asks to unsubscribe, so a body that is not a form, or not
// that form, only makes the event's reason "link". The error is the
// body's (too large, or cut short), never the form's.
func readForm(w http.ResponseWriter, r *http.Request) (bool, error) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if mt == "multipart/form-data" {
		if r.ParseMultipartForm(maxBody) == nil {
			defer func() { _ = r.MultipartForm.RemoveAll() }()
		}
	} else {
		_ = r.ParseForm()
	}
	// Whatever the parsers left (all of a body that is no form) is read
	// to its end, so that the limit holds for every body.
	if _, err := io.Copy(io.Discard, r.Body); err != nil {
		return false, err
	}
	return r.PostForm.Get("List-Unsubscribe") == "One-Click", nil
}

// unsubscribe records that t's recipient unsubscribed and returns the
// result: an unsubscribed event of t's message, and the recipient on its
// tenant's list, both on disk before it returns nil. An address already
// on the list by its own unsubscribe is left as it is, with no second
// event: a provider may post twice.
func (h *handler) unsubscribe(ctx context.Context, t Target, oneClick bool) (string, error) {
	rcpt := queue.NormalizeAddress(t.Rcpt)
	cur, err := h.cfg.Suppressions.Suppressed(ctx, t.Tenant, rcpt)
	if err != nil {
		return ResultError, err
	}
	if cur != nil && !active(cur) {
		cur = nil
	}
	if cur != nil && cur.Source == queue.SuppressUnsubscribe {
		// Read from a store that may not have it on disk yet: a second
		// POST can come while the first waits for its sync, and its 200
		// promises no less.
		if err := h.cfg.Store.SyncOutcomes(ctx); err != nil {
			return ResultError, err
		}
		return ResultAlready, nil
	}
	reason := "link"
	if oneClick {
		reason = "one-click"
	}
	ev := &queue.Event{ID: t.ID, MsgID: msgIDOf(t.ID), Tenant: t.Tenant, Recipients: []string{rcpt},
		Worker: h.cfg.ID, Async: true, Reason: reason}
	if err := h.cfg.Store.PublishEvent(ctx, queue.EventUnsubscribed, ev); err != nil {
		return ResultError, err
	}
	// An entry that never expires (a hard bounce, a complaint, an
	// operator's) keeps the address off the list's mail already, and its
	// reason says more than this one. An entry that expires is replaced:
	// an unsubscribe does not lapse. One compare-and-set: a complaint
	// written meanwhile is not overwritten.
	s := queue.Suppression{Tenant: t.Tenant, Address: rcpt, Reason: "unsubscribed (message " + t.ID + ")",
		Source: queue.SuppressUnsubscribe}
	if _, err := h.cfg.Suppressions.AddFirst(ctx, s); err != nil {
		return ResultError, err
	}
	// Both are on disk before the page says so, and before a provider's
	// 200, after which it does not ask again.
	if err := h.cfg.Store.SyncOutcomes(ctx); err != nil {
		return ResultError, err
	}
	return ResultUnsubscribed, nil
}

// active reports whether s applies now. Suppressed returns only entries
// that do; the check keeps an expired entry from passing for a live one
// whatever the list's implementation.
func active(s *queue.Suppression) bool {
	return s.Expires.IsZero() || time.Now().Before(s.Expires)
}

// msgIDOf is the message id of an envelope id: an envelope id is the
// message's id, or, when the message went to several destinations, the
// id followed by "-" and the envelope's number (queue.Enqueue).
func msgIDOf(id string) string {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || i == len(id)-1 {
		return id
	}
	for _, c := range id[i+1:] {
		if c < '0' || c > '9' {
			return id
		}
	}
	return id[:i]
}

// write renders p as the response with status.
func write(w http.ResponseWriter, status int, p page) {
	var b bytes.Buffer
	if err := pages.Execute(&b, p); err != nil {
		// The template is fixed and its data plain strings: this does not
		// happen.
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	hd := w.Header()
	hd.Set("Content-Type", "text/html; charset=utf-8")
	hd.Set("Content-Length", strconv.Itoa(b.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}
