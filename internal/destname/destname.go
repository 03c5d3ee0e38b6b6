// Package destname checks a destination name that an operator typed: the
// DEST of `outflow dest …` and the destination in a console page's URL.
// Both refuse the same names, through Check.
package destname

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/outflow/outflow/throttle"
)

// MaxLen bounds a name: a domain is at most 253 octets, and DEST@SOURCE
// adds a source address (an IPv6 address is at most 45).
const MaxLen = 300

// refused are the characters no domain, provider group or source address
// has: a list ("gmail.com,yahoo.com"), NATS wildcards and separators,
// quotes, brackets and path separators.
const refused = ",;*>\\\"'</"

// Check returns d as the shared state stores and lists it
// (throttle.NormalizeDest: "Gmail.COM." is gmail.com, bücher.example is
// xn--bcher-kva.example; the SOURCE of DEST@SOURCE as the workers name
// it, "[::1]" and "::ffff:192.0.2.10" as ::1 and 192.0.2.10), or why d
// cannot be a destination: a recipient domain, a provider group, or
// DEST@SOURCE. The shared state accepts any name, so a typo would be
// suspended or rated without matching any mail.
func Check(d string) (string, error) {
	if strings.TrimSpace(d) == "" {
		return "", errors.New("empty: want a domain, a provider group, or DEST@SOURCE")
	}
	if len(d) > MaxLen {
		return "", fmt.Errorf("%.40q…: longer than %d octets", d, MaxLen)
	}
	for _, c := range d {
		if c <= ' ' || c == 0x7f || strings.ContainsRune(refused, c) {
			return "", fmt.Errorf("%q: %q cannot be part of a domain, a provider group or a source address (one destination at a time)", d, c)
		}
	}
	n := throttle.NormalizeDest(d)
	for _, c := range n {
		if c >= utf8.RuneSelf {
			return "", fmt.Errorf("%q: not a domain name (IDNA refuses it)", d)
		}
	}
	return n, nil
}
