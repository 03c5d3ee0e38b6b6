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

// RFC 3461 §4.4 and §4.2 bound ENVID to 100 characters and ORCPT's address
// to 500; longer values are refused rather than truncated.
const (
	maxEnvID = 100
	maxORcpt = 500
)

var (
	errEnvIDTooLong = &smtp.SMTPError{Code: 501, EnhancedCode: smtp.EnhancedCode{5, 5, 4},
		Message: "ENVID longer than 100 characters (RFC 3461 4.4)"}
	errORcptTooLong = &smtp.SMTPError{Code: 501, EnhancedCode: smtp.EnhancedCode{5, 5, 4},
		Message: "ORCPT longer than 500 characters (RFC 3461 4.2)"}
)

// reasonBadDSN: a DSN parameter outside RFC 3461's bounds.
const reasonBadDSN = "bad_dsn_parameter"

// mailDSN returns MAIL FROM's RET and ENVID as the start of a
// transaction's parameters, nil when neither was given.
func mailDSN(opts *smtp.MailOptions) (*queue.DSNParams, *smtp.SMTPError) {
	if opts == nil || opts.Return == "" && opts.EnvelopeID == "" {
		return nil, nil
	}
	if len(opts.EnvelopeID) > maxEnvID {
		return nil, errEnvIDTooLong
	}
	return &queue.DSNParams{Ret: strings.ToUpper(string(opts.Return)), EnvID: opts.EnvelopeID}, nil
}

// rcptDSN returns RCPT TO's NOTIFY and ORCPT, ok false when neither was
// given.
func rcptDSN(opts *smtp.RcptOptions) (p queue.RcptDSN, ok bool, err *smtp.SMTPError) {
	if opts == nil || len(opts.Notify) == 0 && opts.OriginalRecipient == "" {
		return p, false, nil
	}
	if len(opts.OriginalRecipient) > maxORcpt {
		return p, false, errORcptTooLong
	}
	for _, n := range opts.Notify {
		p.Notify = append(p.Notify, strings.ToUpper(string(n)))
	}
	p.ORcpt = opts.OriginalRecipient
	if t := string(opts.OriginalRecipientType); p.ORcpt != "" && !strings.EqualFold(t, "rfc822") {
		p.ORcptType = t
	}
	return p, true, nil
}

// addRcptDSN records one recipient's parameters in the transaction's.
func addRcptDSN(d *queue.DSNParams, rcpt string, p queue.RcptDSN) *queue.DSNParams {
	if d == nil {
		d = &queue.DSNParams{}
	}
	if d.Rcpts == nil {
		d.Rcpts = map[string]queue.RcptDSN{}
	}
	d.Rcpts[rcpt] = p
	return d
}
