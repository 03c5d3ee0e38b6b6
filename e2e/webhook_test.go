package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// verifyStandardWebhook checks one delivery the way the Standard Webhooks
// specification tells a receiver to, written here apart from package
// webhook: HMAC-SHA256, keyed with the base64 secret after "whsec_", over
// "id.timestamp.body", compared with each "v1,<base64>" signature.
func verifyStandardWebhook(secret string, h http.Header, body []byte) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.Get("webhook-id") + "." + h.Get("webhook-timestamp") + "."))
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(h.Get("webhook-signature")) {
		if hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

type hook struct {
	id, typ, msgID string
	verified       bool
}

// TestWebhookRetriesAndRecovers: an endpoint added with `outflow webhook
// add` answers 503 with Retry-After first, then 410, then 200. The
// delivered event arrives signed (checked independently), the deferral
// honours Retry-After in the log, the 410 disables the endpoint and parks
// the event, and `webhook replay` sends it again with the same webhook-id.
func TestWebhookRetriesAndRecovers(t *testing.T) {
	var mu sync.Mutex
	var secret string
	var answers []int // 200 until the test event is in
	got := make(chan hook, 16)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		code := 200
		if len(answers) > 0 {
			code, answers = answers[0], answers[1:]
		}
		sec := secret
		mu.Unlock()
		var p struct {
			Type string `json:"type"`
			Data struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		_ = json.Unmarshal(body, &p)
		if code == 503 {
			w.Header().Set("Retry-After", "1")
		}
		w.WriteHeader(code)
		got <- hook{r.Header.Get("webhook-id"), p.Type, p.Data.ID, verifyStandardWebhook(sec, r.Header, body)}
	}))
	defer recv.Close()

	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--webhook-allow-private")
	cli := func(args ...string) string {
		t.Helper()
		for try := 1; ; try++ {
			var out, errb bytes.Buffer
			cmd := exec.Command(binary, append(args, "--data", d.Data)...)
			cmd.Stdout, cmd.Stderr = &out, &errb
			err := cmd.Run()
			if err == nil {
				return strings.TrimSpace(out.String())
			}
			// A NATS handshake past its 2 s on a loaded machine never
			// reached the daemon: the command did nothing, run it again.
			if try < 3 && strings.Contains(errb.String(), "i/o timeout") {
				continue
			}
			t.Fatalf("outflow %v: %v\n%s%s", args, err, out.String(), errb.String())
		}
	}
	// try is cli for polls: a failed run (a connection timeout on a loaded
	// machine) is "" and the poll goes on.
	try := func(args ...string) string {
		out, _ := exec.Command(binary, append(args, "--data", d.Data)...).Output()
		return string(out)
	}
	sec := cli("webhook", "add", "--tenant", testUser, "--url", recv.URL+"/events", "--events", "delivered")
	if !strings.HasPrefix(sec, "whsec_") {
		t.Fatalf("webhook add printed %q", sec)
	}
	mu.Lock()
	secret = sec
	mu.Unlock()
	list := cli("webhook", "list")
	if !strings.Contains(list, recv.URL) || strings.Contains(list, sec) {
		t.Fatalf("webhook list:\n%s", list)
	}
	epID := strings.Fields(strings.Split(list, "\n")[1])[0]
	// The endpoint's consumer takes events from its creation on: wait for
	// the daemon to have made it (its test event arrives).
	cli("webhook", "test", epID)
	var h hook
	select {
	case h = <-got:
	case <-time.After(60 * time.Second):
		t.Fatalf("no test delivery\n%s", d.Logs())
	}
	if h.typ != "webhook-test" || !h.verified {
		t.Fatalf("test delivery %+v", h)
	}
	mu.Lock()
	answers = []int{503, 410}
	mu.Unlock()

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	if err := submit(c, "app@sender.test", []string{"rcpt@dest.test"}, message("hooked", "")); err != nil {
		t.Fatal(err)
	}
	next := func(what string) hook {
		t.Helper()
		select {
		case h := <-got:
			return h
		case <-time.After(60 * time.Second):
			t.Fatalf("no %s delivery\n%s", what, d.Logs())
			return hook{}
		}
	}
	first := next("first delivered")
	if first.typ != "delivered" || !first.verified || !strings.HasPrefix(first.id, "evt_") {
		t.Fatalf("delivered event %+v", first)
	}
	gone := next("retried delivered")
	if gone.id != first.id || !gone.verified {
		t.Fatalf("retry %+v: want the same webhook-id %s", gone, first.id)
	}
	if logs := d.Logs(); !strings.Contains(logs, `"webhook deferred"`) || !strings.Contains(logs, `"hint_ms":1000`) {
		t.Fatalf("no deferral honouring Retry-After in the log\n%s", logs)
	}
	waitFor(t, 30*time.Second, "the 410 to disable the endpoint", func() bool {
		return strings.Contains(try("webhook", "list"), "disabled")
	})
	cli("webhook", "replay", epID)
	replayed := next("replayed")
	if replayed.id != first.id || !replayed.verified || replayed.typ != "delivered" {
		t.Fatalf("replayed %+v, want webhook-id %s", replayed, first.id)
	}
	waitFor(t, 30*time.Second, "the dead letters emptied", func() bool {
		l := try("webhook", "list", "--json")
		return strings.Contains(l, `"state":"enabled"`) && strings.Contains(l, `"dead":0`)
	})
}

// TestWebhookAddRefusesBadURL: a URL that is not http(s), or has no host,
// is a usage error before anything is stored.
func TestWebhookAddRefusesBadURL(t *testing.T) {
	for _, u := range []string{"ftp://hooks.example/x", "file:///etc/passwd", "https://", "https://user:pw@hooks.example/"} {
		var errb bytes.Buffer
		cmd := exec.Command(binary, "webhook", "add", "--tenant", "shop", "--url", u, "--data", t.TempDir())
		cmd.Stderr = &errb
		err := cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || !strings.Contains(errb.String(), "webhook URL") {
			t.Errorf("webhook add --url %s: %v %s", u, err, errb.String())
		}
	}
}
