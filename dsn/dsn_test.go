package dsn

import (
	"bufio"
	"bytes"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"net/textproto"
	"strings"
	"testing"
	"time"

	usascii "github.com/outflow/outflow/internal/ascii"
)

var original = []byte("From: App <app@example.com>\r\nTo: gone@dest.test\r\nSubject: hello\r\nMessage-ID: <m1@example.com>\r\n\r\nbody line\r\n.dot line\r\n")

// parsed is a report taken apart the way a mail client would.
type parsed struct {
	hdr     mail.Header
	parts   []*multipart.Part
	bodies  [][]byte
	message textproto.MIMEHeader   // the delivery-status per-message group
	rcpts   []textproto.MIMEHeader // one per recipient
}

func parse(t *testing.T, msg []byte) *parsed {
	t.Helper()
	m, err := mail.ReadMessage(bytes.NewReader(msg))
	if err != nil {
		t.Fatalf("read message: %v\n%s", err, msg)
	}
	mt, params, err := mime.ParseMediaType(m.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/report" || params["report-type"] != "delivery-status" {
		t.Fatalf("Content-Type %q (%v)", m.Header.Get("Content-Type"), err)
	}
	p := &parsed{hdr: m.Header}
	mr := multipart.NewReader(m.Body, params["boundary"])
	for {
		part, err := mr.NextRawPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("part %d: %v", len(p.parts), err)
		}
		b, err := io.ReadAll(part)
		if err != nil {
			t.Fatal(err)
		}
		p.parts = append(p.parts, part)
		p.bodies = append(p.bodies, b)
	}
	if len(p.parts) < 2 {
		t.Fatalf("%d parts", len(p.parts))
	}
	if ct := p.parts[1].Header.Get("Content-Type"); ct != "message/delivery-status" {
		t.Fatalf("second part is %q", ct)
	}
	r := textproto.NewReader(bufio.NewReader(bytes.NewReader(append(p.bodies[1], "\r\n"...))))
	for {
		h, err := r.ReadMIMEHeader()
		if len(h) > 0 {
			if p.message == nil {
				p.message = h
			} else {
				p.rcpts = append(p.rcpts, h)
			}
		}
		if err != nil {
			break
		}
	}
	return p
}

func failedReport() *Report {
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	return &Report{
		ReportingMTA: "mx.outflow.test", From: "MAILER-DAEMON@example.com", To: "app@example.com",
		EnvelopeID: "env 42", ArrivalDate: at, Date: at.Add(time.Minute), ID: "abc.1.failed",
		OriginalMessageID: "<m1@example.com>", Original: original,
		Recipients: []Recipient{
			{Final: "gone@dest.test", Original: "Gone@Dest.test", Action: Failed, RemoteMTA: "mx.dest.test",
				Diagnostic: "550 5.1.1 no such\r\n user here", LastAttempt: at.Add(30 * time.Second)},
			{Final: "full@dest.test", Action: Failed, RemoteMTA: "mx.dest.test", Diagnostic: "552 mailbox full", LastAttempt: at},
		},
	}
}

