package dsn

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/mail"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
)

// Expanded: delivered to a mailing list or alias that passed the message
// on to several addresses, whose own outcomes are not reported (RFC 3464
// §2.3.3). outflow never writes it; received reports may carry it.
const Expanded Action = "expanded"

// Limits on what a received report may cost to read.
const (
	// maxStatusPart bounds the status part once its transfer encoding is
	// undone; a report on a few hundred recipients, with their
	// diagnostics, fits.
	maxStatusPart = 256 << 10
	// maxRecipientBlocks bounds the per-recipient blocks of one report.
	maxRecipientBlocks = 1000
	// maxOriginalHeader bounds the returned original's header; a longer
	// one is cut at this size, since it is only read for a few fields.
	maxOriginalHeader = 256 << 10
	// maxDepth bounds how deep the report is looked for, so that hostile
	// nesting costs little: the report itself, or inside a few wrappers.
	maxDepth = 5
	// maxFieldValue bounds one status field's value, unfolded: what is
	// beyond it is dropped and the field kept with its start. No field of
	// RFC 3464 or RFC 5965 needs as much (an address is at most 256
	// octets, RFC 5321 §4.5.3.1.3; a diagnostic quoting a multi-line
	// reply a few hundred), and a diagnostic's code, the part that is
	// read, comes first; refusing the field instead would lose the block
	// of a recipient whose server quoted a long reply.
	maxFieldValue = 8 << 10
)

var (
	// ErrNotReport is returned for a message that is not a multipart/report
	// of the expected report-type: a free-text bounce, an auto-reply, any
	// other mail. The caller may still read it some other way.
	ErrNotReport = errors.New("dsn: not a report of the expected type")
	// ErrMalformed is returned for a report of the right type that cannot
	// be used: its status part is missing, unreadable or too large, it has
	// no usable recipient block (a DSN) or no Feedback-Type (ARF).
	ErrMalformed = errors.New("dsn: malformed report")
)

// Received is a delivery status notification as received from another MTA.
type Received struct {
	// ReportingMTA is the Reporting-MTA's value without its type
	// ("mx.example.net"), "" when the field is missing.
	ReportingMTA string
	// EnvelopeID is the Original-Envelope-Id, xtext-decoded: the ENVID
	// outflow gave when it sent the original ("" when none).
	EnvelopeID string
	// Recipients has one entry per usable per-recipient block, in the
	// report's order. Every one has a Final and an Action.
	Recipients []Recipient
	// OriginalHeader is the header of the returned original (from a
	// text/rfc822-headers or message/rfc822 third part, or their
	// message/global-headers and message/global forms), as received and
	// without the empty line that ends it; nil when none was returned.
	OriginalHeader []byte
}

// ParseDSN reads msg (a whole RFC 5322 message, header and body) as a
// multipart/report; report-type=delivery-status (RFC 3464, RFC 6522) whose
// status part is message/delivery-status, or message/global-delivery-status
// (RFC 6533). The report may be the message itself or be wrapped in other
// multipart entities, a few levels deep.
//
// The error is ErrNotReport for a message that is no such report and
// ErrMalformed for a report that cannot be used, both wrapped with details.
func ParseDSN(msg []byte) (*Received, error) {
	rep, err := readReport(msg, []string{"delivery-status", "global-delivery-status"},
		[]string{"message/delivery-status", "message/global-delivery-status"})
	if err != nil {
		return nil, err
	}
	groups, err := fieldGroups(rep.status)
	if err != nil {
		return nil, err
	}
	if len(groups) == 0 {
		return nil, fmt.Errorf("%w: empty delivery-status part", ErrMalformed)
	}
	r := &Received{OriginalHeader: rep.original}
	perMessage := groups[0]
	_, mta := typed(perMessage.get("reporting-mta"))
	r.ReportingMTA = firstWord(mta)
	r.EnvelopeID = XTextDecode(strings.TrimSpace(perMessage.get("original-envelope-id")))

	blocks := groups[1:]
	if perMessage.get("final-recipient") != "" {
		// The empty line after the per-message fields is missing: the
		// first recipient's fields are in the same group.
		blocks = groups
	}
	if len(blocks) > maxRecipientBlocks {
		return nil, fmt.Errorf("%w: %d recipient blocks, more than %d", ErrMalformed, len(blocks), maxRecipientBlocks)
	}
	for _, g := range blocks {
		if rc, ok := recipient(g); ok {
			r.Recipients = append(r.Recipients, rc)
		}
	}
	if len(r.Recipients) == 0 {
		return nil, fmt.Errorf("%w: no recipient block with a Final-Recipient and an Action", ErrMalformed)
	}
	return r, nil
}

