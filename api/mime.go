package api

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"mime"
	nettextproto "net/textproto"
	"slices"
	"strings"
	"time"

	"github.com/emersion/go-message"
	"github.com/emersion/go-message/mail"
	"github.com/emersion/go-message/textproto"

	"github.com/outflow/outflow/internal/ascii"
	"github.com/outflow/outflow/queue"
)

// Attachment is one file of a built message.
type Attachment struct {
	Filename    string `json:"filename"`
	ContentType string `json:"content_type,omitempty"` // default application/octet-stream
	Content     string `json:"content"`                // base64 (RFC 4648 section 4, padding optional)
	// Inline makes it Content-Disposition: inline with ContentID as its
	// Content-ID, for images an HTML part refers to as cid:<ContentID>.
	Inline    bool   `json:"inline,omitempty"`
	ContentID string `json:"content_id,omitempty"`
}

// MessageRequest is the body of POST /v1/messages: either Raw, a whole RFC
// 5322 message, or the parts of one that outflow builds.
type MessageRequest struct {
	From string   `json:"from"`
	To   []string `json:"to"`
	// Cc recipients are named in a Cc field; Bcc recipients get the
	// message without being named in it (no Bcc field is written).
	Cc          []string          `json:"cc,omitempty"`
	Bcc         []string          `json:"bcc,omitempty"`
	Raw         string            `json:"raw,omitempty"`
	Subject     string            `json:"subject,omitempty"`
	Text        string            `json:"text,omitempty"`
	HTML        string            `json:"html,omitempty"`
	Headers     map[string]string `json:"headers,omitempty"`
	Attachments []Attachment      `json:"attachments,omitempty"`
	// DSN holds the RFC 3461 parameters SMTP carries on MAIL FROM and
	// RCPT TO; nil gives none (see DSNRequest).
	DSN *DSNRequest `json:"dsn,omitempty"`
	// SendAt holds the message until then (RFC 3339), at most MaxSendAhead
	// ahead; a time past sends at once.
	SendAt *time.Time `json:"send_at,omitempty"`
	// ListUnsubscribe asks for one-click unsubscribe links (RFC 8058): the
	// message goes to each recipient as its own envelope, with a
	// List-Unsubscribe field naming that recipient. Absent: the tenant's
	// setting ([tenants.NAME] list-unsubscribe).
	ListUnsubscribe *bool `json:"list_unsubscribe,omitempty"`
}

// MaxSendAhead is how far ahead send_at may be (queue.MaxSendAhead).
const MaxSendAhead = queue.MaxSendAhead

// DSNRequest is a message's delivery status notification parameters, as
// the SMTP listener takes them (RFC 3461) and with the same checks:
// notifications themselves are per tenant ([tenants.NAME] dsn; off by
// default for API tenants, which have webhooks), and these say what a
// notification reports and whether the next hop is asked for one.
type DSNRequest struct {
	Ret   string `json:"ret,omitempty"`   // FULL or HDRS (default): what of the message a notification returns
	EnvID string `json:"envid,omitempty"` // the client's id of the message, returned in notifications; printable ASCII, at most 100
	// Recipients holds NOTIFY and ORCPT by recipient address; each key is
	// one of the recipients in to, cc or bcc (compared case-insensitively).
	Recipients map[string]RcptDSNRequest `json:"recipients,omitempty"`
}

// RcptDSNRequest is one recipient's NOTIFY and ORCPT.
type RcptDSNRequest struct {
	Notify []string `json:"notify,omitempty"` // ["NEVER"], or some of SUCCESS, FAILURE, DELAY; omitted: failures and delays
	ORcpt  string   `json:"orcpt,omitempty"`  // addr-type;address, e.g. "rfc822;bob@example.org", not xtext-encoded
}

// structural header fields that outflow writes itself when it builds a
// message: a caller's value would contradict the MIME structure.
var structural = map[string]bool{
	"Mime-Version": true, "Content-Type": true, "Content-Transfer-Encoding": true, "Content-Disposition": true,
	"Received": true, "Return-Path": true, "Bcc": true,
}

// maxLine is RFC 5322 section 2.1.1's limit on a line, without its CRLF.
const maxLine = 998

