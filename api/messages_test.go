package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-message"
	"github.com/emersion/go-message/mail"

	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/quota"
	"github.com/outflow/outflow/submission"
)

func TestPostBuildsMIMEAndQueuesOneEnvelopePerDomain(t *testing.T) {
	f := newFixture(t, nil)
	pdf := []byte("%PDF-1.4 not really\x00\x01\x02")
	res := f.do(t, "POST", "/v1/messages", f.key, map[string]any{
		"from":    "news@shop.example",
		"to":      []string{"ann@one.example", "bob@two.example", "ANN@one.example"},
		"subject": "Grüße",
		"text":    "hello\nworld",
		"html":    "<p>hello</p>",
		"headers": map[string]string{"Reply-To": "help@shop.example", "X-Campaign": "spring"},
		"attachments": []map[string]any{
			{"filename": "invoice.pdf", "content_type": "application/pdf", "content": base64.StdEncoding.EncodeToString(pdf)},
		},
	}, nil)
	ids := res.ids(t)
	if len(ids) != 2 {
		t.Fatalf("ids %v: want one per destination (one.example, two.example)", ids)
	}
	items := queued(t, f.q)
	if len(items) != 2 {
		t.Fatalf("%d envelopes queued, want 2", len(items))
	}
	for _, it := range items {
		if it.Env.Tenant != "acme" || it.Env.From != "news@shop.example" {
			t.Errorf("envelope %s: tenant %q from %q", it.Env.ID, it.Env.Tenant, it.Env.From)
		}
	}
	b := body(t, f.q, ids[0])
	if bytes.Contains(bytes.ReplaceAll(b, []byte("\r\n"), nil), []byte("\n")) {
		t.Fatal("built message has a bare LF")
	}
	if !bytes.HasPrefix(b, []byte("Received: from [127.0.0.1]")) {
		t.Errorf("no Received line first:\n%.200s", b)
	}
	mr, err := mail.CreateReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := mr.Header.Subject(); s != "Grüße" {
		t.Errorf("subject %q", s)
	}
	if v := mr.Header.Get("X-Campaign"); v != "spring" {
		t.Errorf("X-Campaign %q", v)
	}
	if id, _ := mr.Header.MessageID(); !strings.HasSuffix(id, "@mta.test") {
		t.Errorf("Message-ID %q", id)
	}
	var texts []string
	var att []byte
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(p.Body)
		switch h := p.Header.(type) {
		case *mail.InlineHeader:
			ct, _, _ := h.ContentType()
			texts = append(texts, ct+":"+string(data))
		case *mail.AttachmentHeader:
			if name, _ := h.Filename(); name != "invoice.pdf" {
				t.Errorf("attachment name %q", name)
			}
			att = data
		}
	}
	if want := []string{"text/plain:hello\r\nworld", "text/html:<p>hello</p>"}; !slices.Equal(texts, want) {
		t.Errorf("inline parts %q, want %q", texts, want)
	}
	if !bytes.Equal(att, pdf) {
		t.Errorf("attachment %q, want %q", att, pdf)
	}

	got := f.do(t, "GET", "/v1/messages/"+ids[1], f.key, nil, nil)
	if got.status != 200 || got.json["state"] != "queued" || got.json["tenant"] != "acme" || got.json["dest"] != "two.example" {
		t.Fatalf("GET: %d %s", got.status, got.raw)
	}
}

// TestLongHeadersKeepTheirValue: a header longer than a line is folded at
// its spaces only, so the recipient's unfolded value is the one asked for,
// a token up to what one line holds included (an unfoldable one is refused:
// TestBadRequestsAreProblemsAndStoreNothing).
func TestLongHeadersKeepTheirValue(t *testing.T) {
	f := newFixture(t, nil)
	words := strings.TrimSpace(strings.Repeat("word ", 400))
	token := strings.Repeat("t", 980)
	later := "a " + strings.Repeat("u", 997)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{
		"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x",
		"subject": words,
		"headers": map[string]string{"X-Words": words, "X-Token": token, "X-Later": later},
	}, nil).ids(t)
	b := body(t, f.q, ids[0])
	for _, line := range strings.Split(string(b), "\r\n") {
		if len(line) > 998 {
			t.Fatalf("a line of %d octets", len(line))
		}
	}
	mr, err := mail.CreateReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := mr.Header.Subject(); s != words {
		t.Errorf("subject changed: %q", s)
	}
	for name, want := range map[string]string{"X-Words": words, "X-Token": token, "X-Later": later} {
		if got := mr.Header.Get(name); got != want {
			t.Errorf("%s changed by folding: %d octets, want %d", name, len(got), len(want))
		}
	}
}