// recipient reads one per-recipient block (RFC 3464 §2.3). A block
// without a Final-Recipient, or with neither an Action nor a Status that
// implies one, says nothing usable: ok is false.
func recipient(g group) (rc Recipient, ok bool) {
	typ, addr := typedAddress(g.get("final-recipient"))
	rc.Final = address(typ, addr)
	if rc.Final == "" {
		return rc, false
	}
	if v := g.get("original-recipient"); v != "" {
		// The address as written: outflow writes it decoded (RFC 3461
		// §4.2), as Postfix does, but some MTAs copy the ORCPT
		// parameter's xtext. Which one a report holds cannot be told
		// ("a+2B@x" is a valid address): a caller matching it against
		// its recipients may try XTextDecode too.
		typ, addr := typedAddress(v)
		rc.OriginalType = strings.ToLower(typ)
		rc.Original = address(typ, addr)
	}
	if f := strings.Fields(g.get("status")); len(f) > 0 && validStatus(f[0]) {
		rc.Status = f[0]
	}
	// Sendmail writes "delivered (to mailbox)": the action is the first
	// word.
	if f := strings.Fields(strings.SplitN(g.get("action"), "(", 2)[0]); len(f) > 0 {
		rc.Action = Action(strings.ToLower(f[0]))
	}
	if rc.Action == "" {
		switch {
		case strings.HasPrefix(rc.Status, "5."):
			rc.Action = Failed
		case strings.HasPrefix(rc.Status, "4."):
			rc.Action = Delayed
		default:
			return rc, false
		}
	}
	_, mta := typed(g.get("remote-mta"))
	// Gmail writes "dns; mx.example.org. (192.0.2.25, the server for the
	// domain example.org.)": the host name is the first word, rooted.
	rc.RemoteMTA = strings.TrimSuffix(firstWord(mta), ".")
	if v := g.get("diagnostic-code"); v != "" {
		typ, text := typed(v)
		rc.DiagnosticType = strings.ToLower(typ)
		rc.Diagnostic = text
	}
	rc.LastAttempt = date(g.get("last-attempt-date"))
	rc.WillRetryUntil = date(g.get("will-retry-until"))
	return rc, true
}

// Feedback is an abuse or complaint report (ARF, RFC 5965: a
// multipart/report; report-type=feedback-report), such as a mailbox
// provider's feedback loop sends when a recipient marks mail as spam.
type Feedback struct {
	// Type is the Feedback-Type, lowercased: abuse, fraud, virus, other,
	// not-spam, auth-failure.
	Type string
	// UserAgent names the software that made the report.
	UserAgent string
	// OriginalRcptTo holds the Original-Rcpt-To addresses without angle
	// brackets; often empty, as many reporters redact them.
	OriginalRcptTo []string
	// OriginalMailFrom is the Original-Mail-From without angle brackets:
	// the return path outflow used, which identifies the message.
	OriginalMailFrom string
	// ReportedDomain is the first Reported-Domain, "" when none.
	ReportedDomain string
	// SourceIP is the Source-IP: the address the original came from.
	SourceIP string
	// ArrivalDate is when the reporter received the original; zero when
	// the field is missing or cannot be read.
	ArrivalDate time.Time
	// OriginalHeader is the header of the third part (message/rfc822 or
	// text/rfc822-headers), without the empty line that ends it; nil when
	// none.
	OriginalHeader []byte
}

