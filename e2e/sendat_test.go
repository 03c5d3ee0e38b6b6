package e2e

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestSendAtHoldsUntilThen: `outflow submit --send-at T` stores the
// message at once (it is listed deferred until T) and the destination gets
// it no earlier than T; a restart in between keeps it.
func TestSendAtHoldsUntilThen(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	args := []string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none"}
	d := startDaemon(t, dir+"/data", args...)

	at := time.Now().Add(4 * time.Second).UTC().Truncate(time.Second).Add(time.Second)
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
	d.Stop()
	d = startDaemon(t, dir+"/data", args...)
	waitFor(t, 60*time.Second, "the scheduled message at the destination", func() bool { return len(mx.Messages()) == 1 })
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
	if !strings.Contains(string(mx.Messages()[0].Data), "sent later") {
		t.Fatalf("delivered %q", mx.Messages()[0].Data)
	}
}
