package submission

import (
	"bytes"
	"fmt"

	"github.com/emersion/go-smtp"
)

// The replies this package gives, besides go-smtp's own (docs/submission.md
// has the full table). go-smtp writes a session error as-is only when it is
// a bare *smtp.SMTPError; anything else, even one wrapping an SMTPError,
// becomes a generic 451 or 454. So these are returned unwrapped, always.
var (
	// RFC 4954 section 6: authentication required.
	errAuthRequired = &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0},
		Message: "Authentication required"}
	// The account this session authenticated as was removed, or its
	// password changed, by a reload of the users file (Server.SetUsers);
	// the connection ends after it.
	errCredentialsChanged = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 0},
		Message: "This account's credentials have changed; connect and authenticate again"}
	// RFC 3207 section 4: the server requires TLS before anything else.
	errStartTLSFirst = &smtp.SMTPError{Code: 530, EnhancedCode: smtp.EnhancedCode{5, 7, 0},
		Message: "Must issue a STARTTLS command first, then AUTH"}
	// RFC 4954 section 6: the mechanism needs an encrypted channel.
	errEncryptionRequired = &smtp.SMTPError{Code: 538, EnhancedCode: smtp.EnhancedCode{5, 7, 11},
		Message: "Encryption required for requested authentication mechanism: use STARTTLS or a loopback connection"}
	// RFC 4954 section 4: AUTH is not permitted during a mail transaction.
	errAuthInTransaction = &smtp.SMTPError{Code: 503, EnhancedCode: smtp.EnhancedCode{5, 5, 1},
		Message: "AUTH not permitted during a mail transaction"}
	// RFC 4954 section 4: a malformed SASL response is a syntax error.
	errAuthMalformed = &smtp.SMTPError{Code: 501, EnhancedCode: smtp.EnhancedCode{5, 5, 2},
		Message: "Malformed authentication response"}
	// Too many failures from this address: 421 closes the connection
	// (RFC 5321 section 3.8), 4.7.0 is a temporary security refusal.
	errAuthRateLimited = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 0},
		Message: "Too many failed authentication attempts from your address, try again later; closing connection"}
	// The sender policy (SenderDomains): 553 as Postfix's
	// reject_sender_login_mismatch answers MAIL FROM, 5.7.1 delivery not
	// authorized; after DATA, for a From field, 550 5.7.1.
	errSenderNotOwned = &smtp.SMTPError{Code: 553, EnhancedCode: smtp.EnhancedCode{5, 7, 1},
		Message: "Sender address rejected: not one of the sender domains of this account"}
	// RFC 5321 section 4.1.1.2: MAIL is not allowed inside a transaction.
	errNestedMail = &smtp.SMTPError{Code: 503, EnhancedCode: smtp.EnhancedCode{5, 5, 1},
		Message: "Nested MAIL command: send RSET first"}
	errNeedMail = &smtp.SMTPError{Code: 503, EnhancedCode: smtp.EnhancedCode{5, 5, 1},
		Message: "Send MAIL FROM first"}
	errNeedRcpt = &smtp.SMTPError{Code: 503, EnhancedCode: smtp.EnhancedCode{5, 5, 1},
		Message: "Send RCPT TO first"}
	// RFC 5321 section 4.5.3.1.10 and RFC 3463 X.5.3.
	errTooManyRcpts = &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 5, 3},
		Message: "Too many recipients"}
	// RFC 5321 section 3.8: the service is closing.
	errShuttingDown = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 3, 2},
		Message: "Service shutting down, try again later"}
	// The body stalled or took longer than DataTimeout; the connection is
	// closed after this reply.
	errDataTimeout = &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 4, 2},
		Message: "Timeout reading message data; closing connection"}
	// The client went away or the chunked transfer was aborted; the reply
	// is usually never seen.
	errDataAborted = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 4, 0},
		Message: "Message transfer interrupted, nothing queued"}
	// The queue did not acknowledge the message: it is not accepted, and
	// the client keeps it and retries (RFC 3463 X.3.0: mail system).
	errQueueFailed = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
		Message: "Queue unavailable, message not accepted; try again later"}
	errQueueTimeout = &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0},
		Message: "Queue did not confirm in time, message not accepted; try again later"}
	// The store is near its limit, the rest kept for the mail already
	// queued (queue.ErrNoRoom): RFC 5321 section 4.2.3's 452 and RFC 3463
	// X.3.1, mail system full; nothing was stored, the client retries.
	errStoreFull = &smtp.SMTPError{Code: 452, EnhancedCode: smtp.EnhancedCode{4, 3, 1},
		Message: "Insufficient system storage: the queue is full, message not accepted; try again later"}
	// RFC 5321 section 2.3.8: CR and LF only as CRLF. Bare ones are also
	// how SMTP smuggling hides a second message inside the first.
	errBareLF = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 6, 0},
		Message: "Message contains a bare LF; lines must end with CRLF (RFC 5321 section 2.3.8)"}
	errBareCR = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 6, 0},
		Message: "Message contains a bare CR; lines must end with CRLF (RFC 5321 section 2.3.8)"}
	// RFC 5321 section 4.5.2 / RFC 6152: NUL is not allowed in 7bit or
	// 8bitmime content, and BINARYMIME is not offered.
	errNUL = &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 6, 0},
		Message: "Message contains a NUL byte"}
)

