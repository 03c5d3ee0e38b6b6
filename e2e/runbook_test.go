package e2e

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// runbookScript turns every "$ " line inside the code blocks of
// docs/runbook.md into one bash script, in order.
func runbookScript(t *testing.T, httpAddr string) string {
	t.Helper()
	f, err := os.Open("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b strings.Builder
	b.WriteString("set -euo pipefail\n")
	in := false
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "```") {
			in = !in
			continue
		}
		if !in || !strings.HasPrefix(line, "$ ") {
			continue
		}
		cmd := strings.ReplaceAll(strings.TrimPrefix(line, "$ "), "127.0.0.1:9090", httpAddr)
		b.WriteString("echo '>>> " + strings.ReplaceAll(cmd, "'", `'"'"'`) + "'\n" + cmd + "\n")
		n++
	}
	if n < 15 {
		t.Fatalf("found only %d commands in docs/runbook.md", n)
	}
	return b.String()
}

// TestRunbookCommands stages a throttle incident (a destination answering
// 421 4.7.28, a dead letter, an unknown outcome held for an operator) and
// runs every command of docs/runbook.md against it, in order.
func TestRunbookCommands(t *testing.T) {
	var mu sync.Mutex
	throttles, learnThrottles := 0, 0
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case stage == fakemx.StageRcpt && strings.HasSuffix(arg, "@learned.test") && learnThrottles < 2:
			learnThrottles++
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28}, Message: "Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."}
		case stage == fakemx.StageRcpt && strings.HasSuffix(arg, "@throttled.test") && throttles < 9:
			// Each of the three is throttled three times. The second
			// comes back at once, within the learn hold of the first (one
			// overshoot); the third waits the rate-limit lane's minimum
			// (an hour here).
			throttles++
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28}, Message: "Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."}
		case stage == fakemx.StageRcpt && strings.HasSuffix(arg, "@broken.test"):
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "local problem"}
		case stage == fakemx.StageDot && strings.Contains(arg, "lost.test"):
			return fakemx.Drop
		}
		return nil
	}})
	dir := t.TempDir()
	// throttled.test has a configured rate; learned.test has none and
	// learns one from its throttles.
	conf := filepath.Join(dir, "outflow.toml")
	if err := os.WriteFile(conf, []byte("[destinations.\"throttled.test\"]\nrate = 20\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, filepath.Join(dir, "data"), "--config", conf, "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--unknown-policy", "hold", "--max-attempts", "2",
		"--retry-base", "50ms", "--retry-min", "50ms", "--retry-cap", "100ms",
		"--ratelimit-base", "1h", "--ratelimit-min", "1h", "--ratelimit-cap", "2h")
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	for i, rcpt := range []string{"a@throttled.test", "b@throttled.test", "c@throttled.test", "x@broken.test", "y@lost.test", "l@learned.test"} {
		if err := submit(cl, "app@sender.test", []string{rcpt}, message("rb"+string(rune('0'+i)), "")); err != nil {
			t.Fatal(err)
		}
	}
	_ = cl.Quit()
	defer func() {
		if t.Failed() {
			t.Logf("queue:\n%s", d.cli(t, "queue", "list"))
		}
	}()
	waitFor(t, 30*time.Second, "the incident: 3 throttled, 1 dead, 1 held, a rate learned", func() bool {
		return len(d.listIDs(t, "--state", "throttled", "--dest", "throttled.test")) == 3 && len(d.listIDs(t, "--state", "dead")) == 1 &&
			len(d.listIDs(t, "--state", "unknown")) == 1 && !strings.Contains(d.cli(t, "dest", "status", "learned.test"), "learned:       nothing")
	})
	cmd := exec.Command("bash", "-c", runbookScript(t, d.HTTPAddr))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(binary)+":"+os.Getenv("PATH"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		t.Fatalf("runbook failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{"throttled.test: at most 5/s", "suspended until", "throttled.test: resumed", "throttled.test: rate cap cleared", "queued again",
		"/s since", "learned.test: learned limits cleared", "outflow_dest_learned_rate{dest=\"learned.test\"}",
		"(all of throttled.test's mail, from any source", "event(s) of"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("runbook output lacks %q", want)
		}
	}
	if os.Getenv("OUTFLOW_SHOW_RUNBOOK") != "" {
		t.Log(out.String())
	}
	// After the runbook: the throttled mail and the replayed dead letter
	// are delivered; the held message was dropped.
	waitFor(t, 30*time.Second, "the backlog delivered after resume", func() bool { return countTo(mx.Messages(), "throttled.test") == 3 })
	d.Stop()
}
