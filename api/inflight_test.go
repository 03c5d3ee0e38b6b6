package api

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// attachmentRequest is the JSON of a message with an attachment of n
// random octets.
func attachmentRequest(t testing.TB, n int) []byte {
	t.Helper()
	data := make([]byte, n)
	_, _ = rand.Read(data)
	b, err := json.Marshal(map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "subject": "big", "text": "see attached",
		"attachments": []map[string]any{{"filename": "a.bin", "content": base64.StdEncoding.EncodeToString(data)}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// stalledRequest starts a POST /v1/messages by key that announces a body
// of length octets, sends the start of a JSON object and then pad more
// octets (of a string), and sends no more of it until the returned
// release is called (the request then fails: its body ends early); it
// waits until the server has charged what it sent.
func stalledRequest(t *testing.T, f *fixture, key string, length int64, pad int) (release func()) {
	t.Helper()
	before, _ := f.srv.inflight.InUse()
	pr, pw := io.Pipe()
	req, err := http.NewRequest("POST", f.ts.URL+"/v1/messages", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = length
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}()
	var once sync.Once
	release = func() {
		once.Do(func() {
			_ = pw.CloseWithError(errors.New("client gave up"))
			<-done
		})
	}
	t.Cleanup(release) // before a wait that may fail: the test server waits for the request
	start := []byte(`{"from": "a@src.example", "text": "`)
	go func() { _, _ = pw.Write(append(start, bytes.Repeat([]byte("x"), pad)...)) }()
	want := before + inflightCost(f.srv.inflight, int64(len(start)+pad))
	waitFor(t, "the stalled request's charge", func() bool { used, _ := f.srv.inflight.InUse(); return used == want })
	return release
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// checkInflightProblem checks that r is a too-much-in-flight problem with
// status and a Retry-After header.
func checkInflightProblem(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" || r.json["type"] != ProblemInflight ||
		r.json["status"] != float64(status) || r.json["detail"] == "" {
		t.Fatalf("want a %d %s problem: %d %v %s", status, ProblemInflight, r.status, r.header, r.raw)
	}
	ra, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil || ra < 1 || r.json["retry_after"] != float64(ra) {
		t.Fatalf("Retry-After %q, retry_after %v", r.header.Get("Retry-After"), r.json["retry_after"])
	}
}

// A full budget answers 503 too-much-in-flight after the wait, with
// Retry-After, and stores nothing; once room is made the same request is
// accepted, and a request that waits while room is made is served.
func TestInflightBudgetFullIs503(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxInflightBytes, c.TenantInflightBytes, c.InflightWait = 8<<20, 8<<20, 200*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, _, err := f.srv.Keys().Create(ctx, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}

	const pad = 1_660_000 // charged all of the budget but less than a small request's charge
	release := stalledRequest(t, f, f.key, 2<<20, pad)
	held, _ := f.srv.inflight.InUse()
	start := time.Now()
	r := f.do(t, "POST", "/v1/messages", other, msg, nil)
	checkInflightProblem(t, r, http.StatusServiceUnavailable)
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("refused after %v, before the wait was over", waited)
	}
	if b, full, share := f.srv.Inflight(); b != held || full != 1 || share != 0 {
		t.Fatalf("Inflight() = %d bytes, %d refused for the budget, %d for a share; want the budget held, 1, 0", b, full, share)
	}
	if n := len(queued(t, f.q)); n != 0 {
		t.Fatalf("%d envelopes stored for a refused request", n)
	}
	release()
	waitFor(t, "the budget to come back", func() bool { used, _ := f.srv.inflight.InUse(); return used == 0 })
	f.do(t, "POST", "/v1/messages", other, msg, nil).ids(t)

	// A request that waits while the budget is full is served once there
	// is room, within its wait.
	f.srv.cfg.InflightWait = 10 * time.Second
	release = stalledRequest(t, f, f.key, 2<<20, pad)
	got := make(chan response, 1)
	go func() { got <- f.do(t, "POST", "/v1/messages", other, msg, nil) }()
	time.Sleep(100 * time.Millisecond)
	release()
	if r := <-got; r.status != http.StatusAccepted {
		t.Fatalf("a request that waited for room: %d %s", r.status, r.raw)
	}
	if used, peak := f.srv.inflight.InUse(); used != 0 || peak > 8<<20 {
		t.Fatalf("in use %d after every request, peak %d over the budget", used, peak)
	}
}

// One tenant's requests hold at most its share: past it, 429
// too-much-in-flight with Retry-After, while another tenant is served.
func TestInflightTenantShareIs429(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxInflightBytes, c.InflightWait = 8<<20, 100*time.Millisecond // the share: 4 MiB
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, _, err := f.srv.Keys().Create(ctx, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	second, _, err := f.srv.Keys().Create(ctx, "acme", false) // the same tenant, another key
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}

	release := stalledRequest(t, f, f.key, 1<<20, 825_000) // all of the share but less than a small request's charge
	checkInflightProblem(t, f.do(t, "POST", "/v1/messages", second, msg, nil), http.StatusTooManyRequests)
	if _, full, share := f.srv.Inflight(); full != 0 || share != 1 {
		t.Fatalf("Inflight() refusals: %d for the budget, %d for a share; want 0, 1", full, share)
	}
	f.do(t, "POST", "/v1/messages", other, msg, nil).ids(t)
	if n := len(queued(t, f.q)); n != 1 {
		t.Fatalf("%d envelopes stored, want the other tenant's one", n)
	}
	release()
	waitFor(t, "the share to come back", func() bool { used, _ := f.srv.inflight.InUse(); return used == 0 })
	f.do(t, "POST", "/v1/messages", second, msg, nil).ids(t)
}

// A body of unknown length (chunked) is charged as it is read: refused
// when a read finds no room, served and charged for its size when there
// is.
func TestInflightChunkedBody(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxInflightBytes, c.TenantInflightBytes, c.InflightWait = 64<<20, 64<<20, 100*time.Millisecond
	})
	body := attachmentRequest(t, 2<<20) // 2.7 MiB of JSON
	post := func() response {
		// A reader of no known length: the client sends it chunked.
		req, err := http.NewRequest("POST", f.ts.URL+"/v1/messages", io.MultiReader(bytes.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+f.key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		r := response{status: res.StatusCode, header: res.Header, raw: raw}
		_ = json.Unmarshal(raw, &r.json)
		return r
	}
	if err := f.srv.inflight.Acquire(context.Background(), "someone", 62<<20, 0); err != nil {
		t.Fatal(err)
	}
	checkInflightProblem(t, post(), http.StatusServiceUnavailable)
	f.srv.inflight.Release("someone", 62<<20)
	f.srv.inflight.ResetPeak()

	post().ids(t)
	used, peak := f.srv.inflight.InUse()
	if n := int64(len(body)); used != 0 || peak != inflightCost(f.srv.inflight, n) {
		t.Fatalf("a chunked body of %d octets: in use %d, peak %d, want %d", n, used, peak, inflightCost(f.srv.inflight, n))
	}
}

// A Content-Length over the request limit is a 413 at once, charged
// nothing; a request larger than a tenant's share is charged the share
// and served alone rather than never.
func TestInflightLimits(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxMessageBytes = 64 << 10
		c.MaxInflightBytes, c.InflightWait = 256<<10, 100*time.Millisecond // the share: 128 KiB
	})
	req, err := http.NewRequest("POST", f.ts.URL+"/v1/messages", io.LimitReader(neverEnding{}, 8<<20))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 8 << 20
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+f.key)
	res, err := http.DefaultClient.Do(req)
	if err == nil {
		res.Body.Close()
	}
	if err == nil && res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("Content-Length over the limit: %d", res.StatusCode)
	}
	if _, peak := f.srv.inflight.InUse(); peak != 0 {
		t.Fatalf("a request refused for its Content-Length was charged %d", peak)
	}
	big := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": string(bytes.Repeat([]byte("x"), 60<<10))}
	f.do(t, "POST", "/v1/messages", f.key, big, nil).ids(t) // 4 × 60 KiB + 64 KiB > the share
	if _, peak := f.srv.inflight.InUse(); peak != 128<<10 {
		t.Fatalf("peak %d, want the share", peak)
	}
}