// lineTooLongError is the reply for a body line over max octets including
// CRLF: "500 Line too long" of RFC 5321 sections 4.5.3.1.6 and 4.5.3.1.10.
func lineTooLongError(max int) *smtp.SMTPError {
	return &smtp.SMTPError{Code: 500, EnhancedCode: smtp.EnhancedCode{5, 5, 2},
		Message: fmt.Sprintf("Line too long: at most %d octets including CRLF (RFC 5321 section 4.5.3.1.6)", max)}
}

// addressError is the 553 reply for an address that ParseAddress refused:
// X.1.7 for the sender, X.1.3 for a recipient (RFC 3463), X.6.7 for a
// non-ASCII address without SMTPUTF8 (RFC 6531 section 3.5).
func addressError(err error, sender bool) *smtp.SMTPError {
	ae, _ := err.(*AddressError)
	code := smtp.EnhancedCode{5, 1, 3}
	what := "recipient"
	if sender {
		code = smtp.EnhancedCode{5, 1, 7}
		what = "sender"
	}
	reason := "malformed address"
	if ae != nil {
		reason = ae.Reason
		if ae.NonASCII {
			code = smtp.EnhancedCode{5, 6, 7}
		}
	}
	return &smtp.SMTPError{Code: 553, EnhancedCode: code,
		Message: "Bad " + what + " address syntax: " + reason}
}

