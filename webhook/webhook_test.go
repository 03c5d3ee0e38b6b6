package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// The Standard Webhooks reference vector (from the specification's
// libraries' tests).
func TestSignMatchesSpecVector(t *testing.T) {
	sig, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if err != nil {
		t.Fatal(err)
	}
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; sig != want {
		t.Fatalf("signature %s, want %s", sig, want)
	}
	now := time.Unix(1614265330, 0)
	if err := Verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", "v1,bogus "+sig, []byte(`{"test": 2432232314}`), now, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := Verify("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "msg_p5jXN8AQM9LWM0D4loKWxJek", "1614265330", sig, []byte(`{"test": 1}`), now, time.Minute); err == nil {
		t.Fatal("a changed body verified")
	}
}

func TestRetryAfterAndClassify(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{"": 0, "7": 7 * time.Second, "-1": 0, "soon": 0,
		now.Add(90 * time.Second).Format(http.TimeFormat): 90 * time.Second, now.Add(-time.Hour).Format(http.TimeFormat): 0} {
		if got := retryAfter(v, now); got != want {
			t.Errorf("retryAfter(%q) = %v, want %v", v, got, want)
		}
	}
	for _, c := range []struct {
		status int
		err    error
		want   string
	}{{200, nil, "delivered"}, {204, nil, "delivered"}, {408, nil, "transient"}, {429, nil, "transient"}, {503, nil, "transient"},
		{400, nil, "permanent"}, {404, nil, "permanent"}, {301, nil, "permanent"}, {0, errors.New("refused"), "transient"}} {
		if got := Classify(c.status, c.err); got != c.want {
			t.Errorf("Classify(%d, %v) = %s, want %s", c.status, c.err, got, c.want)
		}
	}
}

// TestLiteralPrivate: the URLs `webhook add` warns about are those the
// dialer refuses by their literal host; a public literal or a name is left
// to the dial-time check.
func TestLiteralPrivate(t *testing.T) {
	for raw, want := range map[string]bool{
		"http://127.0.0.1:8099/hooks": true, "http://[::1]/h": true, "https://10.1.2.3/h": true,
		"http://169.254.169.254/latest": true, "http://LocalHost:80/h": true, "http://app.localhost/h": true,
		"https://192.0.2.10/h": false, "https://shop.example/hooks/mail": false, "https://[2001:db8::1]/h": false,
	} {
		if got := LiteralPrivate(raw); got != want {
			t.Errorf("LiteralPrivate(%q) = %v, want %v", raw, got, want)
		}
	}
}

func TestPrivateAddressRefusedAtDial(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ts.Close()
	ep := &Endpoint{ID: "wh_x", URL: ts.URL, Secret: "whsec_" + "AAAA"}
	_, _, err := Post(context.Background(), NewClient(false, 5*time.Second), ep, "evt_1", []byte("{}"))
	var pe *ErrPrivateAddress
	if !errors.As(err, &pe) || Classify(0, err) != "permanent" {
		t.Fatalf("loopback endpoint: %v", err)
	}
	if status, _, err := Post(context.Background(), NewClient(true, 5*time.Second), ep, "evt_1", []byte("{}")); err != nil || status != 200 {
		t.Fatalf("with allow-private: %d %v", status, err)
	}
	if err := CheckURL("ftp://example.com/"); err == nil {
		t.Error("ftp URL accepted")
	}
	if err := CheckURL("https://user:pw@example.com/"); err == nil {
		t.Error("URL with credentials accepted")
	}
}

// TestPrivateThroughTranslators: an IPv6 address that carries a private
// IPv4 one to a NAT64, 6to4 or IPv4-compatible form is private too; one
// that carries a public address is not; the special-purpose ranges that
// are nobody's public endpoint are refused.
func TestPrivateThroughTranslators(t *testing.T) {
	for addr, want := range map[string]bool{
		"64:ff9b::a00:1":      true,  // 10.0.0.1
		"64:ff9b::7f00:1":     true,  // 127.0.0.1
		"64:ff9b::a9fe:a9fe":  true,  // 169.254.169.254, the metadata service
		"64:ff9b:1::a00:1":    true,  // local-use prefix
		"2002:a00:1::1":       true,  // 6to4 of 10.0.0.1
		"64:ff9b::808:808":    false, // 8.8.8.8
		"2002:808:808::1":     false,
		"2606:4700::1111":     false,
		"8.8.8.8":             false,
		"::ffff:192.168.1.10": true,
		// IPv4-compatible, site-local and the other special ranges.
		"::a00:1":         true, // ::10.0.0.1
		"::7f00:1":        true, // ::127.0.0.1
		"fec0::1":         true,
		"192.0.0.8":       true,
		"198.18.0.1":      true,
		"0.1.2.3":         true,
		"255.255.255.255": true,
		"2001:db8::1":     false, // documentation: unroutable, left to the network
	} {
		if got := private(netip.MustParseAddr(addr)); got != want {
			t.Errorf("private(%s) = %v, want %v", addr, got, want)
		}
	}
}

