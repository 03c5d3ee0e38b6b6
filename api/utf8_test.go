package api

import (
	"bytes"
	"encoding/json"
	"io"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

// TestRawNotUTF8IsRefused: a request whose JSON holds an octet that is
// not UTF-8 (8-bit text pasted as is, a literal 0xE9 for "é" in a raw
// ISO-8859-1 message) was accepted, encoding/json turning the octet into
// U+FFFD, and the message delivered so. It is a 400 bad-message naming
// the field now, and nothing is stored; UTF-8, a U+FFFD sent as such and
// the same 8-bit message sent as quoted-printable are taken.
func TestRawNotUTF8IsRefused(t *testing.T) {
	f := newFixture(t, nil)
	const head = `{"from":"a@src.example","to":["b@dst.example"],`
	raw8bit := "From: a@src.example\r\nTo: b@dst.example\r\nSubject: caf\xe9\r\nContent-Type: text/plain; charset=iso-8859-1\r\n" +
		"Content-Transfer-Encoding: 8bit\r\n\r\nCaf\xe9 cr\xe8me\r\n"
	for _, c := range []struct {
		name, body, field string
	}{
		{"raw", head + `"raw":"` + strings.ReplaceAll(raw8bit, "\r\n", `\r\n`) + `"}`, "raw"},
		{"raw ending in a lone lead octet", head + `"raw":"Subject: x\r\n\r\nx` + "\xe9\"}", "raw"},
		{"truncated sequence at the end", head + `"raw":"Subject: x\r\n\r\nx"}` + "\xe2\x82", ""},
		{"subject", head + `"subject":"caf` + "\xe9" + `","text":"x"}`, "subject"},
		{"header value", head + `"text":"x","headers":{"X-A":"` + "\xff" + `"}}`, "headers"},
		{"attachment", head + `"text":"x","attachments":[{"filename":"a` + "\xc3" + `.txt","content":"eA=="}]}`, "attachments"},
		{"surrogate", head + `"text":"` + "\xed\xa0\x80" + `"}`, "text"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if utf8.ValidString(c.body) {
				t.Fatal("the test body is UTF-8")
			}
			res := f.do(t, "POST", "/v1/messages", f.key, []byte(c.body), nil)
			if res.status != 400 || res.json["type"] != ProblemBadMessage {
				t.Fatalf("got %d %s, want 400 %s", res.status, res.raw, ProblemBadMessage)
			}
			detail, _ := res.json["detail"].(string)
			if !strings.Contains(detail, "UTF-8") || !strings.Contains(detail, "send 8-bit charsets as base64 or quoted-printable") {
				t.Errorf("detail %q", detail)
			}
			errs, _ := res.json["errors"].([]any)
			switch {
			case c.field == "" && len(errs) != 0:
				t.Errorf("errors %v, want none", errs)
			case c.field != "":
				if len(errs) != 1 || errs[0].(map[string]any)["field"] != c.field {
					t.Errorf("errors %v, want field %q", errs, c.field)
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

	// UTF-8 is taken as it is, U+FFFD included.
	utf := "From: a@src.example\r\nTo: b@dst.example\r\nSubject: caf\u00e9\r\n\r\nCaf\u00e9 \ufffd\r\n"
	ids := f.do(t, "POST", "/v1/messages", f.key, map[string]any{"from": "a@src.example", "to": []string{"b@dst.example"}, "raw": utf}, nil).ids(t)
	if b := body(t, f.q, ids[0]); !bytes.HasSuffix(b, []byte(utf)) {
		t.Fatalf("stored %q, want it to end with %q", b, utf)
	}
}

// TestUTF8ReaderAnyChunking: the reader finds the first octet that is not
// UTF-8 wherever the reads cut the body, as utf8.Valid would.
func TestUTF8ReaderAnyChunking(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 8))
	pieces := []string{"a", `"`, `\`, "{", "}", ",", "é", "€", "😀", "\ufffd", "\xe9", "\xff", "\xe2\x82", "\xf0\x9f", "\xed\xa0\x80", "\xc0\xaf", "z"}
	for i := range 3000 {
		var sb strings.Builder
		for range rng.IntN(12) {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		in := sb.String()
		wantAt := int64(-1)
		for j := 0; j < len(in); {
			r, size := utf8.DecodeRuneInString(in[j:])
			if r == utf8.RuneError && size <= 1 {
				wantAt = int64(j)
				break
			}
			j += size
		}
		var rd io.Reader = strings.NewReader(in)
		switch i % 3 {
		case 0:
			rd = iotest.OneByteReader(rd)
		case 1:
			rd = iotest.HalfReader(rd)
		}
		u := &utf8Reader{r: rd}
		out, err := io.ReadAll(u)
		if err != nil || string(out) != in {
			t.Fatalf("%q: read %q, %v", in, out, err)
		}
		if u.bad != (wantAt >= 0) || (u.bad && u.at != wantAt) {
			t.Fatalf("%q (reads %d): bad %v at %d, want bad at %d", in, i%3, u.bad, u.at, wantAt)
		}
	}
}

// TestUTF8ReaderNamesTheField: the field named is the top-level key whose
// value holds the octet, however deep, and whatever keys came before.
func TestUTF8ReaderNamesTheField(t *testing.T) {
	for body, want := range map[string]string{
		`{"a":"x","raw":"y` + "\xe9" + `"}`:                "raw",
		`{"a":{"raw":"x"},"text":"` + "\xe9" + `"}`:        "text",
		`{"a\"b":"x","headers":{"X":"` + "\xe9" + `"}}`:    "headers",
		`{"to":["a","` + "\xe9" + `"]}`:                    "to",
		`{"raw":"a\"b\\` + `","c":"` + "\xe9" + `"}`:       "c",
		`{"k` + "\xe9" + `":"x"}`:                          "",
		`["` + "\xe9" + `"]`:                               "",
		`{"raw":"` + strings.Repeat("x", 9000) + "\xe9\"}": "raw",
	} {
		for _, chunked := range []bool{false, true} {
			var rd io.Reader = strings.NewReader(body)
			if chunked {
				rd = iotest.OneByteReader(rd)
			}
			u := &utf8Reader{r: rd}
			_, _ = io.ReadAll(u)
			if !u.bad || u.field != want {
				t.Errorf("%.60q (one octet a read: %v): bad %v field %q, want %q", body, chunked, u.bad, u.field, want)
			}
		}
	}
	// A valid body is not refused, and is read whole.
	b, _ := json.Marshal(map[string]any{"raw": "Subject: caf\u00e9\r\n\r\n\ufffd", "x": []any{"\\", `"`}})
	u := &utf8Reader{r: iotest.HalfReader(bytes.NewReader(b))}
	if out, _ := io.ReadAll(u); u.bad || !bytes.Equal(out, b) {
		t.Fatalf("%s: bad %v", b, u.bad)
	}
}
