package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// cli runs the outflow binary with args against the daemon's data dir and
// returns stdout; it fails the test on a non-zero exit unless wantErr.
func (d *daemon) cli(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.cliErr(args...)
	if err != nil {
		t.Fatalf("outflow %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (d *daemon) cliErr(args ...string) (string, error) {
	cmd := exec.Command(binary, append(args, "--data", d.Data)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// listIDs returns the ids `queue list --json` prints for args.
func (d *daemon) listIDs(t *testing.T, args ...string) []string {
	t.Helper()
	out := d.cli(t, append([]string{"queue", "list", "--json"}, args...)...)
	var ids []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var r struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("queue list line %q: %v", line, err)
		}
		ids = append(ids, r.ID)
	}
	return ids
}

func countTo(ms []fakemx.Message, domain string) int {
	n := 0
	for _, m := range ms {
		for _, r := range m.Rcpts {
			if strings.HasSuffix(r, "@"+domain) {
				n++
			}
		}
	}
	return n
}

// TestAdminVerbs runs each operator verb against a running daemon and
// checks its effect on delivery.
func TestAdminVerbs(t *testing.T) {
	var mu sync.Mutex
	refuse := map[string]bool{"deferred.test": true, "dead.test": true, "drop.test": true}
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if refuse[arg[strings.LastIndex(arg, "@")+1:]] {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not now"}
		}
		return nil
	}})
	allow := func(domain string) { mu.Lock(); delete(refuse, domain); mu.Unlock() }
	dir := t.TempDir()
	// Retries an hour away: only an operator can make these messages move.
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--retry-base", "1h", "--retry-min", "1h", "--retry-cap", "2h", "--max-attempts", "3")
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer cl.Close()
	send := func(rcpt, id string) {
		t.Helper()
		if err := submit(cl, "app@sender.test", []string{rcpt}, message(id, "")); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("fast-forward", func(t *testing.T) {
		send("a@deferred.test", "ff")
		var ids []string
		waitFor(t, 30*time.Second, "a deferred message", func() bool {
			ids = d.listIDs(t, "--state", "deferred", "--dest", "deferred.test")
			return len(ids) == 1
		})
		allow("deferred.test")
		out := d.cli(t, "queue", "fast-forward", ids[0])
		if !strings.Contains(out, "due now") {
			t.Fatalf("fast-forward said %q", out)
		}
		waitFor(t, 30*time.Second, "delivery after fast-forward", func() bool { return countTo(mx.Messages(), "deferred.test") == 1 })
		// Fast-forwarding again finds nothing to move: it cannot fire twice.
		if out, err := d.cliErr("queue", "fast-forward", ids[0]); err == nil {
			t.Fatalf("second fast-forward succeeded: %s", out)
		}
		// The daemon publishes the delivered event after the delivery.
		var hist string
		waitFor(t, 30*time.Second, "the whole history", func() bool {
			hist = d.cli(t, "queue", "history", ids[0])
			for _, want := range []string{"queued", "deferred", "fast-forwarded", "delivered", "451"} {
				if !strings.Contains(hist, want) {
					return false
				}
			}
			return true
		})
		if recent := d.cli(t, "queue", "history", ids[0], "--since", "1h"); recent != hist {
			t.Fatalf("history --since 1h differs from the whole history:\n%s\n%s", recent, hist)
		}
		// The message has left every lane: --tenant names its tenant, and
		// only that tenant's share of the events is read.
		var first struct{ Tenant string }
		line, _, _ := strings.Cut(d.cli(t, "queue", "history", ids[0], "--json"), "\n")
		if err := json.Unmarshal([]byte(line), &first); err != nil || first.Tenant == "" {
			t.Fatalf("history --json: %q, %v", line, err)
		}
		if own := d.cli(t, "queue", "history", ids[0], "--tenant", first.Tenant); own != hist {
			t.Fatalf("history --tenant %s differs from the whole history:\n%s\n%s", first.Tenant, own, hist)
		}
		if out, err := d.cliErr("queue", "history", ids[0], "--tenant", first.Tenant+"-other"); err == nil {
			t.Fatalf("another tenant's history of the message: %s", out)
		}
	})

	t.Run("replay a dead letter", func(t *testing.T) {
		send("b@dead.test", "dead")
		var ids []string
		// max-attempts 3 with the fake MX always refusing: each attempt
		// defers for an hour; fast-forward attempts 1 and 2 to spend the
		// budget.
		for attempt := 1; attempt <= 2; attempt++ {
			waitFor(t, 30*time.Second, "deferred after the failed attempt", func() bool {
				ids = d.listIDs(t, "--state", "deferred", "--dest", "dead.test")
				return len(ids) == 1 && strings.Contains(d.cli(t, "queue", "list", "--json", "--dest", "dead.test"), `"attempt":`+string(rune('0'+attempt)))
			})
			d.cli(t, "queue", "fast-forward", ids[0])
		}
		waitFor(t, 30*time.Second, "a dead letter", func() bool { return len(d.listIDs(t, "--state", "dead")) == 1 })
		insp := d.cli(t, "queue", "inspect", ids[0])
		if !strings.Contains(insp, "max-attempts") || !strings.Contains(insp, "not now") {
			t.Fatalf("inspect of the dead letter lacks its evidence:\n%s", insp)
		}
		if countTo(mx.Messages(), "dead.test") != 0 {
			t.Fatal("dead.test got mail while refusing")
		}
		allow("dead.test")
		// Suppressed since it died: the replay is refused, naming the
		// address, and nothing is queued; --include-suppressed sends it.
		d.cli(t, "suppress", "add", "b@dead.test", "--tenant", testUser, "--reason", "hard bounce")
		out, err := d.cliErr("queue", "replay", ids[0])
		if err == nil || !strings.Contains(out, "b@dead.test") || !strings.Contains(out, "suppressed") || !strings.Contains(out, "--include-suppressed") {
			t.Fatalf("replay to a suppressed recipient: %v\n%s", err, out)
		}
		if dead := d.listIDs(t, "--state", "dead"); len(dead) != 1 || len(d.listIDs(t, "--state", "queued")) != 0 {
			t.Fatalf("after the refused replay: dead %v, want the dead letter kept and nothing queued", dead)
		}
		out = d.cli(t, "queue", "replay", ids[0], "--include-suppressed", "--json")
		var replayed struct{ Result string }
		// Standard output has the JSON object; standard error (here in
		// the same buffer, after it) says who did it.
		line, _, _ := strings.Cut(out, "\n")
		if err := json.Unmarshal([]byte(line), &replayed); err != nil || replayed.Result != "queued" {
			t.Fatalf("replay --include-suppressed: %q, %v", out, err)
		}
		waitFor(t, 30*time.Second, "delivery of the replayed dead letter", func() bool { return countTo(mx.Messages(), "dead.test") == 1 })
		if ids := d.listIDs(t, "--state", "dead"); len(ids) != 0 {
			t.Fatalf("dead letters after replay: %v", ids)
		}
	})

	t.Run("drop", func(t *testing.T) {
		send("c@drop.test", "drop")
		var ids []string
		waitFor(t, 30*time.Second, "deferred", func() bool {
			ids = d.listIDs(t, "--state", "deferred", "--dest", "drop.test")
			return len(ids) == 1
		})
		d.cli(t, "queue", "drop", ids[0])
		if left := d.listIDs(t, "--dest", "drop.test"); len(left) != 0 {
			t.Fatalf("still listed after drop: %v", left)
		}
		if out, err := d.cliErr("queue", "inspect", ids[0]); err == nil || !strings.Contains(out, "no such message") {
			t.Fatalf("inspect after drop: %v %s", err, out)
		}
		if !strings.Contains(d.cli(t, "queue", "history", ids[0]), "dropped") {
			t.Fatal("no dropped event")
		}
	})

	t.Run("suspend and resume", func(t *testing.T) {
		d.cli(t, "dest", "suspend", "slow.test", "--for", "1h", "--reason", "provider asked us to back off")
		if !strings.Contains(d.cli(t, "dest", "list"), "provider asked us to back off") {
			t.Fatal("dest list does not show the suspension")
		}
		send("x@slow.test", "slow")
		send("y@fast.test", "fast")
		waitFor(t, 30*time.Second, "fast.test delivery while slow.test is suspended", func() bool { return countTo(mx.Messages(), "fast.test") == 1 })
		waitFor(t, 30*time.Second, "slow.test deferred by the suspension", func() bool {
			return len(d.listIDs(t, "--state", "deferred", "--dest", "slow.test")) == 1
		})
		if countTo(mx.Messages(), "slow.test") != 0 {
			t.Fatal("a suspended destination got mail")
		}
		st := d.cli(t, "dest", "status", "slow.test")
		if !strings.Contains(st, "suspended:     until") || !strings.Contains(st, "1 deferred") {
			t.Fatalf("dest status:\n%s", st)
		}
		d.cli(t, "dest", "resume", "slow.test")
		waitFor(t, 30*time.Second, "delivery after resume", func() bool { return countTo(mx.Messages(), "slow.test") == 1 })
	})

	t.Run("clear errors", func(t *testing.T) {
		if out, err := d.cliErr("queue", "inspect", "nosuchid"); err == nil || !strings.Contains(out, "no such message") {
			t.Fatalf("unknown id: %v %q", err, out)
		}
		out, err := exec.Command(binary, "queue", "list", "--data", t.TempDir()).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "outflow serve") {
			t.Fatalf("unreachable daemon: %v %q", err, out)
		}
	})
	d.Stop()
}

