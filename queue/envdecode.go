package queue

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// decodeJSONFast decodes data into a zero e without reflection, for the
// envelopes outflow writes itself, and reports whether it could. It
// accepts a strict subset of JSON: every key one of the envelope's own,
// once, spelled exactly; no null; integers without fraction or exponent;
// strings of valid UTF-8 with the usual escapes (no surrogate halves).
// Anything else, valid or not, is declined (false) and left to
// json.Unmarshal, which then decides and names the error; e must be
// reset before. On what it accepts, the result is json.Unmarshal's
// (TestUnmarshalEnvelopeMatchesUnmarshal, FuzzUnmarshalEnvelope).
func (e *Envelope) decodeJSONFast(data []byte) bool {
	d := fastDec{b: data}
	ok := d.fields(func(key []byte) (bit uint32, ok bool) {
		ok = true
		switch string(key) {
		case "id":
			bit = 1 << 0
			e.ID, ok = d.str()
		case "msg_id":
			bit = 1 << 1
			e.MsgID, ok = d.str()
		case "tenant":
			bit = 1 << 2
			e.Tenant, ok = d.str()
		case "from":
			bit = 1 << 3
			e.From, ok = d.str()
		case "rcpts":
			bit = 1 << 4
			e.Rcpts, ok = d.strs()
		case "dest":
			bit = 1 << 5
			e.Dest, ok = d.str()
		case "body_ref":
			bit = 1 << 6
			e.BodyRef, ok = d.str()
		case "signed":
			bit = 1 << 7
			e.Signed, ok = d.bool()
		case "sig_len":
			bit = 1 << 8
			e.SigLen, ok = d.int()
		case "size":
			bit = 1 << 9
			e.Size, ok = d.int64()
		case "parts":
			bit = 1 << 10
			e.Parts, ok = d.int()
		case "submitted_at":
			bit = 1 << 11
			e.SubmittedAt, ok = d.time()
		case "message_id":
			bit = 1 << 12
			e.MessageID, ok = d.str()
		case "history":
			bit = 1 << 13
			ok = d.array(func() bool {
				var a Attempt
				if !d.attempt(&a) {
					return false
				}
				e.History = append(e.History, a)
				return true
			})
			if ok && e.History == nil {
				e.History = []Attempt{}
			}
		case "source":
			bit = 1 << 14
			e.Source, ok = d.str()
		case "dsn":
			bit = 1 << 15
			e.DSN = new(DSNParams)
			ok = d.dsn(e.DSN)
		case "is_dsn":
			bit = 1 << 16
			e.IsReport, ok = d.bool()
		case "delay_warned":
			bit = 1 << 17
			e.DelayWarned, ok = d.bool()
		case "dsn_pass":
			bit = 1 << 18
			e.PassNoted, ok = d.bool()
		case "delay_noted":
			bit = 1 << 19
			e.DelayNoted, ok = d.int()
		case "send_at":
			bit = 1 << 20
			e.SendAt, ok = d.time()
		case "list_unsubscribe":
			bit = 1 << 21
			e.ListUnsubscribe, ok = d.bool()
		case "group":
			bit = 1 << 22
			e.Group, ok = d.str()
		default:
			return 0, false
		}
		return bit, ok
	})
	if !ok {
		return false
	}
	d.ws()
	return d.i == len(d.b)
}

