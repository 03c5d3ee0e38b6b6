package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/outflow/outflow/api"
)

// sessionCookie names the session cookie; preCookie the sign-in form's
// token before there is a session.
const (
	sessionCookie = "outflow_console"
	preCookie     = "outflow_console_signin"
)

// maxSessions bounds the sessions kept in memory; past it the oldest is
// dropped (its operator signs in again).
const maxSessions = 10000

// session is one signed-in browser.
type session struct {
	token   string
	key     string // the admin key, kept in memory only, looked up on each request
	info    api.KeyInfo
	csrf    string
	created time.Time
	expires time.Time

	mu    sync.Mutex
	flash string // a one-shot notice for the next page ("dest suspended")
}

func (s *session) checkCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(s.csrf)) == 1
}

func (s *session) setFlash(msg string) {
	s.mu.Lock()
	s.flash = msg
	s.mu.Unlock()
}

func (s *session) takeFlash() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.flash
	s.flash = ""
	return f
}

// sessions is the in-memory session table.
type sessions struct {
	ttl time.Duration
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*session
}

func newSessions(ttl time.Duration, now func() time.Time) *sessions {
	return &sessions{ttl: ttl, now: now, m: map[string]*session{}}
}

// randomToken returns 256 random bits, base64url.
func randomToken() string {
	var b [32]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand since Go 1.24)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

func (ss *sessions) create(key string, info api.KeyInfo) *session {
	now := ss.now()
	s := &session{token: randomToken(), key: key, info: info, csrf: randomToken(), created: now, expires: now.Add(ss.ttl)}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for t, o := range ss.m {
		if !now.Before(o.expires) {
			delete(ss.m, t)
		}
	}
	if len(ss.m) >= maxSessions {
		var oldest *session
		for _, o := range ss.m {
			if oldest == nil || o.created.Before(oldest.created) {
				oldest = o
			}
		}
		delete(ss.m, oldest.token)
	}
	ss.m[s.token] = s
	return s
}

func (ss *sessions) get(token string) *session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s := ss.m[token]
	if s == nil {
		return nil
	}
	if !ss.now().Before(s.expires) {
		delete(ss.m, token)
		return nil
	}
	return s
}

func (ss *sessions) drop(token string) {
	ss.mu.Lock()
	delete(ss.m, token)
	ss.mu.Unlock()
}

// sessionOf returns the request's live session, or nil. The key is
// looked up again, so a revoked or demoted key's sessions end at once.
func (c *Console) sessionOf(r *http.Request) *session {
	ck, err := r.Cookie(sessionCookie)
	if err != nil || ck.Value == "" {
		return nil
	}
	s := c.sessions.get(ck.Value)
	if s == nil {
		return nil
	}
	info, err := c.cfg.Keys.Lookup(r.Context(), s.key)
	if err != nil || !info.Admin {
		if errors.Is(err, api.ErrNoKey) || err == nil {
			c.sessions.drop(s.token)
		}
		return nil
	}
	return s
}

// setCookie sets one of the console's cookies: Secure when this listener
// serves TLS, or when the request reached a reverse proxy over HTTPS
// (X-Forwarded-Proto: https, which the proxy sets; a forged one only makes
// the cookie stricter), so a session behind a proxy that ends TLS is never
// sent over plain HTTP.
func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	secure := c.cfg.Secure || strings.EqualFold(strings.TrimSpace(r.Header.Get("X-Forwarded-Proto")), "https")
	http.SetCookie(w, &http.Cookie{Name: name, Value: value, Path: Prefix, MaxAge: maxAge,
		HttpOnly: true, Secure: secure, SameSite: http.SameSiteStrictMode})
}

// loginPage shows the sign-in form. Its token (in a cookie and the form)
// keeps another site from signing the browser in with its own key.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request, _ *session) {
	c.renderLogin(w, r, http.StatusOK, "")
}

func (c *Console) renderLogin(w http.ResponseWriter, r *http.Request, status int, msg string) {
	tok := randomToken()
	c.setCookie(w, r, preCookie, tok, 600)
	next := r.FormValue("next")
	if !safeNext(next) {
		next = ""
	}
	w.Header().Set("Cache-Control", "no-store")
	// lost=1: a form was posted after the session ended (lostQuery).
	lost := r.FormValue("lost") == "1"
	c.render(w, r, nil, status, "login", "Sign in", map[string]any{"Token": tok, "Next": next, "Error": msg, "Lost": lost})
}

