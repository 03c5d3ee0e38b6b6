package queue

import (
	"encoding/json"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendJSON appends ev as JSON, byte for byte what json.Marshal writes
// (field order, omitempty, HTML-safe escaping), without reflection: every
// delivered message publishes two events, and json.Marshal (with its
// copy of Decision) was most of the cost of publishing them. ok is
// false when Decision or State is not valid JSON, which json.Marshal would
// refuse too.
func (ev *Event) appendJSON(b []byte) (_ []byte, ok bool) {
	if len(ev.Decision) > 0 && !json.Valid(ev.Decision) || len(ev.State) > 0 && !json.Valid(ev.State) {
		return b, false
	}
	b = append(b, `{"type":`...)
	b = appendJSONString(b, ev.Type)
	b = append(b, `,"time":"`...)
	b = ev.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","id":`...)
	b = appendJSONString(b, ev.ID)
	b = appendStringField(b, "msg_id", ev.MsgID)
	b = appendStringField(b, "tenant", ev.Tenant)
	b = appendStringField(b, "dest", ev.Dest)
	b = appendIntField(b, "rcpts", int64(ev.Rcpts))
	b = appendIntField(b, "size", ev.Size)
	b = appendIntField(b, "attempt", int64(ev.Attempt))
	b = appendStringField(b, "worker_id", ev.Worker)
	b = appendStringField(b, "reason", ev.Reason)
	if len(ev.Recipients) > 0 {
		b = append(b, `,"recipients":[`...)
		for i, r := range ev.Recipients {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendJSONString(b, r)
		}
		b = append(b, ']')
	}
	if len(ev.Decision) > 0 {
		b = appendCompactJSON(append(b, `,"decision":`...), ev.Decision)
	}
	if len(ev.State) > 0 {
		b = appendCompactJSON(append(b, `,"state":`...), ev.State)
	}
	return append(b, '}'), true
}

func appendStringField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return appendJSONString(b, v)
}

func appendIntField(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return strconv.AppendInt(b, v, 10)
}

// appendCompactJSON appends valid JSON raw as json.Marshal copies a
// json.RawMessage: without the whitespace between tokens, and with <, >,
// &, U+2028 and U+2029 inside strings escaped. Decision and State come
// from json.Marshal already, so for them this is a copy.
func appendCompactJSON(b, raw []byte) []byte {
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

// appendJSONString appends s as a JSON string escaped as encoding/json
// escapes it by default: quote, backslash and control characters, the
// HTML-sensitive <, > and &, U+2028 and U+2029, and invalid UTF-8 as
// U+FFFD.
func appendJSONString(b []byte, s string) []byte {
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
