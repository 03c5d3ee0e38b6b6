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
