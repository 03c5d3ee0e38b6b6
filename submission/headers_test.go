package submission

import (
	"errors"
	"net/mail"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

func TestCompleteHeaders(t *testing.T) {
	now := time.Date(2026, 12, 2, 9, 30, 0, 0, time.UTC)
	const trace = "Received: from x\r\n\tby y; date\r\n"
	cases := []struct {
		name, msg        string
		skip             int
		wantDate, wantID bool // the field is added
		unchanged        bool
	}{
		{name: "both missing", msg: "Subject: hi\r\n\r\nbody\r\n", wantDate: true, wantID: true},
		{name: "both present, any case", msg: "DATE: Tue, 1 Dec 2026 10:00:00 +0000\r\nmessage-id: <a@b>\r\n\r\nbody\r\n", unchanged: true},
		{name: "date missing", msg: "Message-ID: <a@b>\r\nSubject: hi\r\n\r\n", wantDate: true},
		{name: "id missing, folded subject", msg: "Subject: a\r\n Date: not a field\r\nDate: Tue, 1 Dec 2026 10:00:00 +0000\r\n\r\n", wantID: true},
		{name: "field in the body does not count", msg: "Subject: hi\r\n\r\nDate: x\r\nMessage-ID: <y@z>\r\n", wantDate: true, wantID: true},
		{name: "under the trace field", msg: trace + "Subject: hi\r\n\r\nbody\r\n", skip: len(trace), wantDate: true, wantID: true},
		{name: "no header section", msg: "\r\njust a body\r\n", unchanged: true},
		{name: "mbox From line", msg: "From sender Tue Dec  1 10:00:00 2026\r\nSubject: hi\r\n\r\n", unchanged: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := string(CompleteHeaders([]byte(c.msg), c.skip, "relay.example", "", now))
			if c.unchanged {
				if got != c.msg {
					t.Fatalf("changed: %q", got)
				}
				return
			}
			if !strings.HasPrefix(got, c.msg[:c.skip]) || !strings.HasSuffix(got, c.msg[c.skip:]) {
				t.Fatalf("fields not inserted after the first %d octets: %q", c.skip, got)
			}
			m, err := mail.ReadMessage(strings.NewReader(got[c.skip:]))
			if err != nil {
				t.Fatalf("not a message: %v: %q", err, got)
			}
			added := got[c.skip : len(got)-len(c.msg)+c.skip]
			if strings.Contains(added, "Date:") != c.wantDate || strings.Contains(added, "Message-ID:") != c.wantID {
				t.Fatalf("added %q, want Date %v, Message-ID %v", added, c.wantDate, c.wantID)
			}
			if c.wantDate {
				d, err := m.Header.Date()
				if err != nil || !d.Equal(now) {
					t.Fatalf("Date %q: %v %v", m.Header.Get("Date"), d, err)
				}
			}
			if c.wantID {
				id := m.Header.Get("Message-ID")
				if !strings.HasPrefix(id, "<") || !strings.HasSuffix(id, "@relay.example>") || len(id) != len("<@relay.example>")+32 {
					t.Fatalf("Message-ID %q", id)
				}
			}
		})
	}
}

func TestCompleteHeadersMessageIDs(t *testing.T) {
	msg := []byte("Subject: hi\r\n\r\n")
	now := time.Now()
	a := string(CompleteHeaders(msg, 0, "h", "", now))
	b := string(CompleteHeaders(msg, 0, "h", "", now))
	if a == b {
		t.Fatal("two random Message-IDs are the same")
	}
	s1 := string(CompleteHeaders(msg, 0, "h", "tenant\x00key", now))
	s2 := string(CompleteHeaders(msg, 0, "h", "tenant\x00key", now))
	s3 := string(CompleteHeaders(msg, 0, "h", "other\x00key", now))
	if s1 != s2 || s1 == s3 {
		t.Fatalf("seeded ids: same seed %v, other seed differs %v", s1 == s2, s1 != s3)
	}
}

