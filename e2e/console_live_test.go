package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// waitJS waits up to within for the JavaScript expression cond to hold on
// the page, polling it, and fails the test with the page if it does not.
func waitJS(t *testing.T, ctx context.Context, within time.Duration, what, cond string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		if val(t, ctx, what, chromedp.Evaluate[bool](cond)) {
			return time.Since(start)
		}
		if time.Since(start) > within {
			pageFail(t, ctx, what, fmt.Errorf("%s still false after %s", cond, within))
		}
		time.Sleep(250 * time.Millisecond) // polling a page's state, not an event
	}
}

// TestConsoleSaysWhenNotUpdating: a live table says when it was rendered
// ("updated HH:MM:SSZ"), and when the daemon stops answering, a notice
// above it says since when it is not updating, within 15 s: when the
// daemon hangs (SIGSTOP: the browser's requests wait for ever) and when it
// is gone (killed: they are refused). The notice goes when the daemon
// answers again.
func TestConsoleSaysWhenNotUpdating(t *testing.T) {
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir))
	key := adminCLI(t, d.Data, "apikey", "create", "--tenant", "ops", "--admin")
	ctx := newBrowser(t)
	base := "http://" + d.APIAddr
	stamp := chromedp.CSS(`[data-live] .asof`)
	run(t, ctx, "sign in",
		chromedp.Navigate(base+"/ui/dests"),
		chromedp.WaitVisible(chromedp.ID("key")),
		chromedp.SendKeys(chromedp.ID("key"), key),
		chromedp.Click(chromedp.ID("signin")),
		chromedp.WaitVisible(stamp),
	)
	first := val(t, ctx, "stamp", chromedp.Text(stamp))
	if !regexp.MustCompile(`^updated \d\d:\d\d:\d\dZ$`).MatchString(first) {
		t.Fatalf("the destinations table says %q, want updated HH:MM:SSZ", first)
	}
	// It refreshes (every 5 s): the stamp moves on, and no notice shows.
	waitJS(t, ctx, 15*time.Second, "a refresh", `document.querySelector("[data-live] .asof").textContent !== `+jsString(first))
	const noticeShown = `(function () { var n = document.querySelector("p.stale"); return n !== null && !n.hidden; })()`
	if val(t, ctx, "notice", chromedp.Evaluate[bool](noticeShown)) {
		t.Fatal("a notice shows while the daemon answers")
	}

	// The daemon hangs: its connections are accepted, never answered.
	if err := d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.cmd.Process.Signal(syscall.SIGCONT) })
	last := val(t, ctx, "stamp", chromedp.Text(stamp))
	took := waitJS(t, ctx, 15*time.Second, "the notice for a hung daemon", noticeShown)
	text := val(t, ctx, "notice text", chromedp.Evaluate[string](`document.querySelector("p.stale").textContent`))
	if !strings.Contains(text, "Not updating since "+strings.TrimPrefix(last, "updated ")) {
		t.Fatalf("the notice reads %q, want the time of the last refresh (%s)", text, last)
	}
	if !val(t, ctx, "greyed", chromedp.Evaluate[bool](`document.querySelector("[data-live]").classList.contains("is-stale")`)) {
		t.Error("the stale table is not marked is-stale")
	}
	t.Logf("hung daemon: %s after SIGSTOP: %q", took.Round(time.Second), text)

	// It answers again: the notice goes.
	if err := d.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitJS(t, ctx, 25*time.Second, "the notice gone", `!(`+noticeShown+`)`)

	// It is gone: its port refuses the requests.
	d.Kill()
	took = waitJS(t, ctx, 15*time.Second, "the notice for a stopped daemon", noticeShown)
	text = val(t, ctx, "notice text", chromedp.Evaluate[string](`document.querySelector("p.stale").textContent`))
	if !strings.Contains(text, "Not updating since ") || !strings.Contains(text, "cannot be reached") {
		t.Fatalf("the notice reads %q, want since when and that the daemon cannot be reached", text)
	}
	t.Logf("stopped daemon: %s after the kill: %q", took.Round(time.Second), text)
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s) + `"`
}