// TestInlineImagesAreRelated: an inline part with a Content-ID that the
// HTML shows (cid:) goes into a multipart/related beside the body, as mail
// clients expect, so they render it in place instead of listing it as an
// attachment; attachments proper stay in the outer multipart/mixed.
func TestInlineImagesAreRelated(t *testing.T) {
	f := newFixture(t, nil)
	png := base64.StdEncoding.EncodeToString([]byte("\x89PNG not really"))
	structure := func(req map[string]any) string {
		t.Helper()
		req["from"], req["to"] = "news@shop.example", []string{"ann@one.example"}
		ids := f.do(t, "POST", "/v1/messages", f.key, req, nil).ids(t)
		e, err := message.Read(bytes.NewReader(body(t, f.q, ids[0])))
		if err != nil {
			t.Fatal(err)
		}
		var walk func(e *message.Entity) string
		walk = func(e *message.Entity) string {
			mt, params, _ := e.Header.ContentType()
			if mr := e.MultipartReader(); mr != nil {
				out := mt
				if params["type"] != "" {
					out += ";type=" + params["type"]
				}
				out += "["
				for i := 0; ; i++ {
					p, err := mr.NextPart()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if i > 0 {
						out += " "
					}
					out += walk(p)
				}
				return out + "]"
			}
			if id := e.Header.Get("Content-Id"); id != "" {
				mt += id
			}
			return mt
		}
		return walk(e)
	}
	image := map[string]any{"content_type": "image/png", "content": png, "inline": true, "content_id": "logo@shop"}
	pdf := map[string]any{"filename": "a.pdf", "content_type": "application/pdf", "content": png}
	for _, c := range []struct {
		name string
		req  map[string]any
		want string
	}{
		{"text, HTML, an image and an attachment", map[string]any{"text": "hi", "html": `<img src="cid:logo@shop">`, "attachments": []any{image, pdf}},
			"multipart/mixed[multipart/related;type=multipart/alternative[multipart/alternative[text/plain text/html] image/png<logo@shop>] application/pdf]"},
		{"HTML and an image", map[string]any{"html": `<img src="cid:logo@shop">`, "attachments": []any{image}},
			"multipart/related;type=text/html[text/html image/png<logo@shop>]"},
		{"text and an inline part: no HTML to show it", map[string]any{"text": "hi", "attachments": []any{image}},
			"multipart/mixed[text/plain image/png<logo@shop>]"},
		{"an attachment alone", map[string]any{"attachments": []any{pdf}}, "multipart/mixed[application/pdf]"},
		{"text and HTML", map[string]any{"text": "hi", "html": "<p>hi</p>"}, "multipart/alternative[text/plain text/html]"},
	} {
		if got := structure(c.req); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// TestCcAndBcc: cc recipients are named in a Cc field, bcc recipients
// get the message without being named anywhere in it; all of them are
// envelope recipients, each once, and a fault names its own field.
func TestCcAndBcc(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{
		"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x",
		"cc": []string{"bob@one.example", "ANN@one.example"}, "bcc": []string{"hidden@two.example"},
	}, nil).ids(t)
	if len(ids) != 2 {
		t.Fatalf("ids %v, want one per destination", ids)
	}
	var rcpts []string
	for _, it := range queued(t, f.q) {
		rcpts = append(rcpts, it.Env.Rcpts...)
	}
	slices.Sort(rcpts)
	if want := []string{"ann@one.example", "bob@one.example", "hidden@two.example"}; !slices.Equal(rcpts, want) {
		t.Errorf("envelope recipients %q, want %q", rcpts, want)
	}
	for _, id := range ids {
		b := body(t, f.q, id)
		mr, err := mail.CreateReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		if to := mr.Header.Get("To"); to != "<ann@one.example>" {
			t.Errorf("To %q", to)
		}
		if cc := mr.Header.Get("Cc"); cc != "<bob@one.example>, <ANN@one.example>" {
			t.Errorf("Cc %q", cc)
		}
		if bytes.Contains(bytes.ToLower(b), []byte("hidden@")) || mr.Header.Has("Bcc") {
			t.Errorf("the blind copy's address is in the message:\n%s", b)
		}
	}
	r := f.do(t, "POST", "/v1/messages", f.key, map[string]any{
		"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x", "bcc": []string{"ok@two.example", "not an address"},
	}, nil)
	if errs, _ := r.json["errors"].([]any); r.status != 422 || len(errs) != 1 || errs[0].(map[string]any)["field"] != "bcc[1]" {
		t.Errorf("bad bcc: %d %s, want 422 naming bcc[1]", r.status, r.raw)
	}
}

func TestRawMessageGetsCRLF(t *testing.T) {
	f := newFixture(t, nil)
	raw := "From: a@src.example\nTo: b@dst.example\nSubject: raw\n\nline one\nline two\n"
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{"from": "a@src.example", "to": []string{"b@dst.example"}, "raw": raw}, nil).ids(t)
	b := body(t, f.q, ids[0])
	if want := strings.ReplaceAll(raw, "\n", "\r\n"); !strings.HasSuffix(string(b), want) {
		t.Fatalf("stored %q, want it to end with %q", b, want)
	}
	// It lacked a Date and a Message-ID: both are added, once.
	if strings.Count(string(b), "\r\nDate: ") != 1 || strings.Count(string(b), "\r\nMessage-ID: <") != 1 {
		t.Fatalf("stored %q, want one added Date and Message-ID", b)
	}
}

// The message under its Received line is made in one buffer now (the
// Received line and any added Date and Message-ID written in front of the
// normalized message): the same bytes as the Received line, then
// CompleteHeaders of the normalized message, then nothing else, for a
// message that lacks both fields, one, none, one with no body, under a
// short host name and a long one; and a built message is the
// Received line, then what build makes.
func TestMessageUnderReceivedIsUnchanged(t *testing.T) {
	date := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, host := range []string{"mta.test", strings.Repeat("h", 200) + ".example"} {
		s := &Server{cfg: Config{Hostname: host, MaxMessageBytes: 1 << 20}}
		for _, raw := range []string{
			"Subject: x\n\nbody\n",
			"Date: Sun, 06 Dec 2026 10:00:00 +0000\nSubject: x\n\nbody\nMessage-ID: not a header\n",
			"Message-ID: <a@b>\nDate: Sun, 06 Dec 2026 10:00:00 +0000\n\nbody\n",
			"Subject: header only\n",
		} {
			got, p := s.message(&MessageRequest{Raw: raw}, date, "seed", "192.0.2.1:1234")
			if p != nil {
				t.Fatal(p)
			}
			norm, err := normalizeRaw(raw, 0)
			if err != nil {
				t.Fatal(err)
			}
			recv := "Received: from [192.0.2.1]\r\n\tby " + host + " (outflow) with HTTP;\r\n\tSun, 06 Dec 2026 10:00:00 +0000\r\n"
			if want := recv + string(submission.CompleteHeaders(norm, 0, host, "seed", date)); string(got) != want {
				t.Errorf("host %d octets, raw %q:\n got %q\nwant %q", len(host), raw, got, want)
			}
		}
		req := &MessageRequest{From: "a@src.example", To: []string{"b@dst.example"}, Subject: "s", Text: "hi",
			Attachments: []Attachment{{Filename: "a.bin", Content: "aGVsbG8="}}}
		got, p := s.message(req, date, "seed", "192.0.2.1:1234")
		if p != nil {
			t.Fatal(p)
		}
		built, err := build(req, date, host, "seed")
		if err != nil {
			t.Fatal(err)
		}
		if _, rest, ok := bytes.Cut(got, []byte("+0000\r\n")); !ok || !bytes.Equal(rest, built) {
			t.Errorf("built under a Received line: %q, want %q after it", got, built)
		}
	}
}