// receiver is a fake webhook endpoint: it answers with the next status of
// script (the last one repeats) and hands each verified delivery to got.
type receiver struct {
	t      testing.TB
	mu     sync.Mutex
	secret string
	script []func(w http.ResponseWriter)
	got    chan delivery
	seen   []string // the webhook-id of every request, as it arrives
}

type delivery struct {
	id   string
	body map[string]any
	raw  []byte
	hdr  http.Header
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	f := r.script[0]
	if len(r.script) > 1 {
		r.script = r.script[1:]
	}
	secret, got := r.secret, r.got
	r.seen = append(r.seen, req.Header.Get("webhook-id"))
	r.mu.Unlock()
	if err := Verify(secret, req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature"), body, time.Now(), 5*time.Minute); err != nil {
		r.t.Errorf("delivery does not verify: %v", err)
	}
	f(w)
	var m map[string]any
	_ = json.Unmarshal(body, &m)
	if got != nil {
		got <- delivery{req.Header.Get("webhook-id"), m, body, req.Header.Clone()}
	}
}

func status(code int, hdr ...string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(code)
	}
}

// syncBuf is the shared goroutine-safe log sink.
type syncBuf = testutil.SyncBuffer

type fixture struct {
	q     *queue.Queue
	js    jetstream.JetStream // the server seen from outside the queue
	store *Store
	logs  *syncBuf
	rc    *receiver
	ep    *Endpoint
	cfg   Config
	stop  func() // stops the running dispatcher
}

func newFixture(t testing.TB, script ...func(w http.ResponseWriter)) *fixture {
	t.Helper()
	return newFixtureWith(t, nil, script...)
}

func newFixtureWith(t testing.TB, mod func(*Config), script ...func(w http.ResponseWriter)) *fixture {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	ci := emb.InProcessInfo()
	q := testqueue.Connect(t, emb, queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store, err := Open(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{t: t, script: script, got: make(chan delivery, 16)}
	ts := httptest.NewServer(rc)
	t.Cleanup(ts.Close)
	ep, err := store.Add(ctx, "acme", ts.URL+"/hook", nil)
	if err != nil {
		t.Fatal(err)
	}
	rc.secret = ep.Secret
	logs := &syncBuf{}
	cfg := Config{Store: store, Events: q, WorkerID: "w1", AllowPrivate: true, MaxAttempts: 4,
		Backoff: backoff.Backoff{Lane: "webhook", Base: 20 * time.Millisecond, Cap: 100 * time.Millisecond, Multiplier: 2, ContentionWindow: 10 * time.Millisecond},
		Logger:  zerolog.New(logs)}
	if mod != nil {
		mod(&cfg)
	}
	f := &fixture{q: q, js: testutil.JetStream(t, emb.Server(), ci.User, ci.Password), store: store, logs: logs, rc: rc, ep: ep, cfg: cfg}
	f.start(t, nil)
	// The consumer delivers new events only; Add made it, so the events
	// published from here on reach the endpoint, whenever its runner
	// starts.
	waitUntil(t, "the endpoint's consumer", func() bool {
		_, err := f.js.Consumer(context.Background(), queue.StreamEvents, consumerName(ep.ID))
		return err == nil
	})
	return f
}

// start runs a dispatcher with f's config, changed by mod.
func (f *fixture) start(t testing.TB, mod func(*Config)) {
	t.Helper()
	cfg := f.cfg
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(rctx) }()
	var once sync.Once
	f.stop = func() { once.Do(func() { rcancel(); <-done }) }
	stop := f.stop
	t.Cleanup(stop)
}

func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, what, cond)
}

func (f *fixture) next(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-f.rc.got:
		return d
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
		return delivery{}
	}
}

