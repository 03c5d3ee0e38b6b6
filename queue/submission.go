package queue

import "time"

// Submission is one message handed to outflow, by the SMTP submission
// listener or by `outflow submit`, before it is split per destination.
type Submission struct {
	Tenant         string     // the authenticated submitter (AUTH user), or "trusted" for trusted networks
	From           string     // envelope sender (MAIL FROM), may be "" for the null sender
	Rcpts          []string   // envelope recipients (RCPT TO), at least one
	Body           []byte     // the message as received, CRLF line endings
	ReceivedAt     time.Time  // when the submission was accepted
	RemoteAddr     string     // client address, for the Received header and logs
	IdempotencyKey string     // optional; resubmissions with the same key are deduplicated
	Source         string     // SourceSMTP, SourceAPI, SourceNATS or SourceDSN; decides the tenant's default for notifications
	DSN            *DSNParams // RFC 3461 parameters given with the submission, nil if none
	IsReport       bool       // a delivery status notification outflow wrote (never answered with another)
}