// A raw message sent again with its Idempotency-Key stores the same bytes:
// the Message-ID outflow adds is derived from the key.
func TestRawMessageIdempotentMessageID(t *testing.T) {
	f := newFixture(t, nil)
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@dst.example"}, "raw": "Subject: raw\n\nhi\n"}
	first := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-1"}).ids(t)
	other := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-2"}).ids(t)
	a, b := body(t, f.q, first[0]), body(t, f.q, other[0])
	id := func(b []byte) string {
		_, rest, _ := strings.Cut(string(b), "Message-ID: ")
		v, _, _ := strings.Cut(rest, "\r\n")
		return v
	}
	if id(a) == "" || id(a) == id(b) {
		t.Fatalf("Message-IDs %q and %q: want two different ones", id(a), id(b))
	}
	if again := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "k-1"}).ids(t); !slices.Equal(again, first) {
		t.Fatalf("retry ids %v, want %v", again, first)
	}
	if !bytes.Equal(body(t, f.q, first[0]), a) {
		t.Fatal("a retry changed the stored bytes")
	}
}

// takeWork takes the next envelope from the work lane, as a worker would.
func (f *fixture) takeWork(ctx context.Context, t *testing.T) *queue.Delivery {
	t.Helper()
	d, _ := testqueue.Take(t, ctx, f.q, queue.LaneWork) // the pull ends with ctx
	return d
}

func TestGetMessageFollowsItsEvents(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{"from": "a@src.example", "to": []string{"b@dst.example"}, "text": "hi"}, nil).ids(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := f.takeWork(ctx, t)
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	f.q.Event(queue.EventDelivered, &queue.Event{ID: d.Env.ID, MsgID: d.Env.MsgID, Tenant: d.Env.Tenant, Dest: d.Env.Dest, Reason: "250 ok"})

	got := f.do(t, "GET", "/v1/messages/"+ids[0], f.key, nil, nil)
	if got.status != 200 || got.json["state"] != "delivered" {
		t.Fatalf("GET after delivery: %d %s", got.status, got.raw)
	}
	if _, ok := got.json["last_reply"]; ok {
		t.Fatalf("a delivered message has a last reply: %s", got.raw)
	}
	hist, _ := got.json["history"].([]any)
	if len(hist) != 2 {
		t.Fatalf("history %s: want queued then delivered", got.raw)
	}
	// A notice about the delivery (NOTIFY=SUCCESS) comes after it in the
	// history; the state is still the delivery's.
	f.q.Event(queue.EventDSN, &queue.Event{ID: d.Env.ID, MsgID: d.Env.MsgID, Tenant: d.Env.Tenant, Dest: d.Env.Dest, Reason: "delivered dsn-1 b@dst.example"})
	for deadline := time.Now().Add(10 * time.Second); ; {
		got = f.do(t, "GET", "/v1/messages/"+ids[0], f.key, nil, nil)
		if hist, _ := got.json["history"].([]any); len(hist) == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history %s: want the dsn event third", got.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.json["state"] != "delivered" {
		t.Fatalf("state after a dsn event: %s", got.raw)
	}

	// Another tenant's key does not learn the message exists.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel2()
	other, _, err := f.srv.Keys().Create(ctx2, "globex", false)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "GET", "/v1/messages/"+ids[0], other, nil, nil); r.status != 404 || r.json["type"] != ProblemNotFound {
		t.Fatalf("other tenant: %d %s", r.status, r.raw)
	}
	admin, _, err := f.srv.Keys().Create(ctx2, "ops", true)
	if err != nil {
		t.Fatal(err)
	}
	if r := f.do(t, "GET", "/v1/messages/"+ids[0], admin, nil, nil); r.status != 200 {
		t.Fatalf("admin key: %d %s", r.status, r.raw)
	}
}

// TestGetMessageSaysEachRecipientsOutcome: one attempt delivered one of a
// part's recipients and bounced the other. The part's state is one of
// them (its last outcome); outcomes says what became of each, and a later
// notice about the message changes neither.
func TestGetMessageSaysEachRecipientsOutcome(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{"from": "a@src.example",
		"to": []string{"ok@dst.example", "gone@dst.example"}, "text": "hi"}, nil).ids(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := f.takeWork(ctx, t)
	if err := d.Delivered(ctx, d.Env.Rcpts, true); err != nil {
		t.Fatal(err)
	}
	ev := func(typ, rcpt, reason string) {
		f.q.Event(typ, &queue.Event{ID: d.Env.ID, MsgID: d.Env.MsgID, Tenant: d.Env.Tenant, Dest: d.Env.Dest, Attempt: 1,
			Reason: reason, Recipients: []string{rcpt}})
	}
	ev(queue.EventBounced, "gone@dst.example", "550 5.1.1 no such user")
	ev(queue.EventDelivered, "ok@dst.example", "250 ok")
	ev(queue.EventDSN, "gone@dst.example", "failed notice k1")
	var got response
	for deadline := time.Now().Add(10 * time.Second); ; {
		got = f.do(t, "GET", "/v1/messages/"+ids[0], f.key, nil, nil)
		if hist, _ := got.json["history"].([]any); len(hist) == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("history %s: want queued, bounced, delivered, dsn", got.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
	var st MessageStatus
	if err := json.Unmarshal(got.raw, &st); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ok@dst.example": "delivered 250 ok", "gone@dst.example": "bounced 550 5.1.1 no such user"}
	if len(st.Outcomes) != 2 {
		t.Fatalf("outcomes %+v, want one per recipient", st.Outcomes)
	}
	for _, o := range st.Outcomes {
		if want[o.Recipient] != o.State+" "+o.Reason || o.Time.IsZero() {
			t.Errorf("outcome of %s: %s %q at %v", o.Recipient, o.State, o.Reason, o.Time)
		}
	}
}

func TestIdempotencyKey(t *testing.T) {
	f := newFixture(t, nil)
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example", "c@two.example"}, "subject": "once", "text": "hi"}
	hdr := map[string]string{"Idempotency-Key": "order-42"}
	first := f.do(t, "POST", "/v1/messages", f.key, msg, hdr).ids(t)
	firstBody := body(t, f.q, first[0])
	again := f.do(t, "POST", "/v1/messages", f.key, msg, hdr)
	if ids := again.ids(t); !slices.Equal(ids, first) {
		t.Fatalf("repeat gave ids %v, want %v", ids, first)
	}
	if again.header.Get("Idempotent-Replayed") != "true" {
		t.Error("repeat not marked Idempotent-Replayed")
	}
	if n := len(queued(t, f.q)); n != 2 {
		t.Fatalf("%d envelopes after a repeat, want 2", n)
	}
	if !bytes.Equal(body(t, f.q, first[0]), firstBody) {
		t.Fatal("repeat changed the stored body")
	}

	msg["text"] = "something else"
	res := f.do(t, "POST", "/v1/messages", f.key, msg, hdr)
	if res.status != http.StatusUnprocessableEntity || res.json["type"] != ProblemIdemMismatch {
		t.Fatalf("same key, other request: %d %s", res.status, res.raw)
	}

	// The key is the tenant's: another tenant may use the same string.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other, _, err := f.srv.Keys().Create(ctx, "globex", false)
	if err != nil {
		t.Fatal(err)
	}
	if ids := f.do(t, "POST", "/v1/messages", other, msg, hdr).ids(t); slices.Equal(ids, first) {
		t.Fatal("another tenant's request with the same key got the first tenant's ids")
	}
}

func TestIdempotencyKeyConcurrentRequests(t *testing.T) {
	f := newFixture(t, nil)
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	hdr := map[string]string{"Idempotency-Key": "race"}
	const n = 6
	results := make([]response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i] = f.do(t, "POST", "/v1/messages", f.key, msg, hdr) })
	}
	wg.Wait()
	var want []string
	for _, r := range results {
		ids := r.ids(t)
		if want == nil {
			want = ids
		} else if !slices.Equal(ids, want) {
			t.Fatalf("concurrent requests got ids %v and %v", want, ids)
		}
	}
	if got := len(queued(t, f.q)); got != 1 {
		t.Fatalf("%d envelopes queued, want 1", got)
	}
}