func TestBuildFailed(t *testing.T) {
	msg, err := Build(failedReport())
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, msg)
	if got := p.hdr.Get("Auto-Submitted"); got != "auto-replied" {
		t.Errorf("Auto-Submitted %q", got)
	}
	if got := p.hdr.Get("In-Reply-To"); got != "<m1@example.com>" {
		t.Errorf("In-Reply-To %q", got)
	}
	// The worker's notice keys start with "dsn." already; the Message-ID
	// says it once.
	r := failedReport()
	r.ID = "dsn.ABC.2.failed"
	prefixed, err := Build(r)
	if err != nil {
		t.Fatal(err)
	}
	if got := parse(t, prefixed).hdr.Get("Message-ID"); !strings.HasPrefix(got, "<dsn.ABC.2.failed@") {
		t.Errorf("Message-ID %q, want <dsn.ABC.2.failed@…>", got)
	}
	if from, err := mail.ParseAddress(p.hdr.Get("From")); err != nil || from.Address != "MAILER-DAEMON@example.com" {
		t.Errorf("From %q (%v)", p.hdr.Get("From"), err)
	}
	if len(p.parts) != 3 {
		t.Fatalf("%d parts, want 3", len(p.parts))
	}
	if ct := p.parts[0].Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Errorf("first part %q", ct)
	}
	if !bytes.Contains(p.bodies[0], []byte("<gone@dest.test>: 550 5.1.1 no such user here")) {
		t.Errorf("human part:\n%s", p.bodies[0])
	}
	want := map[string]string{"Reporting-Mta": "dns; mx.outflow.test", "Original-Envelope-Id": "env+2042",
		"Arrival-Date": "Tue, 01 Dec 2026 10:00:00 +0000"}
	for k, v := range want {
		if got := p.message.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if len(p.rcpts) != 2 {
		t.Fatalf("%d recipient groups, want 2: %q", len(p.rcpts), p.bodies[1])
	}
	r0 := p.rcpts[0]
	for k, v := range map[string]string{
		"Final-Recipient": "rfc822; gone@dest.test", "Original-Recipient": "rfc822;Gone@Dest.test",
		"Action": "failed", "Status": "5.1.1", "Remote-Mta": "dns; mx.dest.test",
		"Diagnostic-Code": "smtp; 550 5.1.1 no such user here", "Last-Attempt-Date": "Tue, 01 Dec 2026 10:00:30 +0000",
	} {
		if got := r0.Get(k); got != v {
			t.Errorf("recipient 1 %s = %q, want %q", k, got, v)
		}
	}
	if r0.Get("Will-Retry-Until") != "" {
		t.Error("Will-Retry-Until on a failure")
	}
	if got := p.rcpts[1].Get("Status"); got != "5.0.0" {
		t.Errorf("status from a basic code only: %q", got)
	}
	if p.rcpts[1].Get("Original-Recipient") != "" {
		t.Error("Original-Recipient without ORCPT")
	}
	if ct := p.parts[2].Header.Get("Content-Type"); ct != "text/rfc822-headers" {
		t.Errorf("third part %q, want text/rfc822-headers (RET=HDRS by default)", ct)
	}
	if !bytes.Contains(p.bodies[2], []byte("Subject: hello")) || bytes.Contains(p.bodies[2], []byte("body line")) {
		t.Errorf("returned header:\n%s", p.bodies[2])
	}
	if !IsReport(msg) {
		t.Error("IsReport does not recognise a report")
	}
	again, _ := Build(failedReport())
	if !bytes.Equal(msg, again) {
		t.Error("the same report built twice differs")
	}
}

