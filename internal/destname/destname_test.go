package destname

import (
	"strings"
	"testing"
)

// TestCheck: a list, a space, a wildcard, a quote, a path or a name IDNA
// refuses is no destination; domains, groups and DEST@SOURCE are, as the
// shared state stores them.
func TestCheck(t *testing.T) {
	for _, bad := range []string{"", " ", "gmail.com,yahoo.com", "a;b", "a b", "x\ty", "gmail.*", "a.>", `a\b`, `a"b`, "a'b", "a<b", "gmail.com/x",
		"\u0301bad.example", strings.Repeat("a", MaxLen+1)} {
		if n, err := Check(bad); err == nil {
			t.Errorf("%q taken as %q", bad, n)
		}
	}
	for in, want := range map[string]string{"gmail.com": "gmail.com", "Gmail.COM.": "gmail.com", "google": "google",
		"gmail.com@192.0.2.10": "gmail.com@192.0.2.10", "gmail.com@2001:db8::1": "gmail.com@2001:db8::1", "Bücher.Example": "xn--bcher-kva.example"} {
		if n, err := Check(in); err != nil || n != want {
			t.Errorf("%q: %q, %v; want %q", in, n, err, want)
		}
	}
}

// TestCheckSource: DEST@SOURCE names the source as the workers do (the
// [[egress]] address as netip writes it, unmapped), whichever spelling of
// the address the operator or the console URL used; before, each was a
// pair of its own that matched no mail.
func TestCheckSource(t *testing.T) {
	for in, want := range map[string]string{
		"both.h6.test@0:0:0:0:0:0:0:1":    "both.h6.test@::1",
		"both.h6.test@[::1]":              "both.h6.test@::1",
		"both.h6.test@0000:0000::0001":    "both.h6.test@::1",
		"v4only.h6.test@::ffff:127.0.0.1": "v4only.h6.test@127.0.0.1",
		"gmail.com@fe80::1%lo":            "gmail.com@fe80::1%lo",
	} {
		if n, err := Check(in); err != nil || n != want {
			t.Errorf("%q: %q, %v; want %q", in, n, err, want)
		}
	}
}