func TestStoreFailureIs503AndTheKeyCanBeRetried(t *testing.T) {
	f := newFixture(t, nil)
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	hdr := map[string]string{"Idempotency-Key": "retry-me"}
	f.fq.fail.Store(true)
	res := f.do(t, "POST", "/v1/messages", f.key, msg, hdr)
	if res.status != http.StatusServiceUnavailable || res.json["type"] != ProblemUnavailable || res.header.Get("Retry-After") == "" {
		t.Fatalf("store down: %d %v %s", res.status, res.header, res.raw)
	}
	if n := len(queued(t, f.q)); n != 0 {
		t.Fatalf("%d envelopes after a 503", n)
	}
	f.fq.fail.Store(false)
	if ids := f.do(t, "POST", "/v1/messages", f.key, msg, hdr).ids(t); len(ids) != 1 {
		t.Fatalf("retry: ids %v", ids)
	}
}

func TestRateLimitPerKey(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Rate, c.Burst = 0.01, 2 })
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	for range 2 {
		f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)
	}
	res := f.do(t, "POST", "/v1/messages", f.key, msg, nil)
	if res.status != http.StatusTooManyRequests || res.json["type"] != ProblemRateLimited || res.header.Get("Retry-After") == "" {
		t.Fatalf("third request: %d %v %s", res.status, res.header, res.raw)
	}
	// Another key has its own bucket.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	other, _, err := f.srv.Keys().Create(ctx, "acme", false)
	if err != nil {
		t.Fatal(err)
	}
	f.do(t, "POST", "/v1/messages", other, msg, nil).ids(t)
}

