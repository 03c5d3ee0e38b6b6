package api

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"unicode/utf8"
)

// utf8Reader passes a request body through and finds its first octet that
// is not UTF-8. encoding/json does not refuse one: it decodes each as
// U+FFFD, so an 8-bit message sent as raw (a literal 0xE9 for "é" in
// ISO-8859-1) would be accepted and delivered with its text replaced. JSON
// text is UTF-8 (RFC 8259 section 8.1), and the request is refused
// instead (utf8Problem). To say which field the octet is in, it follows
// the JSON enough to know the top-level key of the string it is in.
type utf8Reader struct {
	r    io.Reader
	off  int64   // octets passed through so far
	pend [4]byte // an incomplete sequence at the end of the last read
	np   int

	bad   bool   // an octet that is not UTF-8 was read
	at    int64  // its offset in the body
	field string // the top-level field it is in, "" if not known

	// Where the JSON scanner is.
	inStr, esc, isKey, keyNext bool
	depth                      int
	key                        []byte // the key being read, at most maxKey octets
	last                       string // the last top-level key read
}

const maxKey = 64

func (u *utf8Reader) Read(p []byte) (int, error) {
	n, err := u.r.Read(p)
	if n > 0 && !u.bad {
		u.scan(p[:n])
	}
	if err == io.EOF && u.np > 0 && !u.bad {
		// The body ends in the middle of a sequence.
		u.bad, u.at, u.field = true, u.off-int64(u.np), u.fieldHere()
	}
	return n, err
}

// scan checks p, which follows what was scanned before, and moves the
// JSON scanner to its end or to its first bad octet.
func (u *utf8Reader) scan(p []byte) {
	base := u.off
	u.off += int64(len(p))
	i := 0
	// Finish a sequence the last read cut.
	for u.np > 0 && i < len(p) {
		u.pend[u.np] = p[i]
		u.np++
		i++
		if utf8.FullRune(u.pend[:u.np]) {
			r, size := utf8.DecodeRune(u.pend[:u.np])
			start := base + int64(i-u.np)
			if r == utf8.RuneError && size <= 1 {
				u.bad, u.at, u.field = true, start, u.fieldHere()
				return
			}
			// A valid sequence uses all of pend: it was incomplete
			// until this octet.
			u.np = 0
		}
	}
	if u.np > 0 {
		return // p went into the sequence, still incomplete
	}
	rest := p[i:]
	// An incomplete sequence at the end waits for the next read.
	tail := len(rest)
	for k := len(rest) - 1; k >= 0 && k >= len(rest)-utf8.UTFMax+1; k-- {
		if utf8.RuneStart(rest[k]) {
			if !utf8.FullRune(rest[k:]) {
				tail = k
			}
			break
		}
	}
	body := rest[:tail]
	bad := -1
	if !utf8.Valid(body) {
		for j := 0; j < len(body); {
			r, size := utf8.DecodeRune(body[j:])
			if r == utf8.RuneError && size <= 1 {
				bad = j
				break
			}
			j += size
		}
	}
	if bad >= 0 {
		u.json(body[:bad])
		u.bad, u.at, u.field = true, base+int64(i+bad), u.fieldHere()
		return
	}
	u.json(body)
	u.np = copy(u.pend[:], rest[tail:])
	// The pending octets are inside or outside a string like the octets
	// before them, and are no JSON structure: nothing to scan in them.
}

// fieldHere is the top-level field the scanner is in: the key whose
// value (a string, or an object or array holding the string) it reads.
func (u *utf8Reader) fieldHere() string {
	if !u.inStr || u.isKey || u.depth < 1 {
		return ""
	}
	return u.last
}

// json moves the scanner over p, which holds no bad octet. Only the
// JSON's structure matters here; the decoder finds its faults.
func (u *utf8Reader) json(p []byte) {
	for i := 0; i < len(p); i++ {
		b := p[i]
		if u.inStr {
			switch {
			case u.esc:
				u.esc = false
				u.addKey(b)
			case b == '\\':
				u.esc = true
				u.addKey(b)
			case b == '"':
				u.inStr = false
				if u.isKey {
					u.last, u.isKey = string(u.key), false
				}
			case u.isKey:
				u.addKey(b)
			default:
				// The long strings (raw, an attachment) are skipped
				// to their next quote or backslash.
				j := bytes.IndexAny(p[i:], `"\`)
				if j < 0 {
					return
				}
				i += j - 1
			}
			continue
		}
		switch b {
		case '"':
			u.inStr, u.isKey, u.keyNext = true, u.depth == 1 && u.keyNext, false
			u.key = u.key[:0]
		case '{', '[':
			u.depth++
			u.keyNext = b == '{' && u.depth == 1
		case '}', ']':
			u.depth--
		case ',':
			u.keyNext = u.depth == 1
		}
	}
}

func (u *utf8Reader) addKey(b byte) {
	if u.isKey && len(u.key) < maxKey {
		u.key = append(u.key, b)
	}
}

// utf8Problem is the answer to a body with an octet that is not UTF-8.
// Nothing of the request is stored.
func (u *utf8Reader) problem() *Problem {
	const how = "send 8-bit charsets as base64 or quoted-printable"
	switch u.field {
	case "raw":
		p := fieldProblem(ProblemBadMessage, "message not UTF-8", "raw", fmt.Sprintf("raw must be UTF-8 (an octet that is not, at offset %d of the body); %s", u.at, how))
		return p
	case "":
		return problem(http.StatusBadRequest, ProblemBadMessage, "request not UTF-8",
			fmt.Sprintf("the request must be UTF-8 JSON (an octet that is not, at offset %d of the body); raw must be UTF-8: %s", u.at, how))
	}
	return fieldProblem(ProblemBadMessage, "request not UTF-8", u.field,
		fmt.Sprintf("must be UTF-8 (an octet that is not, at offset %d of the body); raw must be UTF-8 too: %s", u.at, how))
}
