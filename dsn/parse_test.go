package dsn

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func readSample(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "received", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mkReport makes a minimal multipart/report around a status part: header is
// the status part's header lines (CRLF-terminated), status its body.
func mkReport(reportType, header, status string) []byte {
	return []byte("From: MAILER-DAEMON@mx.example.net\r\n" +
		"MIME-Version: 1.0\r\n" +
		"Content-Type: multipart/report; report-type=" + reportType + "; boundary=\"b\"\r\n" +
		"\r\n" +
		"--b\r\nContent-Type: text/plain\r\n\r\nIt failed.\r\n" +
		"--b\r\n" + header + "\r\n" + status + "\r\n" +
		"--b--\r\n")
}

// checkRecipients compares the fields of got and want that a received
// report carries.
func checkRecipients(t *testing.T, got, want []Recipient) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d recipients, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		for _, c := range []struct{ name, got, want string }{
			{"Final", g.Final, w.Final},
			{"Original", g.Original, w.Original},
			{"OriginalType", g.OriginalType, w.OriginalType},
			{"Action", string(g.Action), string(w.Action)},
			{"Status", g.Status, w.Status},
			{"RemoteMTA", g.RemoteMTA, w.RemoteMTA},
			{"Diagnostic", g.Diagnostic, w.Diagnostic},
			{"DiagnosticType", g.DiagnosticType, w.DiagnosticType},
		} {
			if c.got != c.want {
				t.Errorf("recipient %d %s = %q, want %q", i, c.name, c.got, c.want)
			}
		}
		if !g.LastAttempt.Equal(w.LastAttempt) {
			t.Errorf("recipient %d LastAttempt = %v, want %v", i, g.LastAttempt, w.LastAttempt)
		}
		if !g.WillRetryUntil.Equal(w.WillRetryUntil) {
			t.Errorf("recipient %d WillRetryUntil = %v, want %v", i, g.WillRetryUntil, w.WillRetryUntil)
		}
	}
}

