package submission

import (
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
	"net/netip"
)

func TestParseAddress(t *testing.T) {
	for _, s := range []string{
		"user@example.com",
		"first.last+tag@sub.example.co.uk",
		"a!#$%&'*+-/=?^_`{|}~@example.com",
		"x@localhost",
		"x@123.example",
		"x@EXAMPLE.COM",
		strings.Repeat("l", 64) + "@example.com",
	} {
		a, err := ParseAddress(s)
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		if a.String() != s {
			t.Errorf("%q round-trips to %q", s, a.String())
		}
	}
	for _, tc := range []struct {
		in       string
		nonASCII bool
	}{
		{"", false},
		{"user", false},
		{"@example.com", false},
		{"user@", false},
		{".user@example.com", false},
		{"user.@example.com", false},
		{"us..er@example.com", false},
		{"us er@example.com", false},
		{"us\"er@example.com", false},
		{"user@exa mple.com", false},
		{"user@example..com", false},
		{"user@.example.com", false},
		{"user@example.com.", false},
		{"user@-example.com", false},
		{"user@example-.com", false},
		{"user@[192.0.2.1]", false},
		{"user@[IPv6:2001:db8::1]", false},
		{"user@192.0.2.1", false},
		{"user@a@example.com", false},
		{"user@example.com\r\nRCPT TO:<x@y.z>", false},
		{strings.Repeat("l", 65) + "@example.com", false},
		{"u@" + strings.Repeat("a", 64) + ".com", false},
		{"u@" + strings.Repeat("abcdefghi.", 25) + "com", false}, // over 254
		{"jos\u00e9@example.com", true},
		{"user@b\u00fccher.example", true},
		{"\xff@example.com", true},
	} {
		_, err := ParseAddress(tc.in)
		if err == nil {
			t.Errorf("%q accepted", tc.in)
			continue
		}
		ae, ok := err.(*AddressError)
		if !ok || ae.NonASCII != tc.nonASCII {
			t.Errorf("%q: %#v", tc.in, err)
		}
		if strings.Contains(ae.Reason, "\n") {
			t.Errorf("%q: reason with a newline", tc.in)
		}
	}
}

func TestAddressReplies(t *testing.T) {
	_, err := ParseAddress("a..b@example.com")
	if e := addressError(err, true); e.Code != 553 || e.EnhancedCode != (smtp.EnhancedCode{5, 1, 7}) {
		t.Errorf("sender: %+v", e)
	}
	if e := addressError(err, false); e.Code != 553 || e.EnhancedCode != (smtp.EnhancedCode{5, 1, 3}) {
		t.Errorf("recipient: %+v", e)
	}
	_, err = ParseAddress("\u00e9@example.com")
	if e := addressError(err, false); e.EnhancedCode != (smtp.EnhancedCode{5, 6, 7}) {
		t.Errorf("non-ASCII: %+v", e)
	}
}

// FuzzParseAddress: ParseAddress never panics, and what it accepts is
// ASCII, within the RFC 5321 limits, free of anything that could break a
// command or header line, and round-trips.
func FuzzParseAddress(f *testing.F) {
	for _, s := range []string{"user@example.com", "a.b+c@sub.example.org", "@", "a@[1.2.3.4]",
		"x@1.2.3.4", "\u00e9@x.y", "a..b@c", "a@b-.c", strings.Repeat("a", 300) + "@b.c", "a@b\x00.c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAddress(s)
		if err != nil {
			if _, ok := err.(*AddressError); !ok {
				t.Fatalf("error of type %T", err)
			}
			return
		}
		out := a.String()
		if out != s {
			t.Fatalf("accepted %q as %q", s, out)
		}
		if len(out) > maxMailbox || len(a.Local) > maxLocalPart || len(a.Domain) > maxDomain {
			t.Fatalf("accepted over-long %q", s)
		}
		for i := 0; i < len(out); i++ {
			if c := out[i]; c < 0x21 || c > 0x7e || c == '<' || c == '>' || c == '(' || c == ')' {
				t.Fatalf("accepted %q with byte %#x", s, c)
			}
		}
		b, err := ParseAddress(out)
		if err != nil || b != a {
			t.Fatalf("round trip of %q: %v %v", s, b, err)
		}
	})
}

func TestBodyValidatorAcrossReads(t *testing.T) {
	lineErr := lineTooLongError(10)
	for _, tc := range []struct {
		name   string
		chunks []string
		reason string
	}{
		{"clean", []string{"ab\r", "\ncd\r\n"}, ""},
		{"CR at end of one read, LF at start of next", []string{"abc\r", "\n"}, ""},
		{"bare LF after split", []string{"abc", "\ndef\r\n"}, reasonBareLF},
		{"bare CR after split", []string{"abc\r", "x\r\n"}, reasonBareCR},
		{"trailing CR", []string{"abc\r"}, reasonBareCR},
		{"NUL", []string{"a\x00\r\n"}, reasonNUL},
		{"exactly max", []string{"12345678", "\r\n"}, ""},
		{"one over", []string{"123456789", "\r\n"}, reasonLineTooLong},
		{"8-bit is fine", []string{"caf\xc3\xa9\r\n"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := bodyValidator{maxLine: 10, lineTooLong: lineErr}
			for _, c := range tc.chunks {
				v.scan([]byte(c))
			}
			v.finish()
			if v.reason != tc.reason {
				t.Fatalf("reason %q, want %q", v.reason, tc.reason)
			}
		})
	}
}