func (d *fastDec) attempt(a *Attempt) bool {
	return d.fields(func(key []byte) (bit uint32, ok bool) {
		ok = true
		switch string(key) {
		case "at":
			bit = 1 << 0
			a.At, ok = d.time()
		case "attempt":
			bit = 1 << 1
			a.Attempt, ok = d.int()
		case "worker":
			bit = 1 << 2
			a.Worker, ok = d.str()
		case "class":
			bit = 1 << 3
			a.Class, ok = d.str()
		case "rule":
			bit = 1 << 4
			a.Rule, ok = d.str()
		case "code":
			bit = 1 << 5
			a.Code, ok = d.int()
		case "enhanced_code":
			bit = 1 << 6
			a.Enhanced, ok = d.str()
		case "reply":
			bit = 1 << 7
			a.Reply, ok = d.str()
		case "lane":
			bit = 1 << 8
			a.Lane, ok = d.str()
		case "delay_ms":
			bit = 1 << 9
			a.DelayMs, ok = d.int64()
		case "jitter_seed":
			bit = 1 << 10
			a.JitterSeed, ok = d.str()
		case "rcpts":
			bit = 1 << 11
			a.Rcpts, ok = d.int()
		default:
			return 0, false
		}
		return bit, ok
	})
}

// fields decodes an object whose keys field reads, each at most once:
// field decodes the value of key and returns the key's bit, and false for
// a key it does not know or a value it cannot read.
func (d *fastDec) fields(field func(key []byte) (bit uint32, ok bool)) bool {
	var seen uint32
	return d.object(func(key []byte) bool {
		bit, ok := field(key)
		if !ok || seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	})
}

func (d *fastDec) dsn(p *DSNParams) bool {
	return d.fields(func(key []byte) (bit uint32, ok bool) {
		ok = true
		switch string(key) {
		case "ret":
			bit = 1 << 0
			p.Ret, ok = d.str()
		case "envid":
			bit = 1 << 1
			p.EnvID, ok = d.str()
		case "rcpts":
			bit = 1 << 2
			p.Rcpts = map[string]RcptDSN{}
			ok = d.object(func(key []byte) bool {
				rcpt := string(key)
				if _, dup := p.Rcpts[rcpt]; dup {
					return false
				}
				var r RcptDSN
				if !d.rcptDSN(&r) {
					return false
				}
				p.Rcpts[rcpt] = r
				return true
			})
		default:
			return 0, false
		}
		return bit, ok
	})
}

func (d *fastDec) rcptDSN(r *RcptDSN) bool {
	return d.fields(func(key []byte) (bit uint32, ok bool) {
		ok = true
		switch string(key) {
		case "notify":
			bit = 1 << 0
			r.Notify, ok = d.strs()
		case "orcpt":
			bit = 1 << 1
			r.ORcpt, ok = d.str()
		case "orcpt_type":
			bit = 1 << 2
			r.ORcptType, ok = d.str()
		default:
			return 0, false
		}
		return bit, ok
	})
}

// fastDec reads the JSON subset decodeJSONFast accepts. Every method
// returns false for anything outside it, leaving the position undefined.
type fastDec struct {
	b []byte
	i int
}

func (d *fastDec) ws() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// next skips whitespace and consumes c if it comes next.
func (d *fastDec) next(c byte) bool {
	d.ws()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// object reads {"key":value,...}, calling member for each key with the
// position at its value.
func (d *fastDec) object(member func(key []byte) bool) bool {
	if !d.next('{') {
		return false
	}
	if d.next('}') {
		return true
	}
	for {
		k, ok := d.strBytes()
		if !ok || !d.next(':') || !member(k) {
			return false
		}
		if d.next(',') {
			continue
		}
		return d.next('}')
	}
}

// array reads [value,...], calling elem with the position at each value.
func (d *fastDec) array(elem func() bool) bool {
	if !d.next('[') {
		return false
	}
	if d.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if d.next(',') {
			continue
		}
		return d.next(']')
	}
}

// strs reads an array of strings; [] is an empty slice, not nil, as
// json.Unmarshal makes it.
func (d *fastDec) strs() ([]string, bool) {
	out := []string{}
	ok := d.array(func() bool {
		s, ok := d.str()
		out = append(out, s)
		return ok
	})
	return out, ok
}

func (d *fastDec) bool() (bool, bool) {
	d.ws()
	rest := d.b[d.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		d.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		d.i += 5
		return false, true
	}
	return false, false
}

