package webhook

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/queue"
)

// closedURL is an http URL on 127.0.0.1 where nothing listens, with rest
// (path and query) appended.
func closedURL(t *testing.T, rest string) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr + rest
}

// TestURLTokenNeverLogged: a webhook URL may carry its credential in the
// query (?token=, Azure's sig=) or the path (Slack's
// /services/T…/B…/<secret>), which CheckURL accepts. A failed POST's
// error must not carry the URL into the log line nor into the dead
// letter's reason (which `webhook list`, the dead-letter listing and the
// API show).
func TestURLTokenNeverLogged(t *testing.T) {
	const querySecret, pathSecret = "QueryTok-Secret2", "PathSecret-9fQ"
	f := newFixtureWith(t, func(c *Config) { c.MaxAttempts = 2 }, status(200))
	f.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncBuf
	cfg := f.cfg
	cfg.Logger = zerolog.New(&logs)
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.br, err = watchBreakers(ctx, f.store.breakers, func(error) {}); err != nil {
		t.Fatal(err)
	}
	ep := &Endpoint{ID: f.ep.ID, Tenant: "acme", Secret: f.ep.Secret,
		URL: closedURL(t, "/services/T0/B0/"+pathSecret+"?token="+querySecret+"&x=1")}
	if err := CheckURL(ep.URL); err != nil {
		t.Fatalf("CheckURL refuses %s: %v", ep.URL, err)
	}
	var unburied *burial
	if o := d.handle(ctx, d.log.With().Str("endpoint", ep.ID).Logger(), ep, &unburied, 1, "evt_1", queue.EventDelivered, []byte(`{}`), nil); !o.finished {
		t.Fatal("the event is not finished")
	}
	dead, err := f.store.Dead(ctx, ep.ID)
	if err != nil || len(dead) != 1 {
		t.Fatalf("dead letters %+v, %v", dead, err)
	}
	reason := dead[0].Reason
	log := logs.String()
	for what, text := range map[string]string{"log": log, "dead letter reason": reason} {
		for _, secret := range []string{querySecret, pathSecret, "token="} {
			if strings.Contains(text, secret) {
				t.Errorf("%q is in the %s:\n%s", secret, what, text)
			}
		}
	}
	// What is kept still says what went wrong, and where.
	host := strings.TrimPrefix(ep.URL, "http://")
	host = host[:strings.IndexByte(host, '/')]
	if !strings.Contains(reason, "connection refused") || !strings.Contains(reason, host) {
		t.Errorf("dead letter reason %q: want the dial error and the host %s", reason, host)
	}
	if !strings.Contains(log, `"webhook deferred"`) || !strings.Contains(log, "connection refused") {
		t.Errorf("no deferral with its error in the log:\n%s", log)
	}
}

// TestRedactURLKeepsTheCause: the redacted error still unwraps to the
// dial error (Classify finds ErrPrivateAddress through it).
func TestRedactURLKeepsTheCause(t *testing.T) {
	pe := &ErrPrivateAddress{}
	err := redactURL(&url.Error{Op: "Post", URL: "https://h.example/p?sig=S3cr3t", Err: pe})
	var got *ErrPrivateAddress
	if !errors.As(err, &got) || Classify(0, err) != "permanent" {
		t.Fatalf("%v: the private address is lost", err)
	}
	if s := err.Error(); strings.Contains(s, "S3cr3t") || !strings.Contains(s, `Post "https://h.example/…"`) {
		t.Fatalf("redacted error %q", s)
	}
}

// lineWriter keeps what is logged and calls on for each line that
// contains what.
type lineWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	what  []byte
	on    func()
	count int
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if bytes.Contains(p, w.what) {
		w.count++
		if w.on != nil {
			w.on()
		}
	}
	return w.buf.Write(p)
}

func (w *lineWriter) lines(t *testing.T, msg string) []map[string]any {
	t.Helper()
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(w.buf.Bytes()))
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("log line %q: %v", sc.Text(), err)
		}
		if m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// replayDeferral recomputes a "webhook deferred" line's delay from the
