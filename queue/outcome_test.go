package queue

import "testing"

// A bounce mailed back after delivery makes the message bounced; a
// complaint about it, like a notification, leaves it delivered.
func TestLastOutcome(t *testing.T) {
	ev := func(typ string, async bool) Event { return Event{Type: typ, Async: async} }
	for _, tc := range []struct {
		hist []Event
		want string
	}{
		{[]Event{ev(EventQueued, false), ev(EventDelivered, false), ev(EventBounced, true)}, EventBounced},
		{[]Event{ev(EventQueued, false), ev(EventDelivered, false), ev(EventComplained, true)}, EventDelivered},
		{[]Event{ev(EventQueued, false), ev(EventBounced, false), ev(EventDSN, false)}, EventBounced},
		{[]Event{ev(EventQueued, false), ev(EventDelivered, false), ev(EventUnsubscribed, true)}, EventDelivered},
		// Put back on fresh work by an operator or a recovered
		// destination, and not yet picked up: queued, not a state of its
		// own that the API does not document.
		{[]Event{ev(EventQueued, false), ev(EventThrottled, false), ev(EventReleased, false)}, string(StateQueued)},
		{[]Event{ev(EventQueued, false), ev(EventDeferred, false), ev(EventFastFwd, false)}, string(StateQueued)},
		// Dropped while an attempt was under way: the attempt's event
		// comes after, and its step was not written; its server's
		// delivery or refusal stands.
		{[]Event{ev(EventQueued, false), ev(EventDropped, false), ev(EventHeld, false)}, EventDropped},
		{[]Event{ev(EventQueued, false), ev(EventDropped, false), ev(EventDeferred, false)}, EventDropped},
		{[]Event{ev(EventQueued, false), ev(EventDropped, false), ev(EventExpired, false)}, EventDropped},
		{[]Event{ev(EventQueued, false), ev(EventDropped, false), ev(EventDelivered, false)}, EventDelivered},
	} {
		if got := LastOutcome(tc.hist); got != tc.want {
			t.Errorf("%v: %s, want %s", tc.hist, got, tc.want)
		}
		for i := range tc.hist {
			tc.hist[i].Recipients = []string{"r@x.test"}
		}
		if out := RecipientOutcomes(tc.hist, nil); len(out) != 1 || out[0].State != tc.want {
			t.Errorf("%v: recipient outcomes %+v, want %s", tc.hist, out, tc.want)
		}
	}
}
