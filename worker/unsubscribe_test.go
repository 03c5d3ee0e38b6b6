package worker

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-msgauth/dkim"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/unsubscribe"
)

// plainLinks stands in for *unsubscribe.Links: its link spells out what
// it names.
type plainLinks struct{}

func (plainLinks) Header(t unsubscribe.Target) []byte {
	return []byte("List-Unsubscribe: <https://u.test/unsubscribe/" + t.Tenant + "." + t.Rcpt + "." + t.ID + ">\r\n" +
		"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n")
}

const traceTop = "Received: from app (app [127.0.0.1])\r\n\tby outflow.test; Sun, 6 Dec 2026 16:00:00 +0000\r\n"

func (e *env) submitUnsub(rcpts []string, header string) []string {
	e.t.Helper()
	on := true
	ids, err := e.q.Enqueue(context.Background(), &queue.Submission{Tenant: "t1", From: "news@src.test", Rcpts: rcpts,
		Body:            []byte(traceTop + "From: news@src.test\r\n" + header + "Subject: news\r\nMessage-ID: <n@src.test>\r\n\r\nhello\r\n"),
		ListUnsubscribe: &on})
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// Each recipient's copy carries the link naming it, below the trace
// fields and inside the DKIM signature, and the retry sends the bytes
// signed before the first attempt.
func TestListUnsubscribeSignedPerRecipient(t *testing.T) {
	pub, signer := testSigner(t)
	e := newEnv(t, deferFirstDot())
	e.startPool(func(c *Config) { c.Signer, c.Unsubscribe = signer, plainLinks{} })
	ids := e.submitUnsub([]string{"a@dest.test", "b@dest.test"}, "")
	if len(ids) != 2 {
		t.Fatalf("ids %v: want one envelope per recipient", ids)
	}
	for _, id := range ids {
		e.waitEvent(id, queue.EventDelivered)
	}
	lookup := func(name string) ([]string, error) {
		if name == "s1._domainkey.src.test" {
			return []string{"v=DKIM1; k=ed25519; p=" + base64.StdEncoding.EncodeToString(pub)}, nil
		}
		return nil, errors.New("no record")
	}
	byRcpt := map[string][]byte{}
	for _, m := range e.mx.Messages() {
		byRcpt[m.Rcpts[0]] = m.Data
	}
	for i, rcpt := range []string{"a@dest.test", "b@dest.test"} {
		got := byRcpt[rcpt]
		want := "List-Unsubscribe: <https://u.test/unsubscribe/t1." + rcpt + "." + ids[i] + ">\r\n"
		if strings.Count(string(got), "\nList-Unsubscribe:") != 1 || !strings.Contains(string(got), traceTop+want+"List-Unsubscribe-Post: List-Unsubscribe=One-Click\r\nFrom: ") {
			t.Fatalf("message to %s:\n%s\nwant its own link once, below the Received field", rcpt, got)
		}
		vs, err := dkim.VerifyWithOptions(bytes.NewReader(got), &dkim.VerifyOptions{LookupTXT: lookup})
		if err != nil || len(vs) != 1 || vs[0].Err != nil {
			t.Fatalf("verification: %v %+v", err, vs)
		}
		sig := string(got[:bytes.Index(got, []byte(traceTop))])
		if !strings.Contains(strings.ToLower(sig), "list-unsubscribe:list-unsubscribe-post") {
			t.Fatalf("signature does not cover the unsubscribe fields:\n%s", sig)
		}
	}
}

// Unsigned, the link is added afresh at each attempt (the stored message
// stays as submitted), the same each time.
func TestListUnsubscribeUnsignedNotStored(t *testing.T) {
	e := newEnv(t, deferFirstDot())
	e.startPool(func(c *Config) { c.Unsubscribe = plainLinks{} })
	id := e.submitUnsub([]string{"a@dest.test"}, "")[0]
	e.waitEvent(id, queue.EventDeferred)
	it, err := e.q.Find(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := e.q.EnvelopeBody(context.Background(), it.Env)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(stored, []byte("List-Unsubscribe")) || it.Env.Signed {
		t.Fatalf("stored message changed:\n%s", stored)
	}
	e.waitEvent(id, queue.EventDelivered)
	got := string(e.mx.Messages()[0].Data)
	if strings.Count(got, "\nList-Unsubscribe:") != 1 || !strings.Contains(got, "t1.a@dest.test."+id+">") {
		t.Fatalf("delivered:\n%s", got)
	}
}

// A message with a List-Unsubscribe of its own keeps it alone; a process
// without links sends the message as it is.
func TestListUnsubscribeLeftAlone(t *testing.T) {
	t.Run("own field", func(t *testing.T) {
		e := newEnv(t, nil)
		e.startPool(func(c *Config) { c.Unsubscribe = plainLinks{} })
		id := e.submitUnsub([]string{"a@dest.test"}, "list-unsubscribe: <mailto:leave@src.test>\r\n")[0]
		e.waitEvent(id, queue.EventDelivered)
		got := string(e.mx.Messages()[0].Data)
		if strings.Contains(got, "u.test") || !strings.Contains(got, "list-unsubscribe: <mailto:leave@src.test>") {
			t.Fatalf("delivered:\n%s", got)
		}
	})
	t.Run("no links here", func(t *testing.T) {
		e := newEnv(t, nil)
		e.startPool(nil)
		id := e.submitUnsub([]string{"a@dest.test"}, "")[0]
		e.waitEvent(id, queue.EventDelivered)
		if got := string(e.mx.Messages()[0].Data); strings.Contains(got, "List-Unsubscribe") {
			t.Fatalf("delivered:\n%s", got)
		}
	})
}

func TestAfterTrace(t *testing.T) {
	for _, c := range []struct{ msg, rest string }{
		{"From: a\r\n\r\nx", "From: a\r\n\r\nx"},
		{traceTop + "From: a\r\n\r\nx", "From: a\r\n\r\nx"},
		{"Return-Path: <a@b>\r\nReceived: by x; now\r\nReceived : by y;\r\n now\r\nSubject: s\r\n\r\n", "Subject: s\r\n\r\n"},
		{"received: by x\nFrom: a\n\nx", "From: a\n\nx"},
		{"Received-SPF: pass\r\nFrom: a\r\n\r\n", "Received-SPF: pass\r\nFrom: a\r\n\r\n"},
		{" folded first\r\nFrom: a\r\n\r\n", " folded first\r\nFrom: a\r\n\r\n"},
		{"Received: by x; now\r\n", ""},
		{"Received: unterminated", "Received: unterminated"},
		{"", ""},
	} {
		if at := afterTrace([]byte(c.msg)); c.msg[at:] != c.rest {
			t.Errorf("afterTrace(%q) leaves %q, want %q", c.msg, c.msg[at:], c.rest)
		}
	}
}

// BenchmarkListUnsubscribe is what the link costs an attempt of a 2 KiB
// message: the sealed token, the fields, and the copy of the message with
// them below its Received field.
func BenchmarkListUnsubscribe(b *testing.B) {
	links, err := unsubscribe.New(bytes.Repeat([]byte{1}, 32), "https://mail.example.com/unsubscribe")
	if err != nil {
		b.Fatal(err)
	}
	d := &deliverer{Pool: &Pool{cfg: Config{Unsubscribe: links}}}
	body := []byte(traceTop + "From: news@src.test\r\nSubject: news\r\n\r\n" + strings.Repeat(strings.Repeat("x", 76)+"\r\n", 26))
	e := &queue.Envelope{ID: "k1a2b3c4d5e6f7a8b9c0d1e2-3", Tenant: "news", Rcpts: []string{"ann@dest.example"}, ListUnsubscribe: true}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if out := d.listUnsubscribe(e, body); len(out) == len(body) {
			b.Fatal("no link")
		}
	}
}

// checkingList is a suppression list a test writes to directly.
type checkingList struct {
	mu      sync.Mutex
	entries map[string]queue.Suppression
}

func (l *checkingList) Add(_ context.Context, s queue.Suppression) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries[s.Tenant+"/"+queue.NormalizeAddress(s.Address)] = s
	return nil
}