func TestRetryAfterHonouredThenDelivered(t *testing.T) {
	f := newFixture(t, status(503, "Retry-After", "1"), status(200))
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "other", Dest: "x.test"}) // another tenant's
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m2", Tenant: "acme", Dest: "x.test"})
	first := f.next(t)
	again := f.next(t)
	if first.id != again.id || !strings.HasPrefix(first.id, "evt_") {
		t.Fatalf("webhook-id %q then %q: want one stable id", first.id, again.id)
	}
	data, _ := again.body["data"].(map[string]any)
	if again.body["type"] != queue.EventDelivered || data["id"] != "m2" {
		t.Fatalf("payload %v", again.body)
	}
	if !strings.Contains(f.logs.String(), `"hint_ms":1000`) || !strings.Contains(f.logs.String(), `"delay_ms":1000`) {
		t.Fatalf("the deferral did not honour Retry-After:\n%s", f.logs.String())
	}
	select {
	case d := <-f.rc.got:
		t.Fatalf("unexpected delivery %v", d)
	default:
	}
}

func TestGoneDisablesAndReplayDelivers(t *testing.T) {
	f := newFixture(t, status(410), status(200))
	f.q.Event(queue.EventBounced, &queue.Event{ID: "m1", Tenant: "acme"})
	gone := f.next(t)
	ctx := context.Background()
	waitUntil(t, "the endpoint disabled and its event in dead letters", func() bool {
		ep, _, err := f.store.Get(ctx, f.ep.ID)
		dead, _ := f.store.Dead(ctx, f.ep.ID)
		return err == nil && ep.Disabled && len(dead) == 1
	})
	// Events while disabled wait in the consumer.
	f.q.Event(queue.EventBounced, &queue.Event{ID: "m2", Tenant: "acme"})
	if n, err := f.store.Replay(ctx, f.ep.ID); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	// The dead letter is back in the stream: the bucket is empty at once.
	if dead, err := f.store.Dead(ctx, f.ep.ID); err != nil || len(dead) != 0 {
		t.Fatalf("dead letters after the replay: %+v, %v", dead, err)
	}
	got := map[string]string{}
	for range 2 {
		d := f.next(t)
		data, _ := d.body["data"].(map[string]any)
		got[d.id], _ = data["id"].(string)
	}
	if got[gone.id] != "m1" || len(got) != 2 || !slices.Contains(slices.Collect(maps.Values(got)), "m2") {
		t.Fatalf("after the replay got %v, want the dead letter %s (m1) and m2", got, gone.id)
	}
}

// A replay needs NATS, not a daemon: with no dispatcher running, the dead
// letters move into the endpoint's consumer, and the next dispatcher to
// start delivers them with their webhook-ids.
func TestReplayWhileNoDispatcherRuns(t *testing.T) {
	f := newFixture(t, status(400), status(200))
	f.q.Event(queue.EventBounced, &queue.Event{ID: "m1", Tenant: "acme"})
	refused := f.next(t)
	ctx := context.Background()
	waitUntil(t, "the refused event in dead letters", func() bool {
		dead, _ := f.store.Dead(ctx, f.ep.ID)
		return len(dead) == 1
	})
	f.stop()
	if n, err := f.store.Replay(ctx, f.ep.ID); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	f.start(t, nil)
	again := f.next(t)
	if again.id != refused.id || again.body["type"] != queue.EventBounced {
		t.Fatalf("after the restart got %s %v, want the dead letter %s", again.id, again.body, refused.id)
	}
}

// Dead letters expire: the bucket's TTL is the retention asked for.
func TestDeadLettersExpire(t *testing.T) {
	f := newFixture(t, status(200))
	ctx := context.Background()
	for _, c := range []struct {
		ask, want time.Duration
	}{{0, DefaultDeadMaxAge}, {36 * time.Hour, 36 * time.Hour}} {
		if _, err := OpenRetention(ctx, f.q, c.ask); err != nil {
			t.Fatal(err)
		}
		kv, err := f.js.KeyValue(ctx, BucketDead)
		if err != nil {
			t.Fatal(err)
		}
		st, err := kv.Status(ctx)
		if err != nil || st.TTL() != c.want {
			t.Fatalf("dead-letter TTL %v (%v), want %v", st.TTL(), err, c.want)
		}
	}
}

func TestBudgetSpentGoesToDeadLetters(t *testing.T) {
	f := newFixture(t, status(500))
	f.q.Event(queue.EventDeferred, &queue.Event{ID: "m1", Tenant: "acme"})
	for range 4 {
		f.next(t)
	}
	ctx := context.Background()
	waitUntil(t, "the dead letter", func() bool {
		dead, err := f.store.Dead(ctx, f.ep.ID)
		return err == nil && len(dead) == 1 && strings.Contains(dead[0].Reason, "4 attempts")
	})
}

