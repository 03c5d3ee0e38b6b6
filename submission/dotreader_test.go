package submission

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

// modelDot is go-smtp's DATA reader as a model: the octet-at-a-time state
// machine of data.go, with the size limit checked at the start of each
// read (where a body that has reached it is still within it if the
// end-of-data line follows, unlike go-smtp's), and the line limit (lineLimitReader's count, with hard > 0)
// applied to each octet as it is read. It reads in reads of size bsize
// until an error and returns the octets, the error, the octets of in
// consumed and the final state.
func modelDot(in []byte, bsize int, max int64, hard int) (out []byte, used, state int, err error) {
	remain, line := max, 1
	for {
		b := make([]byte, bsize)
		atLimit := false
		if max > 0 {
			if remain <= 0 {
				// Only the end-of-data line may follow: read on until
				// it has, or a body octet has.
				b, atLimit = b[:1], true
			} else if int64(len(b)) > remain {
				b = b[:remain]
			}
		}
		n := 0
		for n < len(b) && state != dotEOF {
			if used == len(in) {
				err = io.ErrUnexpectedEOF
				break
			}
			c := in[used]
			used++
			if hard > 0 {
				if c == '\n' {
					line = 0
				}
				if line++; line > hard {
					return out, used, state, smtp.ErrTooLongLine
				}
			}
			keep := true
			switch state {
			case dotBeginLine:
				switch c {
				case '.':
					state, keep = dotDot, false
				case '\r':
					state = dotCR
				default:
					state = dotData
				}
			case dotDot:
				if c == '\r' {
					state, keep = dotDotCR, false
				} else {
					state = dotData
				}
			case dotDotCR:
				if c == '\n' {
					state, keep = dotEOF, false
				} else {
					state = dotData
				}
			case dotCR:
				if c == '\n' {
					state = dotBeginLine
				} else {
					state = dotData
				}
			case dotData:
				if c == '\r' {
					state = dotCR
				}
			}
			if keep {
				b[n] = c
				n++
			}
		}
		if atLimit && n > 0 {
			return out, used, state, smtp.ErrDataTooLarge
		}
		out = append(out, b[:n]...)
		remain -= int64(n)
		if err != nil {
			return out, used, state, err
		}
		if state == dotEOF {
			return out, used, state, io.EOF
		}
	}
}

// pieces hands out data in reads whose sizes cycle through sizes.
type pieces struct {
	data  []byte
	sizes []byte
	i     int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(p.sizes) > 0 {
		n = int(p.sizes[p.i%len(p.sizes)]) + 1
		p.i++
	}
	n = min(n, len(b), len(p.data))
	copy(b, p.data[:n])
	p.data = p.data[n:]
	return n, nil
}

// readDot reads in through a dotReader the way readBody does, over a
// 16-octet bufio.Reader fed in pieces, and reports as modelDot does; state
// is what dotReader left in go-smtp's state field.
func readDot(in, sizes []byte, bsize int, max int64, hard int) (out []byte, used, state, limit, cur int, err error) {
	br := bufio.NewReaderSize(&pieces{data: in, sizes: sizes}, 16)
	d := &dotReader{br: br, sync: &state, limited: max > 0, remain: max}
	if hard > 0 {
		d.limit, d.cur, d.hard, d.line = &limit, &cur, hard, 1
	}
	for err == nil {
		b := make([]byte, bsize)
		var n int
		n, err = d.Read(b)
		out = append(out, b[:n]...)
	}
	d.release()
	rest, _ := io.ReadAll(br)
	return out, len(in) - len(rest), state, limit, cur, err
}

func checkDot(t *testing.T, in, sizes []byte, bsize int, max int64, hard int) {
	t.Helper()
	wantOut, wantUsed, wantState, wantErr := modelDot(in, bsize, max, hard)
	out, used, state, limit, cur, err := readDot(in, sizes, bsize, max, hard)
	if !errors.Is(err, wantErr) && !errors.Is(err, smtp.ErrTooLongLine) {
		t.Fatalf("%q (read %d, max %d, hard %d): error %v, model %v", in, bsize, max, hard, err, wantErr)
	}
	if hard > 0 && limit != hard {
		t.Fatalf("%q: line limit left at %d, want %d", in, limit, hard)
	}
	if errors.Is(err, smtp.ErrTooLongLine) {
		// Counted a read at a time, as go-smtp counts: a read may hold a
		// long line beyond the octets the model has used. go-smtp's count
		// must be left past the limit, so its next read fails too.
		if !overLong(in, hard) {
			t.Fatalf("%q: line too long, but no line is over %d", in, hard)
		}
		if cur <= hard {
			t.Fatalf("%q: line count left at %d, within %d", in, cur, hard)
		}
		return
	}
	if errors.Is(wantErr, smtp.ErrTooLongLine) {
		t.Fatalf("%q (read %d, max %d, hard %d): error %v, model %v", in, bsize, max, hard, err, wantErr)
	}
	if !bytes.Equal(out, wantOut) || used != wantUsed || state != wantState {
		t.Fatalf("%q (read %d, max %d, hard %d):\n got %q, used %d, state %d\nwant %q, used %d, state %d",
			in, bsize, max, hard, out, used, state, wantOut, wantUsed, wantState)
	}
}