func TestBadRequestsAreProblemsAndStoreNothing(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxMessageBytes = 64 << 10 })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	revokedKey, ri, err := f.srv.Keys().Create(ctx, "acme", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.srv.Keys().Revoke(ctx, ri.ID); err != nil {
		t.Fatal(err)
	}
	ok := func(m map[string]any) map[string]any {
		base := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
		for k, v := range m {
			if v == nil {
				delete(base, k)
			} else {
				base[k] = v
			}
		}
		return base
	}
	big := strings.Repeat("x", 100<<10)
	cases := []struct {
		name   string
		method string
		path   string
		key    string
		body   any
		hdr    map[string]string
		status int
		typ    string
		field  string
	}{
		{"malformed JSON", "POST", "/v1/messages", f.key, `{"from": "a@src.example",`, nil, 400, ProblemBadJSON, ""},
		{"not an object", "POST", "/v1/messages", f.key, `["a"]`, nil, 400, ProblemBadJSON, ""},
		{"wrong type", "POST", "/v1/messages", f.key, `{"from":"a@src.example","to":"b@one.example","text":"x"}`, nil, 400, ProblemBadJSON, "to"},
		{"trailing data", "POST", "/v1/messages", f.key, `{"from":"a@src.example","to":["b@one.example"],"text":"x"} {}`, nil, 400, ProblemBadJSON, ""},
		{"a closing brace after", "POST", "/v1/messages", f.key, `{"from":"a@src.example","to":["b@one.example"],"text":"x"}}`, nil, 400, ProblemBadJSON, ""},
		{"closing brackets after", "POST", "/v1/messages", f.key, `{"from":"a@src.example","to":["b@one.example"],"text":"x"}]]garbage`, nil, 400, ProblemBadJSON, ""},
		{"unknown field", "POST", "/v1/messages", f.key, ok(map[string]any{"subjcet": "x"}), nil, 400, ProblemUnknownField, "subjcet"},
		{"missing from", "POST", "/v1/messages", f.key, ok(map[string]any{"from": nil}), nil, 400, ProblemMissingField, "from"},
		{"missing to", "POST", "/v1/messages", f.key, ok(map[string]any{"to": nil}), nil, 400, ProblemMissingField, "to"},
		{"no content", "POST", "/v1/messages", f.key, ok(map[string]any{"text": nil}), nil, 400, ProblemMissingField, "text"},
		{"bad recipient", "POST", "/v1/messages", f.key, ok(map[string]any{"to": []string{"b@one.example", "not-an-address"}}), nil, 422, ProblemBadAddress, "to[1]"},
		{"address literal", "POST", "/v1/messages", f.key, ok(map[string]any{"to": []string{"root@[127.0.0.1]"}}), nil, 422, ProblemBadAddress, "to[0]"},
		{"bad sender", "POST", "/v1/messages", f.key, ok(map[string]any{"from": "a b@src.example"}), nil, 422, ProblemBadAddress, "from"},
		{"subject injection", "POST", "/v1/messages", f.key, ok(map[string]any{"subject": "hi\r\nBcc: victim@else.example"}), nil, 400, ProblemBadHeader, "subject"},
		{"header injection", "POST", "/v1/messages", f.key, ok(map[string]any{"headers": map[string]string{"X-A": "1\nBcc: v@else.example"}}), nil, 400, ProblemBadHeader, "headers.X-A"},
		{"bad header name", "POST", "/v1/messages", f.key, ok(map[string]any{"headers": map[string]string{"X A": "1"}}), nil, 400, ProblemBadHeader, "headers.X A"},
		{"unfoldable header", "POST", "/v1/messages", f.key, ok(map[string]any{"headers": map[string]string{"X-Token": "a " + strings.Repeat("t", 998)}}), nil, 400, ProblemBadHeader, "headers.X-Token"},
		{"unfoldable subject", "POST", "/v1/messages", f.key, ok(map[string]any{"subject": strings.Repeat("s", 990)}), nil, 400, ProblemBadHeader, "subject"},
		{"structural header", "POST", "/v1/messages", f.key, ok(map[string]any{"headers": map[string]string{"content-type": "text/html"}}), nil, 400, ProblemBadHeader, "headers.content-type"},
		{"bad base64", "POST", "/v1/messages", f.key, ok(map[string]any{"attachments": []map[string]any{{"filename": "a.txt", "content": "!!not base64!!"}}}), nil, 400, ProblemBadAttachment, "attachments[0].content"},
		{"bad RET", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"ret": "ALL"}}), nil, 400, ProblemBadDSN, "dsn.ret"},
		{"long ENVID", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"envid": strings.Repeat("e", 101)}}), nil, 400, ProblemBadDSN, "dsn.envid"},
		{"NOTIFY=NEVER with another", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"recipients": map[string]any{"b@one.example": map[string]any{"notify": []string{"NEVER", "FAILURE"}}}}}), nil, 400, ProblemBadDSN, "dsn.recipients[b@one.example].notify"},
		{"unknown NOTIFY", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"recipients": map[string]any{"b@one.example": map[string]any{"notify": []string{"ALWAYS"}}}}}), nil, 400, ProblemBadDSN, "dsn.recipients[b@one.example].notify"},
		{"ORCPT without a type", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"recipients": map[string]any{"b@one.example": map[string]any{"orcpt": "b@old.example"}}}}), nil, 400, ProblemBadDSN, "dsn.recipients[b@one.example].orcpt"},
		{"DSN for another recipient", "POST", "/v1/messages", f.key, ok(map[string]any{"dsn": map[string]any{"recipients": map[string]any{"c@one.example": map[string]any{"notify": []string{"NEVER"}}}}}), nil, 400, ProblemBadDSN, "dsn.recipients[c@one.example]"},
		{"raw and parts", "POST", "/v1/messages", f.key, ok(map[string]any{"raw": "Subject: x\r\n\r\nhi\r\n"}), nil, 400, ProblemBadMessage, ""},
		{"raw without header", "POST", "/v1/messages", f.key, ok(map[string]any{"text": nil, "raw": "just text, no header"}), nil, 400, ProblemBadMessage, "raw"},
		{"built too large", "POST", "/v1/messages", f.key, ok(map[string]any{"text": big}), nil, 413, ProblemTooLarge, ""},
		{"request too large", "POST", "/v1/messages", f.key, ok(map[string]any{"text": strings.Repeat(big, 12)}), nil, 413, ProblemTooLarge, ""},
		{"not JSON", "POST", "/v1/messages", f.key, "from=a", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, ProblemMediaType, ""},
		{"no key", "POST", "/v1/messages", "", ok(nil), nil, 401, ProblemUnauthorized, ""},
		{"unknown key", "POST", "/v1/messages", KeyPrefix + "AAAA", ok(nil), nil, 401, ProblemUnauthorized, ""},
		{"revoked key", "POST", "/v1/messages", revokedKey, ok(nil), nil, 401, ProblemUnauthorized, ""},
		{"basic auth", "POST", "/v1/messages", "", ok(nil), map[string]string{"Authorization": "Basic YTpi"}, 401, ProblemUnauthorized, ""},
		{"long idempotency key", "POST", "/v1/messages", f.key, ok(nil), map[string]string{"Idempotency-Key": strings.Repeat("k", 300)}, 400, ProblemBadIdemKey, ""},
		{"wrong method", "DELETE", "/v1/messages", f.key, nil, nil, 405, ProblemMethod, ""},
		{"unknown route", "GET", "/v2/nothing", f.key, nil, nil, 404, ProblemNotFound, ""},
		{"unknown message", "GET", "/v1/messages/nosuchid", f.key, nil, nil, 404, ProblemNotFound, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := f.do(t, c.method, c.path, c.key, c.body, c.hdr)
			if res.status != c.status || res.json["type"] != c.typ {
				t.Fatalf("got %d %s, want %d %s", res.status, res.raw, c.status, c.typ)
			}
			if ct := res.header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			if res.json["title"] == "" || res.json["status"] != float64(c.status) {
				t.Errorf("problem without title or status: %s", res.raw)
			}
			if c.status == 401 && res.header.Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			if c.field != "" {
				errs, _ := res.json["errors"].([]any)
				found := false
				for _, e := range errs {
					if m, _ := e.(map[string]any); m["field"] == c.field {
						found = true
					}
				}
				if !found {
					t.Errorf("no error for field %q: %s", c.field, res.raw)
				}
			}
		})
	}
	if n := len(queued(t, f.q)); n != 0 {
		t.Fatalf("%d envelopes stored by refused requests", n)
	}
	if n := f.fq.calls.Load(); n != 0 {
		t.Fatalf("refused requests reached Enqueue %d times", n)
	}
}

