package queue

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"time"
)

// OperatorAdmin is the worker_id of an operator's event (replayed,
// dropped, fast-forwarded) when the caller names nobody: the console, and
// callers of Replay, Drop and FastForward. `outflow queue` names the
// operator as `outflow dest` does, "admin:USER@HOST".
const OperatorAdmin = "admin"

// OperatorEventTypes are the events of a person's action on a message
// (an operator's, or a tenant's cancellation through the API): each
// carries who in worker_id and what changed in reason, and the daemons
// log each once (`outflow serve`'s operator log).
var OperatorEventTypes = []string{EventReplayed, EventDropped, EventFastFwd}

// operator is by, or OperatorAdmin when it is empty.
func operator(by string) string {
	if by == "" {
		return OperatorAdmin
	}
	return by
}

// wasLine says where it was before an operator's action: its state, the
// attempts it had made and its schedule ("was dead after 4 attempt(s)",
// "was deferred after 1 attempt(s), next attempt 2026-12-01T10:00:00Z").
func wasLine(it *Item) string {
	st := string(it.State)
	if it.State == StateUnknown {
		st = "held (outcome unknown)"
	}
	s := "was " + st
	if a := it.Env.Attempt; a > 0 {
		s += fmt.Sprintf(" after %d attempt(s)", a)
		if n := it.Env.ThrottleCount; n > 0 {
			s += fmt.Sprintf(" (%d throttled)", n)
		}
	}
	switch {
	case it.Due:
		s += ", due"
	case !it.NextAt.IsZero():
		s += ", next attempt " + it.NextAt.UTC().Format(time.RFC3339)
	}
	return s
}

// replayReason is a replayed event's reason: that the budget was reset,
// from what, and what else the replay changed ("attempt budget reset: was
// dead after 4 attempt(s); replay 1, deadline 2026-12-02T10:00:00Z;
// headers set: Subject"). Header values are not given: they are the
// tenant's content.
func replayReason(it *Item, e *Envelope, opts ReplayOptions) string {
	parts := []string{"attempt budget reset: " + wasLine(it),
		fmt.Sprintf("replay %d, deadline %s", e.Replays, e.Deadline.UTC().Format(time.RFC3339))}
	set, removed := editedHeaderNames(opts.EditHeaders)
	if len(set) > 0 {
		parts = append(parts, "headers set: "+strings.Join(set, ", "))
	}
	if len(removed) > 0 {
		parts = append(parts, "headers removed: "+strings.Join(removed, ", "))
	}
	if opts.IncludeSuppressed {
		parts = append(parts, "suppression list not checked (include-suppressed)")
	}
	return strings.Join(parts, "; ")
}

// dropReason is a dropped event's reason: where the message was.
func dropReason(it *Item) string { return wasLine(it) }

// fastForwardReason is a fast-forwarded event's reason: the schedule it
// had on lane, and that its next attempt bypasses the throttle.
func fastForwardReason(it *Item, lane Lane) string {
	return wasLine(it) + " on the " + string(lane) + " lane; due now, a probe that bypasses the destination's throttle"
}

// editedHeaderNames are the field names an --edit-headers block sets and
// removes, each once, in the order first named (EditHeaders' syntax;
// lines it would refuse never get here).
func editedHeaderNames(edits []byte) (set, removed []string) {
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(edits))
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || seen[strings.ToLower(name)] {
			continue
		}
		seen[strings.ToLower(name)] = true
		if strings.Trim(value, " \t") == "" {
			removed = append(removed, name)
		} else {
			set = append(set, name)
		}
	}
	return set, removed
}

// ForTenant is who did an event as its tenant is shown it (the API to a
// tenant's key, webhooks): an operator's action says OperatorAdmin, not
// the person and machine (admin:USER@HOST, which the operator's own views
// give: `queue history`, the console, an admin key, the daemons' log).
func ForTenant(worker string) string {
	if strings.HasPrefix(worker, OperatorAdmin+":") {
		return OperatorAdmin
	}
	return worker
}

// EventsForTenant applies ForTenant to evs in place and returns them.
func EventsForTenant(evs []Event) []Event {
	for i := range evs {
		evs[i].Worker = ForTenant(evs[i].Worker)
	}
	return evs
}