// overLong reports whether in has a line over hard octets as go-smtp's
// line limit counts them, from 1.
func overLong(in []byte, hard int) bool {
	line := 1
	for _, c := range in {
		if c == '\n' {
			line = 0
		}
		if line++; line > hard {
			return true
		}
	}
	return false
}

func TestDotReader(t *testing.T) {
	for _, in := range []string{
		".\r\n",
		"hello\r\n.\r\nQUIT\r\n",
		"..one\r\n.two\r\n...\r\n.\r\n",
		"a\r\n.\rX\r\n.\r\n",                  // ".\r" then not LF: both dropped, as go-smtp does
		"a\r\r\n.\r\nb\r\n.\r\n",              // "\r\r\n" does not end a line for go-smtp
		"a\n.\r\nb\r\n.\r\n",                  // nor does a bare LF
		"\r\n.\r\n",                           // an empty line, then the end
		"x\r\n.",                              // cut off
		"x\r\n.\r",                            // cut off in ".\r"
		strings.Repeat("y", 40) + "\r\n.\r\n", // a line over the test's limit
	} {
		for _, bsize := range []int{1, 3, 7, 32 << 10} {
			for _, max := range []int64{0, 1, 5, 6, 7, 100} {
				for _, hard := range []int{0, 30} {
					checkDot(t, []byte(in), []byte{0, 4, 1, 15}, bsize, max, hard)
				}
			}
		}
	}
}

// TestDotReaderWholeBuffers reads bodies through a connection buffer of
// serve's size, which holds many lines at once, so that dotReader's
// searches cover many lines in one go: dots at line starts (a search per
// dot), none (one search a buffer), and dots thick in the middle of lines
// (the change to a search per line), each against the model.
func TestDotReaderWholeBuffers(t *testing.T) {
	for _, body := range []string{
		strings.Repeat("QUJDRA==\r\n..x\r\n", 300),
		strings.Repeat("It was late. The lanes were quiet.\r\n.Then a dot.\r\n", 150),
		strings.Repeat("a.b.c.d.e.f.g.h\r\n", 200) + "..\r\n\r\r\n.\r\n",
	} {
		in := []byte(body + ".\r\nQUIT\r\n")
		want, wantUsed, _, wantErr := modelDot(in, 32<<10, 0, 2000)
		br := bufio.NewReaderSize(bytes.NewReader(in), 4096)
		var state, limit, cur int
		d := &dotReader{br: br, sync: &state}
		d.limit, d.cur, d.hard, d.line = &limit, &cur, 2000, 1
		var got []byte
		var err error
		for err == nil {
			b := make([]byte, 32<<10)
			var n int
			n, err = d.Read(b)
			got = append(got, b[:n]...)
		}
		d.release()
		rest, _ := io.ReadAll(br)
		if err != wantErr || !bytes.Equal(got, want) || len(in)-len(rest) != wantUsed {
			t.Fatalf("%.40q…: got %d octets (%v), used %d; model %d octets (%v), used %d",
				body, len(got), err, len(in)-len(rest), len(want), wantErr, wantUsed)
		}
	}
}

// FuzzDotReader checks dotReader against the octet-at-a-time model for
// any input, read size, size limit, line limit and piece sizes.
func FuzzDotReader(f *testing.F) {
	f.Add([]byte("a\r\n..b\r\n.\r\nNOOP\r\n"), []byte{3, 0}, uint16(5), uint16(0), uint8(0))
	f.Add([]byte(".\rx\r\n\r\r\n.\n.\r\n.\r\n"), []byte{1}, uint16(2), uint16(9), uint8(6))
	f.Add([]byte(strings.Repeat("long line ", 20)+"\r\n.\r\n"), []byte{15, 2}, uint16(64), uint16(0), uint8(40))
	// A read that fills a line to one octet past the limit, with no
	// line feed: the line limit's jump must still fail it.
	f.Add([]byte("0"), []byte("0"), uint16(43), uint16(76), uint8(1))
	f.Fuzz(func(t *testing.T, in, sizes []byte, bsize, max uint16, hard uint8) {
		checkDot(t, in, sizes, int(bsize%200)+1, int64(max), int(hard))
	})
}