// TestDSNParametersStoredAsSMTPStoresThem: dsn's RET, ENVID, NOTIFY and
// ORCPT reach each destination's envelope in the SMTP listener's form:
// upper-cased keywords, the recipient's spelling in "to", rfc822 implied.
func TestDSNParametersStoredAsSMTPStoresThem(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{
		"from": "a@src.example", "to": []string{"Ann@one.example", "bob@two.example"}, "text": "hi",
		"dsn": map[string]any{"ret": "full", "envid": "order 42", "recipients": map[string]any{
			"ann@one.example": map[string]any{"notify": []string{"success", "FAILURE"}, "orcpt": "rfc822;ann@old.example"},
			"bob@two.example": map[string]any{"notify": []string{"NEVER"}, "orcpt": "x-local;bob"},
		}},
	}, nil).ids(t)
	if len(ids) != 2 {
		t.Fatalf("ids %v", ids)
	}
	want := map[string]*queue.DSNParams{
		"one.example": {Ret: "FULL", EnvID: "order 42", Rcpts: map[string]queue.RcptDSN{
			"Ann@one.example": {Notify: []string{"SUCCESS", "FAILURE"}, ORcpt: "ann@old.example"}}},
		"two.example": {Ret: "FULL", EnvID: "order 42", Rcpts: map[string]queue.RcptDSN{
			"bob@two.example": {Notify: []string{"NEVER"}, ORcpt: "bob", ORcptType: "x-local"}}},
	}
	for _, it := range queued(t, f.q) {
		if got := it.Env.DSN; !reflect.DeepEqual(got, want[it.Env.Dest]) {
			t.Errorf("%s: DSN %+v, want %+v", it.Env.Dest, got, want[it.Env.Dest])
		}
	}
}

// TestSenderDomains: a tenant limited to its sender domains is refused
// (422 sender-not-allowed, nothing stored) a from, a From header set
// through headers, or a raw message's From outside them, and sends within
// them.
func TestSenderDomains(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.SenderDomains = submission.SenderDomains{"acme": {"shop.example", "*.shop.example"}}
	})
	base := func(extra map[string]any) map[string]any {
		m := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x"}
		maps.Copy(m, extra)
		return m
	}
	for _, c := range []struct {
		name  string
		body  map[string]any
		field string
	}{
		{"from", base(map[string]any{"from": "ceo@bank.example"}), "from"},
		{"From header", base(map[string]any{"headers": map[string]string{"From": "CEO <ceo@bank.example>"}}), "headers.From"},
		{"raw From", map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"},
			"raw": "From: ceo@bank.example\nSubject: x\n\nbody\n"}, "raw"},
	} {
		r := f.do(t, "POST", "/v1/messages", f.key, c.body, nil)
		errs, _ := r.json["errors"].([]any)
		if r.status != 422 || r.json["type"] != ProblemSenderNotAllowed || len(errs) != 1 || errs[0].(map[string]any)["field"] != c.field {
			t.Errorf("%s: %d %s, want 422 sender-not-allowed on %s", c.name, r.status, r.raw, c.field)
		}
	}
	if items := queued(t, f.q); len(items) != 0 {
		t.Fatalf("%d envelopes stored from refused requests", len(items))
	}
	for _, from := range []string{"news@shop.example", "a@eu.shop.example"} {
		if ids := f.do(t, "POST", "/v1/messages", f.key, base(map[string]any{"from": from}), nil).ids(t); len(ids) != 1 {
			t.Errorf("%s: ids %v", from, ids)
		}
	}
}

// A tenant's sending limit takes a message's recipients all or none: past
// it, 429 quota-exceeded with Retry-After and nothing stored; a retry of
// a stored request (the same Idempotency-Key) is answered from its record
// and counts nothing again.
func TestSendingLimit(t *testing.T) {
	var lim *quota.Limiter
	f := newFixture(t, func(c *Config) {
		var err error
		if lim, err = quota.Open(context.Background(), c.Buckets, quota.Config{Tenants: map[string]int{"acme": 3}}); err != nil {
			t.Fatal(err)
		}
		c.Quota = lim
	})
	msg := func(to ...string) map[string]any {
		return map[string]any{"from": "news@shop.example", "to": to, "text": "x"}
	}
	first := msg("a@one.example", "b@one.example")
	// A message not stored (JetStream down: 503) sends nothing and
	// counts nothing.
	f.fq.fail.Store(true)
	if r := f.do(t, "POST", "/v1/messages", f.key, msg("x@one.example", "y@one.example", "z@one.example"), nil); r.status != 503 {
		t.Fatalf("with the store down: %d %s", r.status, r.raw)
	}
	f.fq.fail.Store(false)
	ids := f.do(t, "POST", "/v1/messages", f.key, first, map[string]string{"Idempotency-Key": "k1"}).ids(t)
	r := f.do(t, "POST", "/v1/messages", f.key, msg("c@one.example", "d@one.example"), nil)
	if r.status != http.StatusTooManyRequests || r.json["type"] != ProblemQuotaExceeded || r.header.Get("Retry-After") == "" ||
		!strings.Contains(string(r.raw), "3 recipients per 24 hours") {
		t.Fatalf("past the limit: %d %s (Retry-After %q)", r.status, r.raw, r.header.Get("Retry-After"))
	}
	if again := f.do(t, "POST", "/v1/messages", f.key, first, map[string]string{"Idempotency-Key": "k1"}).ids(t); !slices.Equal(again, ids) {
		t.Fatalf("the retry got %v, want %v", again, ids)
	}
	f.do(t, "POST", "/v1/messages", f.key, msg("c@one.example"), nil).ids(t)
	if items := queued(t, f.q); len(items) != 2 {
		t.Fatalf("%d envelopes stored, want the two accepted messages'", len(items))
	}
	if r := f.do(t, "POST", "/v1/messages", f.key, msg("e@one.example"), nil); r.status != http.StatusTooManyRequests {
		t.Fatalf("a fourth recipient: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "POST", "/v1/messages", f.key, msg("f@one.example", "g@one.example", "h@one.example", "i@one.example"), nil); r.status != 422 ||
		r.json["type"] != ProblemQuotaExceeded || r.header.Get("Retry-After") != "" {
		t.Fatalf("more recipients than the whole limit: %d %s", r.status, r.raw)
	}
}

// send_at holds the message on the retry lane until then, dated then and
// reported deferred with next_attempt_at; past 72 hours ahead it is 422
// bad-send-at; a time past sends at once.
func TestSendAt(t *testing.T) {
	f := newFixture(t, nil)
	at := time.Now().Add(2 * time.Hour).UTC().Truncate(time.Second)
	msg := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"}, "subject": "later", "text": "x",
		"send_at": at.Format(time.RFC3339)}
	ids := f.do(t, "POST", "/v1/messages", f.key, msg, map[string]string{"Idempotency-Key": "later-1"}).ids(t)
	r := f.do(t, "GET", "/v1/messages/"+ids[0], f.key, nil, nil)
	if r.status != 200 || r.json["state"] != "deferred" || r.json["next_attempt_at"] != at.Format(time.RFC3339) {
		t.Fatalf("status of a scheduled message: %d %s", r.status, r.raw)
	}
	if b := body(t, f.q, ids[0]); !strings.Contains(string(b), "Date: "+at.Format(time.RFC1123Z)) {
		t.Fatalf("a built message scheduled for %v is dated otherwise:\n%s", at, b)
	}
	if items := queued(t, f.q); len(items) != 0 {
		t.Fatalf("a scheduled message on the work lane: %+v", items)
	}

	msg["send_at"] = time.Now().Add(MaxSendAhead + time.Hour).Format(time.RFC3339)
	if r := f.do(t, "POST", "/v1/messages", f.key, msg, nil); r.status != 422 || r.json["type"] != ProblemBadSendAt {
		t.Fatalf("send_at beyond %v: %d %s", MaxSendAhead, r.status, r.raw)
	}
	msg["send_at"] = "tomorrow"
	if r := f.do(t, "POST", "/v1/messages", f.key, msg, nil); r.status != 400 || r.json["type"] != ProblemBadJSON {
		t.Fatalf("send_at not a time: %d %s", r.status, r.raw)
	}
	msg["send_at"] = time.Now().Add(-time.Minute).Format(time.RFC3339)
	f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)
	if items := queued(t, f.q); len(items) != 1 {
		t.Fatalf("a send_at past: %d on the work lane, want it sent at once", len(items))
	}
}