// A hanging endpoint holds only its own consumer: another endpoint (of
// another tenant) gets its events meanwhile.
func TestSlowEndpointDelaysNoOther(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	f := newFixture(t, func(w http.ResponseWriter) { <-release })
	ctx := context.Background()
	rc2 := &receiver{t: t, script: []func(http.ResponseWriter){status(204)}, got: make(chan delivery, 4)}
	ts2 := httptest.NewServer(rc2)
	defer ts2.Close()
	ep2, err := f.store.Add(ctx, "beta", ts2.URL, []string{queue.EventDelivered})
	if err != nil {
		t.Fatal(err)
	}
	rc2.mu.Lock()
	rc2.secret = ep2.Secret
	rc2.mu.Unlock()
	waitUntil(t, "the second endpoint's consumer", func() bool {
		_, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep2.ID))
		return err == nil
	})
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "slow1", Tenant: "acme"})
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "fast1", Tenant: "beta"})
	select {
	case d := <-rc2.got:
		if data, _ := d.body["data"].(map[string]any); data["id"] != "fast1" {
			t.Fatalf("second endpoint got %v", d.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second endpoint waited for the hanging one")
	}
}

// Without AllowPrivate a loopback endpoint is refused at dial time: its
// event goes straight to the dead letters, never retried.
func TestPrivateEndpointEventIsDeadLettered(t *testing.T) {
	f := newFixture(t, status(200))
	ctx := context.Background()
	d, err := New(Config{Store: f.store, Events: f.q, WorkerID: "w2", Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	if d.br, err = watchBreakers(t.Context(), f.store.breakers, func(error) {}); err != nil {
		t.Fatal(err)
	}
	ep := &Endpoint{ID: f.ep.ID, Tenant: "acme", URL: f.ep.URL, Secret: f.ep.Secret}
	var unburied *burial
	if o := d.handle(ctx, zerolog.Nop(), ep, &unburied, 9, "evt_9", "delivered", []byte(`{}`), nil); !o.finished {
		t.Fatal("the refused event is reported unfinished")
	}
	dead, err := f.store.Dead(ctx, ep.ID)
	if err != nil || len(dead) != 1 || dead[0].ID != "evt_9" || !strings.Contains(dead[0].Reason, "loopback, private or link-local") {
		t.Fatalf("dead letters %+v, %v", dead, err)
	}
	select {
	case got := <-f.rc.got:
		t.Fatalf("the receiver was reached: %v", got)
	default:
	}
}

// whileUp is an endpoint that answers 200 while up is set and 500 while
// it is not.
func whileUp(up *atomic.Bool) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		if up.Load() {
			w.WriteHeader(200)
		} else {
			w.WriteHeader(500)
		}
	}
}

// After BreakerAfter events in a row spent their budget, the next event is
// held and retried until the endpoint recovers, not dead-lettered.
func TestBreakerHoldsEventsWhileEndpointIsDown(t *testing.T) {
	var up atomic.Bool
	f := newFixtureWith(t, func(c *Config) { c.MaxAttempts, c.BreakerAfter = 2, 2 }, whileUp(&up))
	ctx := context.Background()
	for _, id := range []string{"e1", "e2", "e3"} {
		f.q.Event(queue.EventDelivered, &queue.Event{ID: id, Tenant: "acme"})
	}
	for range 4 { // e1 and e2: two attempts each, then dead letters
		f.next(t)
	}
	waitUntil(t, "the breaker to open", func() bool { return strings.Contains(f.logs.String(), "webhook breaker open") })
	// e3 is now retried past its budget of 2 instead of going dead.
	for range 3 {
		if d := f.next(t); d.body["data"].(map[string]any)["id"] != "e3" {
			t.Fatalf("while open: %v\n%s", d.body, f.logs.String())
		}
	}
	up.Store(true)
	waitUntil(t, "the breaker to close", func() bool { return strings.Contains(f.logs.String(), "webhook breaker closed") })
	dead, err := f.store.Dead(ctx, f.ep.ID)
	if err != nil || len(dead) != 2 {
		t.Fatalf("dead letters %+v, %v: want e1 and e2 only", dead, err)
	}
	if s, err := f.store.Breaker(ctx, f.ep.ID); err != nil || s != (BreakerState{}) {
		t.Fatalf("breaker after the recovery: %+v, %v", s, err)
	}
}

// The breaker is in the bucket, not in a runner: a dispatcher started
// after the one that opened it (a restart, or another daemon of the
// fleet) holds the endpoint's events too, and its 2xx closes it for all.
func TestBreakerOutlivesTheDispatcher(t *testing.T) {
	var up atomic.Bool
	f := newFixtureWith(t, func(c *Config) { c.MaxAttempts, c.BreakerAfter = 2, 1 }, whileUp(&up))
	ctx := context.Background()
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "e1", Tenant: "acme"})
	f.next(t)
	f.next(t)
	waitUntil(t, "the breaker open in the bucket", func() bool {
		s, err := f.store.Breaker(ctx, f.ep.ID)
		return err == nil && s.Open && s.Spent == 1 && s.Worker == "w1"
	})
	f.stop()
	f.start(t, func(c *Config) { c.WorkerID = "w2" })
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "e2", Tenant: "acme"})
	// e2 is retried past its budget of 2: w2 read the open breaker.
	for range 3 {
		if d := f.next(t); d.body["data"].(map[string]any)["id"] != "e2" {
			t.Fatalf("while open: %v\n%s", d.body, f.logs.String())
		}
	}
	if dead, _ := f.store.Dead(ctx, f.ep.ID); len(dead) != 1 {
		t.Fatalf("dead letters %+v: want e1 only", dead)
	}
	up.Store(true)
	waitUntil(t, "the breaker closed in the bucket", func() bool {
		s, err := f.store.Breaker(ctx, f.ep.ID)
		return err == nil && s == (BreakerState{})
	})
}