func TestBuildFullAndDelayed(t *testing.T) {
	r := failedReport()
	r.Return = ReturnFull
	r.Recipients = r.Recipients[:1]
	r.Recipients[0].Action = Delayed
	r.Recipients[0].Diagnostic = "451 4.7.1 try later"
	r.Recipients[0].WillRetryUntil = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	msg, err := Build(r)
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, msg)
	if got := p.rcpts[0].Get("Will-Retry-Until"); got != "Sun, 06 Dec 2026 10:00:00 +0000" {
		t.Errorf("Will-Retry-Until %q", got)
	}
	if got := p.rcpts[0].Get("Status"); got != "4.7.1" {
		t.Errorf("Status %q", got)
	}
	// RET applies to reports of failure (RFC 3461 4.3): a delay warning
	// returns the header only.
	if ct := p.parts[2].Header.Get("Content-Type"); ct != "text/rfc822-headers" {
		t.Fatalf("RET=FULL in a delay warning: third part %q, want the header only", ct)
	}
	if !strings.Contains(p.hdr.Get("Subject"), "Delayed") {
		t.Errorf("Subject %q", p.hdr.Get("Subject"))
	}

	r.Recipients[0].Action = Failed
	r.Recipients[0].Diagnostic, r.Recipients[0].WillRetryUntil = "550 5.1.1 no such user", time.Time{}
	msg, err = Build(r)
	if err != nil {
		t.Fatal(err)
	}
	p = parse(t, msg)
	if ct := p.parts[2].Header.Get("Content-Type"); ct != "message/rfc822" {
		t.Fatalf("RET=FULL in a failure report: third part %q", ct)
	}
	inner, err := mail.ReadMessage(bytes.NewReader(p.bodies[2]))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(inner.Body)
	if inner.Header.Get("Subject") != "hello" || !bytes.Contains(body, []byte(".dot line")) {
		t.Errorf("returned message: %q / %q", inner.Header.Get("Subject"), body)
	}

	if bytes.Contains(p.bodies[0], []byte("only its header")) {
		t.Error("the text part says the message was cut, and it was not")
	}
	r.MaxFull = 10
	msg, _ = Build(r)
	p = parse(t, msg)
	if ct := p.parts[2].Header.Get("Content-Type"); ct != "text/rfc822-headers" {
		t.Errorf("RET=FULL over MaxFull: %q, want the header only", ct)
	}
	if !bytes.Contains(p.bodies[0], []byte("larger than 10 bytes: only its header is returned")) {
		t.Errorf("the text part does not say why only the header came back:\n%s", p.bodies[0])
	}

	// A Message-ID cut short (or malformed) is not repeated in
	// In-Reply-To and References, which it would make invalid.
	r.OriginalMessageID = "<" + strings.Repeat("x", 190) + "@sho"
	msg, _ = Build(r)
	if h := parse(t, msg).hdr; h.Get("In-Reply-To") != "" || h.Get("References") != "" {
		t.Errorf("In-Reply-To %q References %q from a cut Message-ID", h.Get("In-Reply-To"), h.Get("References"))
	}
}

func TestBuildEdges(t *testing.T) {
	r := failedReport()
	r.Recipients = nil
	if _, err := Build(r); err != ErrNoRecipients {
		t.Errorf("no recipients: %v", err)
	}

	// A boundary that occurs in the original is not used.
	r = failedReport()
	first := pickBoundary(r.ID, nil)
	r.Original = append([]byte("X-Trap: "+first+"\r\n"), original...)
	msg, err := Build(r)
	if err != nil {
		t.Fatal(err)
	}
	if p := parse(t, msg); len(p.parts) != 3 {
		t.Fatalf("%d parts with a colliding boundary", len(p.parts))
	}

	// Non-ASCII and long diagnostics stay parseable ASCII fields.
	r = failedReport()
	r.Original = nil
	r.Recipients[0].Diagnostic = "550 5.7.1 " + strings.Repeat("refusé à cause de la politique ", 8)
	msg, err = Build(r)
	if err != nil {
		t.Fatal(err)
	}
	if !usascii.Is(msg) {
		t.Error("report has non-ASCII bytes")
	}
	p := parse(t, msg)
	if len(p.parts) != 2 {
		t.Errorf("%d parts without an original, want 2", len(p.parts))
	}
	for _, l := range strings.Split(string(p.bodies[1]), "\r\n") {
		if len(l) > 78 {
			t.Errorf("line of %d characters: %q", len(l), l)
		}
	}
	if d := p.rcpts[0].Get("Diagnostic-Code"); !strings.HasPrefix(d, "smtp; 550 5.7.1 refus") {
		t.Errorf("Diagnostic-Code %q", d)
	}

	// A reply of many lines joined into one, with a link longer than a
	// line may be: no line of the notice passes 998 octets (RFC 5322
	// 2.1.1), in the text part either, and the cuts are marked.
	r = failedReport()
	r.Original = nil
	r.Recipients[0].Diagnostic = "550 5.7.1 see https://policy.example/" + strings.Repeat("x", 1200) + " " +
		strings.Repeat("Our policy does not allow this message. ", 100)
	if msg, err = Build(r); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(msg), "\r\n") {
		if len(l) > 998 {
			t.Fatalf("line of %d octets", len(l))
		}
	}
	if p = parse(t, msg); !strings.Contains(string(p.bodies[0]), "xxx...") || !strings.HasSuffix(p.rcpts[0].Get("Diagnostic-Code"), "...") {
		t.Errorf("cuts not marked: text %q, Diagnostic-Code %q", p.bodies[0], p.rcpts[0].Get("Diagnostic-Code"))
	}

	// An ORCPT within RFC 3461's 500 characters that is not printable
	// ASCII, written in xtext four times as long (every tab is "+09"): an
	// Original-Recipient line of some 1,000 octets, which has no white
	// space to fold at, is left out; a usual one is kept, decoded (RFC
	// 3461 §4.2), as is a printable one of 497 characters.
	r = failedReport()
	r.Original = nil
	r.Recipients[0].Original = strings.Repeat("a\t", 245) + "@x.test"
	if msg, err = Build(r); err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(msg), "\r\n") {
		if len(l) > 998 {
			t.Fatalf("line of %d octets: %.60s…", len(l), l)
		}
	}
	if p = parse(t, msg); p.rcpts[0].Get("Original-Recipient") != "" {
		t.Errorf("Original-Recipient %.60q… kept", p.rcpts[0].Get("Original-Recipient"))
	}
	for _, o := range []string{"bob+tag@x.test", strings.Repeat("a+", 245) + "@x.test"} {
		r.Recipients[0].Original = o
		if msg, err = Build(r); err != nil {
			t.Fatal(err)
		}
		if p = parse(t, msg); p.rcpts[0].Get("Original-Recipient") != "rfc822;"+o {
			t.Errorf("Original-Recipient %q, want rfc822;%s", p.rcpts[0].Get("Original-Recipient"), o)
		}
	}
}