// go-smtp (conn.go, in the pinned release) answers some commands with a
// code RFC 5321 does not give them, and has no hook where the session
// could answer instead: it writes these replies before or without calling
// the session. So the connection's reply writers (trackedConn, and
// tlsReplies under TLS) put the right line in place of go-smtp's on its
// way out (amendReply), matched whole, octet for octet:
//
//   - an AUTH response that is not base64 gets a temporary 454 4.7.0,
//     which a client may retry for ever. RFC 4954 section 4 asks for 501:
//     "If the server cannot BASE64 decode any client response, it MUST
//     reject the AUTH command with a 501 reply." go-smtp decodes before
//     any sasl.Server sees the response;
//   - a command out of sequence (MAIL before EHLO or HELO, RCPT before
//     MAIL, DATA or BDAT before RCPT, MAIL, RCPT or DATA inside a BDAT
//     transfer) gets 502, "command not implemented", where RFC 5321
//     section 4.3.2 lists 503 "bad sequence of commands" (section 4.2.4:
//     502 is for a command the server does not implement at all). A client
//     may take 502 for "never send this command here again";
//   - AUTH without a mechanism gets 502 too, where the fault is in its
//     arguments (501, RFC 5321 section 4.2.3);
//   - a line that is no command (a verb of other than four letters)
//     gets 501, "syntax error in parameters", where it is unrecognized:
//     500 (section 4.2.4), what an unknown four-letter verb gets;
//   - a MAIL or RCPT parameter the server does not know gets 500, a
//     syntax error, where RFC 5321 section 4.1.1.11 asks for 555 ("MAIL
//     FROM/RCPT TO parameters not recognized or not implemented"), as
//     Postfix answers.
//
// Under TLS the lines are amended by the writer under go-smtp's
// (tlsReplies), from the end of the handshake on when the client greeted
// before STARTTLS (joinTLS), as clients do: a MAIL before the greeting
// RFC 3207 section 4.2 asks for inside TLS gets 503 there too. After a
// STARTTLS sent before any greeting, from the first greeting inside TLS
// on: until a greeting go-smtp calls nothing of this package that sees
// its connection (a session is made at the first EHLO or HELO), so there
// is nothing to put the writer in place with, and go-smtp's 502 to a
// command before it goes out as it is.
var amendedReplies = map[string]amended{
	"454 4.7.0 Invalid base64 data\r\n": {
		line: []byte("501 5.5.2 Malformed authentication response: not base64 (RFC 4954 section 4)\r\n"), badAuth: true},
	"502 5.5.1 Please introduce yourself first.\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: send EHLO first\r\n")},
	"502 5.5.1 Missing MAIL FROM command.\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: send MAIL FROM first\r\n")},
	"502 5.5.1 Missing RCPT TO command.\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: send RCPT TO first\r\n")},
	"502 5.5.1 MAIL not allowed during message transfer\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: MAIL not allowed during a BDAT transfer\r\n")},
	"502 5.5.1 RCPT not allowed during message transfer\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: RCPT not allowed during a BDAT transfer\r\n")},
	"502 5.5.1 DATA not allowed during message transfer\r\n": {
		line: []byte("503 5.5.1 Bad sequence of commands: DATA not allowed during a BDAT transfer\r\n")},
	// AUTH without a mechanism: a syntax error in its arguments (RFC 5321
	// section 4.2.3, 501; RFC 4954 section 4: AUTH mechanism [initial-response]).
	"502 5.5.4 Missing parameter\r\n": {
		line: []byte("501 5.5.4 Syntax error: AUTH needs a mechanism name\r\n")},
	// A line that is no command (a verb of other than four letters,
	// "FOO", "HELLOTHERE"): unrecognized, 500 (RFC 5321 section 4.2.4),
	// as go-smtp answers an unknown four-letter one; 501 is for a known
	// command's arguments.
	"501 5.5.2 Bad command\r\n": {
		line: []byte("500 5.5.2 Syntax error, command unrecognized\r\n")},
	"500 5.5.4 Unknown MAIL FROM argument\r\n": {
		line: []byte("555 5.5.4 MAIL FROM parameter not recognized or not implemented (RFC 5321 section 4.1.1.11)\r\n")},
	"500 5.5.4 Unknown RCPT TO argument\r\n": {
		line: []byte("555 5.5.4 RCPT TO parameter not recognized or not implemented (RFC 5321 section 4.1.1.11)\r\n")},
}

// amended is a go-smtp reply line as this package writes it.
type amended struct {
	line    []byte // written in place of go-smtp's
	badAuth bool   // go-smtp's line refused a malformed AUTH response: count it
}

// amendReply reports whether b, one reply line as go-smtp writes it, is
// one this package corrects, and how.
func amendReply(b []byte) (amended, bool) {
	if len(b) < 6 || (b[0] != '4' && b[0] != '5') {
		return amended{}, false // the common case: a 2xx or 3xx, not looked up
	}
	a, ok := amendedReplies[string(b)] // no allocation: a lookup by string(b)
	return a, ok
}

// The first line of go-smtp's reply to a greeting: to EHLO a multi-line
// reply without an enhanced code, to HELO one line with one (conn.go's
// handleGreet). The reply writers see which (greetingReply), so that the
// Received field can name the protocol (appendReceived).
var (
	ehloReply = []byte("250-Hello ")
	heloReply = []byte("250 2.0.0 Hello ")
)

// greetingReply reports whether b is the first line of go-smtp's reply to
// a greeting, and whether the greeting was EHLO.
func greetingReply(b []byte) (greeting, ehlo bool) {
	switch {
	case bytes.HasPrefix(b, ehloReply):
		return true, true
	case bytes.HasPrefix(b, heloReply):
		return true, false
	}
	return false, false
}