// BenchmarkDelivery: events delivered per second to one local endpoint
// (one event in flight per endpoint, signed, over a kept-alive connection).
func BenchmarkDelivery(b *testing.B) {
	var n atomic.Int64
	f := newFixture(b, func(w http.ResponseWriter) { n.Add(1); w.WriteHeader(http.StatusNoContent) })
	f.rc.mu.Lock()
	f.rc.got = nil // count only
	f.rc.mu.Unlock()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		f.q.Event(queue.EventDelivered, &queue.Event{ID: "b" + strconv.Itoa(i), Tenant: "acme"})
	}
	waitUntil(b, "every event delivered", func() bool { return n.Load() >= int64(b.N) })
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

// BenchmarkSign: the per-delivery signing cost (HMAC-SHA256 of a typical
// 600-byte event, secret decoded each time as Post does).
func BenchmarkSign(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 600)
	ts := time.Unix(1614265330, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Sign("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "evt_123456", ts, body); err != nil {
			b.Fatal(err)
		}
	}
}

// A dispatcher stopped while its endpoint holds a delivery gives the event
// back to the stream: the one started next delivers it at once, not after
// the consumer's ack wait (a minute), which is longer than this test waits.
func TestStoppedDispatcherGivesTheEventBack(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	f := newFixtureWith(t, nil, func(w http.ResponseWriter) {
		if first.CompareAndSwap(false, true) {
			close(entered)
			<-release // the endpoint hangs on the first delivery
		}
		w.WriteHeader(200)
	})
	t.Cleanup(func() { close(release) }) // before the fixture's server closes, which waits for its handlers
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "e1", Tenant: "acme"})
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no delivery within 30s")
	}
	f.stop() // while the endpoint holds e1
	f.start(t, func(c *Config) { c.WorkerID = "w2" })
	select {
	case d := <-f.rc.got:
		if d.body["data"].(map[string]any)["id"] != "e1" {
			t.Fatalf("delivered %v, want e1 again", d.body)
		}
		// Redelivered by the stream to another dispatcher: the same
		// webhook-id, so the receiver can tell it is the same event.
		f.rc.mu.Lock()
		first := f.rc.seen[0]
		f.rc.mu.Unlock()
		if d.id != first {
			t.Fatalf("webhook-id %q on redelivery, %q the first time: want one id", d.id, first)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("e1 not delivered again within 20s: the stopped dispatcher kept it until the ack wait")
	}
}

