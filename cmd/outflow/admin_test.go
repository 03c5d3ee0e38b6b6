package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// TestHistoryLineMarksPacedDelays: a throttled envelope of a destination
// with a rate waits for its place at that rate, not for its backoff draw, so
// `queue history` says so beside the delay; `outflow schedule` with the
// line's SEED and WORKER reproduces the draw only.
func TestHistoryLineMarksPacedDelays(t *testing.T) {
	const rec = `{"class":"throttled","rule":"gmail-rate-4.7.28","code":421,"enhanced_code":"4.7.28","reply":"slow down",` +
		`"jitter_seed":"18242577662325950712","jitter_ms":15000,"offset_ms":27792,"delay_ms":1001%s}`
	paced := historyLine(queue.Event{Type: queue.EventThrottled, Attempt: 1, Decision: []byte(strings.Replace(rec, "%s", `,"paced_by":"1.00/s learned"`, 1))})
	if cols := strings.Split(paced, "\t"); cols[6] != "1.001s paced" || cols[8] != "27.792s" {
		t.Errorf("paced decision: delay %q offset %q, want \"1.001s paced\" and 27.792s", cols[6], cols[8])
	}
	drawn := historyLine(queue.Event{Type: queue.EventThrottled, Attempt: 1, Decision: []byte(strings.Replace(rec, "%s", "", 1))})
	if cols := strings.Split(drawn, "\t"); cols[6] != "1.001s" {
		t.Errorf("backoff decision: delay %q, want 1.001s", cols[6])
	}
}

// TestHistoryLineDeadKeepsReason: a dead letter's event carries the last
// attempt's decision record (its CLASS and RULE fill the columns) and the
// REPLY column keeps the reason, which names the budget that was spent.
func TestHistoryLineDeadKeepsReason(t *testing.T) {
	rec := `{"class":"transient","rule":"rfc3463-transient","code":451,"enhanced_code":"4.3.0","reply":"local problem"}`
	cols := strings.Split(historyLine(queue.Event{Type: queue.EventDead, Attempt: 2, Worker: "w/1",
		Reason: "max-attempts: 451 4.3.0 local problem", Decision: []byte(rec)}), "\t")
	if cols[4] != "transient" || cols[5] != "rfc3463-transient" || cols[9] != "max-attempts: 451 4.3.0 local problem" {
		t.Errorf("dead event columns %q", cols)
	}
	cols = strings.Split(historyLine(queue.Event{Type: queue.EventDeferred, Attempt: 1, Reason: "local problem", Decision: []byte(rec)}), "\t")
	if cols[9] != "451 4.3.0 local problem" {
		t.Errorf("deferred event reply %q", cols[9])
	}
}

// TestListRowAttempts: the list's ATTEMPT cell says how many attempts were
// throttled, which do not spend the budget; --json carries the count.
func TestListRowAttempts(t *testing.T) {
	it := queue.Item{Env: &queue.Envelope{ID: "a", Attempt: 7, ThrottleCount: 6}, State: queue.StateThrottled}
	r := listRow(it)
	if got := r.attempts(); got != "7 (6 throttled)" {
		t.Fatalf("ATTEMPT cell %q", got)
	}
	if b, _ := json.Marshal(r); !strings.Contains(string(b), `"attempt":7,"throttle_count":6`) {
		t.Fatalf("json %s", b)
	}
	it.Env.ThrottleCount = 0
	if got := listRow(it).attempts(); got != "7" {
		t.Fatalf("ATTEMPT cell without throttles %q", got)
	}
}

// TestInspectShowsMessageIDAsIs: queue inspect --json prints the
// Message-ID an operator looks up in the receiver's logs as it is,
// <id@host>, not with JSON's HTML escapes (\u003c...\u003e). The text form
// is TestInspectTextShowsEvidence's.
func TestInspectShowsMessageIDAsIs(t *testing.T) {
	view := map[string]any{"envelope": &queue.Envelope{ID: "a", MessageID: "<20261205.1@vm>"},
		"message_headers": []string{"Message-Id: <20261205.1@vm>", "Subject: a & b"}}
	var b bytes.Buffer
	if err := printJSON(&b, view); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	if strings.Contains(out, `\u003c`) || strings.Contains(out, `\u0026`) ||
		!strings.Contains(out, `"message_id":"<20261205.1@vm>"`) ||
		!strings.Contains(out, "Message-Id: <20261205.1@vm>") || !strings.Contains(out, "a & b") {
		t.Errorf("--json output escapes the header text:\n%s", out)
	}
	var back map[string]any
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("--json output is not JSON: %v", err)
	}
}

// TestRateColumn: a learned rate (and a worker's share of one) prints to
// two decimals in dest status and delivery status, a configured one as
// written; %g printed a learned 4.134160073737176/s whole.
func TestRateColumn(t *testing.T) {
	for r, want := range map[float64]string{
		0: "unlimited", 20: "20/s", 0.5: "0.5/s", 4.134160073737176: "4.13/s",
		5.025: "5.03/s", 1.0 / 3: "0.33/s", 0.004: "0.004/s",
	} {
		if got := rate(r); got != want {
			t.Errorf("rate(%v) = %q, want %q", r, got, want)
		}
	}
}

// TestPlateauLine: `dest status` says where a learned rate's steps stop
// and when the next probe over that plateau may come.
func TestPlateauLine(t *testing.T) {
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	s := throttle.DestState{LearnedRate: 1.5, LearnedPlateau: 1.97}
	if got := plateauLine(s, now); !strings.HasPrefix(got, "1.97/s") || !strings.Contains(got, "the steps climb to it") {
		t.Errorf("before the steps reach it: %q", got)
	}
	s.LearnedProbeAt, s.LearnedProbes = now.Add(8*time.Second), 1
	if got := plateauLine(s, now); !strings.Contains(got, "not before 2026-12-05T10:00:08Z") || !strings.Contains(got, "1 probe(s) over it met a throttle") {
		t.Errorf("waiting at it: %q", got)
	}
	if got := plateauLine(s, now.Add(time.Minute)); !strings.Contains(got, "probing over it") {
		t.Errorf("after the wait: %q", got)
	}
}