// digits reads an integer as JSON writes one: an optional minus, then 0
// or a digit from 1 followed by digits. A fraction or an exponent after
// it is declined by the caller's next delimiter check.
func (d *fastDec) digits() ([]byte, bool) {
	d.ws()
	start := d.i
	if d.i < len(d.b) && d.b[d.i] == '-' {
		d.i++
	}
	first := d.i
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		d.i++
	}
	if d.i == first || d.b[first] == '0' && d.i-first > 1 {
		return nil, false
	}
	return d.b[start:d.i], true
}

func (d *fastDec) int64() (int64, bool) {
	s, ok := d.digits()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(s), 10, 64)
	return n, err == nil
}

func (d *fastDec) int() (int, bool) {
	s, ok := d.digits()
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(string(s), 10, strconv.IntSize)
	return int(n), err == nil
}

// time reads a string without escapes as time.Time's UnmarshalJSON,
// which json.Unmarshal calls with the quoted literal.
func (d *fastDec) time() (time.Time, bool) {
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return time.Time{}, false
	}
	start := d.i
	for d.i++; d.i < len(d.b); d.i++ {
		switch c := d.b[d.i]; {
		case c == '"':
			d.i++
			var t time.Time
			err := t.UnmarshalJSON(d.b[start:d.i])
			return t, err == nil
		case c == '\\' || c < 0x20 || c >= utf8.RuneSelf:
			return time.Time{}, false
		}
	}
	return time.Time{}, false
}

// str reads a string (see strBytes).
func (d *fastDec) str() (string, bool) {
	b, ok := d.strBytes()
	return string(b), ok
}

// strBytes reads a string: valid UTF-8, no control characters, escapes
// \" \\ \/ \b \f \n \r \t and \uXXXX outside the surrogates.
// The bytes are data's own when there is no escape.
func (d *fastDec) strBytes() ([]byte, bool) {
	d.ws()
	if d.i >= len(d.b) || d.b[d.i] != '"' {
		return nil, false
	}
	d.i++
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			s := d.b[start:d.i]
			d.i++
			return s, true
		case c == '\\':
			return d.strEscaped(start)
		case c < 0x20:
			return nil, false
		case c < utf8.RuneSelf:
			d.i++
		default:
			r, n := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && n == 1 {
				return nil, false
			}
			d.i += n
		}
	}
	return nil, false
}

func (d *fastDec) strEscaped(start int) ([]byte, bool) {
	out := make([]byte, 0, d.i-start+16)
	out = append(out, d.b[start:d.i]...)
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return out, true
		case c == '\\':
			if d.i+1 >= len(d.b) {
				return nil, false
			}
			switch e := d.b[d.i+1]; e {
			case '"', '\\', '/':
				out = append(out, e)
			case 'b':
				out = append(out, '\b')
			case 'f':
				out = append(out, '\f')
			case 'n':
				out = append(out, '\n')
			case 'r':
				out = append(out, '\r')
			case 't':
				out = append(out, '\t')
			case 'u':
				if d.i+6 > len(d.b) {
					return nil, false
				}
				var r rune
				for _, h := range d.b[d.i+2 : d.i+6] {
					switch {
					case h >= '0' && h <= '9':
						h -= '0'
					case h >= 'a' && h <= 'f':
						h -= 'a' - 10
					case h >= 'A' && h <= 'F':
						h -= 'A' - 10
					default:
						return nil, false
					}
					r = r<<4 | rune(h)
				}
				if r >= 0xd800 && r <= 0xdfff {
					return nil, false
				}
				out = utf8.AppendRune(out, r)
				d.i += 4
			default:
				return nil, false
			}
			d.i += 2
		case c < 0x20:
			return nil, false
		case c < utf8.RuneSelf:
			out = append(out, c)
			d.i++
		default:
			r, n := utf8.DecodeRune(d.b[d.i:])
			if r == utf8.RuneError && n == 1 {
				return nil, false
			}
			out = append(out, d.b[d.i:d.i+n]...)
			d.i += n
		}
	}
	return nil, false
}
