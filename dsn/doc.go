// Package dsn is in charge of delivery status notifications as messages:
// writing the multipart/report; report-type=delivery-status messages of
// RFC 3464 that tell a message's sender what became of it, recipient by
// recipient, and reading those (and spam complaints) that other systems
// send back.
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
// ParseDSN and ParseFeedback read the other direction, for the bounce
// listener: reports that come back to outflow's return-path address after
// a remote server had accepted a message with 250. ParseDSN reads a
// delivery status notification (RFC 3464, or RFC 6533's
// message/global-delivery-status) into its Reporting-MTA, ENVID, one
// Recipient per per-recipient block and the returned original's header;
// ParseFeedback reads an abuse report (ARF, RFC 5965). Both take what real
// MTAs send: the report as the message or nested a few multipart levels
// down, parameters in any case, a quoted-printable or base64 status part,
// CRLF or bare LF, folded fields and stray empty lines, vendor fields
// (ignored). Both refuse, with ErrNotReport, a message that is no report of
// their kind (a free-text bounce is for someone else to read) and, with
// ErrMalformed, a report without a readable status part, without a
// recipient block or Feedback-Type, with a status part over 256 KiB or
// with more than 1,000 recipient blocks. A field's value, unfolded, is cut
// to its first 8 KiB (no address or diagnostic needs more), and reading
// costs time linear in the message's length whatever its folding, since
// the bounce listener reads reports from anyone. go-message reads the MIME
// structure and undoes transfer encodings; the status fields are parsed
// here, as their groups are not one header. ParseAttached reads a
// complaint sent with no report, the message complained about attached as
// message/rfc822 to a multipart/mixed (Microsoft JMRP's older format), for
// the attached original's header; what such a message means, and where,
// is for the caller to say.
//
// The package writes and reads messages only; deciding when one is due,
// for whom and how it is sent is package worker's (worker/dsn.go), and
// what a received one means for the recipient is package bounce's.
package dsn
