package api

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
)

// serveFrom sends a GET of path with key ("" for none; auth, when set,
// as the whole Authorization header) from the client address remote,
// straight to the handler, and returns the answer and its problem.
func (f *fixture) serveFrom(t *testing.T, remote, path, key, auth string) (*httptest.ResponseRecorder, Problem) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.RemoteAddr = remote
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	f.srv.Handler().ServeHTTP(rec, req)
	var p Problem
	_ = json.Unmarshal(rec.Body.Bytes(), &p)
	return rec, p
}

// TestAuthFailuresLimitedPerAddress: failed authentications are counted
// by reason and per client address; at AuthFailLimit in the window the
// address's further failures are answered 429 rate-limited with
// Retry-After, until the window from its first failure ends. A valid key
// is served from any address, the guesser's too: applications behind one
// NAT address share it, and one with a wrong key must not stop the rest.
func TestAuthFailuresLimitedPerAddress(t *testing.T) {
	var logs testutil.SyncBuffer
	f := newFixture(t, func(c *Config) {
		c.AuthFailLimit, c.AuthFailWindow = 3, time.Minute
		c.Logger = zerolog.New(&logs).Level(zerolog.InfoLevel)
	})
	now := time.Unix(1_000_000, 0)
	f.srv.auth.f.Now = func() time.Time { return now }
	const guesser, other = "127.0.0.2:40000", "127.0.0.1:40001"
	const path = "/v1/messages/nope" // 404 once the key is taken
	unknown := KeyPrefix + "not-a-key-at-all"

	for _, c := range []struct{ key, auth string }{{"", ""}, {"", "Basic YTpi"}, {unknown, ""}} {
		if rec, p := f.serveFrom(t, guesser, path, c.key, c.auth); rec.Code != http.StatusUnauthorized || p.Type != ProblemUnauthorized {
			t.Fatalf("failure %+v: %d %+v, want 401 unauthorized", c, rec.Code, p)
		}
	}
	if got, want := f.srv.AuthFailures(), [numAuthReasons]uint64{1, 1, 1}; got != want {
		t.Errorf("AuthFailures %v, want %v (missing, malformed, unknown)", got, want)
	}

	// The address is at its limit: its failures are 429s, its valid key
	// is served.
	now = now.Add(20 * time.Second)
	rec, p := f.serveFrom(t, guesser, path, unknown, "")
	if rec.Code != http.StatusTooManyRequests || p.Type != ProblemRateLimited || p.RetryAfter != 40 ||
		rec.Header().Get("Retry-After") != "40" || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("unknown key from an address at its limit: %d %v %+v, want 429 rate-limited, Retry-After 40", rec.Code, rec.Header(), p)
	}
	if rec, _ := f.serveFrom(t, guesser, path, "", ""); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("no key from an address at its limit: %d, want 429", rec.Code)
	}
	if rec, p := f.serveFrom(t, guesser, path, f.key, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("valid key from an address at its limit: %d %+v, want 404 (served)", rec.Code, p)
	}
	if got := f.srv.AuthFailures(); got != [numAuthReasons]uint64{2, 1, 2} {
		t.Errorf("AuthFailures %v, want the 429s counted too", got)
	}
	if got := f.srv.AuthLimiter().Refused(); got != 2 {
		t.Errorf("Refused %d, want 2 (the 429s)", got)
	}
	// Another address: its valid key is served, an IPv4-mapped spelling
	// of the guesser's address is the guesser.
	if rec, p := f.serveFrom(t, other, path, f.key, ""); rec.Code != http.StatusNotFound {
		t.Fatalf("valid key from another address: %d %+v, want 404 (served)", rec.Code, p)
	}
	if rec, _ := f.serveFrom(t, "[::ffff:127.0.0.2]:40002", path, unknown, ""); rec.Code != http.StatusTooManyRequests {
		t.Errorf("the guesser's address IPv4-mapped: %d, want 429", rec.Code)
	}

	// The window ends 1 minute after the first failure.
	now = now.Add(40 * time.Second)
	if rec, p := f.serveFrom(t, guesser, path, unknown, ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("unknown key after the window: %d %+v, want 401", rec.Code, p)
	}

	// Logged: each window's first failure and the one at the limit, with the
	// address and reason, never the key; not every failure, nor the
	// refusals.
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], `"reason":"missing","failures":1`) ||
		!strings.Contains(lines[2], `"reason":"unknown","failures":1`) || // the next window's first
		!strings.Contains(lines[1], `"reason":"unknown","failures":3`) || !strings.Contains(lines[1], `"remote":"127.0.0.2:40000"`) ||
		!strings.Contains(lines[1], `"level":"warn"`) {
		t.Errorf("log, want each window's first failure and the one at the limit:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "not-a-key") || strings.Contains(logs.String(), f.key) {
		t.Errorf("a key was logged:\n%s", logs.String())
	}
}

// TestAuthLimiterWindow: the count runs over a fixed window from the
// first failure, and a failure after it starts a new one (the table's
// bound: clientaddr's TestFailuresBounded).
func TestAuthLimiterWindow(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	l := NewAuthLimiter(2, time.Minute, func() time.Time { return now })
	a, b := netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")
	if l.Fail(a) != 1 || l.Check(a) != 0 {
		t.Fatal("one failure of two blocks")
	}
	now = now.Add(59 * time.Second)
	if l.Fail(a) != 2 || l.Check(a) != time.Second || l.Check(b) != 0 {
		t.Fatalf("second failure: Check %v, %v of another address", l.Check(a), l.Check(b))
	}
	now = now.Add(time.Second)
	if l.Check(a) != 0 || l.Fail(a) != 1 {
		t.Fatal("the window did not end a minute after the first failure")
	}
	if got := RetryAfter(1500 * time.Millisecond); got != 2 {
		t.Errorf("RetryAfter(1.5s) = %d, want 2", got)
	}
	if got := RetryAfter(time.Millisecond); got != 1 {
		t.Errorf("RetryAfter(1ms) = %d, want 1", got)
	}
}

// TestClientAddr: the client is the TCP peer, IPv4-mapped addresses
// unmapped.
func TestClientAddr(t *testing.T) {
	for remote, want := range map[string]string{
		"127.0.0.1:80":          "127.0.0.1",
		"[::1]:80":              "::1",
		"[::ffff:127.0.0.1]:80": "127.0.0.1",
		"not an address":        "invalid IP",
		"127.0.0.1":             "127.0.0.1",
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		if got := ClientAddr(r).String(); got != want {
			t.Errorf("ClientAddr(%q) = %s, want %s", remote, got, want)
		}
	}
}
