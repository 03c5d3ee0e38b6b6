package submission

import (
	"bufio"
	"bytes"
	"io"
	"reflect"
	"sync"
	"unsafe"

	"github.com/emersion/go-smtp"
)

// go-smtp hands Session.Data its own DATA reader, which undoes
// dot-stuffing and finds the end-of-data line one ReadByte at a time:
// with 100 KiB bodies that octet loop was 45 % of the daemon's CPU
// (docs/benchmarks.md, "The DATA reader"). dotReader does the same work
// on the same buffered connection a buffer at a time: bytes.IndexByte
// finds the next dot (or, where dots are thick in the middle of lines,
// the next CR), everything before it is copied in one go, and only the
// octets around it go through the state machine.
//
// go-smtp keeps the reader's fields private, so dotReader reaches them
// through their reflected layout, checked once: the struct must have
// exactly the fields, names and types of the pinned release (v0.25.1;
// v0.26.0's is the same). Anything else, or a reader that is not
// go-smtp's (BDAT's pipe), and Data reads through go-smtp's reader as
// before. dotReader keeps go-smtp's state field in step after every read,
// so whatever go-smtp does with the reader after Data returns (it reads it
// to the end-of-data line) starts exactly where dotReader stopped. The
// results are the same octet for octet, errors and size limit included,
// but for a body of exactly the size limit, which dotReader accepts:
// FuzzDotReader checks it against an octet-at-a-time model of go-smtp's
// reader, and TestDotReaderMatchesGoSMTP sends the same dialogues through a
// server with and without it.

// The states of go-smtp's DATA reader (data.go), in its order.
const (
	dotBeginLine = iota // at the start of a line; the initial state
	dotDot              // read "." at the start of a line
	dotDotCR            // read ".\r" at the start of a line
	dotCR               // read "\r", possibly ending a line
	dotData             // in the middle of a line
	dotEOF              // read the ".\r\n" end-of-data line
)

// goSMTPLayout is where dotReader finds go-smtp's private fields: the
// DATA reader's, and the line limit of the connection's input.
type goSMTPLayout struct {
	dataReader                reflect.Type
	r, state, limited, remain uintptr // in the dataReader

	lineLimiter uintptr // the *lineLimitReader in the Conn
	limit, cur  uintptr // LineLimit and curLineLength in the lineLimitReader
}

var (
	layoutOnce  sync.Once
	layoutKnown *goSMTPLayout // nil: not go-smtp's known layout
)

// field is one expected struct field.
type field struct {
	name string
	typ  reflect.Type
}

// offsets returns the offsets of s's fields if s is a struct of go-smtp's
// named name with exactly the fields want, in order.
func offsets(s reflect.Type, name string, want []field) ([]uintptr, bool) {
	if s.Kind() != reflect.Struct || s.Name() != name ||
		s.PkgPath() != reflect.TypeFor[smtp.Conn]().PkgPath() || s.NumField() != len(want) {
		return nil, false
	}
	off := make([]uintptr, len(want))
	for i, w := range want {
		f := s.Field(i)
		if f.Name != w.name || (w.typ != nil && f.Type != w.typ) {
			return nil, false
		}
		off[i] = f.Offset
	}
	return off, true
}

// learnLayout checks dr, the type of go-smtp's DATA reader, and go-smtp's
// Conn against the layout dotReader expects.
func learnLayout(dr reflect.Type) *goSMTPLayout {
	if dr.Kind() != reflect.Pointer {
		return nil
	}
	d, ok := offsets(dr.Elem(), "dataReader", []field{
		{"r", reflect.TypeFor[*bufio.Reader]()},
		{"state", reflect.TypeFor[int]()},
		{"limited", reflect.TypeFor[bool]()},
		{"n", reflect.TypeFor[int64]()},
	})
	if !ok {
		return nil
	}
	conn := reflect.TypeFor[smtp.Conn]()
	f, ok := conn.FieldByName("lineLimitReader")
	if !ok || f.Type.Kind() != reflect.Pointer || len(f.Index) != 1 {
		return nil
	}
	ll, ok := offsets(f.Type.Elem(), "lineLimitReader", []field{
		{"R", reflect.TypeFor[io.Reader]()},
		{"LineLimit", reflect.TypeFor[int]()},
		{"curLineLength", reflect.TypeFor[int]()},
	})
	if !ok {
		return nil
	}
	return &goSMTPLayout{
		dataReader: dr, r: d[0], state: d[1], limited: d[2], remain: d[3],
		lineLimiter: f.Offset, limit: ll[1], cur: ll[2],
	}
}

