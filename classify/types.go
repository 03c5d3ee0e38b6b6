package classify

import "time"

// Class is what a reply means for the message: the five outcomes every
// attempt ends in.
type Class uint8

const (
	// Delivered: a 2xx after the final dot (or, per recipient, to RCPT when
	// the transaction then completes).
	Delivered Class = iota + 1
	// Transient: worth retrying on the retry lane with backoff.
	Transient
	// Throttled: the receiver asked us to slow down; goes to the rate-limit
	// lane and slows every worker for the destination; the attempt budget is
	// not spent.
	Throttled
	// Permanent: retrying will not help; bounce.
	Permanent
	// Unknown: no reply to the final dot; the message may or may not have
	// been accepted.
	Unknown
)

// Scope says what a result is about, so the caller knows how far to apply
// it: to one recipient, the whole message, the sending tenant, every message
// for the destination, or just this connection.
type Scope uint8

const (
	// ScopeRecipient: about one recipient (unknown user, full mailbox, a
	// per-recipient rate); the message's other recipients are unaffected.
	ScopeRecipient Scope = iota + 1
	// ScopeMessage: about this message for every recipient (too big,
	// content or authentication of its From, no reply to its final dot).
	ScopeMessage
	// ScopeTenant: about the sending tenant's account or setup (smarthost
	// AUTH refused, a relay's daily quota, an unverified sender identity).
	ScopeTenant
	// ScopeDestination: about every message to the destination (a
	// throttle, our IP blocked, the domain does not exist).
	ScopeDestination
	// ScopeConnection: about this connection only (421 closing, timeout,
	// refused connect); another connection or MX may do.
	ScopeConnection
	// ScopeSource: about the address the mail was sent from, at this
	// destination: a DNS blocklist or a provider's block list names our
	// IP, or the receiver will not take its reverse DNS. Another egress
	// address may well be taken, so with several the worker defers the
	// message and the throttle suspends the (destination, source) pair
	// (docs/delivery.md, "Egress addresses").
	ScopeSource
)

// Stage is the point in the SMTP conversation a reply or transport event
// belongs to. The same code means different things at different stages
// (RFC 5321 4.5.3.1.10: 552 to RCPT is a 452).
type Stage uint8

const (
	StageUnknown  Stage = iota
	StageDNS            // MX / address lookup
	StageConnect        // TCP connect
	StageGreeting       // the 220 banner
	StageEHLO           // EHLO / HELO
	StageTLS            // STARTTLS and the handshake
	StageAuth           // AUTH to a smarthost
	StageMail           // MAIL FROM
	StageRcpt           // RCPT TO
	StageData           // the DATA command (before the body)
	StageDataEnd        // the reply to the final dot
)

// Event is a transport-level outcome that carries no SMTP reply.
type Event uint8

const (
	EventNone        Event = iota
	EventConnRefused       // connection refused or reset before DATA
	EventTimeout           // no answer within the step's timeout
	EventConnLost          // connection closed or reset mid-conversation
	EventTLSFailure        // STARTTLS handshake failed or certificate refused
	EventDNSNXDomain       // the domain does not exist
	EventDNSServFail       // DNS temporary failure (SERVFAIL, timeout)
	EventNullMX            // RFC 7505 null MX: the domain accepts no mail
	EventLocal             // outflow refused locally (suspension, breaker); never feeds automation
)

// Input is one thing to classify: either an SMTP reply (Code != 0) or a
// transport Event, at a Stage. Raw, when set, is the reply exactly as the
// server sent it (possibly multi-line with continuation prefixes) and is
// parsed when Code is zero.
type Input struct {
	Stage    Stage
	Code     int    // basic reply code, e.g. 421; 0 when unknown or Event is set
	Enhanced string // enhanced status code, e.g. "4.7.28"; "" when absent
	Text     string // reply text without code prefixes
	Raw      string // the reply as received, if Code is not set
	Event    Event
}

// Result is the classification of one Input.
type Result struct {
	Class      Class
	Scope      Scope
	Rule       string        // name of the rule that matched, e.g. "gmail-rate-4.7.28"
	Code       int           // parsed basic code (0 for transport events)
	Enhanced   string        // parsed enhanced code ("" when absent or invalid)
	Text       string        // reply text (or the event description)
	RetryAfter time.Duration // server hint ("try again in 92 seconds"), else the rule's retry_after floor; 0 when none or not transient/throttled
}
