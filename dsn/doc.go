// Package dsn is in charge of writing delivery status notifications: the
// multipart/report; report-type=delivery-status messages of RFC 3464 that
// tell a message's sender what became of it, recipient by recipient.
//
// A report has three parts (RFC 3462, RFC 3464 §2):
//
//  1. a short text/plain explanation for a person;
//  2. the message/delivery-status part: per-message fields (Reporting-MTA,
//     Original-Envelope-Id, Arrival-Date) and one block per recipient
//     (Final-Recipient, Original-Recipient when the submitter gave ORCPT,
//     Action, Status, Remote-MTA, Diagnostic-Code, Last-Attempt-Date and,
//     for a delay, Will-Retry-Until);
//  3. the original: its header as text/rfc822-headers (RET=HDRS, the
//     default) or the whole message as message/rfc822 (RET=FULL, up to
//     Report.MaxFull bytes; a larger one is returned as its header).
//
// The MIME is written by hand rather than with go-message: the
// delivery-status part is a sequence of header-like field groups
// separated by empty lines, which go-message's single-header writer cannot
// express, and every other part is a fixed layout. All field values are
// folded to US-ASCII one-liners (RFC 3464 §2.1.1 fields are ASCII).
//
// IsReport recognises a delivery status notification on input, so that
// outflow never answers one with another (RFC 3461 §6.2, RFC 5321 §6.1:
// no notification about a notification).
//
// The package writes messages only; deciding when one is due, for whom and
// how it is sent is package worker's (worker/dsn.go).
package dsn