// badHeader reports the fault of a caller's header field, or "".
func badHeader(name, value string) string {
	if name == "" {
		return "empty field name"
	}
	// RFC 5322 section 3.6.8: ftext is printable US-ASCII except colon.
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < 33 || c > 126 || c == ':' {
			return "field name may hold only printable ASCII other than colon"
		}
	}
	if strings.ContainsAny(value, "\r\n\x00") {
		return "CR, LF or NUL in the value (header injection)"
	}
	if len(name)+2+len(value) > maxLine {
		if !ascii.IsString(value) {
			return "field longer than 998 octets"
		}
		if unfoldable(len(name)+2, value) {
			return "a word too long to fold into lines of 998 octets (folding would change the value)"
		}
	}
	return ""
}

// unfoldable reports whether an ASCII field value, written after prefix
// octets ("Name: "), has a word that no folding can fit into a line of
// maxLine octets: folding may break a line only before a space or tab
// (RFC 5322 section 2.2.3), so the first word must fit after the prefix
// and every later one after its folding white space. The MIME writer
// would otherwise insert a space into such a word and change the value.
func unfoldable(prefix int, value string) bool {
	room := maxLine - prefix
	for len(value) > 0 {
		i := strings.IndexAny(value, " \t")
		word := value
		if i >= 0 {
			word = value[:i]
		}
		if len(word) > room {
			return true
		}
		if i < 0 {
			break
		}
		value, room = value[i+1:], maxLine-1
	}
	return false
}

// seeded returns n hex digits derived from seed and label: the boundaries
// and Message-ID of a built message, so that a retry of an idempotent
// request builds the same bytes.
func seeded(seed, label string, n int) string {
	sum := sha256.Sum256([]byte(seed + "\x00" + label))
	return hex.EncodeToString(sum[:])[:n]
}

// build turns the parts of req into a MIME message (CRLF line endings)
// dated date, with a Message-ID at hostname unless the caller set one.
// It returns a *Problem for a fault of the request.
func build(req *MessageRequest, date time.Time, hostname, seed string) ([]byte, error) {
	return buildAfter(nil, req, date, hostname, seed)
}

