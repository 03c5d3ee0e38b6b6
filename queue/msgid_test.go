package queue

import (
	"bytes"
	"net/mail"
	"strings"
	"testing"
)

// TestHeaderMessageID: the in-place scan finds what net/mail's parser
// finds in a well-formed header, and copes with what it rejects.
func TestHeaderMessageID(t *testing.T) {
	big := "Subject: " + strings.Repeat("x", 70<<10) + "\r\n"
	for _, c := range []struct {
		name, body, want string
	}{
		{"plain", "From: a@b\r\nMessage-ID: <1@b>\r\nSubject: s\r\n\r\nbody\r\n", "<1@b>"},
		{"any case", "message-id:   <2@b>  \r\n\r\n", "<2@b>"},
		{"folded", "Message-Id:\r\n <3@b>\r\nTo: c@d\r\n\r\n", "<3@b>"},
		{"folded twice", "Message-Id: <4\r\n\t@b>\r\n\r\n", "<4 @b>"},
		{"first wins", "Message-ID: <5@b>\r\nMessage-ID: <6@b>\r\n\r\n", "<5@b>"},
		{"LF only", "Subject: s\nMessage-ID: <7@b>\n\nbody\n", "<7@b>"},
		{"none", "Subject: s\r\n\r\nMessage-ID: <in the body>\r\n", ""},
		{"no empty line", "Subject: s\r\nMessage-ID: <8@b>", "<8@b>"},
		{"empty body", "", ""},
		{"beyond 64 KiB", big + "Message-ID: <9@b>\r\n\r\n", ""},
		{"a malformed line before it", "no colon here\r\nMessage-ID: <10@b>\r\n\r\n", "<10@b>"},
		{"a similar name", "Message-IDs: x\r\nX-Message-ID: y\r\n\r\n", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := headerMessageID([]byte(c.body))
			if got != c.want {
				t.Fatalf("headerMessageID = %q, want %q", got, c.want)
			}
			// Where net/mail parses the header, it agrees.
			if m, err := mail.ReadMessage(bytes.NewReader([]byte(c.body))); err == nil && !strings.Contains(c.name, "64 KiB") {
				if ref := strings.TrimSpace(m.Header.Get("Message-Id")); ref != got {
					t.Fatalf("net/mail finds %q, the scan %q", ref, got)
				}
			}
		})
	}
}

func BenchmarkHeaderMessageID(b *testing.B) {
	body := []byte("Received: from x (y)\r\n\tby z; Mon, 30 Nov 2026 18:00:00 +0000\r\nFrom: a@b.example\r\nTo: c@d.example\r\n" +
		"Subject: hello\r\nDate: Mon, 30 Nov 2026 18:00:00 +0000\r\nMessage-ID: <abc@b.example>\r\n\r\n" + strings.Repeat("x", 2000) + "\r\n")
	b.ReportAllocs()
	for b.Loop() {
		if headerMessageID(body) != "<abc@b.example>" {
			b.Fatal("not found")
		}
	}
}

// BenchmarkSplit is a submission's recipients grouped into envelopes: one
// recipient (the common case, no map), three at two domains, and three
// with unsubscribe links (one envelope each).
func BenchmarkSplit(b *testing.B) {
	one := []string{"ann@one.example"}
	three := []string{"ann@one.example", "bob@two.example", "cy@one.example"}
	b.Run("one", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = split(one, false)
		}
	})
	b.Run("by-domain", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = split(three, false)
		}
	})
	b.Run("per-recipient", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = split(three, true)
		}
	})
}