// TestGoSMTPLayoutKnown holds the fast path to the pinned go-smtp: if an
// upgrade changes the DATA reader or the line limit's fields, dotReader
// stops being used (Data reads through go-smtp's reader, correct but
// slow) and this test says so.
func TestGoSMTPLayoutKnown(t *testing.T) {
	// Learnt afresh, after other readers were offered first (a BDAT
	// message's pipe can be a process's first body): they must not
	// settle the layout.
	layoutOnce, layoutKnown = sync.Once{}, nil
	pr, pw := io.Pipe()
	defer pw.Close()
	for _, r := range []io.Reader{pr, strings.NewReader("x\r\n.\r\n")} {
		if newDotReader(r, &smtp.Conn{}) != nil {
			t.Fatalf("dotReader in place of a %T", r)
		}
	}
	got := make(chan string, 1)
	srv := smtp.NewServer(layoutBackend{got})
	srv.Domain = "mx.test"
	srv.MaxLineLength = 2000
	srv.MaxMessageBytes = 1 << 20
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := smtp.Dial(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SendMail("a@example.com", []string{"b@example.org"}, strings.NewReader("Subject: x\r\n\r\n.dot\r\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s != "Subject: x\r\n\r\n.dot\r\n" { // go-smtp's client stuffed it
			t.Fatalf("go-smtp's layout is not the one dotReader knows, or it read %q", s)
		}
	case <-time.After(testWait):
		t.Fatal("no DATA")
	}
}

type layoutBackend struct{ got chan string }

func (b layoutBackend) NewSession(c *smtp.Conn) (smtp.Session, error) {
	return layoutSession{b.got, c}, nil
}

type layoutSession struct {
	got  chan string
	conn *smtp.Conn
}

func (layoutSession) Mail(string, *smtp.MailOptions) error { return nil }
func (layoutSession) Rcpt(string, *smtp.RcptOptions) error { return nil }
func (layoutSession) Reset()                               {}
func (layoutSession) Logout() error                        { return nil }

func (s layoutSession) Data(r io.Reader) error {
	d := newDotReader(r, s.conn)
	if d == nil {
		s.got <- "<layout unknown>"
		return nil
	}
	defer d.release()
	b, err := io.ReadAll(d)
	s.got <- string(b)
	return err
}

// TestDotReaderMatchesGoSMTP sends the same dialogues to a server reading
// DATA through dotReader and to one reading through go-smtp's own reader,
// and wants the same replies, the same stored messages and the same
// connection ends; but for a body of exactly the size limit, which
// go-smtp's reader refuses and dotReader accepts.
func TestDotReaderMatchesGoSMTP(t *testing.T) {
	const hdr = "Date: Tue, 01 Dec 2026 10:00:00 +0000\r\nMessage-ID: <m@example.com>\r\n\r\n"
	big := &strings.Builder{}
	for i := 0; big.Len() < 100<<10; i++ {
		fmt.Fprintf(big, "%s line %d of a long message\r\n", strings.Repeat(".", i%3), i)
	}
	bodies := []string{
		hdr + "hello\r\n.\r\n",
		hdr + "..one\r\n.two\r\n...\r\n.\r\n",
		hdr + "a\r\n.\rX\r\n.\r\n",
		hdr + "a\r\r\n.\r\nb\r\n.\r\n",
		hdr + "bare\n.\r\nlf\r\n.\r\n",
		hdr + big.String() + ".\r\n",
		hdr + strings.Repeat("x", 199-len(hdr)-2) + "\r\n.\r\n", // under the size limit
		hdr + strings.Repeat("x", 260) + "\r\n" + strings.Repeat("y\r\n", 300) + ".\r\n",
		hdr + strings.Repeat("l", 150) + "\r\n.\r\n", // over MaxLineLength
		hdr + strings.Repeat("h", 250) + "\r\n.\r\n", // over go-smtp's hard limit: closed
		hdr + "pipelined\r\n.\r\nNOOP\r\nRSET\r\n",
	}
	atLimit := hdr + strings.Repeat(strings.Repeat("x", 63)+"\r\n", 2) // 200 octets
	if len(atLimit) != 200 {
		t.Fatalf("the body at the limit has %d octets", len(atLimit))
	}
	bodies = append(bodies, atLimit+".\r\n", atLimit+"x\r\n.\r\n", atLimit+"..\r\n.\r\n")
	run := func(plain bool, body string, max int64) (string, []string) {
		q := &fakeQueue{}
		cfg := Config{Users: testUsers(t), MaxLineLength: 100}
		if max > 0 {
			cfg.MaxMessageBytes = max
		}
		ts := startServer(t, cfg, q, func(s *Server) { s.plainData = plain })
		rc := ts.raw(t)
		rc.login()
		rc.cmd("MAIL FROM:<app@example.com>", 250)
		rc.cmd("RCPT TO:<rcpt@example.org>", 250)
		rc.cmd("DATA", 354)
		// Written in pieces, then QUIT: the transcript is every reply up
		// to the connection's end. Write errors are part of the ending.
		for i := 0; i < len(body); i += 1000 {
			_, _ = rc.c.Write([]byte(body[i:min(i+1000, len(body))]))
		}
		_, _ = rc.c.Write([]byte("QUIT\r\n"))
		var log strings.Builder
		for {
			code, msg, err := rc.reply()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					t.Fatal("connection neither answered nor closed")
				}
				log.WriteString("closed")
				break
			}
			fmt.Fprintf(&log, "%d %s\n", code, msg)
		}
		var stored []string
		for _, s := range q.got() {
			_, rest := storedMessage(t, s.Body)
			stored = append(stored, rest)
		}
		return log.String(), stored
	}
	for i, body := range bodies {
		for _, max := range []int64{0, 200} {
			if max > 0 && len(body) > 200<<10 {
				continue
			}
			t.Run(fmt.Sprintf("%d/max%d", i, max), func(t *testing.T) {
				wantLog, wantStored := run(true, body, max)
				gotLog, gotStored := run(false, body, max)
				if max > 0 && body == atLimit+".\r\n" {
					if !strings.HasPrefix(wantLog, "552 ") {
						t.Errorf("go-smtp's reader: %q, want 552 (if it accepts a body at the limit now, drop atLimit)", wantLog)
					}
					wantLog = "250 2.0.0 OK: queued as id1\n221 2.0.0 Bye\nclosed"
					wantStored = []string{atLimit}
				}
				if gotLog != wantLog {
					t.Errorf("replies\n got %q\nwant %q", gotLog, wantLog)
				}
				if fmt.Sprint(gotStored) != fmt.Sprint(wantStored) {
					t.Errorf("stored\n got %q\nwant %q", gotStored, wantStored)
				}
			})
		}
	}
}