// An event that ends in the dead letters (its budget spent, or refused)
// is finished: deliver says so, and a runner stopped right after it acks
// it rather than handing it to its successor, which would post it again.
// (TestBreakerOutlivesTheDispatcher caught the stop landing there.)
func TestDeadLetteredEventIsFinished(t *testing.T) {
	f := newFixtureWith(t, func(c *Config) { c.MaxAttempts = 1 }, status(500), status(403))
	f.stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d, err := New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d.br, err = watchBreakers(ctx, f.store.breakers, func(error) {}); err != nil {
		t.Fatal(err)
	}
	for i, id := range []string{"evt_spent", "evt_refused"} {
		var unburied *burial
		if o := d.handle(ctx, zerolog.Nop(), f.ep, &unburied, uint64(i+1), id, queue.EventDelivered, []byte(`{}`), nil); !o.finished {
			t.Fatalf("%s: a dead-lettered event is reported unfinished", id)
		}
	}
	if dead, err := f.store.Dead(ctx, f.ep.ID); err != nil || len(dead) != 2 {
		t.Fatalf("dead letters %+v, %v", dead, err)
	}
	// Stopped: only an event deliver gave up on goes back, at once; an
	// event whose dead letter is not stored goes back later, unless the
	// runner is stopping, and is never acknowledged.
	stopped, stop := context.WithCancel(ctx)
	stop()
	for _, c := range []struct {
		ctx  context.Context
		o    outcome
		want string
	}{{stopped, outcome{finished: true}, "ack"}, {stopped, outcome{}, "nak"},
		{ctx, outcome{again: time.Second}, "nak 1s"}, {stopped, outcome{again: time.Second}, "nak"}} {
		m := &settled{}
		settle(c.ctx, m, c.o)
		if m.did != c.want {
			t.Fatalf("settle(stopped=%v, %+v) did %q, want %q", c.ctx.Err() != nil, c.o, m.did, c.want)
		}
	}
}

// settled is a jetstream.Msg that records whether it was acked or nacked.
type settled struct {
	jetstream.Msg
	did string
}

func (m *settled) Ack() error                         { m.did = "ack"; return nil }
func (m *settled) Nak() error                         { m.did = "nak"; return nil }
func (m *settled) NakWithDelay(d time.Duration) error { m.did = "nak " + d.String(); return nil }

// TestEventTypeNamedTwice: an endpoint that names an event type twice
// (`webhook add --events delivered,delivered`) still gets its events. Add
// stores each type once; and the dispatcher gives the consumer each filter
// once for an endpoint stored with a repeat, since JetStream refuses
// overlapping filter subjects and the endpoint would hear nothing.
func TestEventTypeNamedTwice(t *testing.T) {
	f := newFixture(t, status(200))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ep, err := f.store.Add(ctx, "acme", "https://hooks.example/x", []string{"delivered", "delivered", " bounced", ""})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{queue.EventDelivered, queue.EventBounced}; !slices.Equal(ep.Events, want) {
		t.Fatalf("stored events %q, want %q", ep.Events, want)
	}
	if _, err := f.store.Add(ctx, "acme", "https://hooks.example/x", []string{"deliverd"}); err == nil || !strings.Contains(err.Error(), queue.EventQueued) {
		t.Fatalf("unknown event: %v, want an error listing every type, queued included", err)
	}
	// Named nothing, an endpoint gets the default set, complaints
	// received at the return path among them.
	if def, err := f.store.Add(ctx, "acme", "https://hooks.example/y", nil); err != nil || !slices.Contains(def.Events, queue.EventComplained) || !slices.Contains(def.Events, queue.EventUnsubscribed) {
		t.Fatalf("default events %v (%v), want complained among them", def.Events, err)
	}
	if err := f.store.Remove(ctx, ep.ID); err != nil {
		t.Fatal(err)
	}

	// An endpoint stored with a repeat, as Add once allowed.
	if err := f.store.update(ctx, f.ep.ID, func(ep *Endpoint) { ep.Events = []string{queue.EventDelivered, queue.EventDelivered} }); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the consumer to follow the changed endpoint", func() bool {
		c, err := f.js.Consumer(context.Background(), queue.StreamEvents, consumerName(f.ep.ID))
		// webhook-test and delivered, each in both layouts (queue's
		// EventTenantFilters), and replays
		return err == nil && len(c.CachedInfo().Config.FilterSubjects) == 5
	})
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "acme", Dest: "x.test"})
	if d := f.next(t); d.body["type"] != queue.EventDelivered {
		t.Fatalf("delivery %v", d.body)
	}
}

// TestDroppedReachesADefaultEndpoint: a message cancelled through the API
// or dropped by an operator ends in a dropped event, which an endpoint of
// the default set receives; before, it could not even ask for it, and an
// application following its mail by webhooks waited for ever on it. The
// other events of a tenant's mail can be asked for.
func TestDroppedReachesADefaultEndpoint(t *testing.T) {
	f := newFixture(t, status(200))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f.q.Event(queue.EventDropped, &queue.Event{ID: "m1", Tenant: "acme", Dest: "x.test", Worker: "api", Recipients: []string{"r@x.test"}})
	d := f.next(t)
	if data, _ := d.body["data"].(map[string]any); d.body["type"] != queue.EventDropped || data["id"] != "m1" {
		t.Fatalf("delivery %v, want the dropped event", d.body)
	}
	for _, typ := range []string{queue.EventHeld, queue.EventReplayed, queue.EventFastFwd, queue.EventReleased, queue.EventDSN} {
		if _, err := f.store.Add(ctx, "acme", "https://hooks.example/"+typ, []string{typ}); err != nil {
			t.Errorf("an endpoint for %s: %v", typ, err)
		}
	}
	for _, typ := range []string{queue.EventMalformed, queue.EventLearned} {
		if _, err := f.store.Add(ctx, "acme", "https://hooks.example/"+typ, []string{typ}); err == nil {
			t.Errorf("an endpoint for %s, which belongs to no tenant: accepted", typ)
		}
	}
}

