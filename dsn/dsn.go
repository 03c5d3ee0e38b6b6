package dsn

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"mime"
	"strings"
	"time"

	usascii "github.com/outflow/outflow/internal/ascii"
)

// Action is a recipient's Action field (RFC 3464 §2.3.3).
type Action string

// The actions outflow reports.
const (
	// Failed: the message could not be delivered and will not be retried.
	Failed Action = "failed"
	// Delayed: not delivered yet; still being retried (a warning).
	Delayed Action = "delayed"
	// Delivered: delivered to the recipient (final delivery).
	Delivered Action = "delivered"
	// Relayed: handed to a next hop that does not support DSN, so no
	// further notice will come (RFC 3461 §6.2.2).
	Relayed Action = "relayed"
)

// Return is the submitter's RET parameter (RFC 3461 §4.3).
type Return string

const (
	// ReturnHeaders returns the original's header only; the default.
	ReturnHeaders Return = "HDRS"
	// ReturnFull returns the whole original message.
	ReturnFull Return = "FULL"
)

// DefaultMaxFull is the largest original returned whole for RET=FULL, in
// bytes (1 MiB); a larger one is returned as its header, so that a failed
// 25 MiB message does not come back as a 25 MiB report.
const DefaultMaxFull = 1 << 20

// Recipient is one recipient's block of the delivery-status part.
type Recipient struct {
	// Final is the address outflow tried (Final-Recipient: rfc822;Final).
	Final string
	// Original is the ORCPT the submitter gave, "" when none; OriginalType
	// is its address type (default "rfc822").
	Original     string
	OriginalType string
	Action       Action
	// Status is the RFC 3463 code, e.g. "5.1.1". Empty: derived from the
	// diagnostic's basic code (5.0.0, 4.0.0) or the action.
	Status string
	// RemoteMTA is the host name of the server that answered ("" when
	// none was reached).
	RemoteMTA string
	// Diagnostic is the server's reply, "550 5.1.1 no such user" (sent as
	// Diagnostic-Code: smtp; ...). Empty: no Diagnostic-Code field.
	Diagnostic string
	// DiagnosticType is the diagnostic's type; default "smtp". Another
	// (e.g. "x-outflow") says the reason was not an SMTP reply.
	DiagnosticType string
	// LastAttempt is when outflow last tried; zero omits the field.
	LastAttempt time.Time
	// WillRetryUntil is when outflow gives up (delayed only); zero omits it.
	WillRetryUntil time.Time
}

// Report is one notification: one message, one event, every recipient
// that shared that event.
type Report struct {
	// ReportingMTA is outflow's host name (Reporting-MTA: dns;...).
	ReportingMTA string
	// From is the report's From address, e.g. MAILER-DAEMON@example.com;
	// its domain is the one the report is DKIM-signed for.
	From string
	// To is the address the report goes to.
	To string
	// EnvelopeID is the submitter's ENVID, "" when none.
	EnvelopeID string
	// ArrivalDate is when outflow accepted the original.
	ArrivalDate time.Time
	// Date is the report's own date; zero means now.
	Date time.Time
	// ID makes the report's Message-ID and MIME boundary; the same ID
	// gives the same report, so a retried generation writes equal bytes.
	ID string
	// OriginalMessageID is the original's Message-ID header, for
	// In-Reply-To and References ("" when it had none).
	OriginalMessageID string
	Recipients        []Recipient
	// Original is the message as submitted; nil omits the third part.
	Original []byte
	Return   Return
	// MaxFull bounds a RET=FULL original; 0 means DefaultMaxFull.
	MaxFull int
	// Later says that a failure came after the recipients' server had
	// accepted the message: its bounce came back to outflow's return
	// path. The explanation for a person says so.
	Later bool
}

// ErrNoRecipients is returned by Build for a report without recipients.
var ErrNoRecipients = errors.New("dsn: a report needs at least one recipient")

