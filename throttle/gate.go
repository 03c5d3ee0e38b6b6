package throttle

import (
	"context"
	"time"

	"github.com/outflow/outflow/classify"
)

// Gate is the throttle's answer to "may I send to this destination now?".
// Admit either grants a Permit, to be finished with the attempt's results,
// or refuses with the time to come back and a reason for the log. A refusal
// is outflow's own signal: it costs no attempt and never feeds automation.
type Gate interface {
	Admit(ctx context.Context, domain string) (Permit, Refusal)
	// Group maps a recipient domain to the destination whose limits and
	// shared state apply (the domain itself, or a provider group).
	Group(domain string) string
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
	Reason string // "suspended", "breaker-open", "rate", "conns", …
}

// OpenGate admits everything: no limits configured.
type OpenGate struct{}

// Admit always grants.
func (OpenGate) Admit(context.Context, string) (Permit, Refusal) { return nopPermit{}, Refusal{} }

// Group returns the domain itself.
func (OpenGate) Group(d string) string { return d }

type nopPermit struct{}

func (nopPermit) Done([]classify.Result) {}
func (nopPermit) Limits() Limits         { return Limits{} }
