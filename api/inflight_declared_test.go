package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"
)

// doChunked posts body as a message by key, of no known length (the
// client sends it chunked).
func (f *fixture) doChunked(t *testing.T, key string, body []byte) response {
	t.Helper()
	req, err := http.NewRequest("POST", f.ts.URL+"/v1/messages", io.MultiReader(bytes.NewReader(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
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

// The lock-out the budget once allowed: two tenants' requests declare
// Content-Lengths that, charged, held the whole budget, send a few dozen
// octets and stall. They hold what they sent (the fixed part and their
// octets times inflightFactor), and a third tenant's message is served
// meanwhile, at once. Given up, they hold nothing.
func TestInflightDeclaredLengthHoldsWhatWasSent(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxInflightBytes, c.InflightWait = 8<<20, 100*time.Millisecond // the share: 4 MiB
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var keys [3]string
	for i, tenant := range []string{"one", "two", "three"} {
		k, _, err := f.srv.Keys().Create(ctx, tenant, false)
		if err != nil {
			t.Fatal(err)
		}
		keys[i] = k
	}
	const declared = 30 << 20 // within the request limit, and charged it was a share each
	stalled := stalledRequest(t, f, keys[0], declared, 0)
	stalled2 := stalledRequest(t, f, keys[1], declared, 0)
	start := int64(len(`{"from": "a@src.example", "text": "`))
	if used, _ := f.srv.inflight.InUse(); used != 2*inflightCost(f.srv.inflight, start) {
		t.Fatalf("two requests that sent %d octets of %d hold %d bytes, want %d", start, declared, used, 2*inflightCost(f.srv.inflight, start))
	}
	if got := f.srv.inflight.TenantInUse("one"); got != inflightOverhead+inflightFactor*start {
		t.Fatalf("tenant one holds %d, want what it sent", got)
	}

	began := time.Now()
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	f.do(t, "POST", "/v1/messages", keys[2], msg, nil).ids(t)
	if took := time.Since(began); took >= 100*time.Millisecond {
		t.Errorf("the third tenant's message took %v: it waited for room", took)
	}
	if _, full, share := f.srv.Inflight(); full != 0 || share != 0 {
		t.Fatalf("refused %d for the budget, %d for a share; want none", full, share)
	}

	stalled()
	stalled2()
	waitFor(t, "the budget empty", func() bool { used, _ := f.srv.inflight.InUse(); return used == 0 })
}

// A Content-Length for which there is no room now is still refused
// before a byte of it is read, and the refusal charges nothing; a body
// charged as it is read is refused when a read finds no room, and gives
// back what it held.
func TestInflightDeclaredLengthChecked(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rate = -1
		c.MaxInflightBytes, c.TenantInflightBytes, c.InflightWait = 8<<20, 8<<20, 100*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, _, err := f.srv.Keys().Create(ctx, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	release := stalledRequest(t, f, f.key, 2<<20, 1<<20) // 5 MiB and the fixed part held
	held, _ := f.srv.inflight.InUse()

	// Declared 1 MiB: no room for its 5 MiB now.
	big := attachmentRequest(t, 700<<10)
	r := f.do(t, "POST", "/v1/messages", other, big, nil)
	checkInflightProblem(t, r, http.StatusServiceUnavailable)
	if used, _ := f.srv.inflight.InUse(); used != held || f.srv.inflight.TenantInUse("other") != 0 {
		t.Fatalf("after the refusal %d charged, want %d, none of it other's", used, held)
	}
	// The same, of no known length: refused part-way, what it held given back.
	r = f.doChunked(t, other, big)
	checkInflightProblem(t, r, http.StatusServiceUnavailable)
	if used, _ := f.srv.inflight.InUse(); used != held {
		t.Fatalf("after the refusal %d charged, want %d", used, held)
	}
	if _, full, _ := f.srv.Inflight(); full != 2 {
		t.Fatalf("refused %d for the budget, want 2", full)
	}
	release()
	waitFor(t, "the budget empty", func() bool { used, _ := f.srv.inflight.InUse(); return used == 0 })
	f.do(t, "POST", "/v1/messages", other, big, nil).ids(t)
	if used, peak := f.srv.inflight.InUse(); used != 0 || peak > 8<<20 {
		t.Fatalf("in use %d after every request, peak %d over the budget", used, peak)
	}
}
