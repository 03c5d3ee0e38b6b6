package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"github.com/nats-io/nats.go"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestPoisonMessages mixes three poison messages into a steady stream of
// good mail:
//   - one recipient the destination always refuses with 554 (bounced with
//     the reply logged, no retry),
//   - one recipient the destination always answers 451 (retried until the
//     attempt budget is spent, then parked in dead letters, visible to
//     `outflow queue list --state dead` with its reason),
//   - one envelope corrupted on NATS (a real envelope's JSON truncated and
//     an attempt header garbled, published to the work subject): parked as
//     malformed with the reason logged.
//
// Every good message must arrive exactly once meanwhile.
func TestPoisonMessages(t *testing.T) {
	t.Parallel()
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage != fakemx.StageRcpt {
			return nil
		}
		switch {
		case strings.HasPrefix(arg, "poison5xx@"):
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1}, Message: "Message rejected by policy"}
		case strings.HasPrefix(arg, "poison4xx@"):
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Local error in processing"}
		}
		return nil
	}})
	dir := t.TempDir()
	data := dir + "/data"
	d := startDaemon(t, data, append([]string{"--users", writeUsers(t, dir), "--relay", mx.Addr(),
		"--max-attempts", "3"}, fastRetry...)...)
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer cl.Close()

	good := map[string]bool{}
	sendGood := func(from, to int) {
		for i := from; i < to; i++ {
			id := fmt.Sprintf("good-%d", i)
			if err := submit(cl, "app@sender.test", []string{"g@dest.test"}, message(id, "")); err != nil {
				t.Fatalf("submit %s: %v", id, err)
			}
			good["<"+id+"@e2e.test>"] = true
		}
	}
	sendGood(0, 10)
	if err := submit(cl, "app@sender.test", []string{"poison5xx@dest.test"}, message("poison5xx", "")); err != nil {
		t.Fatal(err)
	}
	if err := submit(cl, "app@sender.test", []string{"poison4xx@dest.test"}, message("poison4xx", "")); err != nil {
		t.Fatal(err)
	}
	sendGood(10, 20)

	// A corrupted envelope on the work subject, as a bit flip or a buggy
	// publisher would leave it.
	nc := natsFor(t, data)
	m := nats.NewMsg("outflow.work.app.dest_test.corrupt1")
	m.Header.Set("Outflow-Attempt", "two")
	m.Data = []byte(`{"id":"corrupt1","msg_id":"corrupt1","tenant":"app","from":"a@sender.test","rcpts":["x@dest.test"],"dest":"dest.t`)
	if err := nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	sendGood(20, 30)

	waitAllDelivered(t, good, mx, 60*time.Second, d.Logs)
	waitFor(t, 30*time.Second, "the 554 to be logged as a bounce", func() bool {
		return d.countLog(`"outcome":"bounced"`, `"code":554`) == 1
	})
	waitFor(t, 60*time.Second, "the always-451 message in dead letters", func() bool {
		return d.countLog(`"moved to dead letters"`, "max-attempts") == 1
	})
	waitFor(t, 30*time.Second, "the corrupted envelope parked", func() bool {
		return d.countLog(`"malformed envelope parked in dead letters"`) == 1
	})
	out, err := runCLI(t, "queue", "list", "--state", "dead", "--data", data, "--json")
	if err != nil {
		t.Fatalf("queue list: %v\n%s", err, out)
	}
	if !strings.Contains(out, "max-attempts") || !strings.Contains(out, "451") {
		t.Errorf("queue list --state dead does not show the spent budget and the reply:\n%s", out)
	}

	// Good mail still flows after the poison, each exactly once; nothing
	// poisoned reached the sink.
	sendGood(30, 40)
	waitAllDelivered(t, good, mx, 60*time.Second, d.Logs)
	got := sinkCounts(mx)
	for id, n := range got {
		if !good[id] {
			t.Errorf("unexpected delivery of %s", id)
		} else if n != 1 {
			t.Errorf("%s delivered %d times", id, n)
		}
	}
	t.Logf("FIGURES poison: good=%d delivered=%d bounced=1 dead(max-attempts)=1 malformed_parked=1 losses=0 duplicates=0",
		len(good), len(got))
	requireNoPanic(t, d.Logs())
	_ = cl.Quit()
	d.Stop()
}