// ParseFeedback reads msg (a whole message) as an ARF report: a
// multipart/report; report-type=feedback-report whose second part is
// message/feedback-report. As for ParseDSN, the report may be wrapped.
//
// The error is ErrNotReport for a message that is no such report and
// ErrMalformed for one without a Feedback-Type.
func ParseFeedback(msg []byte) (*Feedback, error) {
	rep, err := readReport(msg, []string{"feedback-report"}, []string{"message/feedback-report"})
	if err != nil {
		return nil, err
	}
	groups, err := fieldGroups(rep.status)
	if err != nil {
		return nil, err
	}
	// The feedback-report part is a single group of fields (RFC 5965
	// §3.1); a stray empty line in it does not end the report.
	var g group
	for _, gr := range groups {
		g = append(g, gr...)
	}
	f := &Feedback{OriginalHeader: rep.original}
	if w := strings.Fields(g.get("feedback-type")); len(w) > 0 {
		f.Type = strings.ToLower(w[0])
	}
	if f.Type == "" {
		return nil, fmt.Errorf("%w: no Feedback-Type", ErrMalformed)
	}
	f.UserAgent = g.get("user-agent")
	f.OriginalMailFrom = unbracket(g.get("original-mail-from"))
	for _, v := range g.all("original-rcpt-to") {
		if a := unbracket(v); a != "" {
			f.OriginalRcptTo = append(f.OriginalRcptTo, a)
		}
	}
	f.ReportedDomain = firstWord(g.get("reported-domain"))
	f.SourceIP = firstWord(g.get("source-ip"))
	v := g.get("arrival-date")
	if v == "" {
		// The name used by the drafts that preceded RFC 5965, which some
		// feedback loops still send.
		v = g.get("received-date")
	}
	f.ArrivalDate = date(v)
	return f, nil
}

// ParseAttached reads msg as a complaint written without a report: a
// multipart/mixed message whose part is the message complained about, as
// message/rfc822. Microsoft's JMRP sends that in its older format, the
// complainer in the original's X-HmXmrOriginalRecipient field and the
// envelope sender in its Authentication-Results (smtp.mailfrom=), with no
// Return-Path. It returns the header of the first message/rfc822 part
// among the message's own parts, without the empty line that ends it, as
// Feedback.OriginalHeader holds an ARF report's.
//
// The error is ErrNotReport for any other message: one that is not
// multipart/mixed (a multipart/report of any type is some report, not
// this), or that has no such part or an empty one. Any mail may attach a
// message; where one may be taken as a complaint is the caller's to say.
func ParseAttached(msg []byte) ([]byte, error) {
	e, err := message.Read(bytes.NewReader(msg))
	if e == nil {
		return nil, fmt.Errorf("%w: reading the header: %v", ErrNotReport, err)
	}
	mt, params := contentType(e.Header.Get("Content-Type"))
	if mt != "multipart/mixed" || params["boundary"] == "" {
		return nil, fmt.Errorf("%w: the message is %s, not multipart/mixed with an attached message", ErrNotReport, mt)
	}
	parts := textproto.NewMultipartReader(e.Body, params["boundary"])
	for {
		p, err := parts.NextPart()
		if err != nil {
			break
		}
		if pt, _ := contentType(p.Header.Get("Content-Type")); pt == "message/rfc822" {
			if h := headerOf(decoded(p)); h != nil {
				return h, nil
			}
			break
		}
	}
	return nil, fmt.Errorf("%w: multipart/mixed without an attached message (message/rfc822)", ErrNotReport)
}

// report is what readReport found: the decoded status part and the
// returned original's header.
type report struct {
	status   []byte
	original []byte
}

// readReport finds msg's first multipart/report with a report-type among
// reportTypes and reads from it the first part typed among statusTypes and
// the returned original's header.
func readReport(msg []byte, reportTypes, statusTypes []string) (*report, error) {
	e, err := message.Read(bytes.NewReader(msg))
	if e == nil {
		return nil, fmt.Errorf("%w: reading the header: %v", ErrNotReport, err)
	}
	mr, explicit, err := findReport(e.Header.Header, e.Body, reportTypes, 0)
	if err != nil {
		return nil, err
	}
	if mr == nil {
		mt, params := contentType(e.Header.Get("Content-Type"))
		if rt := params["report-type"]; mt == "multipart/report" && rt != "" {
			return nil, fmt.Errorf("%w: multipart/report of report-type %q", ErrNotReport, rt)
		}
		return nil, fmt.Errorf("%w: the message is %s", ErrNotReport, mt)
	}
	var rep report
	found := false
	for !found || rep.original == nil {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			if found {
				// A report cut short after its status part still says
				// what it is for.
				break
			}
			return nil, fmt.Errorf("%w: reading the report's parts: %v", ErrMalformed, err)
		}
		mt, _ := contentType(p.Header.Get("Content-Type"))
		switch {
		case !found && slices.Contains(statusTypes, mt):
			b, err := io.ReadAll(io.LimitReader(decoded(p), maxStatusPart+1))
			if err != nil {
				return nil, fmt.Errorf("%w: reading the %s part: %v", ErrMalformed, mt, err)
			}
			if len(b) > maxStatusPart {
				return nil, fmt.Errorf("%w: %s part larger than %d bytes", ErrMalformed, mt, maxStatusPart)
			}
			rep.status, found = b, true
		case rep.original == nil && isOriginal(mt):
			rep.original = headerOf(decoded(p))
		}
	}
	if !found {
		if !explicit {
			// A multipart/report without a report-type is taken on its
			// status part alone; without one it is some other report.
			return nil, fmt.Errorf("%w: multipart/report without report-type or %s part", ErrNotReport, statusTypes[0])
		}
		return nil, fmt.Errorf("%w: no %s part", ErrMalformed, statusTypes[0])
	}
	return &rep, nil
}

