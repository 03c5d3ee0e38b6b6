package queue

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// laterRelease returns m's envelope as a later release would have written
// it: its JSON with members this release does not know.
func laterRelease(t *testing.T, m *nats.Msg) []byte {
	t.Helper()
	n := len(m.Data)
	if v := m.Header.Get(HdrInlineBody); v != "" {
		var err error
		if n, err = intHeader(m.Header, HdrInlineBody); err != nil {
			t.Fatal(err)
		}
		n = len(m.Data) - n - 1 // the JSON ends before the newline in front of the body
	}
	js := m.Data[:n]
	if js[len(js)-1] != '}' {
		t.Fatalf("the envelope's JSON does not end its object: %q", js)
	}
	later := append([]byte(nil), js[:len(js)-1]...)
	later = append(later, `, "zz_future" : { "b" : [1, 2] }, "Aa_new":"x\n"}`...)
	return append(later, m.Data[n:]...)
}

// TestEnvelopeKeepsALaterReleasesFields: in a rolling upgrade (or after a
// rollback) a worker of this release defers, holds or dead-letters
// envelopes a later release wrote. Each such step writes the envelope
// again, and the fields it did not know were dropped: a one-click
// unsubscribe link or a send_at added by the later release went missing
// from mail a worker of the earlier release had merely deferred.
func TestEnvelopeKeepsALaterReleasesFields(t *testing.T) {
	e := &Envelope{ID: "abc", MsgID: "abc", Tenant: "t", From: "a@x", Rcpts: []string{"b@y"}, Dest: "y", Body: []byte("body\r\n"),
		SubmittedAt: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	m, err := e.Encode("x")
	if err != nil {
		t.Fatal(err)
	}
	m.Data = laterRelease(t, m)
	got, err := DecodeEnvelope(m.Data, m.Header)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != "abc" || string(got.Body) != "body\r\n" || got.Tenant != "t" {
		t.Fatalf("decoded %+v", got)
	}
	next := got.Clone()
	next.Attempt = 1
	m2, err := next.Encode("x")
	if err != nil {
		t.Fatal(err)
	}
	const kept = `,"Aa_new":"x\n","zz_future":{"b":[1,2]}}`
	if !bytes.Contains(m2.Data, []byte(kept)) {
		t.Fatalf("written again without the later release's members:\n%s", m2.Data)
	}
	again, err := DecodeEnvelope(m2.Data, m2.Header)
	if err != nil || again.Attempt != 1 || string(again.Body) != "body\r\n" || string(again.unknown) != strings.TrimSuffix(kept, "}") {
		t.Fatalf("decoded again: %+v, %v", again, err)
	}
	// This release's own envelopes have none.
	if own, _ := DecodeEnvelope(mustEncode(t, e).Data, mustEncode(t, e).Header); own == nil || own.unknown != nil {
		t.Fatalf("own envelope: %+v", own)
	}
}

func mustEncode(t *testing.T, e *Envelope) *nats.Msg {
	t.Helper()
	m, err := e.Encode("x")
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDeferralKeepsALaterReleasesFields: the same through the lanes, a
// deferral to the retry lane and back.
func TestDeferralKeepsALaterReleasesFields(t *testing.T) {
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: []string{"r@d.example"}, Body: []byte("x\r\n")}); err != nil {
		t.Fatal(err)
	}
	work, _ := q.Messages(ctx, LaneWork, 1)
	retry, _ := q.Messages(ctx, LaneRetry, 1)
	d := next(t, work)
	m := mustEncode(t, d.Env)
	later, err := DecodeEnvelope(laterRelease(t, m), m.Header)
	if err != nil {
		t.Fatal(err)
	}
	n := later.Clone()
	n.Attempt = 1
	if err := d.Reschedule(ctx, n, LaneRetry, time.Now(), true); err != nil {
		t.Fatal(err)
	}
	r := next(t, retry)
	if r.Env.Attempt != 1 || !bytes.Contains(r.Env.unknown, []byte(`"zz_future":{"b":[1,2]}`)) {
		t.Fatalf("after the deferral: attempt %d, members kept %q", r.Env.Attempt, r.Env.unknown)
	}
	if err := r.Skip(ctx); err != nil {
		t.Fatal(err)
	}
}