// dotReader reads a DATA body as go-smtp's reader would.
type dotReader struct {
	br      *bufio.Reader
	state   int
	limited bool
	remain  int64 // octets still allowed when limited
	over    bool  // a body octet past the limit was read

	sync *int // go-smtp's state field, written after every read

	// go-smtp's line limit counts every octet read from the connection,
	// also one at a time, as it is read into the buffer. While dotReader
	// reads, go-smtp's is off (as go-smtp itself turns it off for BDAT
	// chunks) and dotReader counts each read the same way, a line at a
	// time, before it uses it; release turns go-smtp's back on with the
	// count at the end of the buffer, where go-smtp's own would be.
	limit, cur *int // go-smtp's LineLimit and curLineLength; nil once released
	hard       int  // the LineLimit to enforce and restore
	line       int  // octets counted on the current line, as curLineLength
}

// newDotReader returns a dotReader in place of r, go-smtp's reader for
// this DATA on c, or nil when either is not of the known layout. The
// caller must call release before go-smtp sees r again.
func newDotReader(r io.Reader, c *smtp.Conn) *dotReader {
	if r == nil || c == nil {
		return nil
	}
	t := reflect.TypeOf(r)
	if t.Kind() != reflect.Pointer || t.Elem().Name() != "dataReader" ||
		t.Elem().PkgPath() != reflect.TypeFor[smtp.Conn]().PkgPath() {
		return nil // BDAT's pipe, or a test's reader: not go-smtp's DATA reader
	}
	layoutOnce.Do(func() { layoutKnown = learnLayout(t) })
	l := layoutKnown
	if l == nil || t != l.dataReader {
		return nil
	}
	p := reflect.ValueOf(r).UnsafePointer()
	d := &dotReader{
		br:      *(**bufio.Reader)(unsafe.Add(p, l.r)),
		state:   *(*int)(unsafe.Add(p, l.state)),
		limited: *(*bool)(unsafe.Add(p, l.limited)),
		remain:  *(*int64)(unsafe.Add(p, l.remain)),
		sync:    (*int)(unsafe.Add(p, l.state)),
	}
	llp := *(*unsafe.Pointer)(unsafe.Add(unsafe.Pointer(c), l.lineLimiter))
	if d.br == nil || llp == nil {
		return nil
	}
	limit, cur := (*int)(unsafe.Add(llp, l.limit)), (*int)(unsafe.Add(llp, l.cur))
	if *limit > 0 && *cur <= *limit {
		// What is buffered already was counted when it was read.
		d.limit, d.cur, d.hard, d.line = limit, cur, *limit, *cur
		*limit = 0
	}
	return d
}

// release gives go-smtp its line limit back, with the count where dotReader
// left it. It may be called more than once.
func (d *dotReader) release() {
	if d.limit == nil {
		return
	}
	*d.limit, *d.cur = d.hard, d.line
	d.limit, d.cur = nil, nil
}

// countLines counts p, one read of the connection, as go-smtp's line
// limit would, and reports whether every line stayed within it. It jumps
// from line feed to line feed as far as the limit lets a line reach,
// to the last line feed in that stretch: any line feed before it ends a
// shorter line, so one backward search covers many lines.
func (d *dotReader) countLines(p []byte) bool {
	for len(p) > 0 {
		// A line feed at p[i] keeps its line within the limit iff i < w.
		w := min(len(p), d.hard-d.line+1)
		if i := bytes.LastIndexByte(p[:w], '\n'); i >= 0 {
			d.line = 1 // a line feed starts the count again, itself included
			p = p[i+1:]
			continue
		}
		if w == len(p) {
			d.line += len(p)
			return d.line <= d.hard
		}
		// No line feed within reach: past the limit. go-smtp's count
		// stays where it failed, at the next line feed or the read's end.
		if i := bytes.IndexByte(p, '\n'); i >= 0 {
			d.line += i
		} else {
			d.line += len(p)
		}
		return false
	}
	return d.line <= d.hard
}

