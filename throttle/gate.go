package throttle

import (
	"context"
	"strings"
	"time"

	"github.com/outflow/outflow/classify"
)

// Gate is everything a delivery worker gets from the throttle, in one
// place: the destination a domain belongs to, whether an attempt may start
// now (in the tenant's share, from one egress address), the attempt's own
// limits (on the Permit), where throttled mail goes in the destination's
// virtual queue, and how far this worker's clock is from the NATS
// server's. Throttle implements it for the fleet; OpenGate admits
// everything and knows nothing.
//
// In every method, tenant is the envelope's tenant ("" for none): a place
// in the virtual queue is in that tenant's share, so that one tenant's
// backlog does not push another's mail back. source is the egress address
// the attempt goes out from ("" without egress addresses): with one, the
// limits and state are the (destination, source) pair's (see PairName).
type Gate interface {
	// Group maps a recipient domain to the destination whose limits and
	// shared state apply (the domain itself, or a provider group).
	Group(domain string) string
	// Admit either grants a Permit, to be finished with the attempt's
	// results, or refuses with the time to come back and a reason for the
	// log. A refusal is outflow's own signal: it costs no attempt and
	// never feeds automation.
	Admit(ctx context.Context, domain, tenant, source string) (Permit, Refusal)
	// Pace gives an envelope that a throttled reply deferred its place in
	// the destination's queue of throttled mail, no earlier than
	// earliest. ok is false when the destination has no rate: the caller
	// keeps its backoff draw. by describes the rate for the decision
	// record ("10.00/s learned").
	Pace(domain, tenant, source string, earliest time.Time) (at time.Time, by string, ok bool)
	// ClockOffset is how far the NATS server's clock is ahead of this
	// worker's (negative: behind); known is false until it is measured. A
	// schedule fires on the server's clock: add the offset to a time on
	// this worker's clock to get the time to write.
	ClockOffset() (offset time.Duration, known bool)
}

// Permit is one admitted attempt. Done reports its outcome (one result per
// recipient; nil when no attempt was made after all) so the throttle can
// adapt rates, trip breakers and run automation rules.
//
// Limits are the destination's configured limits that apply to the
// attempt itself (the sender's messages per connection); the zero Limits
// when the gate has none.
type Permit interface {
	Done(results []classify.Result)
	Limits() Limits
}

// Refusal, when Until is non-zero, means "not now": come back at Until.
type Refusal struct {
	Until  time.Time
	Reason string // "suspended", "breaker-open", "rate", "conns", "window", …
	// Detail says more for an operator: for "suspended", what was
	// suspended and why ("a.test@192.0.2.10: source blocked (…): 550 …").
	Detail string
}

// Public is Detail as the mail's tenant and sender may read it (the
// deferral's reply, its event, a delay notice): a source block's reason
// without the reply it quotes. A suspension is the destination's, and the
// reply that set it answered another message, often another tenant's, and
// may quote its envelope; operators read it whole in the logs and in
// `dest list`.
func (r Refusal) Public() string {
	d := r.Detail
	i := strings.Index(d, ": "+sourceBlockReason)
	if i < 0 {
		return d
	}
	rest := d[i+2+len(sourceBlockReason):]
	if j := strings.Index(rest, "): "); j >= 0 {
		return d[:i+2+len(sourceBlockReason)+j+1]
	}
	return d
}

// OpenGate admits everything: no limits configured, no rates to pace by,
// no clock measured.
type OpenGate struct{}

// Group returns the domain itself.
func (OpenGate) Group(d string) string { return d }

// Admit always grants, with no limits on the attempt.
func (OpenGate) Admit(context.Context, string, string, string) (Permit, Refusal) {
	return nopPermit{}, Refusal{}
}

// Pace gives no place: the caller keeps its backoff draw.
func (OpenGate) Pace(string, string, string, time.Time) (time.Time, string, bool) {
	return time.Time{}, "", false
}

// ClockOffset is unknown.
func (OpenGate) ClockOffset() (time.Duration, bool) { return 0, false }

type nopPermit struct{}

func (nopPermit) Done([]classify.Result) {}
func (nopPermit) Limits() Limits         { return Limits{} }

var (
	_ Gate = (*Throttle)(nil)
	_ Gate = OpenGate{}
)