// buildAfter is build, the message written after prefix (a Received line)
// into a buffer sized for both.
func buildAfter(prefix []byte, req *MessageRequest, date time.Time, hostname, seed string) ([]byte, error) {
	var h mail.Header
	h.SetDate(date)
	h.SetAddressList("From", []*mail.Address{{Address: req.From}})
	list := func(addrs []string) []*mail.Address {
		out := make([]*mail.Address, len(addrs))
		for i, a := range addrs {
			out[i] = &mail.Address{Address: a}
		}
		return out
	}
	h.SetAddressList("To", list(req.To))
	if len(req.Cc) > 0 {
		h.SetAddressList("Cc", list(req.Cc))
	}
	if req.Subject != "" {
		if strings.ContainsAny(req.Subject, "\r\n\x00") {
			return nil, fieldProblem(ProblemBadHeader, "bad header", "subject", "CR, LF or NUL in the subject (header injection)")
		}
		if ascii.IsString(req.Subject) && unfoldable(len("Subject: "), req.Subject) {
			return nil, fieldProblem(ProblemBadHeader, "bad header", "subject", "a word too long to fold into lines of 998 octets (folding would change the value)")
		}
		h.SetSubject(req.Subject)
	}
	h.SetMessageID(seeded(seed, "message-id", 32) + "@" + hostname)
	// In the order of their names: a map's order changes from one
	// build to the next, and every build of a request must give the
	// same bytes (a retry under its Idempotency-Key, a DKIM signature
	// over them).
	for _, name := range slices.Sorted(maps.Keys(req.Headers)) {
		v := req.Headers[name]
		if why := badHeader(name, v); why != "" {
			return nil, fieldProblem(ProblemBadHeader, "bad header", "headers."+name, why)
		}
		canon := nettextproto.CanonicalMIMEHeaderKey(name)
		if structural[canon] {
			return nil, fieldProblem(ProblemBadHeader, "bad header", "headers."+name, "outflow writes this field itself")
		}
		if ascii.IsString(v) {
			h.Set(canon, v)
		} else {
			h.SetText(canon, v) // RFC 2047 encoded words
		}
	}

	var alts []entity
	text := func(typ, s string) entity {
		var ph message.Header
		ph.SetContentType(typ, map[string]string{"charset": "utf-8"})
		ph.Set("Content-Transfer-Encoding", "quoted-printable")
		return entity{h: ph, body: []byte(s)}
	}
	if req.Text != "" {
		alts = append(alts, text("text/plain", req.Text))
	}
	if req.HTML != "" {
		alts = append(alts, text("text/html", req.HTML))
	}
	// files are the attachments proper, related the inline parts with a
	// Content-ID that the HTML body shows (cid: images).
	var files, related []entity
	for i, a := range req.Attachments {
		field := fmt.Sprintf("attachments[%d]", i)
		data, err := decodeBase64(a.Content)
		if err != nil {
			return nil, fieldProblem(ProblemBadAttachment, "bad attachment", field+".content", "not base64: "+err.Error())
		}
		if a.Filename == "" && !a.Inline {
			return nil, fieldProblem(ProblemBadAttachment, "bad attachment", field+".filename", "an attachment needs a filename")
		}
		if strings.ContainsAny(a.Filename+a.ContentType+a.ContentID, "\r\n\x00") {
			return nil, fieldProblem(ProblemBadHeader, "bad header", field, "CR, LF or NUL in filename, content_type or content_id (header injection)")
		}
		ct := a.ContentType
		if ct == "" {
			ct = "application/octet-stream"
		}
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || strings.HasPrefix(mt, "multipart/") {
			return nil, fieldProblem(ProblemBadAttachment, "bad attachment", field+".content_type", "not a single-part media type")
		}
		delete(params, "boundary")
		var ph message.Header
		ph.SetContentType(mt, params)
		ph.Set("Content-Transfer-Encoding", "base64")
		disp := "attachment"
		if a.Inline {
			disp = "inline"
		}
		dp := map[string]string{}
		if a.Filename != "" {
			dp["filename"] = a.Filename
		}
		ph.SetContentDisposition(disp, dp)
		if a.ContentID != "" {
			ph.Set("Content-Id", "<"+strings.Trim(a.ContentID, "<>")+">")
		}
		if a.Inline && a.ContentID != "" && req.HTML != "" {
			related = append(related, entity{h: ph, body: data})
		} else {
			files = append(files, entity{h: ph, body: data})
		}
	}
	if len(alts) == 0 && len(files) == 0 {
		return nil, fieldProblem(ProblemMissingField, "missing field", "text", "give raw, or at least one of text, html and attachments")
	}

	// The structure mail clients expect (RFC 2046, RFC 2387):
	//
	//	multipart/mixed                    when there are attachments
	//	  multipart/related                when the HTML shows inline parts
	//	    multipart/alternative          when there are text and HTML
	//	      text/plain, text/html
	//	    the inline parts (Content-ID)
	//	  the attachments
	multipart := func(typ, label string, kids []entity, extra map[string]string) entity {
		params := map[string]string{"boundary": "=_" + label + "_" + seeded(seed, label, 24)}
		maps.Copy(params, extra)
		var mh message.Header
		mh.SetContentType(typ, params)
		return entity{h: mh, kids: kids}
	}
	var body entity // what the reader reads: the text, the HTML, or both
	switch len(alts) {
	case 1:
		body = alts[0]
	case 2:
		body = multipart("multipart/alternative", "alt", alts, nil)
	}
	if len(related) > 0 { // only with an HTML body
		bodyType, _, _ := body.h.ContentType()
		body = multipart("multipart/related", "rel", append([]entity{body}, related...), map[string]string{"type": bodyType})
	}
	root := body
	if len(files) > 0 {
		if len(alts) > 0 {
			files = append([]entity{body}, files...)
		}
		root = multipart("multipart/mixed", "mixed", files, nil)
	}

	top := h.Header
	for f := root.h.Fields(); f.Next(); {
		top.Set(f.Key(), f.Value())
	}
	var buf bytes.Buffer
	buf.Grow(builtSize(prefix, req, related, files))
	buf.Write(prefix)
	w, err := message.CreateWriter(&buf, top)
	if err == nil {
		if err = root.write(w); err == nil {
			err = w.Close()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("build message: %w", err)
	}
	return buf.Bytes(), nil
}

// builtSize estimates the size of the message built of req after prefix,
// so that its buffer is made once rather than doubled as it fills:
// quoted-printable text about its size, base64 four thirds and a line end
// every 76 octets, some room for the header and each part's.
func builtSize(prefix []byte, req *MessageRequest, parts ...[]entity) int {
	n := len(prefix) + 4096 + len(req.Text) + len(req.Text)/16 + len(req.HTML) + len(req.HTML)/16
	for _, l := range parts {
		for _, e := range l {
			b64 := (len(e.body) + 2) / 3 * 4
			n += b64 + b64/76*2 + 512
		}
	}
	return n
}

// entity is one MIME entity of a message being built: a leaf with its
// content, or a multipart with its parts.
type entity struct {
	h    message.Header // its Content-* fields
	body []byte         // a leaf's content, not yet encoded
	kids []entity       // a multipart's parts
}

// write writes e's content (its body, or its parts) into w, a writer made
// for e's header.
func (e entity) write(w *message.Writer) error {
	if len(e.kids) == 0 {
		_, err := w.Write(e.body)
		return err
	}
	for _, k := range e.kids {
		pw, err := w.CreatePart(k.h)
		if err != nil {
			return err
		}
		if err := k.write(pw); err != nil {
			return err
		}
		if err := pw.Close(); err != nil {
			return err
		}
	}
	return nil
}

// decodeBase64 accepts standard base64 with or without padding, and with
// the line breaks that encoders often insert.
func decodeBase64(s string) ([]byte, error) {
	s = strings.NewReplacer("\r", "", "\n", "", " ", "", "\t", "").Replace(s)
	if strings.HasSuffix(s, "=") {
		return base64.StdEncoding.Strict().DecodeString(s)
	}
	return base64.RawStdEncoding.Strict().DecodeString(s)
}

// normalizeRaw checks a raw message and gives it CRLF line endings: JSON
// clients write "\n", SMTP wants CRLF (RFC 5321 section 2.3.8). It refuses
// NUL, bare CR, lines over 998 octets and a message without a header.
// The message begins room octets into the buffer returned: free room in
// front of it for the fields to go on top.
func normalizeRaw(raw string, room int) ([]byte, error) {
	if strings.IndexByte(raw, 0) >= 0 {
		return nil, fieldProblem(ProblemBadMessage, "bad message", "raw", "NUL in the message")
	}
	s := strings.ReplaceAll(raw, "\r\n", "\n")
	if strings.IndexByte(s, '\r') >= 0 {
		return nil, fieldProblem(ProblemBadMessage, "bad message", "raw", "CR not followed by LF")
	}
	var out bytes.Buffer
	out.Grow(room + len(s) + len(s)/32)
	out.Write(make([]byte, room))
	for line := range strings.Lines(s) {
		line = strings.TrimSuffix(line, "\n")
		if len(line) > maxLine {
			return nil, fieldProblem(ProblemBadMessage, "bad message", "raw", "a line longer than 998 octets (RFC 5322 section 2.1.1)")
		}
		out.WriteString(line)
		out.WriteString("\r\n")
	}
	b := out.Bytes()
	hdr, err := textproto.ReadHeader(bufio.NewReader(bytes.NewReader(b[room:])))
	if err != nil || hdr.Len() == 0 {
		return nil, fieldProblem(ProblemBadMessage, "bad message", "raw", "not an RFC 5322 message: it needs header fields, then an empty line, then the body")
	}
	return b, nil
}

// fieldProblem is a 400 (or, for addresses, 422) problem about one field.
func fieldProblem(typ, title, field, reason string) *Problem {
	status := 400
	if typ == ProblemBadAddress || typ == ProblemBadExpires || typ == ProblemBadSendAt || typ == ProblemNoUnsubscribe {
		status = 422
	}
	p := problem(status, typ, title, field+": "+reason)
	p.Errors = []FieldError{{Field: field, Reason: reason}}
	return p
}
