package queue

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	first, second, third := take("a", now), take("a", now), take("a", now)
	if !first || !second || third {
		t.Fatalf("allowance of two: took %v, %v, %v; want true, true, false", first, second, third)
	}
	if !take("b", now) {
		t.Fatal("another name has its own allowance")
	}
	if !take("a", now.Add(31*time.Minute)) || take("a", now.Add(31*time.Minute)) {
		t.Fatal("half an hour refills one of two per hour")
	}
}

// TestClosePassAtDeadline: a pass closed before every part reached it
// gives the notes it holds, the same on every call; a part reaching it
// afterwards is alone, and a complete pass or none owes nothing.
func TestClosePassAtDeadline(t *testing.T) {
	q, _ := startQueue(t)
	ctx := context.Background()
	part := func(msg string, i int) *Envelope {
		return &Envelope{ID: msg + "-" + strconv.Itoa(i), MsgID: msg, Parts: 3}
	}
	if _, err := q.RecordPass(ctx, part("m", 1), json.RawMessage(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := q.RecordPass(ctx, part("m", 2), nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		notes, owed, err := q.ClosePass(ctx, "m")
		if err != nil || !owed || len(notes) != 1 || string(notes[0]) != `{"n":1}` {
			t.Fatalf("close: %s %v %v", notes, owed, err)
		}
	}
	late, err := q.RecordPass(ctx, part("m", 3), json.RawMessage(`{"n":3}`))
	if err != nil || late.Complete || !late.Alone {
		t.Fatalf("a part after the close: %+v %v", late, err)
	}
	again, err := q.RecordPass(ctx, part("m", 1), json.RawMessage(`{"n":"changed"}`))
	if err != nil || !again.Complete || again.Alone || len(again.Notes) != 1 || string(again.Notes[0]) != `{"n":1}` {
		t.Fatalf("a noted part run again after the close: %+v %v", again, err)
	}
	for i := 1; i <= 3; i++ {
		if _, err := q.RecordPass(ctx, part("full", i), json.RawMessage(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	for _, msg := range []string{"full", "none"} {
		if notes, owed, err := q.ClosePass(ctx, msg); err != nil || owed || notes != nil {
			t.Fatalf("%s: %s %v %v", msg, notes, owed, err)
		}
	}
}

// TestNoteDelayOneClaim: the first claim of a message's warning gets the
// other parts' notes (an ended part's taken out) and keeps them across a
// rerun; later parts learn whether the warning listed them.
func TestNoteDelayOneClaim(t *testing.T) {
	q, _ := startQueue(t)
	ctx := context.Background()
	part := func(i int) *Envelope { return &Envelope{ID: "m-" + strconv.Itoa(i), MsgID: "m", Parts: 4} }
	note := func(e *Envelope, n json.RawMessage, claim bool) Delay {
		t.Helper()
		d, err := q.NoteDelay(ctx, e, n, claim)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if d := note(part(1), json.RawMessage(`{"n":1}`), false); d.Warned {
		t.Fatalf("a note before any claim: %+v", d)
	}
	note(part(1), json.RawMessage(`{"n":"1b"}`), false) // replaces its own
	note(part(2), json.RawMessage(`{"n":2}`), false)
	note(part(2), nil, false) // ended
	for range 2 {             // the claim, then the claimer run again
		d := note(part(3), nil, true)
		if !d.Mine || !d.Listed || len(d.Notes) != 1 || string(d.Notes[0]) != `{"n":"1b"}` {
			t.Fatalf("claim: %+v %s", d, d.Notes)
		}
	}
	if d := note(part(1), nil, true); !d.Warned || d.Mine || !d.Listed {
		t.Fatalf("a listed part claiming later: %+v", d)
	}
	if d := note(part(4), json.RawMessage(`{"n":4}`), true); !d.Warned || d.Mine || d.Listed {
		t.Fatalf("a part deferred after the claim: %+v", d)
	}
}

// BenchmarkRecordPass is what a multi-part message's first pass costs per
// part in the KV store: each iteration is one part's record, half of them
// opening a two-part pass and half completing it (a message of one
// destination makes none). sent-ops/op is SENT-bucket reads and writes;
// "synced" waits for the record's fsync as a daemon at the durable default
// does, "unsynced" is the KV operations alone.
//
// go test -run '^$' -bench RecordPass -benchmem ./queue
func BenchmarkRecordPass(b *testing.B) {
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(emb.Shutdown)
	for _, c := range []struct {
		name string
		o    Options
	}{{"synced", Options{Syncer: emb.Syncer()}}, {"unsynced", Options{}}} {
		b.Run(c.name, func(b *testing.B) {
			q, err := connectTo(emb, c.o)
			if err != nil {
				b.Fatal(err)
			}
			defer q.Close()
			benchRecordPass(b, q, c.name)
		})
	}
}

func benchRecordPass(b *testing.B, q *Queue, prefix string) {
	prefix += nuidNext() // every run opens passes of its own
	ctx := context.Background()
	note := json.RawMessage(`{"id":"x","dest":"d.example","failed":[{"final":"a@d.example","action":"failed","status":"5.1.1"}]}`)
	b.ReportAllocs()
	before := q.Ops()
	defer reportCPU(b)()
	i := 0
	for b.Loop() {
		msg := prefix + strconv.Itoa(i/2)
		e := &Envelope{ID: msg + "-" + strconv.Itoa(i%2+1), MsgID: msg, Parts: 2}
		if _, err := q.RecordPass(ctx, e, note); err != nil {
			b.Fatal(err)
		}
		i++
	}
	after := q.Ops()
	kv := after["sent_get"] + after["sent_put"] - before["sent_get"] - before["sent_put"]
	b.ReportMetric(float64(kv)/float64(b.N), "sent-ops/op")
}

// TestPassWaitsListOnlyOpen: a pass wait keeps its first deadline, is
// listed with what its report needs until it is ended, and leaves nothing
// in the bucket's stream once ended, so a listing reads open waits only.
func TestPassWaitsListOnlyOpen(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	due := time.Now().Add(time.Minute).UTC()
	for _, w := range []struct {
		msg string
		due time.Time
	}{{"a", due}, {"b", due}, {"a", due.Add(time.Hour)}} {
		e := &Envelope{ID: w.msg + "-1", MsgID: w.msg, Parts: 2, From: "s@src.example", Tenant: "t"}
		if err := q.WaitPass(ctx, e, []byte("Subject: x\r\n\r\n"), w.due); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.EndPassWait(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	waits, err := q.PassWaits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(waits) != 1 || waits[0].Env.MsgID != "a" || waits[0].Env.From != "s@src.example" || !waits[0].Due.Equal(due) ||
		string(waits[0].Body) != "Subject: x\r\n\r\n" {
		t.Fatalf("waits %+v; want a's alone, with its first deadline", waits)
	}
	for msg, want := range map[string]bool{"a": true, "b": false} {
		if got, err := q.PassWaited(ctx, msg); err != nil || got != want {
			t.Errorf("PassWaited(%s) = %v, %v; want %v", msg, got, err, want)
		}
	}
	st, err := q.sentStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(sentSubject(passWaitKey(">"))))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(info.State.Subjects); n != 1 {
		t.Fatalf("%d pass-wait subjects in the stream, want 1 (an ended wait leaves no marker)", n)
	}
}
