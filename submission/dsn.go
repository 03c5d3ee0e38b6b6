package submission

import (
	"strings"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/queue"
)

// The DSN extension (RFC 3461) is offered on the listener: go-smtp parses
// and checks RET, ENVID, NOTIFY and ORCPT (xtext decoded, NOTIFY=NEVER
// alone), and the session keeps them with the transaction so that they
// are stored with each envelope (queue.DSNParams), passed on to a next hop
// that offers DSN, and otherwise honoured by outflow's own notifications.

// The rules below are the one check of DSN parameters: the SMTP session
// applies them to what go-smtp parsed from MAIL FROM and RCPT TO, and the
// HTTP API and `outflow submit` to the same parameters given as JSON or
// flags, so all three store the same queue.DSNParams for the same values.

// RFC 3461 §4.4 and §4.2 bound ENVID to 100 characters and ORCPT's address
// to 500; longer values are refused rather than truncated.
const (
	maxEnvID = 100
	maxORcpt = 500
)

// badDSN is the reply to a faulty parameter; msg begins with the
// parameter's name, by which the HTTP API names the faulty field.
func badDSN(msg string) *smtp.SMTPError {
	return &smtp.SMTPError{Code: 501, EnhancedCode: smtp.EnhancedCode{5, 5, 4}, Message: msg}
}

var (
	errRet          = badDSN("RET must be FULL or HDRS (RFC 3461 4.3)")
	errEnvIDTooLong = badDSN("ENVID longer than 100 characters (RFC 3461 4.4)")
	errEnvIDText    = badDSN("ENVID must be printable US-ASCII (RFC 3461 4.4)")
	errNotifyValue  = badDSN("NOTIFY must be NEVER, or some of SUCCESS, FAILURE, DELAY (RFC 3461 4.1)")
	errNotifyNever  = badDSN("NOTIFY=NEVER cannot be combined with another value (RFC 3461 4.1)")
	errNotifyTwice  = badDSN("NOTIFY names a value twice (RFC 3461 4.1)")
	errORcptTooLong = badDSN("ORCPT longer than 500 characters (RFC 3461 4.2)")
	errORcptForm    = badDSN("ORCPT must be addr-type;address, e.g. rfc822;user@example.com (RFC 3461 4.2)")
)

// reasonBadDSN: a DSN parameter outside RFC 3461's bounds.
const reasonBadDSN = "bad_dsn_parameter"

// mailDSN returns MAIL FROM's RET and ENVID as the start of a
// transaction's parameters, nil when neither was given.
func mailDSN(opts *smtp.MailOptions) (*queue.DSNParams, *smtp.SMTPError) {
	if opts == nil {
		return nil, nil
	}
	return MessageDSN(string(opts.Return), opts.EnvelopeID)
}

// rcptDSN returns RCPT TO's NOTIFY and ORCPT, ok false when neither was
// given.
func rcptDSN(opts *smtp.RcptOptions) (p queue.RcptDSN, ok bool, err *smtp.SMTPError) {
	if opts == nil {
		return p, false, nil
	}
	notify := make([]string, len(opts.Notify))
	for i, n := range opts.Notify {
		notify[i] = string(n)
	}
	return RecipientDSN(notify, string(opts.OriginalRecipientType), opts.OriginalRecipient)
}

// MessageDSN checks a message's RET and ENVID (ENVID decoded from xtext)
// and returns them as the start of its parameters, nil when neither is
// given. The error is the SMTP listener's reply to them.
func MessageDSN(ret, envID string) (*queue.DSNParams, *smtp.SMTPError) {
	if ret == "" && envID == "" {
		return nil, nil
	}
	ret = strings.ToUpper(ret)
	if ret != "" && ret != "FULL" && ret != "HDRS" {
		return nil, errRet
	}
	if len(envID) > maxEnvID {
		return nil, errEnvIDTooLong
	}
	for i := 0; i < len(envID); i++ {
		if c := envID[i]; c < ' ' || c > '~' {
			return nil, errEnvIDText
		}
	}
	return &queue.DSNParams{Ret: ret, EnvID: envID}, nil
}

// RecipientDSN checks one recipient's NOTIFY values and ORCPT (its address
// type and decoded address) and returns them as stored, ok false when
// neither is given. The error is the SMTP listener's reply to them.
func RecipientDSN(notify []string, orcptType, orcpt string) (p queue.RcptDSN, ok bool, err *smtp.SMTPError) {
	if len(notify) == 0 && orcpt == "" && orcptType == "" {
		return p, false, nil
	}
	seen := map[string]bool{}
	for _, n := range notify {
		n = strings.ToUpper(n)
		switch {
		case n != queue.NotifyNever && n != queue.NotifySuccess && n != queue.NotifyFailure && n != queue.NotifyDelay:
			return p, false, errNotifyValue
		case seen[n]:
			return p, false, errNotifyTwice
		}
		seen[n] = true
		p.Notify = append(p.Notify, n)
	}
	if seen[queue.NotifyNever] && len(seen) > 1 {
		return p, false, errNotifyNever
	}
	if orcpt != "" || orcptType != "" {
		if orcpt == "" || !isAtom(orcptType) || strings.ContainsAny(orcpt, "\r\n\x00") {
			return p, false, errORcptForm
		}
		if len(orcpt) > maxORcpt {
			return p, false, errORcptTooLong
		}
		p.ORcpt = orcpt
		if !strings.EqualFold(orcptType, "rfc822") {
			p.ORcptType = orcptType
		}
	}
	return p, true, nil
}

// ParseORcpt splits ORCPT's decoded "addr-type;address" form (RFC 3461
// §4.2), as the HTTP API and `outflow submit` take it, for RecipientDSN.
func ParseORcpt(v string) (typ, addr string, err *smtp.SMTPError) {
	typ, addr, ok := strings.Cut(v, ";")
	if !ok {
		return "", "", errORcptForm
	}
	return strings.TrimSpace(typ), strings.TrimSpace(addr), nil
}

// isAtom reports whether s is an RFC 3461 addr-type: an atom of letters,
// digits and hyphens.
func isAtom(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// AddRcptDSN records one recipient's parameters in a message's (nil
// makes them), keyed by the recipient as given.
func AddRcptDSN(d *queue.DSNParams, rcpt string, p queue.RcptDSN) *queue.DSNParams {
	if d == nil {
		d = &queue.DSNParams{}
	}
	if d.Rcpts == nil {
		d.Rcpts = map[string]queue.RcptDSN{}
	}
	d.Rcpts[rcpt] = p
	return d
}