// TestLostConsumerIsMadeAgain: when an endpoint's consumer goes away
// under a running dispatcher (deleted by hand, its stream recreated), the
// runner makes it again and the endpoint's next events arrive; it does
// not stay listed as enabled and hear nothing until a restart.
func TestLostConsumerIsMadeAgain(t *testing.T) {
	f := newFixture(t, status(200))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The runner consuming first: Add made the consumer, and a runner that
	// starts after the delete only makes it, with nothing lost to report.
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m0", Tenant: "acme", Dest: "x.test"})
	if d := f.next(t); d.body["type"] != queue.EventDelivered {
		t.Fatalf("delivery %v", d.body)
	}
	if err := f.js.DeleteConsumer(ctx, queue.StreamEvents, consumerName(f.ep.ID)); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the endpoint's consumer made again", func() bool {
		_, err := f.js.Consumer(context.Background(), queue.StreamEvents, consumerName(f.ep.ID))
		return err == nil
	})
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "acme", Dest: "x.test"})
	if d := f.next(t); d.body["type"] != queue.EventDelivered {
		t.Fatalf("delivery %v", d.body)
	}
	if !strings.Contains(f.logs.String(), "webhook consumer failed; making it again") {
		t.Fatalf("no log line for the lost consumer:\n%s", f.logs.String())
	}
}

// TestWebhookIDAfterStreamMadeAgain: the events stream deleted and
// created again starts its sequences over at 1; an event stored there at
// the sequence of one delivered before still gets a webhook-id of its own,
// not that one's, which a receiver that remembers ids would take for a
// repeat and drop.
func TestWebhookIDAfterStreamMadeAgain(t *testing.T) {
	f := newFixture(t, status(200))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "acme", Dest: "x.test"})
	before := f.next(t)
	seq := func(id string) uint64 {
		t.Helper()
		parts := strings.Split(id, "_")
		n, err := strconv.ParseUint(parts[min(1, len(parts)-1)], 10, 64)
		if len(parts) < 2 || parts[0] != "evt" || err != nil {
			t.Fatalf("webhook-id %q: want evt_<sequence>...", id)
		}
		return n
	}

	s, err := f.js.Stream(ctx, queue.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := f.js.DeleteStream(ctx, queue.StreamEvents); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the endpoint's consumer made again on the new stream", func() bool {
		_, err := f.js.Consumer(context.Background(), queue.StreamEvents, consumerName(f.ep.ID))
		return err == nil
	})
	// Another tenant's events, which the endpoint does not get, bring the
	// new stream up to the sequence m1 had.
	for range seq(before.id) - 1 {
		if err := f.q.PublishEvent(ctx, queue.EventDelivered, &queue.Event{ID: "filler", Tenant: "other", Dest: "x.test"}); err != nil {
			t.Fatal(err)
		}
	}
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m2", Tenant: "acme", Dest: "x.test"})
	after := f.next(t)
	if data, _ := after.body["data"].(map[string]any); data["id"] != "m2" {
		t.Fatalf("delivered %v, want m2", after.body)
	}
	if seq(after.id) != seq(before.id) {
		t.Fatalf("m2 stored at %s, m1 at %s: want the same sequence, as the test means to check", after.id, before.id)
	}
	if after.id == before.id {
		t.Fatalf("m2 has the webhook-id of m1, %q, delivered before the stream was made again", after.id)
	}
}

