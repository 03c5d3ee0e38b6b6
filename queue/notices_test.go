package queue

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRecordPassOneCompleter: parts recording at once count once each;
// exactly one write completes the pass, a part run again afterwards reads
// the same notes, and a note too large for the record is the part's alone.
func TestRecordPassOneCompleter(t *testing.T) {
	q, _ := startQueue(t)
	ctx := context.Background()
	const parts = 4
	part := func(i int) *Envelope {
		return &Envelope{ID: "m-" + strconv.Itoa(i), MsgID: "m", Parts: parts}
	}
	var mu sync.Mutex
	var completers []Pass
	var wg sync.WaitGroup
	for i := range parts - 1 {
		wg.Go(func() {
			note := json.RawMessage(`{"n":` + strconv.Itoa(i) + `}`)
			if i == 1 {
				note = nil // nothing to report
			}
			p, err := q.RecordPass(ctx, part(i), note)
			if err != nil {
				t.Error(err)
				return
			}
			if p.Complete {
				mu.Lock()
				completers = append(completers, p)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(completers) != 0 {
		t.Fatalf("%d of %d parts completed a pass of %d", len(completers), parts-1, parts)
	}
	big := json.RawMessage(`"` + strings.Repeat("x", passMaxBytes) + `"`)
	p, err := q.RecordPass(ctx, part(parts-1), big)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Complete || !p.Alone || len(p.Notes) != 2 || string(p.Notes[0]) != `{"n":0}` || string(p.Notes[1]) != `{"n":2}` {
		t.Fatalf("last part: complete %v alone %v notes %s", p.Complete, p.Alone, p.Notes)
	}
	again, err := q.RecordPass(ctx, part(0), json.RawMessage(`{"n":"changed"}`))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Complete || again.Alone || len(again.Notes) != 2 || string(again.Notes[0]) != `{"n":0}` {
		t.Fatalf("a part run again: complete %v alone %v notes %s", again.Complete, again.Alone, again.Notes)
	}
}

// TestTakeAllowance: one allowance per name, refilled with time.
func TestTakeAllowance(t *testing.T) {
	q, _ := startQueue(t)
	ctx := context.Background()
	now := time.Now()
	take := func(name string, at time.Time) bool {
		ok, err := q.TakeAllowance(ctx, name, 2, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take("a", now) || !take("a", now) || take("a", now) {
		t.Fatal("want two, then refused")
	}
	if !take("b", now) {
		t.Fatal("another name has its own allowance")
	}
	if !take("a", now.Add(31*time.Minute)) || take("a", now.Add(31*time.Minute)) {
		t.Fatal("half an hour refills one of two per hour")
	}
}