func TestParseDSNSamples(t *testing.T) {
	for _, c := range []struct {
		file         string
		reportingMTA string
		envelopeID   string
		messageID    string // in the returned original's header
		rcpts        []Recipient
	}{
		{
			file: "postfix-failed.eml", reportingMTA: "mx1.example.org", envelopeID: "of-7Q2M+z=w",
			messageID: "<20261201100000.c3f1a9@example.com>",
			rcpts: []Recipient{{Final: "nobody@example.org", Original: "nobody@example.org", OriginalType: "rfc822",
				Action: Failed, Status: "5.1.1", RemoteMTA: "mailstore.example.org", DiagnosticType: "smtp",
				Diagnostic: "550 5.1.1 <nobody@example.org>: Recipient address rejected: User unknown in virtual mailbox table"}},
		},
		{
			file: "exim-failed.eml", reportingMTA: "mail.example.net",
			messageID: "<20261201100457.e1d2@example.com>",
			rcpts: []Recipient{{Final: "gone@example.net", Action: Failed, Status: "5.0.0", RemoteMTA: "mx2.example.net",
				DiagnosticType: "smtp", Diagnostic: "550 5.1.1 <gone@example.net>: Recipient address rejected: User unknown"}},
		},
		{
			file: "exchange-online-ndr.eml", reportingMTA: "AM0PR01MB1234.eurprd01.prod.example.net",
			messageID: "<20261201100955.x9k2@example.com>",
			rcpts: []Recipient{{Final: "former.employee@example.net", Original: "former.employee@example.net", OriginalType: "rfc822",
				Action: Failed, Status: "5.1.10", DiagnosticType: "smtp",
				Diagnostic: "550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup"}},
		},
		{
			file: "gmail-nosuchuser.eml", reportingMTA: "mail.example.net",
			messageID: "<20261201101458.g7h8@example.com>",
			rcpts: []Recipient{{Final: "nosuchuser@example.net", Action: Failed, Status: "5.1.1", RemoteMTA: "mx-in.example.net",
				DiagnosticType: "smtp",
				Diagnostic: "550-5.1.1 The email account that you tried to reach does not exist. Please try " +
					"550-5.1.1 double-checking the recipient's email address for typos or " +
					"550-5.1.1 unnecessary spaces. For more information, go to " +
					"550 5.1.1  https://support.example.com/mail/?p=NoSuchUser 41be03b00d2f7-b8a1b2c3d4si12345a12.345 - gsmtp",
				LastAttempt: time.Date(2026, 12, 1, 10, 15, 0, 0, time.UTC)}},
		},
		{
			file: "postfix-delayed.eml", reportingMTA: "relay.example.org", envelopeID: "of-d4e5",
			messageID: "<20261201055959.d4e5@example.com>",
			rcpts: []Recipient{{Final: "slow@example.org", Original: "slow@example.org", OriginalType: "rfc822",
				Action: Delayed, Status: "4.4.7", DiagnosticType: "x-postfix",
				Diagnostic:     "delivery temporarily suspended: connect to mx.example.org[192.0.2.30]:25: Connection timed out",
				WillRetryUntil: time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)}},
		},
		{
			file: "sendmail-two-recipients.eml", reportingMTA: "mail.example.org", envelopeID: "of-f6a7",
			messageID: "<20261201102954.f6a7@example.com>",
			rcpts: []Recipient{
				{Final: "alice@example.org", Action: Delivered, Status: "2.0.0",
					LastAttempt: time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)},
				{Final: "bob@example.org", Action: Failed, Status: "5.2.2", RemoteMTA: "store.example.org",
					DiagnosticType: "smtp", Diagnostic: "552 5.2.2 <bob@example.org>... Mailbox full",
					LastAttempt: time.Date(2026, 12, 1, 10, 30, 0, 0, time.UTC)},
			},
		},
		{
			file: "global-utf8.eml", reportingMTA: "mx.example.org",
			messageID: "<20261201103957.a8b9@example.com>",
			rcpts: []Recipient{{Final: "δοκιμή@example.org", Original: "δοκιμή@example.org", OriginalType: "utf-8",
				Action: Failed, Status: "5.1.1", RemoteMTA: "store.example.org", DiagnosticType: "smtp",
				Diagnostic: "550 5.1.1 <δοκιμή@example.org>: Recipient address rejected: User unknown"}},
		},
		{
			file: "nested-mixed.eml", reportingMTA: "relay.example.org",
			messageID: "<20261201104950.c0d1@example.com>",
			rcpts: []Recipient{{Final: "sales@example.org", Action: Failed, Status: "5.7.1", RemoteMTA: "[192.0.2.50]",
				DiagnosticType: "smtp", Diagnostic: "550 5.7.1 Message rejected by content policy"}},
		},
		{
			file: "base64-status.eml", reportingMTA: "gw.example.net",
			messageID: "<20261201105958.e2f3@example.com>",
			rcpts: []Recipient{{Final: "info@example.net", Action: Failed, Status: "5.2.1", RemoteMTA: "mailbox.example.net",
				DiagnosticType: "smtp", Diagnostic: "550 5.2.1 Mailbox disabled, not accepting messages"}},
		},
	} {
		t.Run(c.file, func(t *testing.T) {
			r, err := ParseDSN(readSample(t, c.file))
			if err != nil {
				t.Fatal(err)
			}
			if r.ReportingMTA != c.reportingMTA {
				t.Errorf("ReportingMTA = %q, want %q", r.ReportingMTA, c.reportingMTA)
			}
			if r.EnvelopeID != c.envelopeID {
				t.Errorf("EnvelopeID = %q, want %q", r.EnvelopeID, c.envelopeID)
			}
			checkRecipients(t, r.Recipients, c.rcpts)
			if !bytes.Contains(r.OriginalHeader, []byte("Message-ID: "+c.messageID)) {
				t.Errorf("OriginalHeader lacks the Message-ID %s:\n%s", c.messageID, r.OriginalHeader)
			}
			// The header only: it ends before the empty line and the body.
			if bytes.Contains(r.OriginalHeader, []byte("selection is here")) || bytes.Contains(r.OriginalHeader, []byte("\n\n")) ||
				bytes.Contains(r.OriginalHeader, []byte("\r\n\r\n")) {
				t.Errorf("OriginalHeader goes past the header:\n%s", r.OriginalHeader)
			}
		})
	}
}