// A bare message submitted over SMTP is stored with a Date and a
// Message-ID under the Received field; a complete one is stored as sent
// (TestSubmitAuthenticated).
func TestSubmissionCompletesBareMessage(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), Hostname: "mx.test"}, q)
	c := ts.dialAuth(t)
	if err := c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader("Subject: bare\r\n\r\nhi\r\n")); err != nil {
		t.Fatal(err)
	}
	subs := q.got()
	if len(subs) != 1 {
		t.Fatalf("%d submissions", len(subs))
	}
	_, rest := storedMessage(t, subs[0].Body)
	m, err := mail.ReadMessage(strings.NewReader(rest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Header.Date(); err != nil {
		t.Errorf("no usable Date: %v: %q", err, rest)
	}
	if id := m.Header.Get("Message-ID"); !strings.HasSuffix(id, "@mx.test>") {
		t.Errorf("Message-ID %q: %q", id, rest)
	}
	if m.Header.Get("Subject") != "bare" {
		t.Errorf("lost the sender's fields: %q", rest)
	}
}

// FuzzCompleteHeaders: whatever the input, the message is kept whole
// behind the added fields, and a second pass adds nothing.
func FuzzCompleteHeaders(f *testing.F) {
	f.Add([]byte("Subject: hi\r\n\r\nbody\r\n"))
	f.Add([]byte("Date: x\r\n\r\n"))
	f.Add([]byte("message-id:<a@b>\r\n \r\n"))
	f.Add([]byte("\r\n"))
	f.Fuzz(func(t *testing.T, msg []byte) {
		now := time.Unix(1_800_000_000, 0)
		once := CompleteHeaders(msg, 0, "h", "s", now)
		if !strings.HasSuffix(string(once), string(msg)) {
			t.Fatalf("%q lost bytes: %q", msg, once)
		}
		if twice := CompleteHeaders(once, 0, "h", "s", now); string(twice) != string(once) {
			t.Fatalf("second pass changed %q to %q", once, twice)
		}
	})
}

// completeHeadersInFrame writes what CompleteHeaders writes, in the free
// octets in front of the body, which stays the frame's tail; with too few
// it copies as CompleteHeaders does.
func TestCompleteHeadersInFrame(t *testing.T) {
	now := time.Date(2026, 12, 3, 9, 30, 0, 0, time.UTC)
	const trace = "Received: from x\r\n\tby y; date\r\n"
	for _, c := range []struct {
		msg    string
		random bool // a Message-ID is added: random, so compared by length
	}{
		{trace + "Message-ID: <a@b>\r\nSubject: hi\r\n\r\nbody\r\n", false}, // Date missing
		{trace + "Date: x\r\nMessage-ID: <a@b>\r\n\r\nbody\r\n", false},     // nothing missing
		{trace + "Subject: hi\r\n\r\nbody\r\n", true},                       // both missing
	} {
		for _, head := range []int{maxAddedHeaders, 0} {
			frame := make([]byte, head+len(c.msg))
			body := frame[head:]
			copy(body, c.msg)
			got := completeHeadersInFrame(frame, body, len(trace), "relay.example", now)
			want := CompleteHeaders([]byte(c.msg), len(trace), "relay.example", "", now)
			if len(got) != len(want) || !strings.HasPrefix(string(got), trace) || !strings.HasSuffix(string(got), c.msg[len(trace):]) ||
				!c.random && string(got) != string(want) {
				t.Fatalf("head %d: got %q\nwant %q", head, got, want)
			}
			tail := &got[len(got)-1] == &frame[len(frame)-1]
			if wantTail := head > 0 || len(got) == len(c.msg); tail != wantTail {
				t.Fatalf("head %d: body is the frame's tail: %v, want %v", head, tail, wantTail)
			}
		}
	}
}

// The listener hands the queue each body as the tail of a frame with room
// in front for the envelope (queue.Submission.Frame), a bare message's
// added fields included, so the body is not copied again to be stored.
func TestSubmissionBodyInFrame(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), Hostname: "mx.test"}, q)
	c := ts.dialAuth(t)
	for _, msg := range []string{"Subject: bare\r\n\r\nhi\r\n", "Date: Thu, 3 Dec 2026 09:00:00 +0000\r\nMessage-ID: <a@b>\r\n\r\nhi\r\n"} {
		if err := c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader(msg)); err != nil {
			t.Fatal(err)
		}
	}
	subs, heads := q.got(), q.frameHeads()
	if len(subs) != 2 {
		t.Fatalf("%d submissions", len(subs))
	}
	for i, s := range subs {
		if heads[i] < 0 {
			t.Fatal("body is not the tail of a frame")
		}
		if need := queue.FrameHeadroom(s.From, s.Rcpts, s.DSN != nil); heads[i] < need {
			t.Fatalf("%d free octets in front of the body, FrameHeadroom asks %d", heads[i], need)
		}
	}
}

// A frame is reused only after its message was stored: a failed enqueue
// (a timeout may leave a publish that still reads the body) leaves it to
// the collector. Frames come from the pool of the smallest class that
// holds them.
func TestFrameRecycledOnlyAfterStore(t *testing.T) {
	var mu sync.Mutex
	var back int
	recycleFrame = func(b []byte) {
		mu.Lock()
		back++
		mu.Unlock()
		putFrame(b)
	}
	t.Cleanup(func() { recycleFrame = putFrame })
	recycled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return back
	}

	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), Hostname: "mx.test"}, q)
	c := ts.dialAuth(t)
	if err := c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader("Subject: a\r\n\r\nhi\r\n")); err != nil {
		t.Fatal(err)
	}
	if n := recycled(); n != 1 {
		t.Fatalf("%d frames back after a stored message, want 1", n)
	}
	q.mu.Lock()
	q.err = errors.New("store down")
	q.mu.Unlock()
	if err := c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader("Subject: b\r\n\r\nhi\r\n")); err == nil {
		t.Fatal("a failed enqueue was accepted")
	}
	if n := recycled(); n != 1 {
		t.Fatalf("%d frames back after a failed enqueue, want still 1", n)
	}

	for _, n := range []int{1, 4 << 10, 4<<10 + 1, 256 << 10, 256<<10 + 1} {
		f := getFrame(n)
		want := n
		for _, c := range frameClasses {
			if n <= c {
				want = c
				break
			}
		}
		if len(f) != n || cap(f) != want {
			t.Fatalf("getFrame(%d): len %d cap %d, want cap %d", n, len(f), cap(f), want)
		}
	}
}

// go test -run '^$' -bench CompleteHeaders -benchmem ./submission
//
// A bare 2 KiB message gets its Date and Message-ID: copied whole by
// CompleteHeaders, written in front of the body by completeHeadersInFrame.
func BenchmarkCompleteHeaders(b *testing.B) {
	now := time.Date(2026, 12, 3, 9, 30, 0, 0, time.UTC)
	const trace = "Received: from x\r\n\tby y; date\r\n"
	msg := []byte(trace + "Subject: bare\r\n\r\n" + strings.Repeat("0123456789abcdef", 128))
	b.Run("copy", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			CompleteHeaders(msg, len(trace), "relay.example", "", now)
		}
	})
	b.Run("in-frame", func(b *testing.B) {
		frame := make([]byte, maxAddedHeaders+len(msg))
		b.ReportAllocs()
		for b.Loop() {
			copy(frame[maxAddedHeaders:], msg) // the body as read, each time
			completeHeadersInFrame(frame, frame[maxAddedHeaders:], len(trace), "relay.example", now)
		}
	})
}
