package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// chromiumPath is Debian's chromium, which `make deps` installs.
const chromiumPath = "/usr/bin/chromium"

// newBrowser starts a headless Chromium with a fresh profile, its window
// 1280×800, and returns a chromedp context for it. The flags keep it from
// reaching anything but the test's servers (the closed network refuses
// the background connections and the browser would keep retrying them).
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromiumPath
	if _, err := os.Stat(path); err != nil {
		if p, lerr := exec.LookPath("chromium"); lerr == nil {
			path = p
		} else {
			t.Skip("chromium is not installed (make deps installs it): the console's browser test needs it")
		}
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true), // tests run as root, where the sandbox cannot start
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel)
	// The first run starts the browser; it must not carry a timeout (that
	// would stop the browser with it).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// run runs browser steps with a deadline, failing the test on error.
func run(t *testing.T, ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		pageFail(t, ctx, what, err)
	}
}

// val runs one browser action that returns a value.
func val[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(tctx, a)
	if err != nil {
		pageFail(t, ctx, what, err)
	}
	return v
}

// pageFail fails the test with where the browser is and what it shows.
func pageFail(t *testing.T, ctx context.Context, what string, err error) {
	t.Helper()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(dctx, chromedp.Location())
	body, _ := chromedp.Run(dctx, chromedp.OuterHTML(chromedp.CSS("main")))
	t.Fatalf("%s: %v\nat %s\n%s", what, err, loc, body)
}

// screenshot saves the page to docs/console/name.png when
// OUTFLOW_SCREENSHOTS is set (so that ordinary runs leave the tree alone).
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("OUTFLOW_SCREENSHOTS") == "" {
		return
	}
	png := val(t, ctx, "screenshot "+name, chromedp.FullScreenshot(100))
	p := filepath.Join("..", "docs", "console", name+".png")
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", p)
}

// reloadUntil loads url until the JavaScript expression cond holds on it
// (up to a minute).
func reloadUntil(t *testing.T, ctx context.Context, url, cond string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		run(t, ctx, "load "+url, chromedp.Navigate(url), chromedp.WaitReady(chromedp.CSS("main")))
		if val(t, ctx, "check "+cond, chromedp.Evaluate[bool](cond)) {
			return
		}
		if time.Now().After(deadline) {
			pageFail(t, ctx, url, errors.New(cond+" still false after a minute"))
		}
		time.Sleep(time.Second) // a page reload, not an event to wait on
	}
}

