package queue

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"
	"time"
)

// sampleDecision is a delivered message's decision record as
// backoff.Record's MarshalJSON writes it.
const sampleDecision = `{"msg_id":"01JABCDEF","tenant":"billing","dest":"one.example","attempt":1,"backoff_attempt":0,` +
	`"worker_id":"w/1","class":"delivered","rule":"2xx","code":250,"enhanced_code":"2.0.0","reply":"Ok: queued as \u003cX\u003e",` +
	`"lane":"","base_ms":0,"min_ms":0,"multiplier":0,"window_ms":0,"nominal_ms":0,"cap_ms":0,"jitter_seed":"0",` +
	`"jitter_ms":0,"offset_ms":0,"hint_ms":0,"delay_ms":0,"next_attempt_at":""}`

func sampleEvents() []*Event {
	at := time.Date(2026, 12, 2, 5, 6, 7, 123456789, time.UTC)
	return []*Event{
		{Type: EventQueued, Time: at, ID: "abc", MsgID: "abc", Tenant: "t1", Dest: "one.example", Rcpts: 1, Size: 2048},
		{Type: EventDelivered, Time: at.In(time.FixedZone("x", 3600)), ID: "abc-2", Attempt: 3, Worker: "w/1",
			Recipients: []string{"a@one.example", "b@one.example"}, Decision: json.RawMessage(`{"class":"delivered","reply":"250 \u003cok\u003e"}`)},
		{Type: EventBounced, ID: "x", Reason: "550 5.1.1 <user@example> \"quoted\" \\ back\r\n\ttab \x00\x1f & > \u2028\u2029 ü 日本 \xff\xfe end"},
		{Type: EventLearned, ID: "dest", State: json.RawMessage(`{"rate":1.5}`)},
		{Type: EventBounced, ID: "abc-4", Tenant: "t1", Recipients: []string{"a@one.example"}, Reason: "550 5.1.1 gone", Async: true},
		{},
		{Type: EventDelivered, Time: at, ID: "abc-3", Attempt: 1, Worker: "w/1", Recipients: []string{"a@one.example"},
			Decision: json.RawMessage(sampleDecision), DecisionMarshaled: true},
		{Type: EventDelivered, Time: at, ID: "abc-5", Attempt: 1, Recipients: []string{"a@one.example", "b@one.example"},
			Notify: &Notify{Sender: "app@shop.example", Submitted: at, MessageID: "<m1@shop.example>", EnvID: "env<1>",
				Rcpts: []NotifyRcpt{{Rcpt: "a@one.example", ORcpt: "A@one.example", ORcptType: "rfc822"}, {Rcpt: "b@one.example", Notify: []string{"SUCCESS", "FAILURE"}}}},
			Decision: json.RawMessage(sampleDecision), DecisionMarshaled: true},
	}
}

// sampleEvent is the sample event with id (by id, not by place: the
// list grows).
func sampleEvent(tb testing.TB, id string) *Event {
	for _, ev := range sampleEvents() {
		if ev.ID == id {
			return ev
		}
	}
	tb.Fatalf("no sample event %s", id)
	return nil
}

// The hand-written encoder writes exactly what json.Marshal writes.
func TestEventJSONMatchesMarshal(t *testing.T) {
	for _, ev := range sampleEvents() {
		want, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := ev.appendJSON(nil)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("appendJSON = %s, %v\nwant         %s", got, ok, want)
		}
	}
	bad := &Event{Type: "x", Decision: json.RawMessage(`{"unterminated"`)}
	if _, ok := bad.appendJSON(nil); ok {
		t.Error("invalid Decision encoded")
	}
}

func FuzzEventJSON(f *testing.F) {
	f.Add("delivered", "id", "550 <a@b> & \"x\"", "a@b.example", int64(3), `{"a":1}`)
	f.Add("\xff", "\u2028", "\x00\n\t", "", int64(-1), `[`)
	f.Fuzz(func(t *testing.T, typ, id, reason, rcpt string, n int64, raw string) {
		ev := &Event{Type: typ, ID: id, Reason: reason, Recipients: []string{rcpt}, Size: n, Attempt: int(n), Decision: json.RawMessage(raw)}
		if raw == "" {
			ev.Decision = nil
		}
		matchesMarshal(t, ev, ev.appendJSON)
	})
}

// go test -run '^$' -bench EventEncode -benchmem ./queue
func BenchmarkEventEncode(b *testing.B) {
	ev := sampleEvents()[1]
	// A delivered event with its whole decision record, as the worker
	// publishes it: checked and compacted, or marked as json.Marshal's.
	for _, marked := range []bool{false, true} {
		name := "delivered/decision-checked"
		if marked {
			name = "delivered/decision-marshaled"
		}
		dev := *sampleEvent(b, "abc-3")
		dev.DecisionMarshaled = marked
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if _, ok := dev.appendJSON(make([]byte, 0, 1024)); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
	// The queued event every envelope publishes, with its recipient
	// (since 2026-12-06) and without.
	for _, rcpts := range [][]string{{"ann@one.example"}, nil} {
		qev := *sampleEvent(b, "abc")
		qev.Recipients = rcpts
		b.Run("queued/recipients-"+strconv.Itoa(len(rcpts)), func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if _, ok := qev.appendJSON(make([]byte, 0, 512)); !ok {
					b.Fatal("refused")
				}
			}
		})
	}
	b.Run("appendJSON", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, ok := ev.appendJSON(make([]byte, 0, 512)); !ok {
				b.Fatal("refused")
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		defer reportCPU(b)()
		for b.Loop() {
			if _, err := json.Marshal(ev); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// matchesMarshal fails t unless appendJSON writes what json.Marshal writes
// of v, and refuses what it refuses; it reports whether v was encoded.
func matchesMarshal(t *testing.T, v any, appendJSON func([]byte) ([]byte, bool)) bool {
	t.Helper()
	want, err := json.Marshal(v)
	got, ok := appendJSON(nil)
	if err != nil {
		if ok {
			t.Fatalf("json.Marshal refused (%v) but appendJSON wrote %s", err, got)
		}
		return false
	}
	if !ok {
		t.Fatalf("appendJSON refused what json.Marshal wrote: %s", want)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("appendJSON = %s\nwant           %s", got, want)
	}
	return true
}