// Build writes r as a complete message (header and body, CRLF line ends).
func Build(r *Report) ([]byte, error) {
	if len(r.Recipients) == 0 {
		return nil, ErrNoRecipients
	}
	if r.ReportingMTA == "" || r.To == "" || r.From == "" {
		return nil, errors.New("dsn: a report needs ReportingMTA, From and To")
	}
	date := r.Date
	if date.IsZero() {
		date = time.Now()
	}
	original, full := r.returned()
	boundary := pickBoundary(r.ID, original)
	action := r.Recipients[0].Action

	var b bytes.Buffer
	b.Grow(2048 + len(original))
	hdr := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	hdr("From", "Mail Delivery System <"+ascii(r.From)+">")
	hdr("To", "<"+ascii(r.To)+">")
	hdr("Subject", subject(action))
	hdr("Date", date.UTC().Format(time.RFC1123Z))
	// "dsn." once: the worker's ids (its notice keys) already start so.
	hdr("Message-ID", "<dsn."+strings.TrimPrefix(token(r.ID), "dsn.")+"@"+ascii(r.ReportingMTA)+">")
	if id := ascii(r.OriginalMessageID); strings.HasPrefix(id, "<") && strings.HasSuffix(id, ">") && !strings.ContainsAny(id, " \t") {
		// Only a whole msg-id: one cut short (the queue keeps 200
		// characters of it) or malformed would make the fields invalid.
		hdr("In-Reply-To", id)
		hdr("References", id)
	}
	// RFC 3834: an automatic reply; responders must not answer it.
	hdr("Auto-Submitted", "auto-replied")
	hdr("MIME-Version", "1.0")
	hdr("Content-Type", `multipart/report; report-type=delivery-status; boundary="`+boundary+`"`)
	b.WriteString("\r\nThis is a MIME-encapsulated delivery status notification (RFC 3464).\r\n")

	// Part 1: for a person.
	b.WriteString("\r\n--" + boundary + "\r\n")
	b.WriteString("Content-Type: text/plain; charset=us-ascii\r\n")
	b.WriteString("Content-Description: Notification\r\n\r\n")
	b.WriteString(humanText(r))

	// Part 2: for a program.
	b.WriteString("\r\n--" + boundary + "\r\n")
	b.WriteString("Content-Type: message/delivery-status\r\n")
	b.WriteString("Content-Description: Delivery report\r\n\r\n")
	b.WriteString(statusFields(r))

	// Part 3: the original.
	if original != nil {
		b.WriteString("\r\n--" + boundary + "\r\n")
		ct, desc := "text/rfc822-headers", "Undelivered message header"
		if full {
			ct, desc = "message/rfc822", "Undelivered message"
		}
		if !usascii.Is(headerBlock(original)) {
			// Raw UTF-8 in a header makes it an internationalized message
			// (RFC 6532), which RFC 6533 3 returns as message/global or
			// message/global-headers. (An 8-bit body under an ASCII
			// header is plain message/rfc822.)
			ct = "message/global-headers"
			if full {
				ct = "message/global"
			}
		}
		if action != Failed {
			desc = strings.Replace(desc, "Undelivered", "Original", 1)
		}
		b.WriteString("Content-Type: " + ct + "\r\n")
		b.WriteString("Content-Description: " + desc + "\r\n")
		if !usascii.Is(original) {
			// Only 7bit, 8bit and binary are allowed for message/rfc822
			// (RFC 2046 §5.2.1); the next hop downgrades if it must.
			b.WriteString("Content-Transfer-Encoding: 8bit\r\n")
		}
		b.WriteString("\r\n")
		b.Write(original)
		if !bytes.HasSuffix(original, []byte("\r\n")) {
			b.WriteString("\r\n")
		}
	}
	b.WriteString("\r\n--" + boundary + "--\r\n")
	return b.Bytes(), nil
}