// A report stored with bare LF line ends reads as the same report with
// CRLF ones.
func TestParseDSNLineEnds(t *testing.T) {
	crlf := readSample(t, "postfix-failed.eml")
	lf := bytes.ReplaceAll(crlf, []byte("\r\n"), []byte("\n"))
	if bytes.Contains(lf, []byte("\r")) {
		t.Fatal("CR left")
	}
	a, err := ParseDSN(crlf)
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseDSN(lf)
	if err != nil {
		t.Fatal(err)
	}
	if a.ReportingMTA != b.ReportingMTA || a.EnvelopeID != b.EnvelopeID {
		t.Errorf("per-message fields differ: %q %q / %q %q", a.ReportingMTA, a.EnvelopeID, b.ReportingMTA, b.EnvelopeID)
	}
	checkRecipients(t, b.Recipients, a.Recipients)
	if !bytes.Equal(bytes.ReplaceAll(a.OriginalHeader, []byte("\r\n"), []byte("\n")), b.OriginalHeader) {
		t.Errorf("OriginalHeader differs:\n%q\n%q", a.OriginalHeader, b.OriginalHeader)
	}

	// The exim sample is stored with LF; read with CRLF it is the same.
	lfExim := readSample(t, "exim-failed.eml")
	if bytes.Contains(lfExim, []byte("\r")) {
		t.Fatal("exim-failed.eml should be stored with bare LF line ends")
	}
	c, err := ParseDSN(lfExim)
	if err != nil {
		t.Fatal(err)
	}
	d, err := ParseDSN(bytes.ReplaceAll(lfExim, []byte("\n"), []byte("\r\n")))
	if err != nil {
		t.Fatal(err)
	}
	checkRecipients(t, d.Recipients, c.Recipients)
}

