package classify

import (
	"strconv"
	"strings"
)

// Parse splits a reply as a server (or a log line) wrote it into its basic
// code, enhanced status code and text. It never fails: what it cannot read
// stays in Text with Code 0, which still classifies (as transient, unless a
// rule recognises the text).
//
// It accepts:
//   - single and multi-line replies, with "250-"/"250 " prefixes on each
//     line (RFC 5321 4.2.1), including multi-line replies that a log has
//     flattened onto one line ("421-4.7.0 a 421-4.7.0 b 421 4.7.0 c");
//   - an enhanced code after the basic code (RFC 2034 4, RFC 3463 2),
//     optionally written "#5.1.0"; an invalid one ("552 1 ...") is left in
//     the text and Enhanced stays empty;
//   - the code after the text, as rspamd writes it ("4.7.1 Ratelimit
//     exceeded (451)");
//   - Postfix and Exim diagnostics ("host x said: 550 5.1.1 ... (in reply
//     to RCPT TO command)"), taking the Stage from them, and Postfix's
//     client-side reports with no reply at all ("conversation with x timed
//     out while sending end of data"), which become an Event at a Stage.
func Parse(raw string) Input {
	in := Input{Raw: raw}
	s := strings.TrimSpace(raw)
	if s == "" {
		return in
	}
	code, ok := leadingCode(s)
	if !ok {
		// Not a bare reply: maybe a Postfix or Exim log line around one.
		in.Stage = stageFromDiagnostic(s)
		if i := indexFold(s, " said: "); i >= 0 {
			if code, ok = leadingCode(s[i+7:]); ok {
				s = s[i+7:]
			}
		} else if i := eximReply(s); i >= 0 {
			code, ok = leadingCode(s[i:])
			s = s[i:]
		}
	}
	if !ok {
		if ev := eventFromDiagnostic(s); ev != EventNone {
			in.Event = ev
			in.Text = s
			return in
		}
		// No code in front: maybe "4.7.1 text (451)", maybe only text.
		enh, rest := cutEnhanced(s)
		if c, body := trailingCode(rest); c != 0 && (enh == "" || enh[0] == byte('0'+c/100)) {
			if strings.ContainsAny(body, "\r\n") {
				body = joinLines(strconv.Itoa(c), enh, body)
			}
			in.Code, in.Enhanced, in.Text = c, enh, body
			return in
		}
		in.Enhanced, in.Text = enh, rest
		return in
	}
	in.Code = code
	prefix := s[:3]
	var rest string
	multi := false
	if len(s) > 3 {
		multi = s[3] == '-'
		rest = s[4:]
	}
	if strings.ContainsAny(rest, "\r\n") {
		multi = true
	}
	enh, body := cutEnhanced(rest)
	if multi {
		body = joinLines(prefix, enh, body)
	}
	// "421 - [Too many sessions opened]", "421 4.4.5 - Too many ...": a
	// dash used as punctuation after the codes is not part of the text.
	body = strings.TrimSpace(body)
	if len(body) > 1 && body[0] == '-' && body[1] == ' ' {
		body = strings.TrimLeft(body[1:], " ")
	}
	in.Enhanced, in.Text = enh, body
	return in
}

// eximReply is the offset of the reply in an Exim diagnostic ("SMTP error
// from remote mail server after RCPT TO:<a@b.example>: host mx.b.example
// [192.0.2.1]: 550 5.1.1 User unknown", or Exim 4.9x's "SMTP error from
// remote server for RCPT TO command, host: mx.b.example (192.0.2.1)
// reason: 550 5.1.1 …"): the first code after a ": " or "reason: ", or -1.
// Only in a line that says it is one: elsewhere a number after a colon is
// text ("Rejected: 421 times").
func eximReply(s string) int {
	if indexFold(s, "smtp error from remote") < 0 {
		return -1
	}
	for i := 0; i+2 < len(s); i++ {
		if s[i] != ':' || s[i+1] != ' ' {
			continue
		}
		j := i + 2
		for j < len(s) && s[j] == ' ' {
			j++
		}
		if _, ok := leadingCode(s[j:]); ok && len(s) > j+3 {
			return j
		}
	}
	return -1
}

