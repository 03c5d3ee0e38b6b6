package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestHTTPAPISubmission: a key made with `outflow apikey create` submits a
// message over POST /v1/messages; it reaches the MX built as MIME, its
// status is readable with GET /v1/messages/{id}, a repeat with the same
// Idempotency-Key sends nothing more, and `apikey revoke` shuts the key
// out.
func TestHTTPAPISubmission(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none")
	if d.APIAddr == "" {
		t.Fatalf("no HTTP API address in the log\n%s", d.Logs())
	}
	cli := func(args ...string) string {
		t.Helper()
		return adminCLI(t, d.Data, args...)
	}
	key := cli("apikey", "create", "--tenant", "shop")
	if !strings.HasPrefix(key, "ofk_") {
		t.Fatalf("apikey create printed %q", key)
	}
	if list := cli("apikey", "list"); !strings.Contains(list, "shop") || strings.Contains(list, key[4:]) {
		t.Fatalf("apikey list:\n%s", list)
	}

	post := func(key, idem string, msg any) (int, []byte) {
		t.Helper()
		b, _ := json.Marshal(msg)
		req, _ := http.NewRequest("POST", "http://"+d.APIAddr+"/v1/messages", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+key)
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, body
	}
	msg := map[string]any{"from": "orders@shop.test", "to": []string{"buyer@dest.test"}, "subject": "Your order", "text": "thank you\n", "html": "<p>thank you</p>"}
	status, body := post(key, "order-7", msg)
	if status != http.StatusAccepted {
		t.Fatalf("POST: %d %s", status, body)
	}
	var acc struct{ IDs []string }
	if err := json.Unmarshal(body, &acc); err != nil || len(acc.IDs) != 1 {
		t.Fatalf("202 body %s", body)
	}
	if status, body := post(key, "order-7", msg); status != http.StatusAccepted || !strings.Contains(string(body), acc.IDs[0]) {
		t.Fatalf("repeat: %d %s", status, body)
	}
	if err := mx.WaitForMessages(1, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	got := mx.Messages()[0]
	if got.From != "orders@shop.test" || len(got.Rcpts) != 1 || got.Rcpts[0] != "buyer@dest.test" {
		t.Fatalf("delivered envelope %s -> %v", got.From, got.Rcpts)
	}
	data := string(got.Data)
	for _, want := range []string{"Subject: Your order\r\n", "multipart/alternative", "thank you\r\n", "<p>thank you</p>"} {
		if !strings.Contains(data, want) {
			t.Errorf("delivered message lacks %q:\n%s", want, data)
		}
	}

	get := func() map[string]any {
		req, _ := http.NewRequest("GET", "http://"+d.APIAddr+"/v1/messages/"+acc.IDs[0], nil)
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]any
		_ = json.NewDecoder(res.Body).Decode(&m)
		return m
	}
	waitFor(t, 30*time.Second, "GET shows the message delivered", func() bool { return get()["state"] == "delivered" })

	// Nothing more reached the MX for the repeat.
	if n := len(mx.Messages()); n != 1 {
		t.Fatalf("%d deliveries, want 1", n)
	}

	var list []struct{ ID string }
	out := cli("apikey", "list", "--json")
	for _, line := range strings.Split(out, "\n") {
		var k struct{ ID string }
		if json.Unmarshal([]byte(line), &k) == nil {
			list = append(list, k)
		}
	}
	if len(list) != 1 {
		t.Fatalf("apikey list --json: %s", out)
	}
	cli("apikey", "revoke", list[0].ID)
	if status, body := post(key, "", msg); status != http.StatusUnauthorized || !strings.Contains(string(body), "urn:outflow:problem:unauthorized") {
		t.Fatalf("revoked key: %d %s", status, body)
	}
	d.Stop()
}