// returned is the original as the third part carries it: the whole
// message for RET=FULL within MaxFull in a failure report, else its header
// block (ending in CRLF, without the empty line). RET asks for the message
// in a report of failure (RFC 3461 4.3); a delay warning or a success
// notice returns the header whatever it says, or every warning of a
// message that waits for hours would carry all of it again.
func (r *Report) returned() (part []byte, full bool) {
	if r.Original == nil {
		return nil, false
	}
	failure := len(r.Recipients) > 0 && r.Recipients[0].Action == Failed
	if r.Return == ReturnFull && failure && len(r.Original) <= r.maxFull() {
		return crlf(r.Original), true
	}
	return headerBlock(r.Original), false
}

// maxFull is MaxFull or its default.
func (r *Report) maxFull() int {
	if r.MaxFull <= 0 {
		return DefaultMaxFull
	}
	return r.MaxFull
}

// headerBlock returns msg's header, up to and without the empty line.
func headerBlock(msg []byte) []byte {
	msg = crlf(msg)
	if i := bytes.Index(msg, []byte("\r\n\r\n")); i >= 0 {
		return msg[:i+2]
	}
	return msg
}

// crlf turns bare LF line ends into CRLF (submitted bodies are CRLF
// already; this guards bodies from elsewhere).
func crlf(b []byte) []byte {
	if !bytes.Contains(b, []byte("\n")) || bytes.Count(b, []byte("\n")) == bytes.Count(b, []byte("\r\n")) {
		return b
	}
	b = bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n"))
	return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n"))
}

func subject(a Action) string {
	switch a {
	case Failed:
		return "Undelivered Mail Returned to Sender"
	case Delayed:
		return "Delayed Mail (still being retried)"
	case Relayed:
		return "Relayed Mail: no further delivery notice"
	default:
		return "Successful Mail Delivery Report"
	}
}

func humanText(r *Report) string {
	var b strings.Builder
	b.WriteString("This is the mail system at " + ascii(r.ReportingMTA) + ".\r\n\r\n")
	switch r.Recipients[0].Action {
	case Failed:
		if r.Later {
			b.WriteString("Your message was accepted by the recipients' mail server, which reported\r\n" +
				"later that it could not be delivered to the recipients below.\r\n")
			break
		}
		b.WriteString("Your message could not be delivered to the recipients below.\r\nIt will not be retried.\r\n")
	case Delayed:
		b.WriteString("Your message has not been delivered yet to the recipients below.\r\n" +
			"It is still being retried; you do not need to send it again.\r\n")
		if t := r.Recipients[0].WillRetryUntil; !t.IsZero() {
			b.WriteString("Delivery will be attempted until " + t.UTC().Format(time.RFC1123Z) + ".\r\n")
		}
	case Relayed:
		b.WriteString("Your message was handed to the recipients' mail server below, which does not\r\n" +
			"send delivery notifications; you will get no further notice.\r\n")
	default:
		b.WriteString("Your message was delivered to the recipients below.\r\n")
	}
	b.WriteString("\r\n")
	for _, rc := range r.Recipients {
		line := "<" + ascii(rc.Final) + ">"
		if rc.Diagnostic != "" {
			line += ": " + ascii(diagnostic(rc.Diagnostic))
		}
		if rc.RemoteMTA != "" {
			line += " (" + ascii(rc.RemoteMTA) + ")"
		}
		// Wrapped as a header is, so that no line of the notice passes
		// RFC 5322's 998 octets: a long reply (a provider's policy text
		// with its links) is one line here.
		b.WriteString(fold(line, 0) + "\r\n")
	}
	if r.Return == ReturnFull && r.Recipients[0].Action == Failed && r.Original != nil && len(r.Original) > r.maxFull() {
		b.WriteString(fmt.Sprintf("\r\nThe message is larger than %d bytes: only its header is returned.\r\n", r.maxFull()))
	}
	return b.String()
}

