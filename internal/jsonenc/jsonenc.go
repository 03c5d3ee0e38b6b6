// Package jsonenc appends JSON values byte for byte as encoding/json
// writes them, without reflection, for the encoders on the delivery path
// (events, decision records) that json.Marshal made a visible share of the
// relay's CPU. Each user checks its output against json.Marshal in a test
// and a fuzz target.
package jsonenc

import (
	"math"
	"strconv"
	"unicode/utf8"
)

// AppendCompact appends valid JSON raw as json.Marshal copies a
// json.RawMessage: without the whitespace between tokens, and with <, >,
// &, U+2028 and U+2029 inside strings escaped. Decision and State come
// from json.Marshal already, so for them this is a copy.
func AppendCompact(b, raw []byte) []byte {
	const hex = "0123456789abcdef"
	inString, escaped := false, false
	start := 0
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case !inString:
			switch c {
			case ' ', '\t', '\n', '\r':
				b = append(b, raw[start:i]...)
				start = i + 1
			case '"':
				inString = true
			}
		case escaped:
			escaped = false
		case c == '\\':
			escaped = true
		case c == '"':
			inString = false
		case c == '<' || c == '>' || c == '&':
			b = append(append(b, raw[start:i]...), '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			start = i + 1
		case c == 0xe2 && i+2 < len(raw) && raw[i+1] == 0x80 && raw[i+2]&^1 == 0xa8:
			b = append(append(b, raw[start:i]...), '\\', 'u', '2', '0', '2', hex[raw[i+2]&0xf])
			i += 2
			start = i + 1
		}
	}
	return append(b, raw[start:]...)
}

// AppendString appends s as a JSON string escaped as encoding/json
// escapes it by default: quote, backslash and control characters, the
// HTML-sensitive <, > and &, U+2028 and U+2029, and invalid UTF-8 as
// U+FFFD.
func AppendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(append(b, s[start:i]...), `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(append(b, s[start:i]...), '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	return append(append(b, s[start:]...), '"')
}

// AppendFloat appends f as encoding/json writes a float64: the shortest
// decimal that reads back as f, in exponent form below 1e-6 and from 1e21,
// with a one-digit negative exponent written as one digit. ok is false for
// NaN and the infinities, which encoding/json refuses.
func AppendFloat(b []byte, f float64) (_ []byte, ok bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-09 becomes e-9, as encoding/json writes it.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}
