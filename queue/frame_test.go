package queue

import (
	"bytes"
	"strings"
	"testing"
)

// inFrame returns a copy of body as the tail of a frame with head free
// octets in front of it, as the submission listener reads one.
func inFrame(body []byte, head int) (frame, tail []byte) {
	frame = make([]byte, head+len(body))
	for i := range head {
		frame[i] = '#' // whatever was there must not show
	}
	copy(frame[head:], body)
	return frame, frame[head:]
}

// An envelope whose inline body is the tail of a frame is encoded into the
// frame's free octets, byte for byte what the copying path writes, and
// its body is not copied; when the free octets are too few, or the body is
// not the frame's tail, the copying path runs and the frame is untouched.
func TestEnvelopeDataInFrame(t *testing.T) {
	want, err := sampleEnvelopes()[0].data()
	if err != nil {
		t.Fatal(err)
	}
	e := sampleEnvelopes()[0]
	jsonLen := len(want) - len(e.Body) // the JSON and its newline

	for _, c := range []struct {
		name    string
		head    int
		inPlace bool
	}{
		{"ample", FrameHeadroom(e.From, e.Rcpts, false), true},
		{"exact", jsonLen, true},
		{"one short", jsonLen - 1, false},
		{"none", 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := sampleEnvelopes()[0]
			frame, body := inFrame(e.Body, c.head)
			e.Body, e.frame = body, frame
			before := bytes.Clone(frame)
			got, err := e.data()
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("data = %q\nwant %q", got, want)
			}
			inFrame := &got[len(got)-len(body)] == &body[0]
			if inFrame != c.inPlace {
				t.Fatalf("written in the frame: %v, want %v", inFrame, c.inPlace)
			}
			if !c.inPlace && !bytes.Equal(frame, before) {
				t.Fatal("the copying path wrote into the frame")
			}
			if !bytes.Equal(body, sampleEnvelopes()[0].Body) {
				t.Fatal("the body changed")
			}
		})
	}

	t.Run("body not the frame's tail", func(t *testing.T) {
		e := sampleEnvelopes()[0]
		frame, body := inFrame(append(bytes.Clone(e.Body), "trailer"...), 1024)
		e.Body, e.frame = body[:len(e.Body)], frame
		got, err := e.data()
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("data = %q, %v", got, err)
		}
		if &got[len(got)-len(e.Body)] == &body[0] {
			t.Fatal("encoded in front of a body that is not the frame's tail")
		}
	})

	t.Run("Object Store body", func(t *testing.T) {
		e := sampleEnvelopes()[1]
		frame, _ := inFrame([]byte("body"), 4096)
		e.frame = frame
		got, err := e.data()
		if err != nil || strings.Contains(string(got), "#") || bytes.Contains(frame[:4096], []byte(`"id"`)) {
			t.Fatalf("an envelope without an inline body used the frame: %q, %v", got, err)
		}
	})
}

// FrameHeadroom leaves room for the JSON of envelopes with many and long
// recipients and DSN parameters, so the listener's frames are used.
func TestFrameHeadroomFits(t *testing.T) {
	for _, e := range []*Envelope{sampleEnvelopes()[0], {
		ID: "01JABCDEFGHIJKLMNOPQRS", MsgID: "01JABCDEFGHIJKLMNOPQRS", Tenant: "a-rather-long-tenant-name",
		From:  strings.Repeat("f", 64) + "@" + strings.Repeat("d", 60) + ".example",
		Rcpts: []string{strings.Repeat("r", 64) + "@x.example", "b@x.example", "c@x.example"}, Dest: "x.example",
		Body: []byte("x"), Size: 1, Parts: 1, MessageID: "<" + strings.Repeat("m", 120) + "@host.example>", Source: SourceSMTP,
		DSN: &DSNParams{Ret: "HDRS", EnvID: "env-1", Rcpts: map[string]RcptDSN{
			strings.Repeat("r", 64) + "@x.example": {Notify: []string{"SUCCESS", "FAILURE", "DELAY"}, ORcpt: "rfc822;" + strings.Repeat("r", 64) + "@x.example"},
		}},
	}} {
		data, err := e.data()
		if err != nil {
			t.Fatal(err)
		}
		need := len(data) - len(e.Body)
		if h := FrameHeadroom(e.From, e.Rcpts, e.DSN != nil); h < need {
			t.Fatalf("FrameHeadroom = %d, the JSON needs %d", h, need)
		}
	}
}

// Once Enqueue has returned nil, nothing it started still reads the
// submission's body or frame (the contract the SMTP listener relies on to
// reuse the buffer): overwriting them afterwards changes nothing stored,
// whichever way the body went (inline, the Object Store, shared by two
// destinations, under an idempotency key).
func TestEnqueueKeepsNoBody(t *testing.T) {
	q, ctx, small, large := inlineLimitQueue(t)
	for _, c := range []struct {
		name  string
		body  []byte
		rcpts []string
		key   string
	}{
		{"inline", small, []string{"r@d.example"}, ""},
		{"Object Store", large, []string{"r@d.example"}, ""},
		{"two destinations", small, []string{"r@d.example", "s@e.example"}, ""},
		{"idempotency key", large, []string{"r@d.example"}, "key-1"},
	} {
		frame, tail := inFrame(c.body, FrameHeadroom("a@b.example", c.rcpts, false))
		ids, err := q.Enqueue(ctx, &Submission{Tenant: "t", From: "a@b.example", Rcpts: c.rcpts, Body: tail, Frame: frame, IdempotencyKey: c.key})
		if err != nil {
			t.Fatal(err)
		}
		for i := range frame {
			frame[i] = '!'
		}
		for _, id := range ids {
			it, err := q.Find(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			got, err := q.EnvelopeBody(ctx, it.Env)
			if err != nil || !bytes.Equal(got, c.body) || it.Env.Size != int64(len(c.body)) || it.Env.From != "a@b.example" {
				t.Fatalf("%s: %s stored %+v, body %q, %v; want %q", c.name, id, it.Env, got, err, c.body)
			}
		}
	}
}