// findReport looks depth-first through the multipart entity of header h
// and body for the first multipart/report with a report-type among
// reportTypes, or without one, and returns a reader of its parts. explicit
// says the report-type was given. Only multipart entities are entered:
// a report inside a message/rfc822 is someone else's forwarded mail. A
// report found without a boundary cannot be read: the error is
// ErrMalformed.
func findReport(h textproto.Header, body io.Reader, reportTypes []string, depth int) (mr *textproto.MultipartReader, explicit bool, err error) {
	mt, params := contentType(h.Get("Content-Type"))
	boundary := params["boundary"]
	if mt == "multipart/report" {
		rt := strings.ToLower(strings.TrimSpace(params["report-type"]))
		if rt != "" && !slices.Contains(reportTypes, rt) {
			return nil, false, nil
		}
		if boundary == "" {
			if rt == "" {
				return nil, false, nil
			}
			return nil, false, fmt.Errorf("%w: multipart/report without a boundary", ErrMalformed)
		}
		return textproto.NewMultipartReader(body, boundary), rt != "", nil
	}
	if !strings.HasPrefix(mt, "multipart/") || boundary == "" || depth+1 >= maxDepth {
		return nil, false, nil
	}
	parts := textproto.NewMultipartReader(body, boundary)
	for {
		p, err := parts.NextPart()
		if err != nil {
			return nil, false, nil
		}
		if mr, explicit, err := findReport(p.Header, p, reportTypes, depth+1); mr != nil || err != nil {
			return mr, explicit, err
		}
	}
}

// decoded is p's body with its Content-Transfer-Encoding undone. An
// unknown encoding (such as "7-bit", seen in the wild) leaves the body as
// it is, which is right for every misspelling of an identity encoding.
// Text is not converted from its charset: the fields read are ASCII.
func decoded(p *textproto.Part) io.Reader {
	h := textproto.Header{}
	if v := p.Header.Get("Content-Transfer-Encoding"); v != "" {
		h.Set("Content-Transfer-Encoding", strings.TrimSpace(v))
	}
	// Only the encoding is given to go-message, so that it neither
	// converts a charset nor treats the part as multipart.
	h.Set("Content-Type", "application/octet-stream")
	e, _ := message.New(message.Header{Header: h}, p)
	return e.Body
}

// isOriginal reports whether a report's part of media type mt returns the
// original message or its header (RFC 3462 §2, RFC 6533 §6, RFC 5965 §2).
func isOriginal(mt string) bool {
	switch mt {
	case "text/rfc822-headers", "message/rfc822", "message/global", "message/global-headers",
		// Not registered, but some MTAs write it for the header.
		"message/rfc822-headers":
		return true
	}
	return false
}