// leadingCode reads a basic reply code at the start of s: three digits,
// the first 2 to 5, followed by a space, a hyphen (continuation) or the end
// of the line. 1yz replies do not exist in SMTP. RFC 5321 4.2 has the
// second digit 0 to 5; 6 to 9 are taken too, since servers send them ("571
// No PTR Record found. Reverse DNS required", in sisimai's corpus): the
// first digit says what the reply means, and refused, such a reply was
// read as text without a code, transient, and retried for days.
func leadingCode(s string) (int, bool) {
	if len(s) < 3 || s[0] < '2' || s[0] > '5' || s[1] < '0' || s[1] > '9' || s[2] < '0' || s[2] > '9' {
		return 0, false
	}
	if len(s) > 3 {
		switch s[3] {
		case ' ', '-', '\r', '\n', '\t':
		default:
			return 0, false
		}
	}
	return int(s[0]-'0')*100 + int(s[1]-'0')*10 + int(s[2]-'0'), true
}

// trailingCode reads a basic code written after the text, bare or in
// parentheses or brackets: "Ratelimit exceeded (451)". It returns 0 when the
// text does not end that way.
func trailingCode(s string) (int, string) {
	t := strings.TrimRight(s, " \t\r\n.")
	if n := len(t); n >= 5 && (t[n-1] == ')' && t[n-5] == '(' || t[n-1] == ']' && t[n-5] == '[') {
		if c, ok := leadingCode(t[n-4 : n-1]); ok {
			return c, strings.TrimSpace(t[:n-5])
		}
		return 0, s
	}
	if n := len(t); n >= 4 && t[n-4] == ' ' {
		if c, ok := leadingCode(t[n-3:]); ok {
			return c, strings.TrimSpace(t[:n-4])
		}
	}
	return 0, s
}

// cutEnhanced takes an enhanced status code off the front of s and returns
// it with the remaining text. RFC 3463 2: class "." subject "." detail, class
// 2, 4 or 5, subject and detail one to three digits. Some servers write a
// "#" in front ("#5.1.0"). When s does not start with a valid code, it
// returns "" and s unchanged, so "552 1 Requested ..." keeps its "1".
func cutEnhanced(s string) (string, string) {
	t := s
	if len(t) > 0 && t[0] == '#' {
		t = t[1:]
	}
	n := enhancedLen(t)
	if n == 0 {
		return "", s
	}
	return t[:n], strings.TrimLeft(t[n:], " \t")
}

// enhancedLen returns the length of the valid enhanced status code at the
// start of s, or 0. The code must end at a space or the end of s.
func enhancedLen(s string) int {
	if len(s) < 5 || (s[0] != '2' && s[0] != '4' && s[0] != '5') || s[1] != '.' {
		return 0
	}
	i := 2
	for part := 0; part < 2; part++ {
		j := i
		for j < len(s) && j-i < 4 && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if j == i || j-i > 3 {
			return 0
		}
		i = j
		if part == 0 {
			if i >= len(s) || s[i] != '.' {
				return 0
			}
			i++
		}
	}
	if i < len(s) {
		switch s[i] {
		case ' ', '\t', '\r', '\n':
		default:
			return 0
		}
	}
	return i
}

// validEnhanced reports whether s is exactly one valid enhanced status code.
func validEnhanced(s string) bool { return s != "" && enhancedLen(s) == len(s) }

// enhancedParts splits a valid enhanced code into its three numbers.
func enhancedParts(s string) (class, subject, detail int) {
	class = int(s[0] - '0')
	i := 2
	for ; s[i] != '.'; i++ {
		subject = subject*10 + int(s[i]-'0')
	}
	for i++; i < len(s); i++ {
		detail = detail*10 + int(s[i]-'0')
	}
	return class, subject, detail
}

