package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/api"
	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// Prefix is where the console is mounted on the API listener.
const Prefix = "/ui/"

// DefaultSessionTTL is how long a session lasts after sign-in.
const DefaultSessionTTL = 8 * time.Hour

// KeyLookup finds an API key's info (*api.Keys).
type KeyLookup interface {
	Lookup(ctx context.Context, key string) (*api.KeyInfo, error)
}

// Config configures a Console. Queue and Keys are required.
type Config struct {
	Queue *queue.Queue
	Keys  KeyLookup
	// Suppressions is the suppression list; nil hides its page.
	Suppressions *queue.Suppressions
	// Local is this daemon's view of a destination (its configured limits
	// and the effective rate it applies), shown beside the shared state
	// in the destinations table; nil shows the shared state alone.
	Local func(dest string) throttle.DestStatus
	// Secure marks the session cookie Secure: set it when the listener
	// serves TLS.
	Secure bool
	// SessionTTL is a session's lifetime from sign-in. Default
	// DefaultSessionTTL.
	SessionTTL time.Duration
	// StatusWait is how long a destination's page waits for the workers'
	// status answers. Default throttle.DefaultStatusWait, as `outflow dest
	// status`.
	StatusWait time.Duration
	// Refresh is how often the live tables poll. Default 5s.
	Refresh time.Duration
	// AuthLimiter limits failed sign-ins per client address: the API's
	// (api.Server.AuthLimiter), so that an address at its limit of
	// failed keys is refused on both, and guesses cannot be split
	// between them. Nil: one of the console's own, with the API's
	// defaults.
	AuthLimiter *api.AuthLimiter
	Logger      zerolog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves the operator's pages. Its Handler expects requests
// under Prefix.
type Console struct {
	cfg      Config
	log      zerolog.Logger
	state    jetstream.KeyValue // the throttle's shared destination state
	registry jetstream.KeyValue // the throttle's live workers
	pages    map[string]*template.Template
	sessions *sessions
	rates    *rates
	mux      *http.ServeMux
	stop     context.CancelFunc
	wg       sync.WaitGroup
	// signInFailures counts failed sign-ins by reason (SignInFailures).
	signInFailures [numSignInReasons]atomic.Uint64
}

// New builds the console and starts following the events stream for the
// overview's charts; Close stops it.
func New(ctx context.Context, cfg Config) (*Console, error) {
	if cfg.Queue == nil || cfg.Keys == nil {
		return nil, errors.New("console: Queue and Keys are required")
	}
	defaults.Set(&cfg.SessionTTL, DefaultSessionTTL)
	defaults.Set(&cfg.StatusWait, throttle.DefaultStatusWait)
	defaults.Set(&cfg.Refresh, 5*time.Second)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AuthLimiter == nil {
		cfg.AuthLimiter = api.NewAuthLimiter(0, 0, cfg.Now)
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{cfg: cfg, log: cfg.Logger.With().Str("component", "console").Logger(), pages: pages,
		sessions: newSessions(cfg.SessionTTL, cfg.Now), mux: http.NewServeMux()}
	if c.state, err = throttle.OpenState(ctx, cfg.Queue); err != nil {
		return nil, err
	}
	if c.registry, err = throttle.OpenRegistry(ctx, cfg.Queue); err != nil {
		return nil, err
	}
	c.rates = newRates(cfg.Now)
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	c.stop = stop
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.rates.follow(rctx, cfg.Queue, c.log)
	}()
	c.routes()
	return c, nil
}

// Close stops following the events stream.
func (c *Console) Close() {
	c.stop()
	c.wg.Wait()
}

// Handler returns the console's HTTP handler, for requests under Prefix.
func (c *Console) Handler() http.Handler { return c.mux }

func (c *Console) routes() {
	static, _ := fs.Sub(staticFS, "static")
	files := http.StripPrefix(Prefix+"static/", http.FileServer(http.FS(static)))
	c.mux.Handle("GET "+Prefix+"static/", c.guard(false, func(w http.ResponseWriter, r *http.Request, _ *session) {
		w.Header().Set("Cache-Control", "max-age=3600")
		files.ServeHTTP(w, r)
	}))
	c.mux.Handle("GET "+Prefix+"login", c.guard(false, c.loginPage))
	c.mux.Handle("POST "+Prefix+"login", c.guard(false, c.login))
	c.mux.Handle("POST "+Prefix+"logout", c.guard(true, c.logout))

	c.mux.Handle("GET "+Prefix+"{$}", c.guard(true, c.overview))
	c.mux.Handle("GET "+Prefix+"dests", c.guard(true, c.destList))
	c.mux.Handle("GET "+Prefix+"dests/{dest}", c.guard(true, c.forDest(c.destPage)))
	c.mux.Handle("POST "+Prefix+"dests/{dest}/{action}", c.guard(true, c.forDest(c.destAction)))
	c.mux.Handle("GET "+Prefix+"queue", c.guard(true, c.queuePage))
	c.mux.Handle("GET "+Prefix+"find", c.guard(true, c.findPage))
	c.mux.Handle("GET "+Prefix+"messages/{id}", c.guard(true, c.messagePage))
	c.mux.Handle("POST "+Prefix+"messages/{id}/{action}", c.guard(true, c.messageAction))
	c.mux.Handle("GET "+Prefix+"dead", c.guard(true, c.deadPage))
	c.mux.Handle("GET "+Prefix+"suppressions", c.guard(true, c.suppressionsPage))
	c.mux.Handle("POST "+Prefix+"suppressions/{action}", c.guard(true, c.suppressionAction))
	c.mux.Handle(Prefix, c.guard(true, func(w http.ResponseWriter, r *http.Request, s *session) {
		c.fail(w, r, s, http.StatusNotFound, "No such page: "+r.URL.Path)
	}))
}

// guard wraps a handler: security headers, a recovered panic, and, when
// auth is set, a valid session (else a redirect to the sign-in page) and,
// for a POST, its CSRF token.
func (c *Console) guard(auth bool, h func(http.ResponseWriter, *http.Request, *session)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				c.log.Error().Str("panic", fmt.Sprint(p)).Str("path", r.URL.Path).Msg("console handler panicked")
				http.Error(w, "internal error", http.StatusInternalServerError)
			}
		}()
		hd := w.Header()
		hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "same-origin")
		hd.Set("X-Frame-Options", "DENY")
		if !auth {
			h(w, r, nil)
			return
		}
		hd.Set("Cache-Control", "no-store")
		s := c.sessionOf(r)
		if s == nil {
			if r.Method == http.MethodGet && r.URL.Query().Get("fragment") != "" {
				// A live refresh after the session ended: tell the script
				// to reload the page, which then goes to the sign-in page.
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			if r.Method == http.MethodPost && r.URL.Path != Prefix+"logout" {
				// An action posted after the session ended (a restart
				// ends them all) was not done: the sign-in page says so
				// and leads back to the page it was posted from.
				http.Redirect(w, r, Prefix+"login"+c.lostQuery(r), http.StatusSeeOther)
				return
			}
			next := ""
			if r.Method == http.MethodGet {
				next = r.URL.RequestURI()
			}
			http.Redirect(w, r, Prefix+"login"+nextQuery(next), http.StatusSeeOther)
			return
		}
		if r.Method == http.MethodPost && !c.sameOrigin(r, s) {
			c.fail(w, r, s, http.StatusForbidden, "This form's CSRF token is missing or wrong (reload the page and try again).")
			return
		}
		h(w, r, s)
	})
}

