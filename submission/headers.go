package submission

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"time"

	"github.com/outflow/outflow/internal/mailhdr"
)

// CompleteHeaders returns msg (CRLF line ends, header section first) with a
// Date and a Message-ID field added where the message has none, as a
// message submission agent may (RFC 6409 section 8.2 and 8.3): RFC 5322
// requires Date, and large mailbox providers reject or junk mail without a
// Message-ID. Scripts and applications that hand over a bare
// "Subject: ..." message are the usual case.
//
// The fields go after the first skip octets of msg (the Received field the
// listener puts on top; 0 elsewhere), so a trace field stays first. The
// Message-ID is <hex@hostname>: random, or derived from seed when seed is
// not empty, so that a retried idempotent request stores the same bytes.
// msg is returned unchanged, not copied, when both fields are present or
// when it has no header section to complete.
func CompleteHeaders(msg []byte, skip int, hostname, seed string, now time.Time) []byte {
	add := missingFields(msg, skip, hostname, seed, now)
	if add == nil {
		return msg
	}
	out := make([]byte, 0, len(msg)+len(add))
	out = append(out, msg[:skip]...)
	out = append(out, add...)
	return append(out, msg[skip:]...)
}

// maxAddedHeaders is the room CompleteHeaders' fields take with a
// hostname of up to 150 octets, what a submission leaves for them in front
// of its body (completeHeadersInFrame).
const maxAddedHeaders = 256

// completeHeadersInFrame is CompleteHeaders (no seed) for a body that is
// the tail of frame (queue.Submission.Frame): the fields go into the free
// octets in front of the body, the first skip octets moving forward to
// make room, so that the body is not copied. The body is still frame's
// tail afterwards. With too few free octets it copies, as CompleteHeaders.
func completeHeadersInFrame(frame, body []byte, skip int, hostname string, now time.Time) []byte {
	add := missingFields(body, skip, hostname, "", now)
	if add == nil {
		return body
	}
	head := len(frame) - len(body)
	if len(body) == 0 || head < len(add) || &frame[head] != &body[0] {
		return CompleteHeaders(body, skip, hostname, "", now)
	}
	at := head - len(add)
	copy(frame[at:], body[:skip]) // overlapping: copy moves
	copy(frame[at+skip:], add)
	return frame[at:]
}

// missingFields returns the Date and Message-ID fields msg lacks, to go
// after its first skip octets; nil when it lacks neither or has no header
// section.
func missingFields(msg []byte, skip int, hostname, seed string, now time.Time) []byte {
	hasDate, hasID, ok := scanHeader(msg[skip:])
	if !ok || (hasDate && hasID) {
		return nil
	}
	var add []byte
	if !hasDate {
		add = append(add, "Date: "...)
		add = now.AppendFormat(add, time.RFC1123Z)
		add = append(add, "\r\n"...)
	}
	if !hasID {
		add = append(add, "Message-ID: <"...)
		add = append(add, messageIDLocal(seed)...)
		add = append(add, '@')
		add = append(add, hostname...)
		add = append(add, ">\r\n"...)
	}
	return add
}

// HasHeader reports whether msg starts with a header section (a field), one
// that fields may be added to.
func HasHeader(msg []byte) bool {
	_, _, ok := scanHeader(msg)
	return ok
}

// scanHeader reports whether the header section of msg has a Date and a
// Message-ID field (names compared without case, as RFC 5322 says). ok is
// false when msg does not start with a header field: a body with no header
// section is not one to add fields to.
func scanHeader(msg []byte) (hasDate, hasID, ok bool) {
	for len(msg) > 0 {
		var line []byte
		line, msg = mailhdr.Line(msg)
		if len(line) == 0 {
			return hasDate, hasID, ok // end of the header section
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue // a folded continuation of the previous field
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return hasDate, hasID, ok
		}
		name := bytes.TrimRight(line[:colon], " \t")
		if !fieldName(name) {
			return hasDate, hasID, ok // an mbox "From " line, or a body
		}
		ok = true
		switch {
		case bytes.EqualFold(name, []byte("Date")):
			hasDate = true
		case bytes.EqualFold(name, []byte("Message-ID")):
			hasID = true
		}
	}
	return hasDate, hasID, ok
}

// fieldName reports whether b is a header field name: printable US-ASCII
// other than colon (RFC 5322 section 3.6.8).
func fieldName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c < 33 || c > 126 || c == ':' {
			return false
		}
	}
	return true
}

// messageIDLocal is the left-hand side of an added Message-ID: 32 hex
// digits, random or derived from seed.
func messageIDLocal(seed string) string {
	var b [16]byte
	if seed == "" {
		_, _ = rand.Read(b[:])
	} else {
		sum := sha256.Sum256([]byte("outflow message-id\x00" + seed))
		copy(b[:], sum[:])
	}
	return hex.EncodeToString(b[:])
}
