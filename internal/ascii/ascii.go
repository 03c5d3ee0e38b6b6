// Package ascii answers whether text is all US-ASCII, the question SMTP
// asks of every message (8BITMIME, SMTPUTF8), of every DSN's fields and of
// every address outflow writes into a header: one fast loop, shared.
package ascii

import (
	"encoding/binary"
	"strings"

	"golang.org/x/net/idna"
)

// Is reports whether b holds only US-ASCII octets (below 0x80).
func Is(b []byte) bool {
	// Four words OR-ed per test: one branch per 32 octets, and loads the
	// processor can issue together.
	for ; len(b) >= 32; b = b[32:] {
		w := binary.LittleEndian.Uint64(b) | binary.LittleEndian.Uint64(b[8:]) |
			binary.LittleEndian.Uint64(b[16:]) | binary.LittleEndian.Uint64(b[24:32])
		if w&0x8080808080808080 != 0 {
			return false
		}
	}
	for ; len(b) >= 8; b = b[8:] {
		if binary.LittleEndian.Uint64(b)&0x8080808080808080 != 0 {
			return false
		}
	}
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// IsString is Is for a string.
func IsString(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

// Domain is a domain name as outflow keys, queues and compares it: lower
// case, without a final dot, an internationalised name in A-labels (IDNA's
// lookup rules: bücher.example is xn--bcher-kva.example), since mail is
// queued under the ASCII form. A name IDNA refuses is returned as it is,
// lower-cased. An ASCII name is not given to IDNA, whose rules would also
// refuse names mail uses (an underscore).
func Domain(d string) string {
	d = strings.ToLower(strings.TrimSuffix(d, "."))
	if IsString(d) {
		return d
	}
	if a, err := idna.Lookup.ToASCII(d); err == nil {
		return a
	}
	return d
}