func TestIsReport(t *testing.T) {
	for _, c := range []struct {
		msg  string
		want bool
	}{
		{"Content-Type: multipart/report; report-type=delivery-status; boundary=x\r\n\r\n", true},
		{"content-type: Multipart/Report;\r\n\treport-type=\"Delivery-Status\"; boundary=x\r\n\r\n", true},
		{"Content-Type: multipart/report; report-type=disposition-notification; boundary=x\r\n\r\n", false},
		{"Content-Type: multipart/mixed; boundary=x\r\n\r\nContent-Type: multipart/report; report-type=delivery-status\r\n", false},
		{"Subject: hi\r\n\r\nbody\r\n", false},
		{"Content-Type: multipart/report; report-type=delivery-status; =broken\r\n\r\n", true},
	} {
		if got := IsReport([]byte(c.msg)); got != c.want {
			t.Errorf("IsReport(%q) = %v", c.msg, got)
		}
	}
}

func TestXText(t *testing.T) {
	if got := XText("a+b=c d\x01é"); got != "a+2Bb+3Dc+20d+01+C3+A9" {
		t.Errorf("XText = %q", got)
	}
}

// A failure reported after the recipients' server accepted the message
// says so to the person reading it; the fields for programs are the same.
func TestBuildLater(t *testing.T) {
	r := failedReport()
	r.Later = true
	msg, err := Build(r)
	if err != nil {
		t.Fatal(err)
	}
	p := parse(t, msg)
	if !bytes.Contains(p.bodies[0], []byte("accepted by the recipients' mail server, which reported\r\nlater")) ||
		bytes.Contains(p.bodies[0], []byte("It will not be retried")) {
		t.Errorf("human part:\n%s", p.bodies[0])
	}
	if got := p.rcpts[0].Get("Action"); got != "failed" {
		t.Errorf("Action %q", got)
	}
	if got := p.hdr.Get("Subject"); got != "Undelivered Mail Returned to Sender" {
		t.Errorf("Subject %q", got)
	}
}

