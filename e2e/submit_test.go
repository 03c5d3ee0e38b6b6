package e2e

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestSubmitOverNATS: the second submission path. A resubmission with the
// same --idempotency-key (a client retrying after a timeout) is absorbed
// by JetStream's deduplication; without a key, two submissions are two
// messages.
func TestSubmitOverNATS(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none")
	run := func(stdin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(binary, append([]string{"submit", "--data", d.Data, "--from", "app@sender.test"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("submit %v: %v\n%s", args, err, out.String())
		}
		return strings.TrimSpace(out.String())
	}
	body := "Subject: via nats\nMessage-ID: <nats-1@e2e.test>\n\nhello over NATS\n"
	id1 := run(body, "--to", "r@dest.test", "--idempotency-key", "order-42")
	id2 := run(body, "--to", "r@dest.test", "--idempotency-key", "order-42")
	if id1 == "" || id1 != id2 {
		t.Fatalf("same idempotency key gave ids %q and %q", id1, id2)
	}
	run("Subject: two\nMessage-ID: <nats-2@e2e.test>\n\nb\n", "--to", "r@dest.test")
	run("Subject: two\nMessage-ID: <nats-3@e2e.test>\n\nb\n", "--to", "r@dest.test")
	if err := mx.WaitForMessages(3, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ids := messageIDs(bodiesOf(mx.Messages()))
	if ids["<nats-1@e2e.test>"] != 1 || ids["<nats-2@e2e.test>"] != 1 || ids["<nats-3@e2e.test>"] != 1 {
		t.Fatalf("deliveries by Message-ID: %v", ids)
	}
	got := string(mx.Messages()[0].Data)
	if !strings.Contains(got, "hello over NATS\r\n") {
		t.Fatalf("body not CRLF-normalised: %q", got)
	}
	// Bad input gets a clear error, and nothing is queued.
	cmd := exec.Command(binary, "submit", "--data", d.Data, "--to", "not an address")
	cmd.Stdin = strings.NewReader(body)
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "--to") {
		t.Fatalf("bad recipient: %v %s", err, out)
	}
	d.Stop()
}