func TestReceivedHeader(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	h := string(appendReceived(nil, "evil\r\nX-Injected: yes (c) ;", netip.MustParseAddr("2001:db8::1"), "mx.test", true, true, true, at))
	want := "Received: from evil__X-Injected:_yes__c___ ([IPv6:2001:db8::1])\r\n" +
		"\tby mx.test (outflow) with ESMTPSA;\r\n" +
		"\tWed, 04 Mar 2026 05:06:07 +0000\r\n"
	if h != want {
		t.Errorf("got  %q\nwant %q", h, want)
	}
	h = string(appendReceived([]byte("X: y\r\n"), "client.test", netip.MustParseAddr("192.0.2.7"), "mx.test", true, true, false, at))
	want = "X: y\r\nReceived: from client.test ([192.0.2.7])\r\n" +
		"\tby mx.test (outflow) with ESMTPS;\r\n" +
		"\tWed, 04 Mar 2026 05:06:07 +0000\r\n"
	if h != want {
		t.Errorf("got  %q\nwant %q", h, want)
	}
	if h := string(appendReceived(nil, "", netip.Addr{}, "mx", true, false, false, at)); !strings.HasPrefix(h, "Received: from unknown (unknown)\r\n\tby mx (outflow) with ESMTP;") {
		t.Errorf("got %q", h)
	}
}

func TestQueuedReply(t *testing.T) {
	e := queuedReply([]string{"a", "b", "c", "d", "e"}).(*smtp.SMTPError)
	if e.Code != 250 || e.Message != "OK: queued as a b c (+2 more)" {
		t.Errorf("%+v", e)
	}
}

// FuzzBodyValidator checks scan's line-at-a-time fast path against the
// octet loop that defines it: the same body, cut into the same reads, must
// end in the same fault (or none) and the same carried-over state.
func FuzzBodyValidator(f *testing.F) {
	for _, s := range []string{
		"ab\r\ncd\r\n", "abc\r\n\r\n.\r\n", "abc\rx\r\n", "abc\ndef", "a\x00b\r\n",
		"12345678\r\n123456789\r\n", "caf\xc3\xa9\r\n", "\r", "\n", "\r\r\n",
	} {
		f.Add([]byte(s), uint8(3), uint8(10))
	}
	// A CR carried over between reads, into a read with a bare CR of its
	// own: cleanChunk's count must not take one for the other.
	f.Add([]byte("\r\n\r\n\r0"), uint8(2), uint8(8))
	f.Add([]byte("ab\r\ncd\r\nef\r\n"), uint8(4), uint8(4))
	f.Fuzz(func(t *testing.T, body []byte, cut, maxLine uint8) {
		lineErr := lineTooLongError(int(maxLine))
		fast := bodyValidator{maxLine: int(maxLine), lineTooLong: lineErr}
		slow := fast
		step := int(cut)%17 + 1
		for i := 0; i < len(body); i += step {
			chunk := body[i:min(i+step, len(body))]
			fast.scan(chunk)
			if slow.err == nil {
				slow.scanBytes(chunk)
			}
		}
		fast.finish()
		slow.finish()
		if fast.reason != slow.reason {
			t.Fatalf("%q in reads of %d, max line %d: scan says %q, scanBytes %q", body, step, maxLine, fast.reason, slow.reason)
		}
		if fast.err == nil && (fast.lineLen != slow.lineLen || fast.prevCR != slow.prevCR) {
			t.Fatalf("%q: scan ends at line length %d CR %v, scanBytes at %d %v", body, fast.lineLen, fast.prevCR, slow.lineLen, slow.prevCR)
		}
	})
}

// BenchmarkBodyValidator scans a 100 KiB body of 76-octet lines, the shape
// of base64 or quoted-printable mail, in 32 KiB reads as readBody does.
func BenchmarkBodyValidator(b *testing.B) {
	line := strings.Repeat("x", 76) + "\r\n"
	body := []byte(strings.Repeat(line, 100<<10/len(line)))
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		v := bodyValidator{maxLine: 1000, lineTooLong: lineTooLongError(1000)}
		for i := 0; i < len(body); i += bodyChunk {
			v.scan(body[i:min(i+bodyChunk, len(body))])
		}
		if v.finish(); v.err != nil {
			b.Fatal(v.reason)
		}
	}
}
