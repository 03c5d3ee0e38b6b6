package e2e

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestSendingLimit: a tenant with a sending limit of 3 recipients a day
// sends over SMTP until the limit, where the next recipient is deferred at
// RCPT with 452 4.4.5 while those before it are delivered; the HTTP API,
// for the same tenant, then refuses with 429 quota-exceeded and
// Retry-After; another tenant without a limit is not held back. `outflow
// quota list` shows the tenant's count.
func TestSendingLimit(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	cfg := dir + "/outflow.toml"
	if err := os.WriteFile(cfg, []byte("[tenants.free]\nmax-recipients-per-day = 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--config", cfg, "--max-recipients-per-day", "3")

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"a@dest.test", "b@dest.test", "c@dest.test"} {
		if err := c.Rcpt(r, nil); err != nil {
			t.Fatalf("RCPT %s: %v", r, err)
		}
	}
	var se *smtp.SMTPError
	if err := c.Rcpt("d@dest.test", nil); !errors.As(err, &se) || se.Code != 452 || se.EnhancedCode != (smtp.EnhancedCode{4, 4, 5}) ||
		!strings.Contains(se.Message, "3 recipients per 24 hours") {
		t.Fatalf("the fourth recipient: %v, want 452 4.4.5", err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(message("limited", "")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("DATA with the three accepted recipients: %v", err)
	}
	waitFor(t, 60*time.Second, "the three recipients delivered", func() bool {
		msgs := mx.Messages()
		return len(msgs) == 1 && len(msgs[0].Rcpts) == 3
	})

	// The operator sees the count: the three recipients taken.
	if u := adminCLI(t, d.Data, "quota", "list", "--tenant", testUser, "--json"); !strings.Contains(u, `"tenant":"`+testUser+`","last_24h":3,`) {
		t.Fatalf("quota list: %s", u)
	}
	key := adminCLI(t, d.Data, "apikey", "create", "--tenant", testUser)
	b, _ := json.Marshal(map[string]any{"from": "app@sender.test", "to": []string{"e@dest.test"}, "text": "x"})
	status, hdr, body := apiCall(t, "POST", "http://"+d.APIAddr+"/v1/messages", key, b)
	if status != http.StatusTooManyRequests || !strings.Contains(string(body), "quota-exceeded") || hdr.Get("Retry-After") == "" {
		t.Fatalf("API past the limit: %d %s (Retry-After %q)", status, body, hdr.Get("Retry-After"))
	}

	free := adminCLI(t, d.Data, "apikey", "create", "--tenant", "free")
	if status, _, body := apiCall(t, "POST", "http://"+d.APIAddr+"/v1/messages", free, b); status != http.StatusAccepted {
		t.Fatalf("a tenant whose limit is lifted: %d %s", status, body)
	}
	if m := scrapeNoFatal(d); m[`outflow_submission_rejections_total{reason="quota"}`] != 1 {
		t.Fatalf("quota rejections: %v", m[`outflow_submission_rejections_total{reason="quota"}`])
	}
}