// Read fills b with body octets, dot-stuffing undone, until b is full or
// the end-of-data line is read (io.EOF), as go-smtp's reader does. Past
// the size limit it returns smtp.ErrDataTooLarge.
func (d *dotReader) Read(b []byte) (n int, err error) {
	if d.limited {
		if d.remain <= 0 {
			return 0, d.atLimit()
		}
		if int64(len(b)) > d.remain {
			b = b[:d.remain]
		}
	}
	for n < len(b) && d.state != dotEOF {
		if d.br.Buffered() == 0 {
			// The one place the buffer fills: one read of the connection.
			if _, err = d.br.Peek(1); err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				break
			}
			if p, _ := d.br.Peek(d.br.Buffered()); d.limit != nil && !d.countLines(p) {
				// As go-smtp's limit fails that read: its octets are
				// dropped, and every later read of the connection fails,
				// so go-smtp closes it after the reply.
				_, _ = d.br.Discard(len(p))
				err = smtp.ErrTooLongLine
				break
			}
		}
		buf, _ := d.br.Peek(d.br.Buffered())
		var used int
		n, used = d.scan(b, n, buf)
		_, _ = d.br.Discard(used)
	}
	*d.sync = d.state
	if err == nil && d.state == dotEOF {
		err = io.EOF
	}
	if err != nil {
		d.release()
	}
	if d.limited {
		d.remain -= int64(n)
	}
	return n, err
}

// atLimit is Read once the body has reached the size limit. A body of
// exactly the limit is within it (RFC 1870; go-smtp's own reader refuses
// it, and accepts the same body sent with BDAT): it is too large only if
// a body octet follows, not the end-of-data line, which yields none.
func (d *dotReader) atLimit() error {
	if d.over {
		return smtp.ErrDataTooLarge
	}
	var one [1]byte
	d.limited = false
	n, err := d.Read(one[:])
	d.limited = true
	if n > 0 {
		d.over = true
		return smtp.ErrDataTooLarge
	}
	return err
}

// scan runs the state machine over buf, writing body octets to b from n
// on, and returns the new n and how much of buf it used. It stops when b
// is full, buf is used up, or the end-of-data line has been read.
func (d *dotReader) scan(b []byte, n int, buf []byte) (int, int) {
	i, misses := 0, 0 // misses: dots found in the middle of a line
	byLine := false   // searching for CRs for the rest of buf
	for i < len(buf) && n < len(b) && d.state != dotEOF {
		if d.state == dotData && byLine {
			// Dots in the middle of lines thicker than one in 64
			// octets (prose): a search per line costs less than one
			// per dot. Only CR leaves the middle of a line: copy up to
			// and including the next one.
			end := min(len(buf), i+len(b)-n)
			j := bytes.IndexByte(buf[i:end], '\r')
			if j < 0 {
				n += copy(b[n:], buf[i:end])
				i = end
				continue
			}
			n += copy(b[n:], buf[i:i+j+1])
			i += j + 1
			d.state = dotCR
			continue
		}
		if d.state == dotData {
			// Octets are dropped only by a dot at a line's start, so a
			// stretch without a dot is body as it stands, and after any
			// octet in it that is not CR or LF the state is dotData
			// again. Copy up to the next dot, or to the end, short of
			// the CRs and LFs just before it: those and the dot go
			// through the state machine below. One search covers a
			// base64 part's whole buffer.
			end := min(len(buf), i+len(b)-n)
			stop := end
			if k := bytes.IndexByte(buf[i:end], '.'); k >= 0 {
				stop = i + k
				if stop == 0 || buf[stop-1] != '\n' {
					misses++
					byLine = misses > 4+i>>6
				}
			}
			t := stop
			for t > i && (buf[t-1] == '\r' || buf[t-1] == '\n') {
				t--
			}
			if t > i {
				n += copy(b[n:], buf[i:t])
				i = t
				continue
			}
		}
		c := buf[i]
		i++
		keep := true
		switch d.state {
		case dotBeginLine:
			switch c {
			case '.':
				d.state, keep = dotDot, false
			case '\r':
				d.state = dotCR
			default:
				d.state = dotData
			}
		case dotDot:
			if c == '\r' {
				d.state, keep = dotDotCR, false
			} else {
				d.state = dotData
			}
		case dotDotCR:
			if c == '\n' {
				d.state, keep = dotEOF, false
			} else {
				d.state = dotData
			}
		case dotCR:
			if c == '\n' {
				d.state = dotBeginLine
			} else {
				d.state = dotData
			}
		case dotData:
			if c == '\r' {
				d.state = dotCR
			}
		}
		if keep {
			b[n] = c
			n++
		}
	}
	return n, i
}
