package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
)

// logLines returns the JSON lines of logs whose message is msg.
func logLines(t *testing.T, logs string, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(logs, "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["message"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestOperatorActionsNameTheOperator: `outflow submit`, `queue replay` and
// `queue drop` record who ran them ("admin:USER@HOST", as `outflow dest`
// writes it) in the event `queue history` shows, and the daemon's
// operator log writes a line for each: the submission as the SMTP
// listener's "submission accepted", the replay and the drop with msg_id,
// by and what changed.
func TestOperatorActionsNameTheOperator(t *testing.T) {
	dir := t.TempDir()
	q := testqueue.Connect(t, testqueue.Listening(t, dir), queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The consumer first, as serve makes it at start: it delivers what
	// comes after it.
	if _, err := q.EventConsumer(ctx, operatorLogConfig()); err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	stop := startOperatorLog(ctx, q, zerolog.New(&logs))
	defer stop()
	by := adminBy()

	rootCmd.SetIn(strings.NewReader("Subject: hi\n\nhello\n"))
	if err := execRoot(ctx, nil, "submit", "--data", dir, "--from", "app@src.example", "--to", "ann@one.example"); err != nil {
		t.Fatal(err)
	}
	d, stopWork := testqueue.Take(t, ctx, q, queue.LaneWork)
	id := d.Env.ID
	dead := d.Env.Clone()
	dead.Attempt = 4
	if err := d.Dead(ctx, dead, "max-attempts"); err != nil {
		t.Fatal(err)
	}
	stopWork()

	runAdmin(t, ctx, dir, false, "queue", "replay", id)
	runAdmin(t, ctx, dir, false, "queue", "drop", id)

	hist, err := q.History(ctx, id, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{queue.EventReplayed, queue.EventDropped} {
		i := slices.IndexFunc(hist, func(ev queue.Event) bool { return ev.Type == typ })
		if i < 0 || hist[i].Worker != by {
			t.Errorf("%s event of %s: %+v, want worker_id %q", typ, id, hist, by)
		}
	}

	want := map[string]func(m map[string]any) bool{
		"submission accepted": func(m map[string]any) bool {
			ids, _ := m["ids"].([]any)
			return m["source"] == "nats" && m["by"] == by && len(ids) == 1 && ids[0] == id && m["rcpt_count"] == 1.0
		},
		"message replayed": func(m map[string]any) bool {
			return m["msg_id"] == id && m["by"] == by && m["event"] == "replayed" && m["attempts_made"] == 4.0 &&
				m["attempt_budget_reset"] == true && strings.HasPrefix(m["reason"].(string), "attempt budget reset: was dead after 4 attempt(s)")
		},
		"message dropped": func(m map[string]any) bool {
			return m["msg_id"] == id && m["by"] == by && m["event"] == "dropped" && m["reason"] == "was queued"
		},
	}
	deadline := time.Now().Add(30 * time.Second)
	for msg, ok := range want {
		for {
			lines := logLines(t, logs.String(), msg)
			if len(lines) == 1 && ok(lines[0]) {
				break
			}
			if len(lines) > 1 || time.Now().After(deadline) {
				t.Fatalf("want one %q line for %s by %s, got %v\n%s", msg, id, by, lines, logs.String())
			}
			time.Sleep(50 * time.Millisecond) // polling the log with a deadline
		}
	}
}