// TestListedEndpointHasNoSecretKey: an endpoint shown without its secret
// (`webhook list --json`) has no "secret" key at all, rather than an empty
// one a client could take for the secret.
func TestListedEndpointHasNoSecretKey(t *testing.T) {
	b, err := json.Marshal(Endpoint{ID: "wh_1", Tenant: "acme", URL: "https://hooks.example/", Events: DefaultEvents})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"secret"`) {
		t.Fatalf("%s: want no secret key", b)
	}
	b, _ = json.Marshal(Endpoint{ID: "wh_1", Secret: "whsec_AAAA"})
	if !strings.Contains(string(b), `"secret":"whsec_AAAA"`) {
		t.Fatalf("%s: the secret of a new endpoint is missing", b)
	}
}

// TestSlowEndpointInAFleet: two daemons pull one endpoint's consumer and
// the endpoint takes longer than the ack wait to answer. The event stays
// with the daemon that has it (InProgress through the POST), so the
// endpoint sees it once, never two POSTs at a time.
func TestSlowEndpointInAFleet(t *testing.T) {
	f := newFixtureWith(t, func(c *Config) { c.ackWait, c.Timeout = time.Second, 10*time.Second }, status(200))
	ctx := context.Background()
	var mu sync.Mutex
	posts, inflight, most, done := 0, 0, 0, 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		posts++
		inflight++
		most = max(most, inflight)
		mu.Unlock()
		time.Sleep(2500 * time.Millisecond) // the endpoint is slow: over two ack waits
		mu.Lock()
		inflight--
		done++
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer ts.Close()
	f.stop()
	ep, err := f.store.Add(ctx, "acme", ts.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.store.Remove(ctx, f.ep.ID); err != nil {
		t.Fatal(err)
	}
	f.start(t, func(c *Config) { c.WorkerID = "daemon-a" })
	f.start(t, func(c *Config) { c.WorkerID = "daemon-b" })
	waitUntil(t, "the consumer", func() bool {
		_, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep.ID))
		return err == nil
	})
	f.q.Event(queue.EventDelivered, &queue.Event{ID: "m1", Tenant: "acme"})
	waitUntil(t, "the event acknowledged", func() bool {
		c, err := f.js.Consumer(ctx, queue.StreamEvents, consumerName(ep.ID))
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		mu.Lock()
		defer mu.Unlock()
		return err == nil && done >= 1 && inflight == 0 && info.NumAckPending == 0 && info.NumPending == 0
	})
	mu.Lock()
	defer mu.Unlock()
	if posts != 1 || most != 1 {
		t.Fatalf("%d POSTs of one event, %d at once; want 1", posts, most)
	}
}

// TestReplayLeavesAnEnabledEndpointAlone: replaying an enabled endpoint's
// dead letters does not write the endpoint: the dispatcher restarts an
// endpoint's runner at every change to it, and a restart during the first
// replayed event's delivery sent that event twice.
func TestReplayLeavesAnEnabledEndpointAlone(t *testing.T) {
	f := newFixture(t, status(400), status(200))
	f.q.Event(queue.EventBounced, &queue.Event{ID: "m1", Tenant: "acme"})
	first := f.next(t)
	ctx := context.Background()
	waitUntil(t, "the event in dead letters", func() bool {
		dead, _ := f.store.Dead(ctx, f.ep.ID)
		return len(dead) == 1
	})
	_, before, err := f.store.Get(ctx, f.ep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.store.Replay(ctx, f.ep.ID); err != nil || n != 1 {
		t.Fatalf("replay: %d, %v", n, err)
	}
	if _, after, err := f.store.Get(ctx, f.ep.ID); err != nil || after != before {
		t.Errorf("the replay wrote the endpoint (revision %d to %d, %v): its runner restarts", before, after, err)
	}
	if d := f.next(t); d.id != first.id {
		t.Errorf("replayed %s, want %s", d.id, first.id)
	}
}

// An operator's action reaches the tenant's webhook as done by "admin",
// not by the person and machine its event names (admin:USER@HOST, for the
// operator's own views); every other field is the event's.
func TestOperatorNotNamedToTheTenant(t *testing.T) {
	f := newFixture(t, status(200), status(200))
	f.q.Event(queue.EventDropped, &queue.Event{ID: "m1", Tenant: "acme", Dest: "x.test", Worker: "admin:bob@ops-1",
		Reason: "was deferred after 1 attempt(s)", Recipients: []string{"ann@x.test"}})
	f.q.Event(queue.EventDropped, &queue.Event{ID: "m2", Tenant: "acme", Dest: "x.test", Worker: "api"})
	for _, want := range []struct{ id, worker string }{{"m1", "admin"}, {"m2", "api"}} {
		d := f.next(t)
		data, _ := d.body["data"].(map[string]any)
		if data["id"] != want.id || data["worker_id"] != want.worker {
			t.Fatalf("payload %v: want id %s by %q", d.body, want.id, want.worker)
		}
		if want.id == "m1" && (data["reason"] != "was deferred after 1 attempt(s)" || data["tenant"] != "acme" || data["dest"] != "x.test") {
			t.Fatalf("the operator's event lost its fields: %v", data)
		}
	}
}
