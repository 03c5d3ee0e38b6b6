package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// TestInspectPrintsTextOrJSON: `queue inspect` prints lines for a person,
// as `dest status` does, and with --json the one JSON object scripts
// read, with the keys it always had.
func TestInspectPrintsTextOrJSON(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
	if err := execRoot(ctx, nil, "submit", "--data", dir, "--from", "app@src.example", "--to", "ann@one.example"); err != nil {
		t.Fatal(err)
	}
	items, err := q.List(ctx, queue.Filter{State: queue.StateQueued})
	if err != nil || len(items) != 1 {
		t.Fatalf("queued %d, %v", len(items), err)
	}
	id := items[0].Env.ID

	text := runAdmin(t, ctx, dir, false, "queue", "inspect", id)
	var v any
	if json.Unmarshal([]byte(text), &v) == nil {
		t.Fatalf("queue inspect without --json printed JSON:\n%s", text)
	}
	for _, want := range []string{"id:              " + id + "\n", "state:           queued\n", "tenant:          ",
		"recipients:      ann@one.example\n", "destination:     one.example\n", "attempt:         0, replay 0\n",
		"\nattempt metadata:\n", "\nmessage headers:\n", "  Subject: hi\n"} {
		if !strings.Contains(text, want) {
			t.Errorf("queue inspect lacks %q:\n%s", want, text)
		}
	}

	obj := oneObject(t, runAdmin(t, ctx, dir, true, "queue", "inspect", id))
	for _, k := range []string{"id", "state", "envelope", "attempt", "headers", "message_headers", "stream_seq"} {
		if _, ok := obj[k]; !ok {
			t.Errorf("queue inspect --json lacks %q: %v", k, obj)
		}
	}
	if obj["id"] != id || obj["state"] != "queued" {
		t.Errorf("queue inspect --json: id %v state %v, want %s queued", obj["id"], obj["state"], id)
	}
}

// TestInspectTextShowsEvidence: the text form of a dead letter carries
// the evidence whole (its reason and last reply, which the list cuts
// short), its attempts, and the message's headers with the Message-ID as
// the receiver's log has it; a control character a tenant or a remote
// server put in a header or a reply is shown escaped, not sent to the
// operator's terminal.
func TestInspectTextShowsEvidence(t *testing.T) {
	at := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	reply := "451 4.3.0 local problem, not now, please try again much later than this \x1b[2J"
	it := &queue.Item{State: queue.StateDead, Subject: "outflow.dead.abc", Seq: 7, Stored: at,
		DeadReason: "max-attempts: " + reply,
		Header:     nats.Header{"Outflow-Attempt": []string{"2"}, "Outflow-Last-Class": []string{"transient"}, "Content-Type": []string{"x"}},
		Env: &queue.Envelope{ID: "abc", MsgID: "m1", Parts: 2, Tenant: "app", From: "app@src.example", Rcpts: []string{"b@dead.test"},
			Dest: "dead.test", BodyRef: "m1", Size: 1234, SubmittedAt: at, MessageID: "<20261205.1@vm>", Attempt: 2, LastClass: "transient",
			LastReply: reply, History: []queue.Attempt{{At: at, Attempt: 1, Worker: "w/0", Class: "transient", Rule: "rfc3463-transient",
				Code: 451, Enhanced: "4.3.0", Reply: "local problem", Lane: "retry", DelayMs: 1500}}}}
	in := inspection{it: it, headers: []string{"Message-Id: <20261205.1@vm>", "Subject: a & b \x1b]0;owned\x07"}, keptUntil: at.Add(14 * 24 * time.Hour)}
	var b strings.Builder
	if err := in.writeText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"state:           dead\n",
		"message:         m1 (2 part(s), one per destination)\n",
		"dead reason:     max-attempts: 451 4.3.0 local problem, not now, please try again much later than this \\x1b[2J\n",
		"last reply:      451 4.3.0 local problem, not now",
		"message-id:      <20261205.1@vm>\n",
		"body:            stored apart (m1), kept until 2026-12-19T10:00:00Z\n",
		"451 4.3.0 local problem", "rfc3463-transient", "1.5s",
		"  Outflow-Attempt: 2\n", "  Message-Id: <20261205.1@vm>\n", `  Subject: a & b \x1b]0;owned\a` + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect text lacks %q:\n%s", want, out)
		}
	}
	if strings.ContainsAny(out, "\x1b\x07") {
		t.Errorf("inspect text passes control characters through:\n%q", out)
	}
	if strings.Contains(out, "Content-Type") {
		t.Errorf("inspect text shows a header that is not attempt metadata:\n%s", out)
	}
	if got := printable("ok\tfine \xff é"); got != `ok	fine \xff é` {
		t.Errorf("printable: %q", got)
	}
}