func (l *checkingList) AddFirst(ctx context.Context, s queue.Suppression) (bool, error) {
	return true, l.Add(ctx, s)
}

func (l *checkingList) Suppressed(_ context.Context, tenant, addr string) (*queue.Suppression, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.entries[tenant+"/"+queue.NormalizeAddress(addr)]; ok {
		return &s, nil
	}
	return nil, nil
}

// A recipient who unsubscribed while a bulk message waited (a retry, a
// send_at) is not sent it: the envelope ends with a suppressed event.
// Mail without links is not looked up.
func TestUnsubscribedWhileQueuedNotSent(t *testing.T) {
	list := &checkingList{entries: map[string]queue.Suppression{}}
	e := newEnv(t, deferFirstDot())
	e.startPool(func(c *Config) {
		c.Unsubscribe, c.Suppressions = plainLinks{}, list
		c.Retry.Base, c.Retry.Min, c.Retry.Cap = time.Second, time.Second, time.Second
	})
	id := e.submitUnsub([]string{"a@dest.test"}, "")[0]
	e.waitEvent(id, queue.EventDeferred)
	_ = list.Add(context.Background(), queue.Suppression{Tenant: "t1", Address: "A@dest.test", Source: queue.SuppressUnsubscribe})
	evs := e.waitEvent(id, queue.EventSuppressed)
	if last := evs[len(evs)-1]; !strings.Contains(last.Reason, "(unsubscribe) since it was queued") {
		t.Fatalf("suppressed event %+v", last)
	}
	if n := len(e.mx.Messages()); n != 0 {
		t.Fatalf("%d messages delivered after the unsubscribe", n)
	}
	if got := e.events(id); slices.Contains(got, queue.EventDelivered) {
		t.Fatalf("events %v", got)
	}
}

// An application's own DKIM signature that lists List-Unsubscribe or
// List-Unsubscribe-Post (so that none may be added) keeps the message as
// it is.
func TestSignsField(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{"DKIM-Signature: v=1; a=rsa-sha256; d=x; s=s;\r\n h=From:Subject:List-Unsubscribe:\r\n List-Unsubscribe; bh=..; b=..\r\nFrom: a\r\n\r\nx", true},
		{"dkim-signature: v=1; h = from : list-unsubscribe ; b=..\r\n\r\n", true},
		{"DKIM-Signature: v=1; h=From:Subject:List-Unsubscribe-Post; b=..\r\nFrom: a\r\n\r\n", true},
		{"DKIM-Signature: v=1; h=From:Subject:List-Unsubscribe-Posted; b=..\r\nFrom: a\r\n\r\n", false},
		{"From: a\r\n\r\nDKIM-Signature: v=1; h=List-Unsubscribe; b=..\r\n", false},
		{"X-Note: h=List-Unsubscribe\r\n\r\n", false},
		{"", false},
	} {
		if got := signsField([]byte(c.msg), "List-Unsubscribe", "List-Unsubscribe-Post"); got != c.want {
			t.Errorf("signsField(%q) = %v, want %v", c.msg, got, c.want)
		}
	}
}