// line alone: its parameters, seed, worker and attempt.
func replayDeferral(t *testing.T, l map[string]any) (backoff.Backoff, backoff.Decision) {
	t.Helper()
	ms := func(k string) time.Duration {
		v, ok := l[k].(float64)
		if !ok {
			t.Fatalf("the deferral line has no %s: %v", k, l)
		}
		return time.Duration(v) * time.Millisecond
	}
	mult, ok := l["multiplier"].(float64)
	if !ok {
		t.Fatalf("the deferral line has no multiplier: %v", l)
	}
	worker, _ := l["worker_id"].(string)
	seedS, _ := l["jitter_seed"].(string)
	seed, err := backoff.ParseSeed(seedS)
	if err != nil {
		t.Fatalf("jitter_seed %q: %v", seedS, err)
	}
	attempt, ok := l["backoff_attempt"].(float64)
	if !ok {
		t.Fatalf("the deferral line has no backoff_attempt: %v", l)
	}
	b := backoff.Backoff{Lane: l["lane"].(string), Base: ms("base_ms"), Min: ms("min_ms"), Cap: ms("cap_ms"),
		Multiplier: mult, ContentionWindow: ms("window_ms")}
	return b, b.Decide(int(attempt), worker, seed, ms("hint_ms"))
}

// TestWebhookDeferralReplays: a "webhook deferred" line carries every
// input of its decision, as mail's "backoff decision" lines do, so that
// the delay can be computed again from the line alone (`outflow schedule
// --lane webhook`, which takes webhook.DefaultBackoff's parameters).
func TestWebhookDeferralReplays(t *testing.T) {
	t.Run("custom backoff", func(t *testing.T) {
		custom := backoff.Backoff{Lane: "webhook", Base: 7 * time.Millisecond, Min: 3 * time.Millisecond, Cap: 90 * time.Millisecond,
			Multiplier: 1.7, ContentionWindow: 13 * time.Millisecond}
		f := newFixtureWith(t, func(c *Config) { c.MaxAttempts = 6; c.Backoff = custom }, status(500))
		f.stop()
		w := &lineWriter{what: []byte(`"webhook deferred"`)}
		cfg := f.cfg
		cfg.WorkerID = "host-b/2"
		cfg.Logger = zerolog.New(w).With().Str("worker_id", cfg.WorkerID).Logger() // as serve's logger
		d, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d.br, err = watchBreakers(t.Context(), f.store.breakers, func(error) {}); err != nil {
			t.Fatal(err)
		}
		var unburied *burial
		d.handle(t.Context(), d.log, f.ep, &unburied, 1, "evt_1", queue.EventDelivered, []byte(`{}`), nil)
		lines := w.lines(t, "webhook deferred")
		if len(lines) != 5 {
			t.Fatalf("%d deferral lines, want 5", len(lines))
		}
		for _, l := range lines {
			b, dec := replayDeferral(t, l)
			if b != custom {
				t.Errorf("parameters %+v from the line, want %+v", b, custom)
			}
			if got := l["delay_ms"].(float64); int64(got) != dec.DelayMs || l["attempt"] != l["backoff_attempt"] {
				t.Errorf("line %v: replayed delay_ms %d, logged %v", l, dec.DelayMs, got)
			}
		}
	})
	// The daemon's schedule (Config.Backoff left zero) is DefaultBackoff,
	// the lane `outflow schedule --lane webhook` fills in; a Retry-After
	// is logged as hint_ms and replayed with --hint. The dispatcher is
	// stopped by its first deferral line, not waited out.
	t.Run("default backoff", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		defer srv.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w := &lineWriter{what: []byte(`"webhook deferred"`), on: cancel}
		d := &Dispatcher{cfg: Config{WorkerID: "host-a/0", Backoff: DefaultBackoff(), MaxAttempts: DefaultMaxAttempts, ackWait: time.Minute},
			client: NewClient(true, 5*time.Second)}
		log := zerolog.New(w).With().Str("worker_id", d.cfg.WorkerID).Logger()
		ep := &Endpoint{ID: "wh_1", Tenant: "acme", URL: srv.URL + "/hook", Secret: SecretPrefix + "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0"}
		if taken, b := d.deliver(ctx, log, ep, "evt_1", queue.EventDelivered, []byte(`{}`), nil); taken || b != nil {
			t.Fatalf("deliver: taken %v, burial %+v", taken, b)
		}
		lines := w.lines(t, "webhook deferred")
		if len(lines) != 1 {
			t.Fatalf("%d deferral lines, want 1", len(lines))
		}
		b, dec := replayDeferral(t, lines[0])
		if b != DefaultBackoff() {
			t.Errorf("parameters %+v from the line, want DefaultBackoff %+v", b, DefaultBackoff())
		}
		seed, _ := backoff.ParseSeed(lines[0]["jitter_seed"].(string))
		again := DefaultBackoff().Decide(1, "host-a/0", seed, 2*time.Second)
		logged := int64(lines[0]["delay_ms"].(float64))
		if dec.DelayMs != logged || again.DelayMs != logged || lines[0]["hint_ms"] != float64(2000) {
			t.Errorf("logged delay_ms %d; replayed from the line %d, from the defaults %d (%v)", logged, dec.DelayMs, again.DelayMs, lines[0])
		}
	})
}