// joinLines turns the text of a multi-line reply into one line: each line's
// "NNN-"/"NNN " prefix (RFC 5321 4.2.1) and repeated enhanced code go, and
// the lines are joined with one space. It also undoes logs that flattened
// the lines onto one ("... temporarily 421-4.7.0 rate limited"): a token
// equal to the reply's code followed by "-" or " " and preceded by a space
// is a line break.
func joinLines(code, enh, text string) string {
	var b strings.Builder
	b.Grow(len(text))
	for i := 0; i < len(text); {
		// Start of a line or of a flattened continuation: drop prefixes.
		rest := text[i:]
		if strings.HasPrefix(rest, code) && (len(rest) == 3 || rest[3] == '-' || rest[3] == ' ') {
			rest = rest[min(4, len(rest)):]
			i = len(text) - len(rest)
		}
		if enh != "" && strings.HasPrefix(rest, enh) && (len(rest) == len(enh) || rest[len(enh)] == ' ') {
			i += min(len(enh)+1, len(rest))
		}
		// Copy up to the next line break or flattened prefix.
		j := i
		for j < len(text) {
			c := text[j]
			if c == '\r' || c == '\n' {
				break
			}
			if c == ' ' && strings.HasPrefix(text[j+1:], code) {
				k := j + 1 + len(code)
				if k == len(text) || text[k] == '-' || text[k] == ' ' {
					break
				}
			}
			j++
		}
		if seg := strings.TrimSpace(text[i:j]); seg != "" {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(seg)
		}
		i = j + 1
	}
	return b.String()
}

// diagnostics recognised when a line carries no reply: Postfix's and Exim's
// own words for what happened on the wire. Order matters: the first match
// wins, so the more specific phrase comes first.
var eventPhrases = []struct {
	phrase string
	event  Event
}{
	{"host not found, try again", EventDNSServFail},
	{"servfail", EventDNSServFail},
	{"nullmx", EventNullMX},
	{"null mx", EventNullMX},
	{"host not found", EventDNSNXDomain},
	{"nxdomain", EventDNSNXDomain},
	{"connection refused", EventConnRefused},
	{"lost connection", EventConnLost},
	{"connection reset", EventConnLost},
	{"timed out", EventTimeout},
	{"timeout", EventTimeout},
	{"tls handshake", EventTLSFailure},
	{"cannot start tls", EventTLSFailure},
	{"certificate verification failed", EventTLSFailure},
}

var stagePhrases = []struct {
	phrase string
	stage  Stage
}{
	{"end of data", StageDataEnd},
	{"message body", StageData},
	{"data command", StageData},
	{"after data", StageData},
	{"rcpt to", StageRcpt},
	{"mail from", StageMail},
	{"initial server greeting", StageGreeting},
	{"ehlo", StageEHLO},
	{"helo", StageEHLO},
	{"starttls", StageTLS},
	{"auth", StageAuth},
	{"connect to", StageConnect},
	{"name service error", StageDNS},
}

// eventFromDiagnostic names the transport event a client-side diagnostic
// describes, or EventNone.
func eventFromDiagnostic(s string) Event {
	for _, p := range eventPhrases {
		if indexFold(s, p.phrase) >= 0 {
			return p.event
		}
	}
	return EventNone
}

// stageFromDiagnostic finds the conversation step in "(in reply to RCPT TO
// command)", "while sending end of data" or "after RCPT TO:".
func stageFromDiagnostic(s string) Stage {
	i := indexFold(s, "in reply to ")
	if i < 0 {
		i = indexFold(s, "while ")
	}
	if i < 0 {
		i = indexFold(s, " after ")
	}
	if i < 0 {
		i = indexFold(s, "smtp error from remote server for ") // Exim 4.9x
	}
	if i < 0 {
		return StageUnknown
	}
	tail := s[i:]
	for _, p := range stagePhrases {
		if indexFold(tail, p.phrase) >= 0 {
			return p.stage
		}
	}
	return StageUnknown
}

// indexFold is strings.Index ignoring ASCII case; substr must be lower case.
func indexFold(s, substr string) int {
	n := len(substr)
	for i := 0; i+n <= len(s); i++ {
		j := 0
		for ; j < n; j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != substr[j] {
				break
			}
		}
		if j == n {
			return i
		}
	}
	return -1
}
