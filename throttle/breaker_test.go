package throttle

import (
	"testing"

	"github.com/outflow/outflow/classify"
)

func TestOutcomeOf(t *testing.T) {
	perm := classify.Result{Class: classify.Permanent, Scope: classify.ScopeRecipient, Rule: "user-unknown", Code: 550}
	perConn := classify.Result{Class: classify.Throttled, Scope: classify.ScopeConnection, Rule: "too-many-messages-per-connection", Code: 421}
	greet := classify.Result{Class: classify.Transient, Scope: classify.ScopeConnection, Rule: "no-rule", Code: 421}
	grey := classify.Result{Class: classify.Transient, Scope: classify.ScopeRecipient, Rule: "greylist", Code: 450}
	perRcpt := classify.Result{Class: classify.Throttled, Scope: classify.ScopeRecipient, Rule: "mailbox-rate", Code: 452}
	perTenant := classify.Result{Class: classify.Throttled, Scope: classify.ScopeTenant, Rule: "sending-quota", Code: 550}
	for _, c := range []struct {
		name string
		res  []classify.Result
		want attemptOutcome
	}{
		{"nil", nil, attemptOutcome{}},
		{"delivered", []classify.Result{resDelivered}, attemptOutcome{reached: true, answered: true, delivered: true}},
		{"conn failure", []classify.Result{resConnFail, resConnFail}, attemptOutcome{failed: true}},
		{"421 greeting", []classify.Result{greet}, attemptOutcome{failed: true}},
		{"bounce is an answer", []classify.Result{perm}, attemptOutcome{reached: true, answered: true}},
		{"greylisting is an answer", []classify.Result{grey}, attemptOutcome{reached: true, answered: true}},
		{"a mailbox's throttle is no answer", []classify.Result{perRcpt}, attemptOutcome{reached: true}},
		{"a tenant's throttle slows no one else", []classify.Result{perTenant}, attemptOutcome{reached: true}},
		{"throttle", []classify.Result{resThrottled}, attemptOutcome{reached: true, throttled: true, why: resThrottled}},
		{"too many connections", []classify.Result{resConn, resThrottled}, attemptOutcome{reached: true, throttled: true, connThrottled: true, why: resThrottled, connWhy: resConn}},
		{"per-connection throttle", []classify.Result{perConn}, attemptOutcome{reached: true}},
		{"local only", []classify.Result{resLocal}, attemptOutcome{}},
		{"mixed", []classify.Result{resConnFail, resDelivered}, attemptOutcome{reached: true, answered: true, delivered: true}},
	} {
		if got := outcomeOf(c.res); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
