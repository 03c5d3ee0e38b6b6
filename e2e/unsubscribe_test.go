package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testutil"
)

var unsubLink = regexp.MustCompile(`(?m)^List-Unsubscribe: <https://mail\.sender\.test/unsubscribe/([A-Za-z0-9_-]+)>\r$`)

// TestOneClickUnsubscribe: a tenant whose mail carries one-click
// unsubscribe links (RFC 8058) sends one message to two recipients over
// SMTP; each gets its own copy with its own link. Opening a link (GET)
// only shows a page; the one-click POST a mailbox provider makes puts
// that recipient, and only that one, on the tenant's suppression list with
// an unsubscribed event, so the tenant's next message to it is refused at
// RCPT. A forged link is 404, and an API message that asks for no links
// goes without.
func TestOneClickUnsubscribe(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	cfg := dir + "/outflow.toml"
	if err := os.WriteFile(cfg, []byte("[tenants."+testUser+"]\nlist-unsubscribe = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--config", cfg, "--unsubscribe-url", "https://mail.sender.test/unsubscribe")

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	if err := testutil.Send(c, "app@sender.test", []string{"ann@dest.test", "bob@dest.test"}, message("news", "")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "a copy for each recipient", func() bool { return len(mx.Messages()) == 2 })
	tokens := map[string]string{}
	for _, m := range mx.Messages() {
		found := unsubLink.FindAllSubmatch(m.Data, -1)
		if len(m.Rcpts) != 1 || len(found) != 1 || !strings.Contains(string(m.Data), "\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n") {
			t.Fatalf("message to %v:\n%s\nwant one recipient and one link with its one-click field", m.Rcpts, m.Data)
		}
		tokens[m.Rcpts[0]] = string(found[0][1])
	}
	if tokens["ann@dest.test"] == tokens["bob@dest.test"] || strings.Contains(tokens["ann@dest.test"], "ann") {
		t.Fatalf("tokens %v: want one per recipient, the address not readable", tokens)
	}

	// The operator's proxy passes https://mail.sender.test/unsubscribe/
	// to /unsubscribe/ on --api-addr; the test calls it directly.
	page := "http://" + d.APIAddr + "/unsubscribe/" + tokens["ann@dest.test"]
	res, err := http.Get(page)
	if err != nil {
		t.Fatal(err)
	}
	html, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || !strings.Contains(string(html), "ann@dest.test") || !strings.Contains(string(html), `method="post"`) {
		t.Fatalf("GET %s: %d\n%s", page, res.StatusCode, html)
	}
	if list := d.cli(t, "suppress", "list", "--tenant", testUser, "--json"); strings.Contains(list, "ann@dest.test") {
		t.Fatalf("opening the link unsubscribed:\n%s", list)
	}
	res, err = http.Post(page, "application/x-www-form-urlencoded", strings.NewReader("List-Unsubscribe=One-Click"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("one-click POST: %d", res.StatusCode)
	}

	// Recorded before the 200: no waiting.
	list := d.cli(t, "suppress", "list", "--tenant", testUser, "--json")
	var entry struct {
		Address, Source, Reason string
	}
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Address == "ann@dest.test" {
			break
		}
		entry.Address = ""
	}
	if entry.Address == "" || entry.Source != "unsubscribe" || strings.Contains(list, "bob@dest.test") {
		t.Fatalf("suppress list:\n%s\nwant ann alone, by unsubscribe", list)
	}
	if only := d.cli(t, "suppress", "list", "--tenant", testUser, "--source", "unsubscribe", "--since", "1h", "--json"); strings.Count(only, "\n") != 1 ||
		!strings.Contains(only, "ann@dest.test") {
		t.Fatalf("suppress list --source unsubscribe --since 1h:\n%s", only)
	}
	if none := d.cli(t, "suppress", "list", "--source", "bounce", "--json"); strings.TrimSpace(none) != "" {
		t.Fatalf("suppress list --source bounce:\n%s", none)
	}
	id := regexp.MustCompile(`message (\S+)\)`).FindStringSubmatch(entry.Reason)
	if id == nil {
		t.Fatalf("the entry's reason %q names no message", entry.Reason)
	}
	if hist := d.cli(t, "queue", "history", id[1], "--json"); !strings.Contains(hist, `"type":"unsubscribed"`) ||
		!strings.Contains(hist, `"recipients":["ann@dest.test"]`) {
		t.Fatalf("history of %s:\n%s", id[1], hist)
	}

	// The operator reads a link a recipient forwarded.
	var check struct {
		Tenant, Recipient, ID string
		Suppressed            *struct{ Source string }
	}
	out := d.cli(t, "unsubscribe", "check", "<https://mail.sender.test/unsubscribe/"+tokens["ann@dest.test"]+">", "--json")
	if err := json.Unmarshal([]byte(out), &check); err != nil || check.Recipient != "ann@dest.test" || check.ID != id[1] ||
		check.Suppressed == nil || check.Suppressed.Source != "unsubscribe" {
		t.Fatalf("unsubscribe check: %v\n%s", err, out)
	}
	if out := d.cli(t, "unsubscribe", "check", tokens["bob@dest.test"]); !strings.Contains(out, "recipient bob@dest.test") ||
		!strings.HasSuffix(strings.TrimSpace(out), "not suppressed") {
		t.Fatalf("unsubscribe check of bob's link: %s", out)
	}

	var se *smtp.SMTPError
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("ann@dest.test", nil); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("RCPT of the unsubscribed recipient: %v, want 550", err)
	}
	if err := c.Rcpt("bob@dest.test", nil); err != nil {
		t.Fatalf("RCPT of the other: %v", err)
	}
	_ = c.Reset()

	forged := []byte(tokens["bob@dest.test"])
	forged[len(forged)/2] ^= 1
	if res, err := http.Post("http://"+d.APIAddr+"/unsubscribe/"+string(forged), "application/x-www-form-urlencoded",
		strings.NewReader("List-Unsubscribe=One-Click")); err != nil || res.StatusCode != 404 {
		t.Fatalf("a forged link: %v %v, want 404", res, err)
	} else {
		res.Body.Close()
	}
	if out, err := d.cliErr("unsubscribe", "check", string(forged)); err == nil || !strings.Contains(out, "not a link of this fleet") {
		t.Fatalf("unsubscribe check of a forged link: %v\n%s", err, out)
	}

	key := adminCLI(t, d.Data, "apikey", "create", "--tenant", testUser)
	b, _ := json.Marshal(map[string]any{"from": "app@sender.test", "to": []string{"cy@dest.test"}, "subject": "receipt", "text": "x",
		"list_unsubscribe": false})
	if status, _, body := apiCall(t, "POST", "http://"+d.APIAddr+"/v1/messages", key, b); status != http.StatusAccepted {
		t.Fatalf("POST without links: %d %s", status, body)
	}
	waitFor(t, 60*time.Second, "the receipt", func() bool { return len(mx.Messages()) == 3 })
	if m := mx.Messages()[2]; m.Rcpts[0] != "cy@dest.test" || strings.Contains(string(m.Data), "List-Unsubscribe") {
		t.Fatalf("message asked without links:\n%s", m.Data)
	}
	m := scrapeNoFatal(d)
	if m[`outflow_unsubscribe_requests_total{result="unsubscribed"}`] != 1 || m[`outflow_unsubscribe_requests_total{result="invalid"}`] != 1 {
		t.Fatalf("metrics: unsubscribed %v, invalid %v", m[`outflow_unsubscribe_requests_total{result="unsubscribed"}`],
			m[`outflow_unsubscribe_requests_total{result="invalid"}`])
	}
}