// TestConsoleInBrowser drives the console in a real browser: it signs in
// with an admin key, finds the destination a fake MX throttles (421 4.7.28),
// suspends it and sees the state change, opens the throttled message, sees
// its retry timeline, fast-forwards it and sees it delivered, then finds it
// by its recipient.
func TestConsoleInBrowser(t *testing.T) {
	var throttling atomic.Bool
	throttling.Store(true)
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		switch {
		case strings.Contains(arg, "@throttled.example") && throttling.Load():
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28}, Message: "Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."}
		case strings.HasPrefix(arg, "gone@"):
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "The email account that you tried to reach does not exist."}
		}
		return nil
	}})
	dir := t.TempDir()
	// A long rate-limit lane keeps the throttled message waiting until the
	// browser fast-forwards it.
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--ratelimit-base", "30m", "--ratelimit-min", "20m", "--ratelimit-cap", "2h")
	cli := func(args ...string) string {
		t.Helper()
		return adminCLI(t, d.Data, args...)
	}
	key := cli("apikey", "create", "--tenant", "ops", "--admin")

	// Some traffic for the overview's charts: delivered mail, a bounce,
	// and the message the destination throttles.
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	for i := range 4 {
		if err := submit(c, "app@sender.test", []string{"user@ok.example"}, message("ok"+string(rune('a'+i)), "")); err != nil {
			t.Fatal(err)
		}
	}
	if err := submit(c, "app@sender.test", []string{"gone@ok.example"}, message("gone", "")); err != nil {
		t.Fatal(err)
	}
	hostile := []byte("From: app@sender.test\r\nTo: buyer@throttled.example\r\nSubject: <script>alert('xss')</script> your order\r\n" +
		"Message-ID: <throttled@e2e.test>\r\n\r\nbody\r\n")
	if err := submit(c, "app@sender.test", []string{"buyer@throttled.example"}, hostile); err != nil {
		t.Fatal(err)
	}
	c.Quit()
	var id string
	waitFor(t, 60*time.Second, "the message on the rate-limit lane", func() bool {
		out := cli("queue", "list", "--state", "throttled", "--dest", "throttled.example", "--json")
		var row struct {
			ID string `json:"id"`
		}
		if json.Unmarshal([]byte(out), &row) == nil && row.ID != "" {
			id = row.ID
			return true
		}
		return false
	})
	if err := mx.WaitForMessages(4, 60*time.Second); err != nil {
		t.Fatal(err)
	}

	ctx := newBrowser(t)
	base := "http://" + d.APIAddr

	// Sign in: an unauthenticated request lands on the sign-in page.
	run(t, ctx, "open the console", chromedp.Navigate(base+"/ui/dests"), chromedp.WaitVisible(chromedp.ID("key")))
	if loc := val(t, ctx, "location", chromedp.Location()); !strings.Contains(loc, "/ui/login") {
		t.Fatalf("unauthenticated /ui/dests went to %s, want the sign-in page", loc)
	}
	destRow := chromedp.CSS(`tr[data-dest="throttled.example"]`)
	run(t, ctx, "sign in",
		chromedp.SendKeys(chromedp.ID("key"), key),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(destRow),
	)
	if text := val(t, ctx, "state", chromedp.Text(chromedp.CSS(`tr[data-dest="throttled.example"] td.state`))); !strings.Contains(text, "throttled") {
		t.Fatalf("throttled.example's state reads %q, want throttled", text)
	}

	// The overview: its charts fill from the events stream.
	reloadUntil(t, ctx, base+"/ui/", `document.querySelectorAll("figure.delivered rect").length > 0 && document.querySelectorAll("figure.bounced rect").length > 0 && document.querySelector('tr[data-dest="throttled.example"]') !== null`)
	screenshot(t, ctx, "overview")

	// Suspend it from its page and see the state change.
	run(t, ctx, "suspend",
		chromedp.Click(chromedp.CSS(`tr[data-dest="throttled.example"] a`)),
		chromedp.WaitVisible(chromedp.ID("suspend-form")),
		chromedp.SetValue(chromedp.CSS(`#suspend-form input[name="for"]`), "45m"),
		chromedp.SendKeys(chromedp.CSS(`#suspend-form input[name="reason"]`), "provider incident"),
		chromedp.Click(chromedp.ID("suspend")),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
	)
	if text := val(t, ctx, "dest state", chromedp.Text(chromedp.ID("dest-state"))); !strings.Contains(text, "suspended until") || !strings.Contains(text, "provider incident") {
		t.Fatalf("destination state after suspend:\n%s", text)
	}
	if st := cli("dest", "status", "throttled.example"); !strings.Contains(st, "provider incident") {
		t.Fatalf("dest status does not show the console's suspension:\n%s", st)
	}
	screenshot(t, ctx, "destination")

	// The MX recovers; open the throttled message and see its timeline.
	throttling.Store(false)
	run(t, ctx, "open the message",
		chromedp.Click(chromedp.CSS(`tr[data-id="`+id+`"] a`)),
		chromedp.WaitVisible(chromedp.CSS("#timeline svg")),
	)
	if text := val(t, ctx, "message state", chromedp.Text(chromedp.ID("msg-state"))); text != "throttled" {
		t.Fatalf("message state %q, want throttled", text)
	}
	if headers := val(t, ctx, "headers", chromedp.Text(chromedp.ID("headers"))); !strings.Contains(headers, "<script>alert('xss')</script>") {
		t.Fatalf("headers shown as %q, want the Subject as text", headers)
	}
	if n := val(t, ctx, "scripts", chromedp.Evaluate[int](`document.querySelectorAll("main script").length`)); n != 0 {
		t.Fatal("the hostile Subject became a script element")
	}
	if n := val(t, ctx, "strips", chromedp.Evaluate[int](`Array.from(document.querySelectorAll("#timeline svg text")).filter(e => e.textContent.startsWith("attempt ")).length`)); n < 1 {
		t.Fatal("the timeline has no attempt strip")
	}
	screenshot(t, ctx, "message")

	// Fast-forward, confirm, and see it delivered although the
	// destination is still suspended (a fast-forward is a probe).
	run(t, ctx, "fast-forward",
		chromedp.Click(chromedp.ID("fast-forward")),
		chromedp.WaitVisible(chromedp.ID("confirm")),
		chromedp.Click(chromedp.ID("confirm")),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
	)
	if text := val(t, ctx, "notice", chromedp.Text(chromedp.CSS(".flash"))); !strings.Contains(text, "due now") {
		t.Fatalf("after fast-forward: %q", text)
	}
	reloadUntil(t, ctx, base+"/ui/messages/"+id, `document.querySelector("#history .badge.delivered") !== null`)
	delivered := false
	for _, m := range mx.Messages() {
		if bytes.Contains(m.Data, []byte("<throttled@e2e.test>")) {
			delivered = true
		}
	}
	if !delivered {
		t.Fatal("the console shows the message delivered but the MX has not received it")
	}

	// Find it by its recipient: nothing waits any more, and its events
	// (throttled, then delivered) are one link away.
	run(t, ctx, "search by recipient",
		chromedp.Navigate(base+"/ui/queue"),
		chromedp.WaitVisible(chromedp.CSS(`form.search input[name="rcpt"]`)),
		chromedp.SendKeys(chromedp.CSS(`form.search input[name="rcpt"]`), "Buyer@throttled.example"),
		chromedp.Click(chromedp.CSS(`form.search button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.CSS(`a[href^="/ui/find?"]`)),
		chromedp.Click(chromedp.CSS(`a[href^="/ui/find?"]`)),
		chromedp.WaitVisible(chromedp.CSS(`tr[data-id="`+id+`"]`)),
	)
	events := val(t, ctx, "found events", chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('tr[data-id="`+id+`"] td:nth-child(2)')).map(e => e.textContent)`))
	if !slices.Contains(events, "delivered") || !slices.Contains(events, "throttled") {
		t.Fatalf("the find page shows %q for %s, want throttled and delivered", events, id)
	}
	screenshot(t, ctx, "find")

	// On a phone (390×844, the viewport meta honoured): no page is wider
	// than the screen; wide tables scroll inside their own box.
	run(t, ctx, "phone", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	for _, p := range []string{"/ui/", "/ui/dests", "/ui/dests/throttled.example", "/ui/messages/" + id, "/ui/queue", "/ui/dead", "/ui/suppressions",
		"/ui/find?rcpt=buyer@throttled.example"} {
		run(t, ctx, "phone "+p, chromedp.Navigate(base+p), chromedp.WaitReady(chromedp.CSS("main")))
		if w := val(t, ctx, "width", chromedp.Evaluate[int](`document.documentElement.scrollWidth - 390`)); w > 2 {
			t.Errorf("%s on a phone is %d px wider than the screen", p, w)
		}
		if p == "/ui/" {
			screenshot(t, ctx, "overview-phone")
		}
	}
}