// headerOf reads the header block at the start of r: its lines up to and
// without the first empty one, skipping empty lines before it (some MTAs
// write one). It is cut to maxOriginalHeader bytes; nil when empty.
func headerOf(r io.Reader) []byte {
	br := bufio.NewReader(io.LimitReader(r, maxOriginalHeader))
	var out []byte
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimRight(line, " \t\r\n")) == 0 {
			if len(out) > 0 || err != nil {
				break
			}
			continue
		}
		out = append(out, line...)
		if err != nil {
			break
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// contentType parses a Content-Type value, lowercasing the media type and
// parameter names; an empty value is text/plain (RFC 2045 §5.2). A value
// that mime.ParseMediaType refuses (a duplicate boundary, a stray
// character) is split on semicolons instead: a report is worth reading
// even when its sender's MIME is sloppy.
func contentType(v string) (string, map[string]string) {
	if strings.TrimSpace(v) == "" {
		return "text/plain", map[string]string{}
	}
	if mt, params, err := mime.ParseMediaType(v); err == nil {
		return mt, params
	}
	parts := strings.Split(v, ";")
	params := map[string]string{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		k = strings.ToLower(strings.TrimSpace(k))
		if !ok || k == "" {
			continue
		}
		if _, dup := params[k]; !dup {
			params[k] = strings.Trim(strings.TrimSpace(val), `"`)
		}
	}
	return strings.ToLower(strings.TrimSpace(parts[0])), params
}

// field is one field of a status part: its name lowercased, its value
// unfolded and trimmed.
type field struct{ name, value string }

// group is one group of fields: the per-message fields, one recipient's
// fields, or an ARF report's.
type group []field

// get returns the value of the first field called name (lowercase), ""
// when none.
func (g group) get(name string) string {
	for _, f := range g {
		if f.name == name {
			return f.value
		}
	}
	return ""
}

// all returns the values of every field called name (lowercase).
func (g group) all(name string) []string {
	var vs []string
	for _, f := range g {
		if f.name == name {
			vs = append(vs, f.value)
		}
	}
	return vs
}

// fieldGroups splits a status part (RFC 3464 §2.1, RFC 5965 §3.1) into
// its groups of header-like fields. Groups are separated by one or more
// blank lines, where a line of spaces and tabs counts as blank; lines end
// in CRLF or a bare LF; a line starting with a space or a tab continues
// the field above it and is joined to it with one space. A line that is
// not a field (no colon, or a continuation with no field above it) is
// skipped. A value is cut to maxFieldValue bytes (appendValue). Only the
// number of groups is limited here; their use is the caller's.
//
// The work is linear in len(b): a field's lines are gathered in one
// builder and the value made once the field ends. Joining each
// continuation line to the value as a string copied the whole value per
// line, and a status part of one field folded over 256 KiB of short lines
// took seconds to read, from anyone who can mail the listener.
func fieldGroups(b []byte) ([]group, error) {
	var groups []group
	var cur group
	// val gathers the value of cur's last field while open.
	var val strings.Builder
	open := false
	closeField := func() {
		if open {
			cur[len(cur)-1].value = val.String()
			val.Reset()
			open = false
		}
	}
	end := func() {
		closeField()
		if len(cur) > 0 {
			groups = append(groups, cur)
			cur = nil
		}
	}
	for len(b) > 0 {
		var line []byte
		line, b = nextLine(b)
		text := bytes.TrimSpace(line)
		switch {
		case len(text) == 0:
			end()
			// One per-message group and at most maxRecipientBlocks
			// more; stop before building a huge list.
			if len(groups) > maxRecipientBlocks+1 {
				return nil, fmt.Errorf("%w: more than %d recipient blocks", ErrMalformed, maxRecipientBlocks)
			}
		case line[0] == ' ' || line[0] == '\t':
			if open {
				appendValue(&val, text)
			}
		default:
			name, value, ok := bytes.Cut(text, []byte(":"))
			name = bytes.TrimSpace(name)
			if !ok || len(name) == 0 {
				continue
			}
			closeField()
			cur = append(cur, field{name: strings.ToLower(string(name))})
			open = true
			appendValue(&val, bytes.TrimSpace(value))
		}
	}
	end()
	return groups, nil
}

// nextLine splits off b's first line, without its LF or CRLF.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.TrimSuffix(b, []byte("\r")), nil
	}
	return bytes.TrimSuffix(b[:i], []byte("\r")), b[i+1:]
}

// appendValue adds one line's trimmed text t to the field value gathered
// in v, after a space unless it is the first, and keeps the value within
// maxFieldValue bytes: a line that does not fit is cut (at a character's
// start, so that a UTF-8 value stays valid) and the lines after it are
// dropped.
func appendValue(v *strings.Builder, t []byte) {
	if len(t) == 0 {
		return
	}
	room := maxFieldValue - v.Len()
	if v.Len() > 0 {
		room-- // the space
	}
	if room <= 0 {
		return
	}
	if len(t) > room {
		for room > 0 && !utf8.RuneStart(t[room]) {
			room--
		}
		if t = t[:room]; len(t) == 0 {
			return
		}
	}
	if v.Len() > 0 {
		v.WriteByte(' ')
	}
	v.Write(t)
}