// TestStatusInTheActionsClass: a report's Status is in the class its
// Action says (RFC 3464 2.3.4), whatever the reply's enhanced code: a
// 421 4.7.0 that classification made permanent is reported 5.7.0, since
// software that reads the Status would take a 4.x.x failure for a soft
// bounce and go on mailing the address.
func TestStatusInTheActionsClass(t *testing.T) {
	for _, c := range []struct {
		rc   Recipient
		want string
	}{
		{Recipient{Action: Failed, Status: "4.7.0"}, "5.7.0"},
		{Recipient{Action: Failed, Diagnostic: "421 4.7.0 [TS03] Messages from 192.0.2.1 permanently deferred"}, "5.7.0"},
		{Recipient{Action: Failed, Diagnostic: "451 try later"}, "5.0.0"},
		{Recipient{Action: Failed, Status: "5.1.1"}, "5.1.1"},
		{Recipient{Action: Delayed, Status: "5.4.7"}, "4.4.7"},
		{Recipient{Action: Delivered, Status: "5.0.0"}, "2.0.0"},
		{Recipient{Action: Relayed}, "2.0.0"},
	} {
		if got := status(c.rc); got != c.want {
			t.Errorf("%+v: Status %s, want %s", c.rc, got, c.want)
		}
	}
}

// TestORCPT: an original recipient as the ORCPT parameter carries it:
// utf-8 addresses as RFC 6533 utf-8-addr-xtext (xtext's "+HH" is not valid
// there), ASCII ones of type utf-8 as rfc822, others as xtext. A notice's
// Original-Recipient writes a utf-8 address the same way (the others
// decoded: TestOriginalRecipientRoundTrip).
func TestORCPT(t *testing.T) {
	for _, c := range [][3]string{
		{"utf-8", "jörg@example.com", `utf-8;j\x{F6}rg@example.com`},
		{"UTF-8", "a+b@example.com", "rfc822;a+2Bb@example.com"},
		{"", "a=b@example.com", "rfc822;a+3Db@example.com"},
		{"x-local", "ann", "x-local;ann"},
	} {
		if got := ORCPT(c[0], c[1]); got != c[2] {
			t.Errorf("ORCPT(%q, %q) = %q, want %q", c[0], c[1], got, c[2])
		}
	}
	r := failedReport()
	r.Recipients[0].Original, r.Recipients[0].OriginalType = "jörg@example.com", "utf-8"
	msg, err := Build(r)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(msg), "Original-Recipient: utf-8;j\\x{F6}rg@example.com\r\n") {
		t.Errorf("notice lacks the utf-8-addr-xtext Original-Recipient:\n%s", msg)
	}
}

// TestReturnedInternationalized: an original whose header has raw UTF-8
// (RFC 6532) comes back as message/global-headers, or message/global with
// RET=FULL (RFC 6533 3); an 8-bit body under an ASCII header stays
// message/rfc822.
func TestReturnedInternationalized(t *testing.T) {
	for _, c := range []struct {
		name, orig string
		ret        Return
		want       string
	}{
		{"utf-8 header", "Subject: Grüße\r\nFrom: a@b.example\r\n\r\nhi\r\n", ReturnHeaders, "message/global-headers"},
		{"utf-8 header, full", "Subject: Grüße\r\nFrom: a@b.example\r\n\r\nhi\r\n", ReturnFull, "message/global"},
		{"8-bit body", "Subject: hi\r\nFrom: a@b.example\r\n\r\nGrüße\r\n", ReturnFull, "message/rfc822"},
		{"ascii", "Subject: hi\r\nFrom: a@b.example\r\n\r\nhi\r\n", ReturnHeaders, "text/rfc822-headers"},
	} {
		r := failedReport()
		r.Original, r.Return = []byte(c.orig), c.ret
		msg, err := Build(r)
		if err != nil {
			t.Fatal(err)
		}
		if ct := parse(t, msg).parts[2].Header.Get("Content-Type"); ct != c.want {
			t.Errorf("%s: returned as %q, want %q", c.name, ct, c.want)
		}
	}
}
