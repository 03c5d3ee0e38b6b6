package queue

import "time"

// PostmasterTenant is the tenant of mail to postmaster@ and abuse@ the
// return-path domains that the bounce listener forwards to the operator
// (bounce.ForwardTenant). No SMTP account or API key may be named so: it
// would see, and could cancel, those reports, which are often about other
// tenants' mail.
const PostmasterTenant = "postmaster"

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
	// SendAt, when later than now, holds the message until then: its
	// envelopes wait on the retry lane, as a first attempt scheduled for
	// SendAt, and its age budget counts from SendAt. Zero sends at once.
	SendAt time.Time
	// ListUnsubscribe asks for one-click unsubscribe links (RFC 8058):
	// each recipient gets an envelope of its own, and the worker puts a
	// List-Unsubscribe field naming that recipient in front of the
	// message (worker.Config.Unsubscribe). Nil is the tenant's setting,
	// which serve applies before Enqueue; Enqueue takes nil as no.
	ListUnsubscribe *bool
	// PerRecipient gives each recipient an envelope, and so an SMTP
	// transaction and a return path, of its own, as ListUnsubscribe does,
	// while the parts still join their notices into one per pass.
	// Options.PerRecipient sets it for a whole tenant (serve's: one whose
	// mail goes out with a return path, since one shared by several
	// recipients lets any of them forge a bounce or a complaint about
	// another, and have that address suppressed).
	PerRecipient bool

	// Frame, when not nil, is the buffer Body was read into: Body is its
	// tail, and the octets in front of Body are free. Enqueue writes an
	// inline envelope's JSON into them instead of copying the body after
	// it (see FrameHeadroom for how many to leave); it falls back to the
	// copy when they are too few. The caller must not use them afterwards.
	Frame []byte
}

// FrameHeadroom is how many free octets to leave in front of a body read
// into a Submission.Frame, for an envelope from from to rcpts (with DSN
// parameters when dsn): the size of its JSON with room for a long
// Message-ID and tenant. Too few costs only the copy the frame saves.
func FrameHeadroom(from string, rcpts []string, dsn bool) int {
	n := 640 + len(from)
	for _, r := range rcpts {
		n += len(r) + 3
		if dsn {
			n += 80 + 2*len(r)
		}
	}
	return n
}