// Bounds on a diagnostic as a notice repeats it: a server's reply may be
// hundreds of lines (joined into one here) and a word of it (a link)
// longer than a line may be.
const (
	maxDiagnostic     = 2000
	maxDiagnosticWord = 400
)

// diagnostic is a reply as a notice repeats it: on one line, no word
// longer than maxDiagnosticWord and the whole at most maxDiagnostic,
// each cut marked with "...".
func diagnostic(s string) string {
	words := strings.Fields(s)
	n := 0
	for i, w := range words {
		if len(w) > maxDiagnosticWord {
			words[i] = w[:maxDiagnosticWord] + "..."
		}
		if n += len(words[i]) + 1; n > maxDiagnostic {
			words = append(words[:i], "...")
			break
		}
	}
	return strings.Join(words, " ")
}

// statusFields writes the message/delivery-status body: the per-message
// group, then one group per recipient, each preceded by an empty line
// (RFC 3464 §2.1).
func statusFields(r *Report) string {
	var b strings.Builder
	field := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	field("Reporting-MTA", "dns; "+ascii(r.ReportingMTA))
	if r.EnvelopeID != "" {
		// RFC 3464 §2.2.1: the ENVID as given, in xtext.
		field("Original-Envelope-Id", XText(r.EnvelopeID))
	}
	if !r.ArrivalDate.IsZero() {
		field("Arrival-Date", r.ArrivalDate.UTC().Format(time.RFC1123Z))
	}
	for _, rc := range r.Recipients {
		b.WriteString("\r\n")
		if o := originalRecipient(rc.OriginalType, rc.Original); rc.Original != "" && len("Original-Recipient: ")+len(o) <= 998 {
			// RFC 3464 §2.3.1: the ORCPT as given, in the field's form
			// (originalRecipient, not the parameter's xtext). An address
			// has no white space to fold at: one whose form (an xtext
			// fallback may be up to three times the 500 characters RFC
			// 3461 allows) would make the line longer than RFC 5322's 998
			// octets is left out, as an optional field, rather than break
			// the notice.
			field("Original-Recipient", o)
		}
		field("Final-Recipient", "rfc822; "+ascii(rc.Final))
		field("Action", string(rc.Action))
		field("Status", status(rc))
		if rc.RemoteMTA != "" {
			field("Remote-MTA", "dns; "+ascii(rc.RemoteMTA))
		}
		if rc.Diagnostic != "" {
			typ := rc.DiagnosticType
			if typ == "" {
				typ = "smtp"
			}
			typ = ascii(typ)
			field("Diagnostic-Code", typ+"; "+fold(ascii(diagnostic(rc.Diagnostic)), len("Diagnostic-Code: ; ")+len(typ)))
		}
		if !rc.LastAttempt.IsZero() {
			field("Last-Attempt-Date", rc.LastAttempt.UTC().Format(time.RFC1123Z))
		}
		if rc.Action == Delayed && !rc.WillRetryUntil.IsZero() {
			field("Will-Retry-Until", rc.WillRetryUntil.UTC().Format(time.RFC1123Z))
		}
	}
	return b.String()
}

// status is the recipient's Status: its own, else the enhanced code in
// its diagnostic, else the class of the diagnostic's basic code, else the
// action's generic code; in the class its action says (RFC 3464 2.3.4: a
// failure is 5, a delay 4, a delivery 2). A reply such as Yahoo's "421
// 4.7.0 ... permanently deferred", which classification made a failure,
// is reported 5.7.0: software reading the Status as a soft bounce would
// go on mailing the address.
func status(rc Recipient) string {
	s := reportedStatus(rc)
	class := byte('2')
	switch rc.Action {
	case Failed:
		class = '5'
	case Delayed:
		class = '4'
	}
	if s[0] != class {
		s = string(class) + s[1:]
	}
	return s
}