// DELETE takes a tenant's waiting message out of the queue (a dropped
// event by "api"); a message that has left the queue is 409 already-sent,
// another tenant's 404.
func TestCancelMessage(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	other, _, err := f.srv.Keys().Create(ctx, "other", false)
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x",
		"send_at": time.Now().Add(time.Hour).Format(time.RFC3339)}
	id := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)[0]
	if r := f.do(t, "DELETE", "/v1/messages/"+id, other, nil, nil); r.status != 404 {
		t.Fatalf("another tenant's cancel: %d %s", r.status, r.raw)
	}
	r := f.do(t, "DELETE", "/v1/messages/"+id, f.key, nil, nil)
	if r.status != 200 || r.json["state"] != "dropped" || r.json["was"] != "deferred" {
		t.Fatalf("cancel: %d %s", r.status, r.raw)
	}
	if _, err := f.q.Find(ctx, id); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("still in the queue after cancel: %v", err)
	}
	st := f.do(t, "GET", "/v1/messages/"+id, f.key, nil, nil)
	if st.json["state"] != "dropped" || !strings.Contains(string(st.raw), `"worker_id":"api"`) {
		t.Fatalf("status after cancel: %s", st.raw)
	}
	if r := f.do(t, "DELETE", "/v1/messages/"+id, f.key, nil, nil); r.status != 409 || r.json["type"] != ProblemAlreadySent ||
		!strings.Contains(string(r.raw), "dropped") {
		t.Fatalf("cancel again: %d %s", r.status, r.raw)
	}
	if r := f.do(t, "DELETE", "/v1/messages/nosuchid", f.key, nil, nil); r.status != 404 {
		t.Fatalf("cancel of nothing: %d %s", r.status, r.raw)
	}
}

