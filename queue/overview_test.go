package queue

import (
	"context"
	"testing"
	"time"
)

// TestLaneStatsAndWaiting: fresh mail counts in the work lane and for its
// destination, a deferral in the retry lane, a held envelope apart from
// the retry lane's schedules.
func TestLaneStatsAndWaiting(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	deferOne(t, q, LaneRetry, time.Now().Add(time.Hour))
	for range 2 {
		if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@w.example"}, Body: []byte("Subject: x\r\n\r\nbody\r\n")}); err != nil {
			t.Fatal(err)
		}
	}

	stats, err := q.LaneStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]LaneStat{}
	for _, s := range stats {
		by[s.Lane] = s
	}
	if len(by) != 5 {
		t.Fatalf("lanes %v, want work, retry, ratelimit, held, dead", stats)
	}
	if by["work"].Depth != 2 || by["work"].Oldest.IsZero() {
		t.Errorf("work lane %+v, want 2 stored with an oldest time", by["work"])
	}
	if by["retry"].Depth != 1 || by["retry"].Due != 0 {
		t.Errorf("retry lane %+v, want one schedule not yet due", by["retry"])
	}
	if by["held"].Depth != 0 || by["dead"].Depth != 0 {
		t.Errorf("held %+v dead %+v, want empty", by["held"], by["dead"])
	}

	waiting, err := q.WaitingByDest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Waiting{}
	for _, w := range waiting {
		got[w.Dest] = w
	}
	if w := got["w.example"]; w.Queued != 2 || w.Total() != 2 {
		t.Errorf("w.example waiting %+v, want 2 queued", w)
	}
	if w := got["d.example"]; w.Deferred != 1 {
		t.Errorf("d.example waiting %+v, want 1 deferred", w)
	}
	if waiting[0].Dest != "w.example" {
		t.Errorf("first %q, want the destination with the most mail", waiting[0].Dest)
	}
}
