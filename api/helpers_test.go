package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// startQueue starts an embedded JetStream in a temp dir and connects to it.
func startQueue(t testing.TB) *queue.Queue {
	t.Helper()
	q, _ := startQueueJS(t)
	return q
}

// startQueueJS is startQueue, with a JetStream client of the same server
// for looking at its streams from outside the queue.
func startQueueJS(t testing.TB) (*queue.Queue, jetstream.JetStream) {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q := testqueue.Connect(t, emb, queue.Options{})
	ci := emb.InProcessInfo()
	return q, testutil.JetStream(t, emb.Server(), ci.User, ci.Password)
}

// failingQueue is a queue whose Enqueue fails while fail is set, as the
// daemon's does while the embedded JetStream is down.
type failingQueue struct {
	*queue.Queue
	fail  atomic.Bool
	calls atomic.Int32
}

func (f *failingQueue) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	f.calls.Add(1)
	if f.fail.Load() {
		return nil, errors.New("jetstream unavailable")
	}
	return f.Queue.Enqueue(ctx, s)
}

// fixture is an API server on a fresh queue, with one key for tenant "acme".
type fixture struct {
	q   *queue.Queue
	js  jetstream.JetStream
	fq  *failingQueue
	srv *Server
	ts  *httptest.Server
	key string
}

func newFixture(t testing.TB, mod func(*Config)) *fixture {
	t.Helper()
	q, js := startQueueJS(t)
	fq := &failingQueue{Queue: q}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sup, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Queue: fq, Buckets: q, Suppressions: sup, Hostname: "mta.test", Logger: zerolog.Nop()}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	key, _, err := srv.Keys().Create(ctx, "acme", false)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return &fixture{q: q, js: js, fq: fq, srv: srv, ts: ts, key: key}
}

// response is one answer, its JSON body decoded into a map.
type response struct {
	status int
	header http.Header
	raw    []byte
	json   map[string]any
}

// do sends a request with key as its Bearer token ("" for none) and body
// as JSON (a string or []byte is sent as is).
func (f *fixture) do(t testing.TB, method, path, key string, body any, hdr map[string]string) response {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		enc, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(enc)
	}
	req, err := http.NewRequest(method, f.ts.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := response{status: res.StatusCode, header: res.Header, raw: raw}
	_ = json.Unmarshal(raw, &r.json)
	return r
}

// ids returns the "ids" of a 202.
func (r response) ids(t testing.TB) []string {
	t.Helper()
	if r.status != http.StatusAccepted {
		t.Fatalf("status %d, want 202: %s", r.status, r.raw)
	}
	var a Accepted
	if err := json.Unmarshal(r.raw, &a); err != nil {
		t.Fatal(err)
	}
	return a.IDs
}

// queued lists the envelopes waiting in the work lane.
func queued(t testing.TB, q *queue.Queue) []queue.Item {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	items, err := q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil {
		t.Fatal(err)
	}
	return items
}

// body returns the stored message of envelope id.
func body(t testing.TB, q *queue.Queue, id string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	it, err := q.Find(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	b, err := q.EnvelopeBody(ctx, it.Env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