// list_unsubscribe asks for one-click unsubscribe links: one envelope per
// recipient. The links' page is served without a key; a server without
// links refuses the request (422) and serves no such page.
func TestListUnsubscribeRequest(t *testing.T) {
	page := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "page for "+strings.TrimPrefix(r.URL.Path, "/unsubscribe/"))
	})
	f := newFixture(t, func(c *Config) { c.Unsubscribe = page })
	msg := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example", "bob@one.example"}, "subject": "news", "text": "x",
		"list_unsubscribe": true}
	ids := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)
	if len(ids) != 2 {
		t.Fatalf("ids %v: want one per recipient", ids)
	}
	items := queued(t, f.q)
	if len(items) != 2 || !items[0].Env.ListUnsubscribe || len(items[0].Env.Rcpts) != 1 {
		t.Fatalf("queued %+v", items)
	}
	msg["list_unsubscribe"] = false
	if ids := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t); len(ids) != 1 {
		t.Fatalf("without links: ids %v, want one for the domain", ids)
	}
	resp, err := http.Post(f.ts.URL+"/unsubscribe/tok", "application/x-www-form-urlencoded", strings.NewReader("List-Unsubscribe=One-Click"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "page for tok" {
		t.Fatalf("unsubscribe page without a key: %d %s", resp.StatusCode, b)
	}

	bare := newFixture(t, nil)
	msg["list_unsubscribe"] = true
	if r := bare.do(t, "POST", "/v1/messages", bare.key, msg, nil); r.status != 422 || r.json["type"] != ProblemNoUnsubscribe {
		t.Fatalf("links asked of a server without: %d %s", r.status, r.raw)
	}
	if resp, err := http.Get(bare.ts.URL + "/unsubscribe/tok"); err != nil || resp.StatusCode != 404 {
		t.Fatalf("unsubscribe page on a server without links: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// hangOnce is a queue whose first Enqueue waits out its context.
type hangOnce struct {
	*failingQueue
	hung atomic.Bool
}

func (h *hangOnce) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	if h.hung.CompareAndSwap(false, true) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return h.failingQueue.Enqueue(ctx, s)
}

// TestIdempotentRetryAfterTimeout: an enqueue that ran out of time is a
// 503 "send it again", and the retry under the same Idempotency-Key goes
// through at once, not 409 in-progress.
func TestIdempotentRetryAfterTimeout(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Queue = &hangOnce{failingQueue: c.Queue.(*failingQueue)}
		c.EnqueueTimeout = 2 * time.Second
	})
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	h := map[string]string{"Idempotency-Key": "retry-after-timeout"}
	if r := f.do(t, "POST", "/v1/messages", f.key, msg, h); r.status != 503 {
		t.Fatalf("first: %d %s, want 503", r.status, r.raw)
	}
	if r := f.do(t, "POST", "/v1/messages", f.key, msg, h); r.status != 202 {
		t.Fatalf("retry: %d %s, want 202", r.status, r.raw)
	}
}

// TestBuildIsStable: a request with several headers builds the same bytes
// every time (a Go map's order changes from one range to the next).
func TestBuildIsStable(t *testing.T) {
	req := &MessageRequest{From: "a@src.example", To: []string{"b@one.example"}, Text: "x",
		Headers: map[string]string{"X-A": "1", "X-B": "2", "X-C": "3", "X-D": "4", "X-E": "5", "X-F": "6"}}
	date := time.Unix(1700000000, 0)
	first, err := build(req, date, "h.example", "seed")
	if err != nil {
		t.Fatal(err)
	}
	for range 30 {
		if b, _ := build(req, date, "h.example", "seed"); !bytes.Equal(b, first) {
			t.Fatalf("two builds of one request differ:\n%s\n---\n%s", first, b)
		}
	}
}

// TestGetMessageSaysWhyItWaits: a stored message's status carries its last
// class and reply, here the coordinator's reason for holding it before any
// attempt (a source address blocked by its destination), which no event
// records: the history alone showed a queued message deferred for an
// hour with no reason.
func TestGetMessageSaysWhyItWaits(t *testing.T) {
	f := newFixture(t, nil)
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{"from": "a@src.example", "to": []string{"b@dst.example"}, "text": "hi"}, nil).ids(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	d := f.takeWork(ctx, t)
	next := d.Env.Clone()
	next.LastClass, next.LastReply = "local", "suspended: dst.example@192.0.2.10: source blocked (source-listed): 554 5.7.1 listed"
	if err := d.Reschedule(ctx, next, queue.LaneRetry, time.Now().Add(time.Hour), true); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		got := f.do(t, "GET", "/v1/messages/"+ids[0], f.key, nil, nil)
		if got.json["state"] == "deferred" {
			if got.json["last_class"] != "local" || got.json["last_reply"] != next.LastReply {
				t.Fatalf("status of a held message: %s", got.raw)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("never deferred: %s", got.raw)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An operator's action on a message (here a drop by `outflow queue drop`,
// worker_id admin:USER@HOST) is shown to the tenant's key as "admin", in
// the message's status and in GET /v1/events; an admin key sees who.
func TestOperatorNamedOnlyToOperators(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	adminKey, _, err := f.srv.Keys().Create(ctx, "acme", true)
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x",
		"send_at": time.Now().Add(time.Hour).Format(time.RFC3339)}
	id := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)[0]
	const by = "admin:bob@ops-1"
	if _, err := f.q.DropBy(ctx, id, by); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/v1/messages/" + id, "/v1/events?recipient=ann@one.example"} {
		var r response
		waitFor(t, path+" showing the drop", func() bool {
			r = f.do(t, "GET", path, f.key, nil, nil)
			return strings.Contains(string(r.raw), "dropped")
		})
		if strings.Contains(string(r.raw), "bob@ops-1") || !strings.Contains(string(r.raw), `"worker_id":"admin"`) {
			t.Errorf("%s to the tenant's key names the operator: %s", path, r.raw)
		}
		if a := f.do(t, "GET", path, adminKey, nil, nil); !strings.Contains(string(a.raw), `"worker_id":"`+by+`"`) {
			t.Errorf("%s to an admin key does not name the operator: %s", path, a.raw)
		}
	}
}

// TestAdminKeyActsAsTheOperator: an admin key's cancellation of another
// tenant's message and its suppression for that tenant are the
// operator's, not the tenant's own API calls: the tenant sees the drop by
// "admin" and the entry's source "admin" (they said "api", as if the
// tenant had done it), and the operator's views name the key.
func TestAdminKeyActsAsTheOperator(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	adminKey, info, err := f.srv.Keys().Create(ctx, "ops", true)
	if err != nil {
		t.Fatal(err)
	}
	msg := map[string]any{"from": "news@shop.example", "to": []string{"ann@one.example"}, "text": "x",
		"send_at": time.Now().Add(time.Hour).Format(time.RFC3339)}
	id := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)[0]
	if r := f.do(t, "DELETE", "/v1/messages/"+id, adminKey, nil, nil); r.status != 200 {
		t.Fatalf("admin cancel: %d %s", r.status, r.raw)
	}
	var r response
	waitFor(t, "the drop in the tenant's view", func() bool {
		r = f.do(t, "GET", "/v1/messages/"+id, f.key, nil, nil)
		return strings.Contains(string(r.raw), "dropped")
	})
	if !strings.Contains(string(r.raw), `"worker_id":"admin"`) || strings.Contains(string(r.raw), `"worker_id":"api"`) {
		t.Errorf("the tenant's view of an admin key's cancellation: %s", r.raw)
	}
	if a := f.do(t, "GET", "/v1/messages/"+id, adminKey, nil, nil); !strings.Contains(string(a.raw), `"worker_id":"admin:apikey `+info.ID+`"`) {
		t.Errorf("the operator's view does not name the key: %s", a.raw)
	}
	// The tenant's own cancellation stays the API's.
	own := f.do(t, "POST", "/v1/messages", f.key, msg, nil).ids(t)[0]
	if r := f.do(t, "DELETE", "/v1/messages/"+own, f.key, nil, nil); r.status != 200 {
		t.Fatalf("own cancel: %d %s", r.status, r.raw)
	}
	waitFor(t, "the tenant's own drop", func() bool {
		r = f.do(t, "GET", "/v1/messages/"+own, f.key, nil, nil)
		return strings.Contains(string(r.raw), `"worker_id":"api"`)
	})

	s := f.do(t, "POST", "/v1/suppressions", adminKey, map[string]any{"address": "gone@example.org", "tenant": "acme"}, nil)
	if s.status != http.StatusCreated || s.json["source"] != queue.SuppressAdmin {
		t.Fatalf("admin key's suppression for acme: %d %s, want source %q", s.status, s.raw, queue.SuppressAdmin)
	}
	if s := f.do(t, "POST", "/v1/suppressions", adminKey, map[string]any{"address": "own@example.org"}, nil); s.json["source"] != queue.SuppressAPI {
		t.Errorf("admin key's suppression for its own tenant: %s, want source %q", s.raw, queue.SuppressAPI)
	}
}
