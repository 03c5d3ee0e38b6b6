package queue

import "time"

// RecipientOutcome is one recipient's state as its message's events leave
// it (RecipientOutcomes): GET /v1/messages/{id}'s outcomes, the console's
// message page.
type RecipientOutcome struct {
	Recipient string    `json:"recipient"`
	State     string    `json:"state"`
	Reason    string    `json:"reason,omitempty"`
	Time      time.Time `json:"time"`
}

// StateAfter is the state an event of type typ leaves its message (or
// recipient) in, from state prev: the type, or queued for one stored,
// replayed, released or fast-forwarded (put back on fresh work). ok is
// false for a notice sent, a complaint or an unsubscribe received: about
// the message, not what became of it. An attempt under way when the
// message was dropped writes its event after the dropped one, but not the
// step it names: held, deferred, throttled, dead or expired after dropped
// leave it dropped (delivered or bounced do not: that attempt's server
// took or refused the message).
func StateAfter(prev, typ string) (state string, ok bool) {
	switch typ {
	case EventDSN, EventComplained, EventUnsubscribed:
		return "", false
	case EventQueued, EventReplayed, EventReleased, EventFastFwd:
		return string(StateQueued), true
	case EventHeld, EventDeferred, EventThrottled, EventDead, EventExpired:
		if prev == EventDropped {
			return prev, true
		}
	}
	return typ, true
}

// LastOutcome is the state of a message no longer stored, its events
// (oldest first) read in order with StateAfter. A notification about it
// (dsn) comes after the outcome it reports, and says nothing new of the
// message. A last queued, replayed, released or fast-forwarded event
// means stored and being delivered (the last three put it back on fresh
// work): queued.
func LastOutcome(hist []Event) string {
	state := string(StateQueued)
	for _, ev := range hist {
		if s, ok := StateAfter(state, ev.Type); ok {
			state = s
		}
	}
	return state
}

// RecipientOutcomes reads each recipient's state from hist (oldest first,
// StateAfter of the events naming it), in the order the recipients first
// appear. One attempt can deliver some of a part's recipients and bounce
// others, which the message's one state cannot say. The reason is the
// event's, or reason's for it when reason is not nil (the console gives a
// delivery's reply from its decision record).
func RecipientOutcomes(hist []Event, reason func(Event) string) []RecipientOutcome {
	var out []RecipientOutcome
	at := map[string]int{}
	for _, ev := range hist {
		why := ev.Reason
		if reason != nil {
			why = reason(ev)
		}
		for _, r := range ev.Recipients {
			i, seen := at[r]
			prev := ""
			if seen {
				prev = out[i].State
			}
			state, ok := StateAfter(prev, ev.Type)
			if !ok {
				continue
			}
			o := RecipientOutcome{Recipient: r, State: state, Reason: why, Time: ev.Time}
			if seen {
				out[i] = o
				continue
			}
			at[r] = len(out)
			out = append(out, o)
		}
	}
	return out
}