type neverEnding struct{}

func (neverEnding) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}

// heapPeak samples the heap while f runs and returns the most it grew
// above what was live before: live, the live heap as the collector last
// marked it (/gc/heap/live:bytes), and alloc, the heap's objects,
// garbage not yet swept included (what HeapAlloc says).
func heapPeak(f func()) (live, alloc uint64) {
	runtime.GC()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/objects:bytes"}}
	read := func() (uint64, uint64) {
		metrics.Read(sample)
		return sample[0].Value.Uint64(), sample[1].Value.Uint64()
	}
	baseLive, baseAlloc := read()
	var peakLive, peakAlloc atomic.Uint64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			l, a := read()
			if l > baseLive && l-baseLive > peakLive.Load() {
				peakLive.Store(l - baseLive)
			}
			if a > baseAlloc && a-baseAlloc > peakAlloc.Load() {
				peakAlloc.Store(a - baseAlloc)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Microsecond):
			}
		}
	}()
	f()
	runtime.GC() // marks what is live at the end too
	close(stop)
	<-done
	return peakLive.Load(), peakAlloc.Load()
}

// TestInflightFactor keeps inflightFactor honest: the live heap one large
// message request takes at its peak (the collector run often, so that it
// marks often) is within its charge, for an attachment and for a raw
// message (whose JSON string, escaped, the decoder unquotes into a copy
// before it makes the string).
func TestInflightFactor(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Rate = -1 })
	defer debug.SetGCPercent(debug.SetGCPercent(5))
	attach := attachmentRequest(t, 8<<20)
	var raw bytes.Buffer
	raw.WriteString("Subject: big\n\n")
	line := bytes.Repeat([]byte("0123456789"), 7)
	for raw.Len() < 10<<20 {
		raw.Write(line)
		raw.WriteByte('\n')
	}
	rawReq, _ := json.Marshal(map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "raw": raw.String()})
	for _, c := range []struct {
		name string
		body []byte
	}{{"attachment", attach}, {"raw", rawReq}} {
		var code int
		live, alloc := heapPeak(func() {
			req := httptest.NewRequest("POST", "/v1/messages", bytes.NewReader(c.body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer "+f.key)
			rec := httptest.NewRecorder()
			f.srv.Handler().ServeHTTP(rec, req)
			code = rec.Code
		})
		if code != http.StatusAccepted {
			t.Fatalf("%s: %d", c.name, code)
		}
		n := float64(len(c.body))
		charge := inflightCost(f.srv.inflight, int64(len(c.body)))
		t.Logf("%s: body %d, peak live heap %d (%.2f times), objects %d (%.2f times), charged %d",
			c.name, len(c.body), live, float64(live)/n, alloc, float64(alloc)/n, charge)
		if live > uint64(charge) {
			t.Errorf("%s: a request of %d octets held %d bytes of heap, more than its charge of %d", c.name, len(c.body), live, charge)
		}
	}
}

// TestInflightBoundsHeap: sixteen concurrent requests with a 2 MiB
// attachment each, under a budget of 32 MiB (two whole ones at a time),
// are all served (charged as they are read, those part-way through wait
// for room until one gives up, and a refused one is sent again, as its
// Retry-After says), and neither the bytes charged nor the live heap ever
// exceed the budget (with no bound the same requests held several times
// it, as the log line shows).
func TestInflightBoundsHeap(t *testing.T) {
	const budget = 32 << 20
	body := attachmentRequest(t, 2<<20)
	run := func(bound int64) (live, alloc uint64, f *fixture) {
		f = newFixture(t, func(c *Config) {
			c.Rate = -1
			c.MaxInflightBytes, c.TenantInflightBytes, c.InflightWait = bound, max(bound, 1), 100*time.Millisecond
		})
		defer debug.SetGCPercent(debug.SetGCPercent(10))
		var codes [16]int
		live, alloc = heapPeak(func() {
			var wg sync.WaitGroup
			for i := range codes {
				wg.Go(func() {
					for deadline := time.Now().Add(time.Minute); ; {
						req := httptest.NewRequest("POST", "/v1/messages", bytes.NewReader(body))
						req.Header.Set("Content-Type", "application/json")
						req.Header.Set("Authorization", "Bearer "+f.key)
						rec := httptest.NewRecorder()
						f.srv.Handler().ServeHTTP(rec, req)
						codes[i] = rec.Code
						if rec.Code != http.StatusServiceUnavailable && rec.Code != http.StatusTooManyRequests || time.Now().After(deadline) {
							return
						}
					}
				})
			}
			wg.Wait()
		})
		for i, c := range codes {
			if c != http.StatusAccepted {
				t.Fatalf("request %d: %d", i, c)
			}
		}
		return live, alloc, f
	}
	if !raceEnabled { // for comparison only, and slow under the race detector
		live, alloc, _ := run(-1)
		t.Logf("16 requests of %d octets without a bound: peak live heap %d MiB (objects %d MiB)", len(body), live>>20, alloc>>20)
	}
	live, alloc, f := run(budget)
	used, charged := f.srv.inflight.InUse()
	t.Logf("16 requests of %d octets under a budget of %d MiB: peak live heap %d MiB (objects %d MiB), %d MiB charged at most",
		len(body), budget>>20, live>>20, alloc>>20, charged>>20)
	if used != 0 || charged > budget || charged < inflightCost(f.srv.inflight, int64(len(body))) {
		t.Fatalf("charged %d at most (in use %d after), want a request's worth at least, within %d", charged, used, budget)
	}
	// The budget, and some room for what the store keeps a while after
	// a request (its file store's block caches).
	if live > budget+budget/4 {
		t.Fatalf("peak live heap %d MiB under a budget of %d MiB", live>>20, budget>>20)
	}
}
