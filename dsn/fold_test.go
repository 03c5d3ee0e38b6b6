package dsn

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"unicode/utf8"
)

// foldedReport is a failure report whose recipient block has a
// Diagnostic-Code folded over lines continuation lines of " a", followed
// by a Status field: the shape of a status part that one field with a
// quarter of a megabyte of continuations fills.
func foldedReport(reportType string, lines int) []byte {
	if reportType == "feedback-report" {
		return mkReport(reportType, "Content-Type: message/feedback-report\r\n",
			"Feedback-Type: abuse\r\nUser-Agent: x"+strings.Repeat("\r\n a", lines)+"\r\nVersion: 1\r\n")
	}
	return mkReport(reportType, "Content-Type: message/delivery-status\r\n",
		"Reporting-MTA: dns; mx.example.net\r\n\r\n"+
			"Final-Recipient: rfc822; bob@example.org\r\nAction: failed\r\n"+
			"Diagnostic-Code: smtp; 550 5.1.1 no such user"+strings.Repeat("\r\n a", lines)+"\r\n"+
			"Status: 5.1.1\r\n")
}

// foldedHeader is a message whose Content-Type is folded over lines
// continuation lines, which IsReport unfolds.
func foldedHeader(lines int) []byte {
	return []byte("Content-Type: multipart/report; report-type=delivery-status;" +
		strings.Repeat("\r\n a", lines) + "\r\nSubject: x\r\n\r\nbody\r\n")
}

// allocated is the fewest bytes the heap grew by over three runs of f.
// Bytes allocated, unlike time, do not depend on the machine's load, and
// they measure the copying that joining a folded field one line at a time
// did: the whole value again for each line.
func allocated(f func()) uint64 {
	best := ^uint64(0)
	var before, after runtime.MemStats
	for range 3 {
		runtime.ReadMemStats(&before)
		f()
		runtime.ReadMemStats(&after)
		best = min(best, after.TotalAlloc-before.TotalAlloc)
	}
	return best
}