// sameOrigin checks a POST's CSRF token, and refuses a browser's
// cross-site request outright.
func (c *Console) sameOrigin(r *http.Request, s *session) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
		return false
	}
	r.Body = http.MaxBytesReader(nil, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		return false
	}
	return s.checkCSRF(r.PostForm.Get("csrf"))
}

// nextQuery is the ?next= of a redirect to the sign-in page: only a path
// inside the console, so the sign-in cannot send the browser elsewhere.
func nextQuery(next string) string {
	if !safeNext(next) {
		return ""
	}
	return "?next=" + urlQueryEscape(next)
}

// lostQuery is the query of the sign-in page for a POST that came
// without a session: lost=1, and as next the console page the form was
// on (its Referer, which the console's Referrer-Policy sends within the
// origin), when that is a page inside the console. A confirmation page
// has the URL of the action that showed it (POST only): next is then the
// page above it (/ui/messages/ID for /ui/messages/ID/drop).
func (c *Console) lostQuery(r *http.Request) string {
	v := url.Values{"lost": {"1"}}
	ref, err := url.Parse(r.Referer())
	if err != nil || ref.Path == "" {
		return "?" + v.Encode()
	}
	page := &url.URL{Path: ref.Path, RawPath: ref.RawPath, RawQuery: ref.RawQuery}
	if !c.isPage(page) {
		page = &url.URL{Path: path.Dir(ref.Path)}
	}
	if next := page.RequestURI(); c.isPage(page) && safeNext(next) && !strings.HasPrefix(next, Prefix+"login") {
		v.Set("next", next)
	}
	return "?" + v.Encode()
}

// isPage reports whether u is a page of the console: a GET of it finds a
// handler other than the one for no such page.
func (c *Console) isPage(u *url.URL) bool {
	_, pattern := c.mux.Handler(&http.Request{Method: http.MethodGet, URL: u, Host: "console"})
	return pattern != "" && pattern != Prefix
}

func safeNext(next string) bool {
	return strings.HasPrefix(next, Prefix) && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n")
}

// ctx bounds one page's reads of NATS.
func (c *Console) ctx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 15*time.Second)
}