// The reasons a failed sign-in is counted under (cmd/outflow exports
// them as outflow_console_signin_failures_total{reason}).
const (
	// SignInUnknown: a key that does not exist or was revoked (or none).
	SignInUnknown = "unknown"
	// SignInNotAdmin: a tenant's key, not an admin key.
	SignInNotAdmin = "not-admin"
)

// SignInFailureReasons lists the reasons in the order SignInFailures
// returns them.
var SignInFailureReasons = [numSignInReasons]string{SignInUnknown, SignInNotAdmin}

// Indexes in SignInFailureReasons.
const (
	signInUnknown = iota
	signInNotAdmin
	numSignInReasons
)

// SignInFailures returns how many sign-ins this console refused for their
// key, by reason, in the order of SignInFailureReasons; for the metrics.
func (c *Console) SignInFailures() [numSignInReasons]uint64 {
	var n [numSignInReasons]uint64
	for i := range n {
		n[i] = c.signInFailures[i].Load()
	}
	return n
}

// signInFailed counts a refused sign-in, by reason and against its
// client's address, and logs it as the API logs its failures: the first
// of an address in its window, and the one that reaches the limit.
func (c *Console) signInFailed(r *http.Request, reason int) {
	c.signInFailures[reason].Add(1)
	c.cfg.AuthLimiter.Failed(c.log, r, SignInFailureReasons[reason])
}

// login checks an admin key and starts a session. A failed sign-in from
// an address at its limit of failures (of sign-ins and API keys: the
// limiter is the API's) is answered 429 until its window ends; a valid
// admin key from it still signs in (the API's route says why).
func (c *Console) login(w http.ResponseWriter, r *http.Request, _ *session) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	wait := c.cfg.AuthLimiter.Check(api.ClientAddr(r))
	refuse := func(status int, msg string) {
		if wait > 0 {
			c.cfg.AuthLimiter.Refusing()
			secs := api.RetryAfter(wait)
			w.Header().Set("Retry-After", strconv.Itoa(secs))
			status, msg = http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins from your address; try again in %s.", time.Duration(secs)*time.Second)
		}
		c.renderLogin(w, r, status, msg)
	}
	if err := r.ParseForm(); err != nil {
		c.renderLogin(w, r, http.StatusBadRequest, "The form could not be read.")
		return
	}
	pre, err := r.Cookie(preCookie)
	if err != nil || pre.Value == "" || subtle.ConstantTimeCompare([]byte(pre.Value), []byte(r.PostForm.Get("csrf"))) != 1 {
		c.renderLogin(w, r, http.StatusForbidden, "The sign-in form expired; try again.")
		return
	}
	key := strings.TrimSpace(r.PostForm.Get("key"))
	info, err := c.cfg.Keys.Lookup(r.Context(), key)
	switch {
	case errors.Is(err, api.ErrNoKey):
		c.signInFailed(r, signInUnknown)
		refuse(http.StatusUnauthorized, "Unknown API key.")
		return
	case err != nil:
		c.log.Error().Err(err).Msg("console sign-in: key store")
		c.renderLogin(w, r, http.StatusServiceUnavailable, "The key store cannot be read; try again.")
		return
	case !info.Admin:
		c.signInFailed(r, signInNotAdmin)
		refuse(http.StatusForbidden, "This key is not an admin key (outflow apikey create --admin).")
		return
	}
	s := c.sessions.create(key, *info)
	c.setCookie(w, r, sessionCookie, s.token, int(c.cfg.SessionTTL/time.Second))
	c.setCookie(w, r, preCookie, "", -1)
	c.log.Info().Str("key_id", info.ID).Str("tenant", info.Tenant).Str("remote", r.RemoteAddr).Msg("console sign-in")
	next := r.PostForm.Get("next")
	if !safeNext(next) {
		next = Prefix
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request, s *session) {
	c.sessions.drop(s.token)
	c.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

func urlQueryEscape(s string) string { return url.QueryEscape(s) }
