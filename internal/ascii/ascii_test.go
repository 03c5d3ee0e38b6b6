package ascii

import (
	"bytes"
	"strings"
	"testing"
)

func FuzzIs(f *testing.F) {
	for _, s := range []string{"", "a", "caf\xc3\xa9", "12345678\x80", strings.Repeat("x", 31) + "\xff", strings.Repeat("y", 64)} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		want := true
		for _, c := range b {
			want = want && c < 0x80
		}
		if Is(b) != want || IsString(string(b)) != want {
			t.Fatalf("Is(%q) = %v, IsString %v, want %v", b, Is(b), IsString(string(b)), want)
		}
	})
}

// BenchmarkIs is the 8-bit check of a 100 KiB body, which the sender makes
// of every message before its MAIL FROM.
func BenchmarkIs(b *testing.B) {
	body := bytes.Repeat([]byte(strings.Repeat("x", 76)+"\r\n"), 100<<10/78)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !Is(body) {
			b.Fatal("8-bit")
		}
	}
}

// TestDomain: the form a domain is keyed and queued under.
func TestDomain(t *testing.T) {
	for in, want := range map[string]string{
		"Gmail.COM.":            "gmail.com",
		"Bücher.Example":        "xn--bcher-kva.example",
		"xn--bcher-kva.example": "xn--bcher-kva.example",
		"_dmarc.Example.com":    "_dmarc.example.com", // ASCII: not IDNA's to refuse
		"\u0301bad.example":     "\u0301bad.example",  // refused by IDNA: as it is
	} {
		if got := Domain(in); got != want {
			t.Errorf("Domain(%q) = %q, want %q", in, got, want)
		}
	}
}