// typed splits a typed field value, "dns; mx.example.net" or
// "smtp;550 ...", into its type and the trimmed rest (RFC 3464 §2.1.2).
// A value whose part before the first semicolon is not a type name has no
// type: "550 5.1.1 <a@example.com>; no such user" is all text.
func typed(v string) (typ, rest string) { return splitType(v, isTypeName) }

// typedAddress is typed for a Final-Recipient or Original-Recipient value,
// "rfc822; user@example.com", whose address-type is any atom
// (isAddressType).
func typedAddress(v string) (typ, rest string) { return splitType(v, isAddressType) }

// splitType splits v at its first semicolon when what precedes it is a
// type as isType says.
func splitType(v string, isType func(string) bool) (typ, rest string) {
	t, r, ok := strings.Cut(v, ";")
	t = strings.TrimSpace(t)
	if !ok || !isType(t) {
		return "", strings.TrimSpace(v)
	}
	return t, strings.TrimSpace(r)
}

// isAddressType reports whether s can be an address-type, which RFC 3464
// §2.1.2 (and RFC 3461 §4.2 for the ORCPT it comes from) makes an atom:
// RFC 5322 atext, and a "." as isTypeName takes. Unlike an MTA-name or
// diagnostic type it need not start with a letter: outflow's intake takes
// an ORCPT of any atom type, such as "0", and its notice writes it back
// ("Original-Recipient: 0;0"); an address field holds no reply text whose
// code could be taken for a type.
func isAddressType(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-/=?^_`{|}~.", c) >= 0) {
			return false
		}
	}
	return true
}

// isTypeName reports whether s can be an MTA-name or diagnostic type: an
// atom such as dns, smtp, x-postfix or X-Unix, starting with a letter so
// that a bare "550;" is not taken for one.
func isTypeName(s string) bool {
	if s == "" || len(s) > 32 || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
			return false
		}
	}
	return true
}

// address is a recipient address of type typ as a bare address: without
// angle brackets and, for a utf-8 address, with RFC 6533's \x{HEX}
// escapes decoded.
func address(typ, addr string) string {
	addr = unbracket(addr)
	if strings.EqualFold(typ, "utf-8") {
		addr = unescapeUnicode(addr)
	}
	return addr
}

// unbracket trims s and removes the angle brackets around it, if any.
func unbracket(s string) string {
	s = strings.TrimSpace(s)
	if len(s) >= 2 && s[0] == '<' && s[len(s)-1] == '>' {
		s = strings.TrimSpace(s[1 : len(s)-1])
	}
	return s
}

// firstWord is the first space-separated word of s, "" when none; it drops
// the comments some MTAs put after a host name or an IP address.
func firstWord(s string) string {
	if f := strings.Fields(s); len(f) > 0 {
		return f[0]
	}
	return ""
}

// date parses an RFC 5322 date, with the comments and obsolete zones the
// mail.ParseDate accepts; zero when v is empty or unreadable.
func date(v string) time.Time {
	if v == "" {
		return time.Time{}
	}
	t, err := mail.ParseDate(v)
	if err != nil {
		return time.Time{}
	}
	return t
}

// XTextDecode undoes XText (RFC 3461 §4): "+HH" is the byte of hex value
// HH. A "+" not followed by two hex digits is kept as it is, since some
// MTAs write the ENVID unencoded.
func XTextDecode(s string) string {
	if !strings.Contains(s, "+") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '+' && i+2 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unescapeUnicode decodes RFC 6533 §3's embedded-unicode-char, "\x{HEX}"
// for the code point HEX, as written in utf-8 addresses. An escape that is
// malformed or names no valid character is kept as it is.
func unescapeUnicode(s string) string {
	if !strings.Contains(s, `\x{`) {
		return s
	}
	var b strings.Builder
	for {
		i := strings.Index(s, `\x{`)
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		b.WriteString(s[:i])
		s = s[i:]
		// The closing brace is looked for only where it can be (at most
		// six hex digits): searching the whole rest for each "\x{" made
		// a value of escapes never closed quadratic.
		j := strings.IndexByte(s[:min(len(s), 10)], '}')
		if j > 3 && j <= 9 {
			if v, err := strconv.ParseUint(s[3:j], 16, 32); err == nil && utf8.ValidRune(rune(v)) {
				b.WriteRune(rune(v))
				s = s[j+1:]
				continue
			}
		}
		b.WriteString(`\x{`)
		s = s[3:]
	}
}
