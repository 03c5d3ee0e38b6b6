package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/internal/membudget"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// Defaults applied by New to zero-valued Config fields. The CLI's flags and
// docs/configuration.md use these.
const (
	DefaultAddr            = "127.0.0.1:8025"
	DefaultMaxMessageBytes = 25 << 20 // as the SMTP listener's --max-message-size
	DefaultMaxRecipients   = 1000
	DefaultRate            = 100.0 // requests per second per key
	DefaultBurst           = 200
	DefaultEnqueueTimeout  = 30 * time.Second
	DefaultSearchTimeout   = 30 * time.Second
)

// Queue is what the API needs of the queue: *queue.Queue, or a wrapper
// whose Enqueue fails fast while the store cannot take mail.
type Queue interface {
	Enqueue(ctx context.Context, s *queue.Submission) ([]string, error)
	Find(ctx context.Context, id string) (*queue.Item, error)
	History(ctx context.Context, id string, since time.Time) ([]queue.Event, error)
	TenantHistory(ctx context.Context, tenant, id string, since time.Time) ([]queue.Event, error)
	DropBy(ctx context.Context, id, by string) (*queue.Item, error)
	FindEvents(ctx context.Context, q queue.EventQuery) ([]queue.Event, int, error)
}

// Config configures a Server. Zero values take the documented default.
type Config struct {
	Queue   Queue
	Buckets Bucketer // where keys and idempotency records live (the *queue.Queue)
	// Hostname is the right-hand side of built Message-IDs and the "by"
	// of the Received header.
	Hostname string
	// MaxMessageBytes is the largest message accepted, raw or built
	// (413 above). Default DefaultMaxMessageBytes.
	MaxMessageBytes int64
	// MaxRecipients is the most recipients of one request (422 above).
	// Default DefaultMaxRecipients.
	MaxRecipients int
	// Rate is each key's sustained request rate per second, Burst the
	// requests it may make at once (429 beyond). Defaults DefaultRate and
	// DefaultBurst; a negative Rate turns the limit off.
	Rate  float64
	Burst int
	// IdempotencyTTL is how long an Idempotency-Key is remembered: the
	// queue's deduplication window (serve passes Queue.DedupWindow).
	// Default queue.DefaultDedupWindow.
	IdempotencyTTL time.Duration
	// EnqueueTimeout bounds one store of a submission (503 past it).
	// Default DefaultEnqueueTimeout.
	EnqueueTimeout time.Duration
	// MaxInflightBytes bounds, process-wide, the memory the message
	// requests in flight may hold: each POST /v1/messages is charged for
	// the body octets it has read, times what they hold at its peak, as
	// they arrive (a declared Content-Length is checked first, not
	// charged; inflight.go), and waits up to InflightWait for room, then
	// is refused with 503 too-much-in-flight. Default
	// DefaultMaxInflightBytes; negative: no bound.
	MaxInflightBytes int64
	// TenantInflightBytes is the most of MaxInflightBytes one tenant's
	// requests may hold (429 too-much-in-flight beyond). Default half of
	// MaxInflightBytes.
	TenantInflightBytes int64
	// InflightWait is how long a request waits for room under
	// MaxInflightBytes. Default DefaultInflightWait.
	InflightWait time.Duration
	// SearchTimeout bounds one GET /v1/events, which reads through the
	// events (422 query-too-broad past it). Default DefaultSearchTimeout.
	SearchTimeout time.Duration
	// Suppressions is the suppression list: recipients on it are refused
	// (422), and /v1/suppressions manages it. Nil: no list, and no
	// /v1/suppressions routes.
	Suppressions Suppressions
	// Quota, when set, counts a message's recipients against its tenant's
	// sending limit before it is stored (429 quota-exceeded past it); nil:
	// no limits.
	Quota submission.Quota
	// SenderDomains limits the domains each tenant it names may send as
	// (from, and the From field of a built or raw message): 422
	// sender-not-allowed otherwise. Nil: any domain, for every tenant.
	SenderDomains submission.SenderDomains
	// Unsubscribe serves the one-click unsubscribe links under
	// /unsubscribe/, without an API key (unsubscribe.NewHandler); nil: no
	// links, and a list_unsubscribe request is refused (422).
	Unsubscribe http.Handler
	// AuthFailLimit is how many failed authentications (no key, not the
	// Bearer scheme, an unknown or revoked key) one client address, an
	// IPv4 address or an IPv6 /64, may make within AuthFailWindow; after
	// that every request from it is answered 429 without its key being
	// looked up, until the window, counted from the first failure, ends.
	// The console's sign-in counts against the same limit
	// (Server.AuthLimiter). Default DefaultAuthFailLimit.
	AuthFailLimit int
	// AuthFailWindow is the period failures are counted over. Default
	// DefaultAuthFailWindow.
	AuthFailWindow time.Duration
	Logger         zerolog.Logger
}