// BenchmarkDotReader is dotReader alone on a 100 KiB DATA body held in
// memory, read as readBody reads it (a 4 KiB connection buffer, 32 KiB
// reads) with serve's line limit: base64 lines (no dots), prose (a dot a
// sentence) and a line in eight stuffed with a leading dot.
func BenchmarkDotReader(b *testing.B) {
	lines := map[string][]string{
		"base64": {strings.Repeat("QUJD", 19) + "\r\n"},
		"prose":  {"It was late. The queue had drained, and the lanes were quiet. Nobody\r\n"},
		"dots": {"..a line that starts with a dot, stuffed on the wire as two of them\r\n",
			"x\r\n", "y\r\n", "z\r\n", "w\r\n", "v\r\n", "u\r\n", "t\r\n"},
	}
	for _, kind := range []string{"base64", "prose", "dots"} {
		b.Run(kind, func(b *testing.B) {
			var in []byte
			for len(in) < 100<<10 {
				for _, l := range lines[kind] {
					in = append(in, l...)
				}
			}
			in = append(in, ".\r\n"...)
			src := bytes.NewReader(in)
			br := bufio.NewReaderSize(src, 4096)
			out := make([]byte, 32<<10)
			var state, limit, cur int
			b.SetBytes(int64(len(in)))
			for b.Loop() {
				src.Reset(in)
				br.Reset(src)
				state = dotBeginLine
				d := &dotReader{br: br, sync: &state}
				d.limit, d.cur, d.hard, d.line = &limit, &cur, 2*DefaultMaxLineLength, 1
				for {
					_, err := d.Read(out)
					if err == io.EOF {
						break
					}
					if err != nil {
						b.Fatal(err)
					}
				}
				d.release()
			}
		})
	}
}
