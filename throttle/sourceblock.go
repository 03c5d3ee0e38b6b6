package throttle

import (
	"strings"
	"time"

	"github.com/outflow/outflow/classify"
)

// A reply scoped to the source (classify.ScopeSource: "Client host
// [192.0.2.10] blocked using zen.spamhaus.org", Microsoft's S3150, Gmail's
// 5.7.25 on a missing PTR record) says the receiver will take nothing from
// that address, whatever the message. With egress addresses the attempt
// went out from one of several, so the (destination, source) pair is
// suspended for Config.SourceBlockHold, like `outflow dest suspend
// DEST@SOURCE`, and the destination's mail goes out from the tenant's
// other addresses at once (the worker defers the refused message instead
// of bouncing it). When the hold ends, the next attempt from the address
// shows whether the block is gone; another such reply suspends it again.
// Without egress addresses there is nothing else to send from: the reply
// bounces its mail, and nothing is suspended.
//
// The pair suspended is the recipient domain's, not its provider group's:
// one Microsoft 365 customer's own block list ("blocked using Customer
// Block list") is that customer's, and suspending microsoft@SOURCE held
// the tenant's mail to every domain Microsoft hosts, outlook.com
// included. Inside a group the domain's pair holds above the group's
// (own.go); each domain that refuses the address is suspended in turn.

// blockSource suspends d, a (domain, source) pair, after why, a reply
// about its source.
func (t *Throttle) blockSource(d *dest, why classify.Result, now time.Time) {
	if _, src := SplitPair(d.name); src == "" {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	until := now.Add(t.cfg.SourceBlockHold)
	// The classifier's rule: the worker's deferral adds "/other-source".
	rule, _, _ := strings.Cut(why.Rule, "/")
	reason := sourceBlockReason + rule + "): " + replyLine(why)
	fn := suspendTill(until, reason)
	if !fn(&d.state, now) {
		return
	}
	t.enqueue(op{d: d, change: "suspend", fn: fn, after: func(b, a DestState) {
		t.transition(d.name, "suspend", fmtUntil(b.SuspendedUntil, now), "suspended until "+a.SuspendedUntil.Format(time.RFC3339), reason)
	}})
}

// sourceBlockReason starts the reason of a suspension blockSource wrote.
const sourceBlockReason = "source blocked ("

// SourceBlocked reports whether domain refused source as blocked: the
// domain's pair, or its provider group's, is suspended by blockSource
// now. The worker asks it before deferring a message refused as from a
// blocked address, to know whether another address can take it. Another
// suspension (an automation rule's 15 minutes after throttles, an
// operator's) ends and the address is then taken: the message waits for
// it rather than bounce.
func (t *Throttle) SourceBlocked(domain, source string) bool {
	group, d := t.Group(domain), NormalizeDest(domain)
	for _, name := range []string{PairName(d, source), PairName(group, source)} {
		if r, suspended := t.wholeSuspended(name); suspended && strings.HasPrefix(r.Detail, name+": "+sourceBlockReason) {
			return true
		}
	}
	return false
}

// maxReasonReply bounds the reply quoted in a suspension's reason: dest
// list shows it, and providers' block replies run to several hundred
// bytes of links and tracking ids.
const maxReasonReply = 160

// replyLine is r as a reply line ("550 5.7.1 text", replyText), cut at
// maxReasonReply bytes.
func replyLine(r classify.Result) string {
	line := replyText(r)
	if len(line) > maxReasonReply {
		cut := maxReasonReply
		for cut > 0 && line[cut]&0xC0 == 0x80 { // not inside a UTF-8 sequence
			cut--
		}
		line = line[:cut] + "…"
	}
	return line
}
