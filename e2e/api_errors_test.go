package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestHTTPAPIErrors: every error the API gives, against the real binary,
// each a problem document of its type; concurrent requests with one
// Idempotency-Key store the message once; and nothing refused reaches the
// MX.
func TestHTTPAPIErrors(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--max-message-size", "100000", "--api-rate", "0.001", "--api-burst", "40")
	cli := func(args ...string) string {
		t.Helper()
		return adminCLI(t, d.Data, args...)
	}
	key := cli("apikey", "create", "--tenant", "shop")
	spare := cli("apikey", "create", "--tenant", "other")
	do := func(method, path, key, ctype string, body []byte, hdr ...string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+d.APIAddr+path, bytes.NewReader(body))
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		if res.StatusCode >= 400 && res.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %d with Content-Type %q", method, path, res.StatusCode, res.Header.Get("Content-Type"))
		}
		return res.StatusCode, m
	}
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	good := map[string]any{"from": "a@shop.test", "to": []string{"b@dest.test"}, "subject": "s", "text": "hi"}
	with := func(k string, v any) map[string]any {
		m := map[string]any{}
		for a, b := range good {
			m[a] = b
		}
		m[k] = v
		return m
	}
	const app = "application/json"
	cases := []struct {
		name, method, path, key, ctype string
		body                           []byte
		hdr                            []string
		status                         int
		typ                            string
	}{
		{"malformed JSON", "POST", "/v1/messages", key, app, []byte("{"), nil, 400, "bad-json"},
		{"unknown field", "POST", "/v1/messages", key, app, js(with("txt", "x")), nil, 400, "unknown-field"},
		{"bad base64", "POST", "/v1/messages", key, app, js(with("attachments", []map[string]any{{"filename": "a.bin", "content": "%%%"}})), nil, 400, "bad-attachment"},
		{"CR LF in subject", "POST", "/v1/messages", key, app, js(with("subject", "hi\r\nBcc: victim@dest.test")), nil, 400, "bad-header"},
		{"CR LF in headers", "POST", "/v1/messages", key, app, js(with("headers", map[string]string{"X-Tag": "a\r\nBcc: victim@dest.test"})), nil, 400, "bad-header"},
		{"no key", "POST", "/v1/messages", "", app, js(good), nil, 401, "unauthorized"},
		{"unknown key", "POST", "/v1/messages", "ofk_nope", app, js(good), nil, 401, "unauthorized"},
		{"another tenant's list", "GET", "/v1/suppressions?tenant=shop", spare, "", nil, nil, 403, "forbidden"},
		{"unknown message", "GET", "/v1/messages/nosuch", key, "", nil, nil, 404, "not-found"},
		{"wrong method", "DELETE", "/v1/messages", key, "", nil, nil, 405, "method-not-allowed"},
		{"huge body", "POST", "/v1/messages", key, app, js(with("text", strings.Repeat("x", 200000))), nil, 413, "too-large"},
		{"not JSON", "POST", "/v1/messages", key, "text/plain", []byte("hi"), nil, 415, "unsupported-media-type"},
		{"bad address", "POST", "/v1/messages", key, app, js(with("to", []string{"nope"})), nil, 422, "bad-address"},
	}
	for _, c := range cases {
		status, p := do(c.method, c.path, c.key, c.ctype, c.body, c.hdr...)
		if status != c.status || p["type"] != "urn:outflow:problem:"+c.typ {
			t.Errorf("%s: %d %v, want %d %s", c.name, status, p, c.status, c.typ)
		}
	}

	// One key, different requests: 422. Concurrent identical requests: one
	// message stored, every answer the same ids (or 409 while in progress).
	if status, _ := do("POST", "/v1/messages", key, app, js(good), "Idempotency-Key", "k1"); status != 202 {
		t.Fatalf("first k1: %d", status)
	}
	if status, p := do("POST", "/v1/messages", key, app, js(with("text", "other")), "Idempotency-Key", "k1"); status != 422 || p["type"] != "urn:outflow:problem:idempotency-key-reused" {
		t.Errorf("k1 reused: %d %v", status, p)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	idsSeen := map[string]int{}
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, p := do("POST", "/v1/messages", key, app, js(with("to", []string{"c@dest.test"})), "Idempotency-Key", "k2")
			mu.Lock()
			defer mu.Unlock()
			switch status {
			case 202:
				b, _ := json.Marshal(p["ids"])
				idsSeen[string(b)]++
			case 409:
			default:
				t.Errorf("concurrent k2: %d %v", status, p)
			}
		}()
	}
	wg.Wait()
	if len(idsSeen) != 1 {
		t.Errorf("concurrent requests with one key got ids %v, want one set", idsSeen)
	}

	// A suppressed recipient.
	if status, _ := do("POST", "/v1/suppressions", key, app, js(map[string]any{"address": "gone@dest.test", "reason": "complaint"})); status != 201 {
		t.Fatalf("POST /v1/suppressions: %d", status)
	}
	if status, p := do("POST", "/v1/messages", key, app, js(with("to", []string{"gone@dest.test"}))); status != 422 || p["type"] != "urn:outflow:problem:recipient-suppressed" ||
		!strings.Contains(p["detail"].(string), "gone@dest.test") {
		t.Errorf("suppressed: %d %v", status, p)
	}

	// Rate limit: the spare key's burst of 40, then 429 with Retry-After.
	var last int
	for range 41 {
		last, _ = do("GET", "/v1/messages/nosuch", spare, "", nil)
	}
	if last != 429 {
		t.Errorf("after the burst: %d, want 429", last)
	}

	// Only the two accepted messages (k1, k2) reach the MX.
	if err := mx.WaitForMessages(2, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 30*time.Second, "an empty queue", func() bool {
		out, err := exec.Command(binary, "queue", "list", "--data", d.Data).Output()
		return err == nil && !strings.Contains(string(out), "dest.test")
	})
	if n := len(mx.Messages()); n != 2 {
		t.Fatalf("%d messages reached the MX, want 2", n)
	}
}