// reportedStatus is status before its class is made the action's.
func reportedStatus(rc Recipient) string {
	if validStatus(rc.Status) {
		return rc.Status
	}
	f := strings.Fields(rc.Diagnostic)
	if rc.DiagnosticType != "" && rc.DiagnosticType != "smtp" {
		f = nil
	}
	if len(f) > 1 && validStatus(f[1]) && f[1][0] == f[0][0] {
		return f[1]
	}
	if len(f) > 0 && len(f[0]) == 3 && (f[0][0] == '4' || f[0][0] == '5') {
		return f[0][:1] + ".0.0"
	}
	switch rc.Action {
	case Failed:
		return "5.0.0"
	case Delayed:
		return "4.0.0"
	}
	return "2.0.0"
}

// validStatus checks an RFC 3463 code: class.subject.detail with class
// 2, 4 or 5, subject up to 3 digits and detail up to 3 digits.
func validStatus(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) != 3 || len(parts[0]) != 1 || !strings.ContainsAny(parts[0], "245") {
		return false
	}
	for _, p := range parts[1:] {
		if len(p) == 0 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

// ORCPT is an original recipient as the SMTP ORCPT parameter carries it
// (RFC 3461 §4.2), "type;address" encoded for its type: an address of
// type utf-8 with non-ASCII characters as RFC 6533 utf-8-addr-xtext, one
// of type utf-8 that is ASCII as rfc822 (which every DSN-capable server
// reads), anything else as xtext. A notice's Original-Recipient field
// carries the address decoded: see originalRecipient.
func ORCPT(typ, addr string) string {
	if typ == "" {
		typ = "rfc822"
	}
	switch {
	case !strings.EqualFold(typ, "utf-8"):
		return XText(typ) + ";" + XText(addr)
	case usascii.IsString(addr):
		return "rfc822;" + XText(addr)
	}
	return "utf-8;" + UTF8AddrXText(addr)
}

// originalRecipient is an original recipient as a notice's
// Original-Recipient field carries it (RFC 3464 §2.3.1), "type;address".
// The xtext of the ORCPT parameter is its SMTP transport encoding: the
// field holds the address it decodes to, which RFC 3461 §4.2 requires to
// be printable US-ASCII (as Postfix writes it). So an address of a type
// other than utf-8, or of type utf-8 that is ASCII (written as rfc822, as
// ORCPT does), is written as it is when it is printable US-ASCII (0x20 to
// 0x7E) without a space at either end, which a reader would trim. One
// that is not (outflow's intake takes any decoded ORCPT without CR, LF or
// NUL) falls back to the parameter's xtext form, ORCPT's: the field stays
// one line of ASCII and keeps what was given, and a reader that decodes
// xtext, as outflow's bounce listener does when the field as written
// names no recipient, reads it back. An address of type utf-8 with
// non-ASCII characters is written as RFC 6533 §3 utf-8-addr-xtext, the
// form of message/delivery-status, the only status part outflow writes
// (utf-8-addr-unitext is message/global-delivery-status's).
func originalRecipient(typ, addr string) string {
	if typ == "" || strings.EqualFold(typ, "utf-8") && usascii.IsString(addr) {
		typ = "rfc822"
	}
	if !strings.EqualFold(typ, "utf-8") && fieldAddress(addr) {
		return XText(typ) + ";" + addr
	}
	return ORCPT(typ, addr)
}

// fieldAddress reports whether addr can be written in a field as it is:
// printable US-ASCII, not empty, with no space at either end.
func fieldAddress(addr string) bool {
	if addr == "" || addr[0] == ' ' || addr[len(addr)-1] == ' ' {
		return false
	}
	for i := 0; i < len(addr); i++ {
		if c := addr[i]; c < ' ' || c > '~' {
			return false
		}
	}
	return true
}

// UTF8AddrXText encodes s as RFC 6533 utf-8-addr-xtext, the form of an
// address of type utf-8: "+", "=", "\", controls, space and every
// non-ASCII character become "\x{HEX}" of its code point. (Plain xtext's
// "+HH" is not valid there: a next hop refused it with 501.)
func UTF8AddrXText(s string) string {
	var b strings.Builder
	for _, r := range s {
		if r > ' ' && r < 0x7f && r != '+' && r != '=' && r != '\\' {
			b.WriteRune(r)
			continue
		}
		fmt.Fprintf(&b, "\\x{%02X}", r)
	}
	return b.String()
}

// XText encodes s as RFC 3461 §4 xtext: "+" and "=", controls, space and
// anything outside printable ASCII become "+HH".
func XText(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '!' || c > '~' || c == '+' || c == '=' {
			fmt.Fprintf(&b, "+%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// IsReport reports whether msg is a delivery status notification: its
// top-level Content-Type is multipart/report with report-type
// delivery-status (RFC 3464 §2). Only the header is read.
func IsReport(msg []byte) bool {
	hdr := headerBlock(msg)
	if len(hdr) > 64<<10 {
		hdr = hdr[:64<<10]
	}
	v, ok := headerValue(hdr, "content-type")
	if !ok {
		return false
	}
	mt, params, err := mime.ParseMediaType(v)
	if err != nil {
		// A malformed parameter list still names its type.
		mt = strings.ToLower(strings.TrimSpace(strings.SplitN(v, ";", 2)[0]))
		return mt == "multipart/report" && strings.Contains(strings.ToLower(v), "delivery-status")
	}
	return mt == "multipart/report" && strings.EqualFold(params["report-type"], "delivery-status")
}

// headerValue finds the first field name in a header block, unfolded (its
// lines joined with a space, as fieldGroups joins a status field's) and
// cut to maxFieldValue bytes. A field folded over thousands of lines costs
// time linear in its length: its lines are gathered in one builder.
func headerValue(hdr []byte, name string) (string, bool) {
	for len(hdr) > 0 {
		var line []byte
		line, hdr = nextLine(hdr)
		k, v, ok := bytes.Cut(line, []byte(":"))
		if !ok || line[0] == ' ' || line[0] == '\t' || !bytes.EqualFold(bytes.TrimSpace(k), []byte(name)) {
			continue
		}
		var b strings.Builder
		appendValue(&b, bytes.TrimSpace(v))
		for len(hdr) > 0 && (hdr[0] == ' ' || hdr[0] == '\t') {
			line, hdr = nextLine(hdr)
			appendValue(&b, bytes.TrimSpace(line))
		}
		return b.String(), true
	}
	return "", false
}

// pickBoundary derives a boundary from id that does not occur in the
// returned content (RFC 2046 §5.1.1).
func pickBoundary(id string, content []byte) string {
	seed := id
	for n := 0; ; n++ {
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d", seed, n)))
		b := "=_dsn_" + hex.EncodeToString(sum[:12])
		if !bytes.Contains(content, []byte(b)) {
			return b
		}
	}
}

// token keeps the characters of id that are safe in a Message-ID's left
// side.
func token(id string) string {
	var b strings.Builder
	for _, c := range id {
		if c < 128 && (c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune(".-_+", c)) {
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		return "x"
	}
	return b.String()
}

// ascii replaces what cannot appear in a US-ASCII header field: non-ASCII
// bytes and controls become "?".
func ascii(s string) string {
	return strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return '?'
		}
		return r
	}, s)
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// fold breaks a long field value at spaces so that no line exceeds 78
// characters where it can (RFC 5322 §2.1.1); continuation lines start
// with a space. start is the length of what precedes v on its first line.
func fold(v string, start int) string {
	const width = 76
	if start+len(v) <= width {
		return v
	}
	var b strings.Builder
	line := start
	for i, w := range strings.Split(v, " ") {
		if i > 0 {
			if line+1+len(w) > width {
				b.WriteString("\r\n ")
				line = 1
			} else {
				b.WriteByte(' ')
				line++
			}
		}
		b.WriteString(w)
		line += len(w)
	}
	return b.String()
}
