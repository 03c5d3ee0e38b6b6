package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestSendAtHoldsUntilThen: `outflow submit --send-at T` stores the
// message at once (it is listed deferred until T) and the destination gets
// it no earlier than T, from its tenant's fresh mail; a restart in between keeps it. A message the API
// was asked to send before T, and then to cancel, is never sent.
func TestSendAtHoldsUntilThen(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	args := []string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none"}
	d := startDaemon(t, dir+"/data", args...)

	at := time.Now().Add(10 * time.Second).UTC().Truncate(time.Second)
	cmd := exec.Command(binary, "submit", "--data", d.Data, "--from", "app@sender.test", "--to", "later@dest.test",
		"--send-at", at.Format(time.RFC3339))
	cmd.Stdin = strings.NewReader("Subject: later\n\nsent later\n")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("submit --send-at: %v\n%s", err, out)
	}
	id := strings.TrimSpace(string(out))
	var it struct {
		ID     string `json:"id"`
		State  string `json:"state"`
		NextAt string `json:"next_attempt_at"`
	}
	line := d.cli(t, "queue", "list", "--state", "deferred", "--json")
	if err := json.Unmarshal([]byte(strings.SplitN(line, "\n", 2)[0]), &it); err != nil || it.ID != id {
		t.Fatalf("queue list --state deferred: %v\n%s", err, line)
	}
	if next, err := time.Parse(time.RFC3339Nano, it.NextAt); err != nil || !next.Equal(at) {
		t.Fatalf("next attempt %q, want %v", it.NextAt, at)
	}
	// Another, over the API, due 3 s earlier, is canceled: when the
	// first arrives, it would have been there before it.
	key := adminCLI(t, d.Data, "apikey", "create", "--tenant", "nats")
	b, _ := json.Marshal(map[string]any{"from": "app@sender.test", "to": []string{"canceled@dest.test"}, "text": "never",
		"send_at": at.Add(-3 * time.Second).Format(time.RFC3339)})
	status, _, body := apiCall(t, "POST", "http://"+d.APIAddr+"/v1/messages", key, b)
	var acc struct{ IDs []string }
	if err := json.Unmarshal(body, &acc); status != 202 || err != nil || len(acc.IDs) != 1 {
		t.Fatalf("POST send_at: %d %s", status, body)
	}
	if status, _, body := apiCall(t, "DELETE", "http://"+d.APIAddr+"/v1/messages/"+acc.IDs[0], key, nil); status != 200 {
		t.Fatalf("DELETE: %d %s", status, body)
	}

	d.Stop()
	d = startDaemon(t, dir+"/data", args...)
	waitFor(t, 60*time.Second, "the scheduled message at the destination", func() bool { return len(mx.Messages()) >= 1 })
	var delivered time.Time
	waitFor(t, 30*time.Second, "the delivered event", func() bool {
		for _, l := range strings.Split(d.cli(t, "queue", "history", id, "--json"), "\n") {
			var ev struct {
				Type string    `json:"type"`
				Time time.Time `json:"time"`
			}
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == "delivered" {
				delivered = ev.Time
				return true
			}
		}
		return false
	})
	if delivered.Before(at) {
		t.Fatalf("delivered at %v, before %v", delivered, at)
	}
	// It joined its tenant's fresh mail when its time came, rather than
	// going out from the retry lane.
	if n := d.countLog("scheduled message due", id); n != 1 {
		t.Fatalf("%d move lines for %s, want 1:\n%s", n, id, d.Logs())
	}
	if msgs := mx.Messages(); len(msgs) != 1 || !strings.Contains(string(msgs[0].Data), "sent later") {
		t.Fatalf("delivered %d messages, want only the one not canceled", len(msgs))
	}
}

// apiCall sends one request to the HTTP API with key and returns the
// status, the header and the body.
func apiCall(t *testing.T, method, url, key string, body []byte) (int, http.Header, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, b
}