// Server is the HTTP API. Its Handler serves every route.
type Server struct {
	cfg  Config
	keys *Keys
	idem *idempotency
	log  zerolog.Logger
	mux  *http.ServeMux

	// inflight bounds the bytes of message requests in flight; nil: no
	// bound.
	inflight *membudget.Budget

	mu       sync.Mutex
	limiters map[string]*rate.Limiter // by key id
	// searches counts the GET /v1/events running, by key and by tenant
	// (events.go).
	searches searches
	// submitted counts the answers to POST /v1/messages by result
	// (Submissions).
	submitted [numResults]atomic.Uint64
	// auth limits failed authentications per client address;
	// authFailures counts them by reason (AuthFailures).
	auth         *AuthLimiter
	authFailures [numAuthReasons]atomic.Uint64
}

// New opens the key and idempotency buckets and returns the API.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Queue == nil || cfg.Buckets == nil {
		return nil, errors.New("api: Queue and Buckets are required")
	}
	if cfg.Hostname == "" {
		cfg.Hostname = "localhost"
	}
	defaults.Set(&cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	defaults.Set(&cfg.MaxRecipients, DefaultMaxRecipients)
	if cfg.Rate == 0 {
		cfg.Rate = DefaultRate
	}
	defaults.Set(&cfg.Burst, DefaultBurst)
	defaults.Set(&cfg.IdempotencyTTL, queue.DefaultDedupWindow)
	defaults.Set(&cfg.EnqueueTimeout, DefaultEnqueueTimeout)
	defaults.Set(&cfg.SearchTimeout, DefaultSearchTimeout)
	if cfg.MaxInflightBytes == 0 { // negative: no bound
		cfg.MaxInflightBytes = DefaultMaxInflightBytes
	}
	defaults.Set(&cfg.TenantInflightBytes, max(1, cfg.MaxInflightBytes/2))
	defaults.Set(&cfg.InflightWait, DefaultInflightWait)
	keys, err := OpenKeys(ctx, cfg.Buckets)
	if err != nil {
		return nil, err
	}
	idem, err := openIdempotency(ctx, cfg.Buckets, cfg.IdempotencyTTL, 2*cfg.EnqueueTimeout)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, keys: keys, idem: idem, log: cfg.Logger.With().Str("component", "api").Logger(),
		mux: http.NewServeMux(), limiters: map[string]*rate.Limiter{},
		searches: searches{keys: map[string]bool{}, tenants: map[string]int{}},
		inflight: membudget.New(cfg.MaxInflightBytes, cfg.TenantInflightBytes),
		auth:     NewAuthLimiter(cfg.AuthFailLimit, cfg.AuthFailWindow, nil)}
	s.mux.Handle("/v1/messages", s.route(map[string]handler{http.MethodPost: s.postMessage}, s.countSubmission))
	s.mux.Handle("/v1/messages/{id}", s.route(map[string]handler{http.MethodGet: s.getMessage, http.MethodDelete: s.cancelMessage}))
	s.mux.Handle("/v1/events", s.route(map[string]handler{http.MethodGet: s.listEvents}))
	if cfg.Suppressions != nil {
		s.mux.Handle("/v1/suppressions", s.route(map[string]handler{http.MethodPost: s.postSuppression, http.MethodGet: s.listSuppressions}))
		s.mux.Handle("/v1/suppressions/{address}", s.route(map[string]handler{http.MethodDelete: s.deleteSuppression}))
	}
	if cfg.Unsubscribe != nil {
		// The recipients' side: no key (RFC 8058 3.2), the token is the
		// credential. The one path an operator exposes publicly.
		s.mux.Handle("/unsubscribe/", cfg.Unsubscribe)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, problem(http.StatusNotFound, ProblemNotFound, "not found", "no such route: "+r.URL.Path))
	})
	return s, nil
}

// Keys returns the server's key store.
func (s *Server) Keys() *Keys { return s.keys }

// AuthLimiter returns the limit on failed authentications per client
// address, for the console's sign-in to share.
func (s *Server) AuthLimiter() *AuthLimiter { return s.auth }

// Handler returns the API's HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// handler serves one authenticated request.
type handler func(w http.ResponseWriter, r *http.Request, key *KeyInfo) *Problem