// The status part's field syntax: folding, blank lines (several, leading,
// trailing, of whitespace), case, unknown fields and the blocks that are
// skipped or completed.
func TestParseDSNFields(t *testing.T) {
	status := "\r\n\r\n" + // leading blank lines
		"REPORTING-MTA: DNS;\r\n mx.example.net\r\n" +
		"original-envelope-id: a+2Bb+3Dc+20d+zz\r\n" +
		"X-Vendor-Thing: ignored\r\n" +
		" \t\r\n" + // a blank line of whitespace
		"\r\n\r\n" +
		"final-recipient: RFC822;<First@Example.org>\r\n" +
		"ACTION: Failed\r\n" +
		"Status: 5.1.1 (bad destination mailbox address)\r\n" +
		"Remote-MTA: dns; mx1.example.org (192.0.2.1)\r\n" +
		"Diagnostic-Code: smtp; 550 5.1.1\r\n" +
		"\tno such\r\n" +
		"      user here\r\n" +
		"\r\n" +
		"Original-Recipient: rfc822;orphan@example.org\r\n" + // no Final-Recipient: skipped
		"Action: failed\r\n" +
		"\r\n" +
		"Final-Recipient: rfc822; noaction@example.org\r\n" + // Action from the Status's class
		"Status: 4.2.2\r\n" +
		"\r\n" +
		"Final-Recipient: rfc822; nothing@example.org\r\n" + // no Action, no usable Status: skipped
		"Status: 550\r\n" +
		"\r\n" +
		"Final-Recipient: rfc822; list@example.org\r\n" +
		"Action: expanded\r\n" +
		"Status: 2.0.0\r\n" +
		"Diagnostic-Code: 550 5.1.1 <a@example.org>; no type here\r\n" +
		"\r\n" +
		"Final-Recipient: rfc822; odd@example.org\r\n" +
		"Action: Bounced\r\n" +
		"Status: 9.1.1\r\n" +
		"\r\n\r\n \r\n" // trailing blank lines
	r, err := ParseDSN(mkReport("delivery-status", "Content-Type: message/delivery-status\r\n", status))
	if err != nil {
		t.Fatal(err)
	}
	if r.ReportingMTA != "mx.example.net" || r.EnvelopeID != "a+b=c d+zz" {
		t.Errorf("ReportingMTA %q, EnvelopeID %q", r.ReportingMTA, r.EnvelopeID)
	}
	checkRecipients(t, r.Recipients, []Recipient{
		{Final: "First@Example.org", Action: Failed, Status: "5.1.1", RemoteMTA: "mx1.example.org",
			DiagnosticType: "smtp", Diagnostic: "550 5.1.1 no such user here"},
		{Final: "noaction@example.org", Action: Delayed, Status: "4.2.2"},
		{Final: "list@example.org", Action: Expanded, Status: "2.0.0", Diagnostic: "550 5.1.1 <a@example.org>; no type here"},
		{Final: "odd@example.org", Action: "bounced"},
	})
	if r.OriginalHeader != nil {
		t.Errorf("OriginalHeader %q without a third part", r.OriginalHeader)
	}

	// The per-message group without its empty line: the first recipient's
	// fields follow Reporting-MTA directly.
	r, err = ParseDSN(mkReport("delivery-status", "Content-Type: message/delivery-status\r\n",
		"Reporting-MTA: dns; mx.example.net\r\nFinal-Recipient: rfc822; a@example.org\r\nAction: failed\r\nStatus: 5.0.0\r\n"+
			"\r\nFinal-Recipient: rfc822; b@example.org\r\nAction: failed\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Recipients) != 2 || r.Recipients[0].Final != "a@example.org" || r.Recipients[1].Final != "b@example.org" {
		t.Errorf("recipients %+v", r.Recipients)
	}
}

// Content-Type parameters are case-insensitive, a quoted-printable status
// part is decoded, and a sloppy Content-Type (a duplicated parameter) is
// still read.
func TestParseDSNMIME(t *testing.T) {
	status := "Reporting-MTA: dns; mx.example.net\r\n\r\nFinal-Recipient: rfc822; a@example.org\r\nAction: failed\r\n" +
		"Status: 5.1.1\r\nDiagnostic-Code: smtp; 550 5.1.1 a very long diagnostic that a quoted-printable encoder h=\r\nas broken\r\n"
	msg := mkReport("delivery-status", "Content-Type: Message/Delivery-Status; charset=us-ascii\r\nContent-Transfer-Encoding: Quoted-Printable\r\n", status)
	msg = bytes.Replace(msg, []byte("report-type=delivery-status"), []byte(`Report-Type="Delivery-Status"; boundary=b`), 1)
	r, err := ParseDSN(msg)
	if err != nil {
		t.Fatal(err)
	}
	if d := r.Recipients[0].Diagnostic; d != "550 5.1.1 a very long diagnostic that a quoted-printable encoder has broken" {
		t.Errorf("Diagnostic %q", d)
	}
}

func TestParseDSNNotReport(t *testing.T) {
	for name, msg := range map[string][]byte{
		"free text":  readSample(t, "freetext-bounce.eml"),
		"ARF":        readSample(t, "arf-abuse.eml"),
		"MDN":        mkReport("disposition-notification", "Content-Type: message/disposition-notification\r\n", "Final-Recipient: rfc822; a@example.org\r\n"),
		"empty":      nil,
		"no header":  []byte("\r\nhello\r\n"),
		"bad header": []byte(" folded first line\r\n\r\n"),
		"mixed":      []byte("Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\nContent-Type: text/plain\r\n\r\nhi\r\n--x--\r\n"),
		// A report forwarded as an attachment is someone else's mail.
		"forwarded": []byte("Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\nContent-Type: message/rfc822\r\n\r\n" +
			string(readSample(t, "postfix-failed.eml")) + "\r\n--x--\r\n"),
		// Without a report-type, a report needs its status part.
		"untyped": bytes.Replace(mkReport("x", "Content-Type: text/plain\r\n", "hello"), []byte("report-type=x; "), nil, 1),
	} {
		r, err := ParseDSN(msg)
		if !errors.Is(err, ErrNotReport) || r != nil {
			t.Errorf("%s: %v, %v; want ErrNotReport", name, r, err)
		}
	}
	if _, err := ParseFeedback(readSample(t, "postfix-failed.eml")); !errors.Is(err, ErrNotReport) {
		t.Errorf("ParseFeedback of a DSN: %v, want ErrNotReport", err)
	}

	// Without a report-type, a report with the status part is read.
	untyped := bytes.Replace(mkReport("x", "Content-Type: message/delivery-status\r\n",
		"Reporting-MTA: dns; mx.example.net\r\n\r\nFinal-Recipient: rfc822; a@example.org\r\nAction: failed\r\n"),
		[]byte("report-type=x; "), nil, 1)
	if r, err := ParseDSN(untyped); err != nil || r.Recipients[0].Final != "a@example.org" {
		t.Errorf("untyped report: %v, %v", r, err)
	}
}

func TestParseDSNMalformed(t *testing.T) {
	ds := "Content-Type: message/delivery-status\r\n"
	blocks := func(n int) string {
		var b strings.Builder
		b.WriteString("Reporting-MTA: dns; mx.example.net\r\n")
		for i := range n {
			fmt.Fprintf(&b, "\r\nFinal-Recipient: rfc822; u%d@example.org\r\nAction: failed\r\n", i)
		}
		return b.String()
	}
	for name, msg := range map[string][]byte{
		"empty status part":  mkReport("delivery-status", ds, ""),
		"blank status part":  mkReport("delivery-status", ds, "\r\n \r\n\r\n"),
		"no status part":     mkReport("delivery-status", "Content-Type: text/plain\r\n", "Reporting-MTA: dns; x\r\n"),
		"per-message only":   mkReport("delivery-status", ds, "Reporting-MTA: dns; mx.example.net\r\n"),
		"no Final-Recipient": mkReport("delivery-status", ds, "Reporting-MTA: dns; mx.example.net\r\n\r\nAction: failed\r\nStatus: 5.1.1\r\n"),
		"bad base64": mkReport("delivery-status", ds+"Content-Transfer-Encoding: base64\r\n",
			"Reporting-MTA: dns; mx.example.net\r\n\r\nFinal-Recipient: rfc822; a@example.org\r\n"),
		"oversize": mkReport("delivery-status", ds, "Reporting-MTA: dns; mx.example.net\r\n\r\nFinal-Recipient: rfc822; a@example.org\r\n"+
			"Action: failed\r\nX-Padding: "+strings.Repeat("x", maxStatusPart)+"\r\n"),
		"too many recipients": mkReport("delivery-status", ds, blocks(maxRecipientBlocks+1)),
		"no boundary":         []byte("Content-Type: multipart/report; report-type=delivery-status\r\n\r\nhello\r\n"),
	} {
		r, err := ParseDSN(msg)
		if !errors.Is(err, ErrMalformed) || r != nil {
			t.Errorf("%s: %v, %v; want ErrMalformed", name, r, err)
		}
	}
	r, err := ParseDSN(mkReport("delivery-status", ds, blocks(maxRecipientBlocks)))
	if err != nil || len(r.Recipients) != maxRecipientBlocks {
		t.Errorf("%d recipient blocks: %v", maxRecipientBlocks, err)
	}
}

// Nesting deeper than maxDepth is not searched; within it, the report is
// found under other multiparts.
func TestParseDSNNesting(t *testing.T) {
	inner := readSample(t, "postfix-failed.eml")
	hdr, body, _ := bytes.Cut(inner, []byte("\r\n\r\n"))
	ct := hdr[bytes.Index(hdr, []byte("Content-Type:")):]
	ct = ct[:bytes.Index(ct, []byte("\r\nContent-Transfer-Encoding"))]
	wrap := func(levels int) []byte {
		msg := string(ct) + "\r\n\r\n" + string(body)
		for i := range levels {
			b := fmt.Sprintf("level%d", i)
			msg = "Content-Type: multipart/mixed; boundary=" + b + "\r\n\r\n--" + b + "\r\n" + msg + "\r\n--" + b + "--\r\n"
		}
		return []byte("Subject: wrapped\r\n" + msg)
	}
	if r, err := ParseDSN(wrap(maxDepth - 1)); err != nil || r.Recipients[0].Final != "nobody@example.org" {
		t.Errorf("report %d levels down: %v", maxDepth-1, err)
	}
	if _, err := ParseDSN(wrap(maxDepth)); !errors.Is(err, ErrNotReport) {
		t.Errorf("report %d levels down: %v, want ErrNotReport", maxDepth, err)
	}
	start := time.Now()
	if _, err := ParseDSN(wrap(1000)); !errors.Is(err, ErrNotReport) {
		t.Errorf("hostile nesting: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("hostile nesting took %v", d)
	}
}

// A report written by Build reads back as what it was built from.
func TestParseDSNRoundTrip(t *testing.T) {
	built := failedReport()
	delayed := failedReport()
	delayed.ID = "abc.1.delayed"
	delayed.Return = ReturnFull
	delayed.Recipients = delayed.Recipients[:1]
	delayed.Recipients[0].Action = Delayed
	delayed.Recipients[0].Diagnostic = "451 4.7.1 try later"
	delayed.Recipients[0].WillRetryUntil = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	for _, rep := range []*Report{built, delayed} {
		msg, err := Build(rep)
		if err != nil {
			t.Fatal(err)
		}
		r, err := ParseDSN(msg)
		if err != nil {
			t.Fatal(err)
		}
		if r.ReportingMTA != rep.ReportingMTA || r.EnvelopeID != rep.EnvelopeID {
			t.Errorf("ReportingMTA %q, EnvelopeID %q; want %q, %q", r.ReportingMTA, r.EnvelopeID, rep.ReportingMTA, rep.EnvelopeID)
		}
		var want []Recipient
		for _, rc := range rep.Recipients {
			w := Recipient{Final: rc.Final, Original: rc.Original, Action: rc.Action, Status: status(rc),
				RemoteMTA: rc.RemoteMTA, Diagnostic: oneLine(rc.Diagnostic), DiagnosticType: "smtp",
				LastAttempt: rc.LastAttempt, WillRetryUntil: rc.WillRetryUntil}
			if rc.Original != "" {
				w.OriginalType = "rfc822"
			}
			want = append(want, w)
		}
		checkRecipients(t, r.Recipients, want)
		if !bytes.Contains(r.OriginalHeader, []byte("Message-ID: <m1@example.com>")) || bytes.Contains(r.OriginalHeader, []byte("body line")) {
			t.Errorf("OriginalHeader:\n%s", r.OriginalHeader)
		}
	}
}

func TestParseFeedback(t *testing.T) {
	f, err := ParseFeedback(readSample(t, "arf-abuse.eml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, got, want string }{
		{"Type", f.Type, "abuse"},
		{"UserAgent", f.UserAgent, "Yahoo!-Mail-Feedback/2.0"},
		{"OriginalMailFrom", f.OriginalMailFrom, "bounces+a1b2@bounces.example.com"},
		{"OriginalRcptTo", strings.Join(f.OriginalRcptTo, ","), "reader@example.net"},
		{"ReportedDomain", f.ReportedDomain, "example.com"},
		{"SourceIP", f.SourceIP, "203.0.113.10"},
	} {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if want := time.Date(2026, 12, 1, 18, 0, 3, 0, time.UTC); !f.ArrivalDate.Equal(want) {
		t.Errorf("ArrivalDate %v, want %v", f.ArrivalDate, want)
	}
	for _, s := range []string{"Message-ID: <20261201180000.a1b2@example.com>", "List-Unsubscribe: <https://example.com/u/a1b2>"} {
		if !bytes.Contains(f.OriginalHeader, []byte(s)) {
			t.Errorf("OriginalHeader lacks %q:\n%s", s, f.OriginalHeader)
		}
	}
	if bytes.Contains(f.OriginalHeader, []byte("selection is here")) {
		t.Errorf("OriginalHeader has the body:\n%s", f.OriginalHeader)
	}

	// A minimal report: the type lowercased, the older Received-Date,
	// several recipients, no third part.
	f, err = ParseFeedback(mkReport("Feedback-Report", "Content-Type: message/feedback-report\r\n",
		"Feedback-Type: Not-Spam\r\nVersion: 1\r\nReceived-Date: Tue, 1 Dec 2026 10:00:00 +0000\r\n"+
			"Original-Rcpt-To: a@example.net\r\nOriginal-Rcpt-To: <b@example.net>\r\nArrival-Date: not a date\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Type != "not-spam" || strings.Join(f.OriginalRcptTo, ",") != "a@example.net,b@example.net" || !f.ArrivalDate.IsZero() || f.OriginalHeader != nil {
		t.Errorf("minimal report: %+v", f)
	}
	f, err = ParseFeedback(mkReport("feedback-report", "Content-Type: message/feedback-report\r\n",
		"Feedback-Type: fraud\r\nReceived-Date: Tue, 1 Dec 2026 10:00:00 +0000\r\n"))
	if err != nil || !f.ArrivalDate.Equal(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)) {
		t.Errorf("Received-Date: %+v, %v", f, err)
	}

	for name, msg := range map[string][]byte{
		"no Feedback-Type": mkReport("feedback-report", "Content-Type: message/feedback-report\r\n", "User-Agent: x\r\nVersion: 1\r\n"),
		"empty part":       mkReport("feedback-report", "Content-Type: message/feedback-report\r\n", ""),
		"no report part":   mkReport("feedback-report", "Content-Type: text/plain\r\n", "Feedback-Type: abuse\r\n"),
	} {
		if _, err := ParseFeedback(msg); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", name, err)
		}
	}
	if _, err := ParseFeedback(readSample(t, "freetext-bounce.eml")); !errors.Is(err, ErrNotReport) {
		t.Errorf("free text: %v, want ErrNotReport", err)
	}
}

// A complaint in Microsoft JMRP's older format, no report but the
// original attached: its header, with the complainer and the envelope
// sender that Authentication-Results names; any other message, reports
// included, is none.
func TestParseAttached(t *testing.T) {
	h, err := ParseAttached(readSample(t, "jmrp-hotmail.eml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"X-HmXmrOriginalRecipient: reader@example.net", "smtp.mailfrom=bounces+a1b2@bounces.example.com",
		"Message-ID: <20261203233000.a1b2@example.com>"} {
		if !bytes.Contains(h, []byte(s)) {
			t.Errorf("header lacks %q:\n%s", s, h)
		}
	}
	if bytes.Contains(h, []byte("selection is here")) || bytes.Contains(h, []byte("staff@hotmail.example")) {
		t.Errorf("header has the body or the wrapper's fields:\n%s", h)
	}
	// A part before the attached message (the reporter's note) is passed.
	msg := "Content-Type: multipart/mixed; boundary=m\r\n\r\n--m\r\nContent-Type: text/plain\r\n\r\nSpam.\r\n" +
		"--m\r\nContent-Type: message/rfc822\r\nContent-Transfer-Encoding: base64\r\n\r\n" +
		"UmV0dXJuLVBhdGg6IDxhQGIuZXhhbXBsZT4NCg0KYm9keQ0K\r\n--m--\r\n"
	if h, err := ParseAttached([]byte(msg)); err != nil || string(h) != "Return-Path: <a@b.example>\r\n" {
		t.Errorf("base64 attachment after a note: %q, %v", h, err)
	}
	for name, msg := range map[string][]byte{
		"an ARF report": readSample(t, "arf-abuse.eml"),
		"a DSN":         readSample(t, "postfix-failed.eml"),
		"free text":     readSample(t, "freetext-bounce.eml"),
		"no attachment": []byte("Content-Type: multipart/mixed; boundary=m\r\n\r\n--m\r\nContent-Type: text/plain\r\n\r\nhi\r\n--m--\r\n"),
		"an empty one":  []byte("Content-Type: multipart/mixed; boundary=m\r\n\r\n--m\r\nContent-Type: message/rfc822\r\n\r\n\r\n--m--\r\n"),
	} {
		if _, err := ParseAttached(msg); !errors.Is(err, ErrNotReport) {
			t.Errorf("%s: %v, want ErrNotReport", name, err)
		}
	}
}

func TestXTextDecode(t *testing.T) {
	for _, s := range []string{"", "plain", "a+b=c d\x01é", "env 42", "+"} {
		if got := XTextDecode(XText(s)); got != s {
			t.Errorf("XTextDecode(XText(%q)) = %q", s, got)
		}
	}
	// A "+" without two hex digits after it is kept.
	for in, want := range map[string]string{"a+": "a+", "a+4": "a+4", "a+zz": "a+zz", "a+2b": "a+"} {
		if got := XTextDecode(in); got != want {
			t.Errorf("XTextDecode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUnescapeUnicode(t *testing.T) {
	for in, want := range map[string]string{
		`\x{3B4}@example.org`:      "δ@example.org",
		`a\x{}b`:                   `a\x{}b`,
		`a\x{110000}b`:             `a\x{110000}b`,
		`a\x{D800}b`:               `a\x{D800}b`,
		`a\x{41`:                   `a\x{41`,
		`\x{48}\x{49}`:             "HI",
		`no escapes@example.org`:   "no escapes@example.org",
		`\x{zz}\x{4A}@example.org`: `\x{zz}J@example.org`,
	} {
		if got := unescapeUnicode(in); got != want {
			t.Errorf("unescapeUnicode(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzParseDSN checks that no input makes ParseDSN, ParseFeedback or
// ParseAttached panic and that every recipient ParseDSN returns has a
// Final.
func FuzzParseDSN(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "received", "*.eml"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no samples: %v", err)
	}
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		r, err := ParseDSN(msg)
		if err == nil && r == nil {
			t.Fatal("nil result without an error")
		}
		if r != nil {
			if len(r.Recipients) == 0 {
				t.Error("a result without recipients")
			}
			for i, rc := range r.Recipients {
				if rc.Final == "" {
					t.Errorf("recipient %d has no Final", i)
				}
			}
		}
		if fb, err := ParseFeedback(msg); err == nil && (fb == nil || fb.Type == "") {
			t.Errorf("feedback %+v without a Type", fb)
		}
		if h, err := ParseAttached(msg); err == nil && len(h) == 0 {
			t.Error("an attached original without a header")
		}
	})
}

// BenchmarkParseDSN reads Postfix's failure report, what the bounce
// listener does for each report it takes.
func BenchmarkParseDSN(b *testing.B) {
	msg, err := os.ReadFile("testdata/received/postfix-failed.eml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseDSN(msg); err != nil {
			b.Fatal(err)
		}
	}
}