// TestFoldedFieldLinear: reading a field folded over four times as many
// lines costs about four times the memory, not sixteen. The bounce
// listener reads reports from anyone (fbl@ needs no MAC), and a status
// part of one field and 256 KiB of continuation lines took ParseDSN 4.9 s
// and ParseFeedback 6.3 s when each line was joined to the value as a
// string, copying the whole value per line.
func TestFoldedFieldLinear(t *testing.T) {
	const small, large = 4 << 10, 16 << 10 // lines of " a": 16 and 64 KiB
	for _, c := range []struct {
		name string
		read func(lines int) func()
	}{
		{"ParseDSN", func(lines int) func() {
			msg := foldedReport("delivery-status", lines)
			return func() {
				if _, err := ParseDSN(msg); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"ParseFeedback", func(lines int) func() {
			msg := foldedReport("feedback-report", lines)
			return func() {
				if _, err := ParseFeedback(msg); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"IsReport", func(lines int) func() {
			msg := foldedHeader(lines)
			return func() {
				if !IsReport(msg) {
					t.Fatal("not taken for a report")
				}
			}
		}},
	} {
		a, b := allocated(c.read(small)), allocated(c.read(large))
		// Linear work gives a ratio of about 4 (less with the value's
		// cap); joining line by line gave 16.
		if ratio := float64(b) / float64(a); ratio > 8 {
			t.Errorf("%s: %d bytes allocated for %d folded lines, %d for %d: ratio %.1f, want linear (about 4)",
				c.name, a, small, b, large, ratio)
		}
	}
}

// TestFieldValueCapped: a status field's value is cut to maxFieldValue
// bytes, its start kept, and the fields after it are read as usual; a
// value cut inside a UTF-8 character stays valid.
func TestFieldValueCapped(t *testing.T) {
	r, err := ParseDSN(foldedReport("delivery-status", 20<<10))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Recipients) != 1 {
		t.Fatalf("%d recipients", len(r.Recipients))
	}
	rc := r.Recipients[0]
	if !strings.HasPrefix(rc.Diagnostic, "550 5.1.1 no such user a a a") || rc.DiagnosticType != "smtp" {
		t.Fatalf("diagnostic %q (type %q)", rc.Diagnostic[:min(len(rc.Diagnostic), 60)], rc.DiagnosticType)
	}
	// "smtp; " is part of the value the cap counts.
	if n := len(rc.Diagnostic) + len("smtp; "); n > maxFieldValue || n < maxFieldValue-2 {
		t.Errorf("diagnostic of %d bytes with its type, want %d", n, maxFieldValue)
	}
	if rc.Status != "5.1.1" || rc.Action != Failed || rc.Final != "bob@example.org" {
		t.Errorf("recipient %+v: the fields around the long one not read", rc)
	}

	// One long line, not folded, is cut the same way, here before the
	// second byte of an "é".
	long := mkReport("delivery-status", "Content-Type: message/delivery-status\r\n",
		"Final-Recipient: rfc822; bob@example.org\r\nAction: failed\r\nDiagnostic-Code: x-unix; z"+
			strings.Repeat("é", maxFieldValue)+"\r\nStatus: 5.2.2\r\n")
	r, err = ParseDSN(long)
	if err != nil {
		t.Fatal(err)
	}
	rc = r.Recipients[0]
	if n := len(rc.Diagnostic) + len("x-unix; "); n > maxFieldValue || n < maxFieldValue-1 || !utf8.ValidString(rc.Diagnostic) {
		t.Errorf("diagnostic of %d bytes with its type (valid UTF-8: %v), want %d", n, utf8.ValidString(rc.Diagnostic), maxFieldValue)
	}
	if rc.Status != "5.2.2" {
		t.Errorf("status %q after the long line", rc.Status)
	}

	// A feedback report's fields too.
	fb, err := ParseFeedback(foldedReport("feedback-report", 20<<10))
	if err != nil {
		t.Fatal(err)
	}
	if len(fb.UserAgent) != maxFieldValue-1 || !strings.HasPrefix(fb.UserAgent, "x a a") || fb.Type != "abuse" {
		t.Errorf("feedback %q (%d bytes), type %q", fb.UserAgent[:min(len(fb.UserAgent), 20)], len(fb.UserAgent), fb.Type)
	}

	// And the Content-Type IsReport reads.
	v, ok := headerValue(headerBlock(foldedHeader(20<<10)), "content-type")
	if !ok || len(v) > maxFieldValue || !strings.HasPrefix(v, "multipart/report; report-type=delivery-status; a a") {
		t.Errorf("content-type of %d bytes: %q", len(v), v[:min(len(v), 60)])
	}
}

// TestUnescapeUnicodeUnclosed: escapes that never close are kept as they
// are, and each is given up on after the few characters a closing brace
// could be in, not after a search of the whole rest of the value.
func TestUnescapeUnicodeUnclosed(t *testing.T) {
	in := strings.Repeat(`\x{`, 1000) + `\x{41}}`
	if got, want := unescapeUnicode(in), strings.Repeat(`\x{`, 1000)+"A}"; got != want {
		t.Fatalf("unescapeUnicode = %q…, want %q…", got[len(got)-20:], want[len(want)-20:])
	}
}

// BenchmarkParseFoldedField reads a report whose status part is mostly one
// field folded over many short lines, at three sizes up to the status
// part's limit: the MB/s stay level when the work is linear (they fell
// about fourfold per step when each line was joined by copying the value).
func BenchmarkParseFoldedField(b *testing.B) {
	for _, kib := range []int{16, 64, 240} {
		for _, typ := range []string{"delivery-status", "feedback-report"} {
			msg := foldedReport(typ, kib<<10/4)
			b.Run(fmt.Sprintf("%s/%dKiB", typ, kib), func(b *testing.B) {
				b.SetBytes(int64(len(msg)))
				b.ReportAllocs()
				for b.Loop() {
					var err error
					if typ == "delivery-status" {
						_, err = ParseDSN(msg)
					} else {
						_, err = ParseFeedback(msg)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkUnescapeUnclosed decodes a utf-8 address made of escapes that
// never close, at two sizes: linear, the second costs four times the
// first.
func BenchmarkUnescapeUnclosed(b *testing.B) {
	for _, n := range []int{2 << 10, 8 << 10} {
		s := strings.Repeat(`\x{`, n)
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			b.SetBytes(int64(len(s)))
			for b.Loop() {
				unescapeUnicode(s)
			}
		})
	}
}