// daemonLines returns the daemon's JSON log lines whose message is msg.
func daemonLines(d *daemon, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(d.Logs(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestOperatorActionsInTheDaemonLog: what an operator does to a message
// from a shell is in the daemon's log, which is what operators collect: a
// message submitted over NATS (`outflow submit`) gets the "submission
// accepted" line the SMTP listener writes, a replayed dead letter and a
// dropped message one line each with msg_id and by, the operator as
// `outflow dest` names one (admin:USER@HOST). `queue history` shows by,
// and the command itself says who did it on standard error.
func TestOperatorActionsInTheDaemonLog(t *testing.T) {
	var mu sync.Mutex
	refuse := true
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		mu.Lock()
		defer mu.Unlock()
		if refuse && strings.HasSuffix(arg, "@dead.test") {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "not now"}
		}
		return nil
	}})
	dir := t.TempDir()
	// One attempt: the first 451 makes a dead letter; retries an hour away.
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--retry-base", "1h", "--retry-min", "1h", "--retry-cap", "2h", "--max-attempts", "1")
	host, _ := os.Hostname()
	by := "admin:e2e-operator@" + host
	run := func(stdin string, args ...string) (stdout, stderr string) {
		t.Helper()
		cmd := exec.Command(binary, append(args, "--data", d.Data)...)
		cmd.Env = append(os.Environ(), "USER=e2e-operator")
		cmd.Stdin = strings.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		if err := cmd.Run(); err != nil {
			t.Fatalf("outflow %s: %v\n%s%s", strings.Join(args, " "), err, o.String(), e.String())
		}
		return o.String(), e.String()
	}
	// waitLine waits for the one line msg with these fields.
	waitLine := func(msg string, fields map[string]any) map[string]any {
		t.Helper()
		var got []map[string]any
		waitFor(t, 30*time.Second, "the daemon's "+msg+" line", func() bool {
			got = nil
			for _, m := range daemonLines(d, msg) {
				match := true
				for k, v := range fields {
					if m[k] != v {
						match = false
					}
				}
				if match {
					got = append(got, m)
				}
			}
			return len(got) > 0
		})
		time.Sleep(time.Second) // a second line would come now: a fleet of one logs each once
		if n := len(daemonLines(d, msg)); n != 1 {
			t.Fatalf("%d %q lines, want 1:\n%s", n, msg, d.Logs())
		}
		return got[0]
	}

	// A message submitted over NATS, to be sent in an hour: no listener
	// of the daemon saw it.
	subOut, subErr := run("Subject: nats\nMessage-ID: <op-1@e2e.test>\n\nhello\n", "submit", "--from", "app@sender.test", "--to", "c@drop.test",
		"--send-at", time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	dropID := strings.TrimSpace(subOut)
	if dropID == "" || subErr != "" {
		t.Fatalf("submit: stdout %q, stderr %q", subOut, subErr)
	}
	sub := waitLine("submission accepted", map[string]any{"source": "nats", "by": by})
	if ids, _ := sub["ids"].([]any); len(ids) != 1 || ids[0] != dropID || sub["tenant"] != "nats" {
		t.Fatalf("submission accepted line %v, want ids [%s]", sub, dropID)
	}

	// A dead letter, replayed.
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer cl.Close()
	if err := submit(cl, "app@sender.test", []string{"b@dead.test"}, message("op-dead", "")); err != nil {
		t.Fatal(err)
	}
	var dead []string
	waitFor(t, 30*time.Second, "a dead letter", func() bool { dead = d.listIDs(t, "--state", "dead"); return len(dead) == 1 })
	mu.Lock()
	refuse = false
	mu.Unlock()
	out, errOut := run("", "queue", "replay", dead[0])
	if want := dead[0] + ": queued again for 1 recipient(s) (replay 1)\n"; out != want {
		t.Errorf("replay printed %q, want %q", out, want)
	}
	if !strings.Contains(errOut, dead[0]+" replayed by "+by) {
		t.Errorf("replay's standard error %q does not say who replayed it", errOut)
	}
	rp := waitLine("message replayed", map[string]any{"msg_id": dead[0]})
	if rp["by"] != by || rp["event"] != "replayed" || rp["attempts_made"] != 1.0 || rp["attempt_budget_reset"] != true ||
		!strings.HasPrefix(rp["reason"].(string), "attempt budget reset: was dead after 1 attempt(s)") {
		t.Errorf("replayed line %v, want by %s, the attempt spent and the budget reset", rp, by)
	}
	waitFor(t, 30*time.Second, "delivery of the replayed dead letter", func() bool { return countTo(mx.Messages(), "dead.test") == 1 })

	// The NATS submission, waiting for its time, dropped.
	if deferred := d.listIDs(t, "--state", "deferred", "--dest", "drop.test"); len(deferred) != 1 || deferred[0] != dropID {
		t.Fatalf("deferred to drop.test: %v, want %s", deferred, dropID)
	}
	if _, errOut := run("", "queue", "drop", dropID); !strings.Contains(errOut, dropID+" dropped by "+by) {
		t.Errorf("drop's standard error %q does not say who dropped it", errOut)
	}
	dr := waitLine("message dropped", map[string]any{"msg_id": dropID})
	if dr["by"] != by || dr["event"] != "dropped" || !strings.HasPrefix(dr["reason"].(string), "was deferred, next attempt ") {
		t.Errorf("dropped line %v, want by %s and where it was", dr, by)
	}
	// queue history shows who, in its WORKER column.
	for _, id := range []string{dead[0], dropID} {
		if hist := d.cli(t, "queue", "history", id); !strings.Contains(hist, by) {
			t.Errorf("queue history %s does not name %s:\n%s", id, by, hist)
		}
	}
	d.Stop()
}