// route dispatches by method, authenticates (a failure from a client
// address at its limit of failed authentications is a 429), applies the
// key's rate limit,
// and writes a returned Problem. A panic in a handler is a 500, logged,
// not the end of the process. Each observe, when given, is told how every
// request of a known method ended: its problem, or nil for a success.
func (s *Server) route(methods map[string]handler, observe ...func(*Problem)) http.Handler {
	allow := make([]string, 0, len(methods))
	for m := range methods {
		allow = append(allow, m)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := methods[r.Method]
		if !ok {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeProblem(w, problem(http.StatusMethodNotAllowed, ProblemMethod, "method not allowed", r.Method+" "+r.URL.Path))
			return
		}
		defer func() {
			if p := recover(); p != nil {
				s.log.Error().Str("panic", fmt.Sprint(p)).Str("path", r.URL.Path).Msg("api handler panicked")
				p := problem(http.StatusInternalServerError, ProblemInternal, "internal error", "")
				writeProblem(w, p)
				for _, o := range observe {
					o(p)
				}
			}
		}()
		// An address at its limit of failed authentications is answered
		// 429 for each further failure; a valid key from it is still
		// served: applications behind one NAT address share it, and one
		// with a wrong key must not stop the others. The keys' 256 bits
		// are what stops guessing; the limit makes it seen and slowed.
		blocked := s.authBlocked(r)
		key, p := s.authenticate(r)
		if p != nil && p.Status == http.StatusUnauthorized && blocked != nil {
			p = blocked
			s.auth.Refusing()
		}
		if p == nil {
			p = s.limit(key)
		}
		if p == nil {
			p = h(w, r, key)
		}
		if p != nil {
			writeProblem(w, p)
		}
		for _, o := range observe {
			o(p)
		}
	})
}

// authenticate checks the Bearer key (RFC 6750 section 2.1). A failure
// is counted, by reason, and against the client's address (authBlocked).
func (s *Server) authenticate(r *http.Request) (*KeyInfo, *Problem) {
	auth := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(auth, " ")
	if auth == "" {
		s.authFailed(r, authMissing)
		return nil, problem(http.StatusUnauthorized, ProblemUnauthorized, "missing API key", "send Authorization: Bearer KEY, a key from outflow apikey create")
	}
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		s.authFailed(r, authMalformed)
		return nil, problem(http.StatusUnauthorized, ProblemUnauthorized, "bad Authorization header", "want the Bearer scheme: Authorization: Bearer KEY")
	}
	info, err := s.keys.Lookup(r.Context(), strings.TrimSpace(token))
	if errors.Is(err, ErrNoKey) {
		s.authFailed(r, authUnknown)
		return nil, problem(http.StatusUnauthorized, ProblemUnauthorized, "unknown API key", "the key does not exist or was revoked")
	}
	if err != nil {
		s.log.Error().Err(err).Msg("api key lookup")
		return nil, unavailable("the key store cannot be read")
	}
	return info, nil
}

// maxLimiters bounds the per-key limiter map; when full it starts again,
// which at worst grants each key one fresh burst.
const maxLimiters = 65536

// limit takes one token from key's bucket, or answers 429.
func (s *Server) limit(key *KeyInfo) *Problem {
	if s.cfg.Rate < 0 {
		return nil
	}
	s.mu.Lock()
	lim := s.limiters[key.ID]
	if lim == nil {
		if len(s.limiters) >= maxLimiters {
			s.limiters = map[string]*rate.Limiter{}
		}
		lim = rate.NewLimiter(rate.Limit(s.cfg.Rate), s.cfg.Burst)
		s.limiters[key.ID] = lim
	}
	s.mu.Unlock()
	if lim.Allow() {
		return nil
	}
	res := lim.Reserve()
	wait := res.Delay()
	res.Cancel()
	p := problem(http.StatusTooManyRequests, ProblemRateLimited, "rate limited",
		fmt.Sprintf("this key may make %g requests per second (bursts of %d)", s.cfg.Rate, s.cfg.Burst))
	p.RetryAfter = RetryAfter(wait)
	return p
}

// unavailable is the 503 for a store that cannot take or answer requests.
func unavailable(detail string) *Problem {
	p := problem(http.StatusServiceUnavailable, ProblemUnavailable, "store unavailable", detail)
	p.RetryAfter = 5
	return p
}

// storeFull is the 503 store-unavailable for queue.ErrNoRoom: the store
// is near its limit and keeps the rest for the mail already queued.
// Refused before anything was written; deliveries free the room, so the
// client is asked to come back in a minute rather than in 5 s.
func storeFull() *Problem {
	p := problem(http.StatusServiceUnavailable, ProblemUnavailable, "store full",
		"the queue's store is near its limit, the rest kept for the mail already queued: nothing was stored; send it again later")
	p.RetryAfter = 60
	return p
}
