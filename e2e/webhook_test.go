package e2e

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
		return adminCLI(t, d.Data, args...)
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
	var l string
	deadline := time.Now().Add(60 * time.Second)
	for l = try("webhook", "list", "--json"); !strings.Contains(l, `"state":"enabled"`) || !strings.Contains(l, `"dead":0`); l = try("webhook", "list", "--json") {
		if time.Now().After(deadline) {
			t.Fatalf("the endpoint not enabled with no dead letters after the replay: %s\n%s", l, d.Logs())
		}
		time.Sleep(200 * time.Millisecond) // polling with a deadline
	}

	// A burst while the endpoint answers 503 (Retry-After) twice: every
	// event arrives, each signed, once it recovers.
	mu.Lock()
	answers = []int{503, 503}
	mu.Unlock()
	for i := range 3 {
		if err := submit(c, "app@sender.test", []string{"rcpt@dest.test"}, message(fmt.Sprintf("burst-%d", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	taken := map[string]bool{} // webhook-ids answered 200
	for len(taken) < 3 {
		h := next("burst")
		if !h.verified || h.typ != "delivered" {
			t.Fatalf("burst delivery %+v", h)
		}
		mu.Lock()
		recovered := len(answers) == 0
		mu.Unlock()
		if recovered {
			taken[h.id] = true
		}
	}
	if n := strings.Count(d.Logs(), `"hint_ms":1000`); n < 3 {
		t.Fatalf("%d deferrals honouring Retry-After in the log, want 3", n)
	}

	// A rotation: the new secret is printed once, and the receiver that
	// has switched to it verifies what follows (the old one also signs
	// for the overlap, so a receiver that has not yet verifies too).
	rotated := strings.TrimSpace(cli("webhook", "rotate", epID, "--keep", "1h"))
	if !strings.HasPrefix(rotated, "whsec_") || rotated == sec {
		t.Fatalf("webhook rotate printed %q", rotated)
	}
	if l := cli("webhook", "list", "--json"); strings.Contains(l, rotated) || strings.Contains(l, sec) {
		t.Fatalf("webhook list shows a secret: %s", l)
	}
	mu.Lock()
	secret = rotated
	mu.Unlock()
	for i := 0; ; i++ {
		if err := submit(c, "app@sender.test", []string{"rcpt@dest.test"}, message(fmt.Sprintf("rotated-%d", i), "")); err != nil {
			t.Fatal(err)
		}
		if h := next("after the rotation"); h.verified {
			break
		}
		if i == 10 {
			t.Fatalf("no delivery after the rotation verifies with the new secret\n%s", d.Logs())
		}
	}
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

// startNATSServer starts one JetStream nats-server (the version pinned in
// go.mod) with client auth, and returns its URL with the credentials.
func startNATSServer(t *testing.T, user, password string) string {
	t.Helper()
	dir := t.TempDir()
	bin := buildNATSServer(t, dir)
	addr := freeAddr(t)
	conf := fmt.Sprintf("listen: %s\njetstream { store_dir: %q, max_file_store: 1G, max_memory_store: 64M }\nauthorization { user: %q, password: %q }\n",
		addr, filepath.Join(dir, "js"), user, password)
	cf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	lf, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", cf)
	cmd.Stdout, cmd.Stderr = lf, lf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n := &natsNode{name: "single", clientAddr: addr, cmd: cmd, exited: make(chan struct{}), log: lf}
	go func() { _ = cmd.Wait(); close(n.exited) }()
	t.Cleanup(func() { n.kill(); lf.Close() })
	waitFor(t, 60*time.Second, "nats-server listening", func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return "nats://" + user + ":" + password + "@" + addr
}

// TestWebhookReplayWhileDaemonDown: with the daemon on an external NATS,
// an event the endpoint refused (400) is a dead letter; the daemon stops;
// `webhook replay` (which talks to NATS only) moves it back to the
// endpoint's queue; the restarted daemon delivers it with its webhook-id.
func TestWebhookReplayWhileDaemonDown(t *testing.T) {
	t.Parallel()
	url := startNATSServer(t, "outflow", "replay-test-pw-51d2")
	var mu sync.Mutex
	var secret string
	code := http.StatusBadRequest
	got := make(chan hook, 16)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		c, sec := code, secret
		mu.Unlock()
		var p struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(body, &p)
		w.WriteHeader(c)
		got <- hook{id: r.Header.Get("webhook-id"), typ: p.Type, verified: verifyStandardWebhook(sec, r.Header, body)}
	}))
	defer recv.Close()
	next := func(what string, logs func() string) hook {
		t.Helper()
		select {
		case h := <-got:
			return h
		case <-time.After(60 * time.Second):
			t.Fatalf("no %s delivery\n%s", what, logs())
			return hook{}
		}
	}
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	args := []string{"--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--nats-url", url, "--webhook-allow-private"}
	d := startDaemon(t, dir+"/data", args...)
	cli := func(args ...string) string {
		t.Helper()
		return adminCLI(t, d.Data, append(args, "--nats-url", url)...)
	}
	sec := cli("webhook", "add", "--tenant", testUser, "--url", recv.URL, "--events", "delivered")
	mu.Lock()
	secret = sec
	code = http.StatusOK
	mu.Unlock()
	var ep struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(cli("webhook", "list", "--json")), &ep); err != nil || ep.ID == "" {
		t.Fatalf("webhook list --json: %v", err)
	}
	cli("webhook", "test", ep.ID) // its arrival says the consumer exists
	if h := next("test", d.Logs); h.typ != "webhook-test" || !h.verified {
		t.Fatalf("test delivery %+v", h)
	}
	mu.Lock()
	code = http.StatusBadRequest
	mu.Unlock()
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(c, "app@sender.test", []string{"rcpt@dest.test"}, message("replay-down", "")); err != nil {
		t.Fatal(err)
	}
	c.Close()
	refused := next("refused", d.Logs)
	if refused.typ != "delivered" || !refused.verified {
		t.Fatalf("refused delivery %+v", refused)
	}
	waitFor(t, 30*time.Second, "the refused event in dead letters", func() bool {
		return strings.Contains(cli("webhook", "list", "--json"), `"dead":1`)
	})
	d.Stop()

	mu.Lock()
	code = http.StatusOK
	mu.Unlock()
	if out := cli("webhook", "replay", ep.ID); !strings.Contains(out, "replaying 1 dead letter") {
		t.Fatalf("webhook replay with the daemon down: %q", out)
	}
	if l := cli("webhook", "list", "--json"); !strings.Contains(l, `"dead":0`) {
		t.Fatalf("after the replay: %s", l)
	}
	select {
	case h := <-got:
		t.Fatalf("a delivery with the daemon down: %+v", h)
	default:
	}
	d2 := startDaemon(t, dir+"/data", args...)
	replayed := next("replayed", d2.Logs)
	if replayed.id != refused.id || replayed.typ != "delivered" || !replayed.verified {
		t.Fatalf("replayed %+v, want webhook-id %s", replayed, refused.id)
	}
	// The daemon logs the replay once the endpoint has answered, which
	// may be after the receiver saw the delivery.
	waitFor(t, 10*time.Second, "the replay line in the log", func() bool {
		return strings.Contains(d2.Logs(), `"webhook dead letter replayed"`)
	})
}

// TestWebhookPrivateAddressRefused: without webhook-allow-private, an
// endpoint whose name resolves to loopback (localhost here; the check is on
// the address dialled, so a public-looking name that resolves there is
// caught the same way) is never reached: its event is a dead letter saying
// why, at the first attempt.
func TestWebhookPrivateAddressRefused(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { hits.Add(1) }))
	defer recv.Close()
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(recv.URL, "http://"))
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir))
	adminCLI(t, d.Data, "webhook", "add", "--tenant", testUser, "--url", "http://localhost:"+port+"/hook")
	var ep struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(adminCLI(t, d.Data, "webhook", "list", "--json")), &ep); err != nil || ep.ID == "" {
		t.Fatalf("webhook list --json: %v", err)
	}
	// The test event is published once the consumer exists, which the
	// daemon makes as it sees the endpoint: repeat until one is refused.
	waitFor(t, 60*time.Second, "the event refused at dial time", func() bool {
		adminCLI(t, d.Data, "webhook", "test", ep.ID)
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			if strings.Contains(d.Logs(), "loopback, private or link-local") {
				return true
			}
			time.Sleep(100 * time.Millisecond) // polling the log with a deadline
		}
		return false
	})
	if l := adminCLI(t, d.Data, "webhook", "list", "--json"); strings.Contains(l, `"dead":0`) {
		t.Fatalf("no dead letter: %s", l)
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("the loopback receiver got %d requests", n)
	}
	if strings.Contains(d.Logs(), `"webhook deferred"`) {
		t.Fatalf("a refused address was retried\n%s", d.Logs())
	}
}
