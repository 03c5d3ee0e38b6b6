package queue

import (
	"encoding/json"
	"time"
)

// Event types, the last-but-one token of outflow.events.<type>.<id>.
const (
	EventQueued    = "queued"    // accepted and stored
	EventDelivered = "delivered" // recipients accepted by the destination
	EventDeferred  = "deferred"  // transient failure, scheduled on the retry lane
	EventThrottled = "throttled" // throttled, scheduled on the rate-limit lane
	EventBounced   = "bounced"   // permanent failure for some recipients
	EventUnknown   = "unknown"   // no reply to the final dot
	EventHeld      = "held"      // unknown outcome held for an operator
	EventDead      = "dead"      // budget spent, moved to dead letters
	EventExpired   = "expired"   // max age passed, moved to dead letters
	EventDropped   = "dropped"   // removed by an operator
	EventReplayed  = "replayed"  // moved back to fresh work by an operator
	EventFastFwd   = "fast-forwarded"
	EventMalformed = "malformed" // an undecodable envelope was parked
)

// Event is one outcome, published as JSON to outflow.events.<type>.<id> and
// kept in the events stream, so a client can follow its mail and an
// operator can read one envelope's whole history.
type Event struct {
	Type       string    `json:"type"`
	Time       time.Time `json:"time"`
	ID         string    `json:"id"`
	MsgID      string    `json:"msg_id,omitempty"`
	Tenant     string    `json:"tenant,omitempty"`
	Dest       string    `json:"dest,omitempty"`
	Rcpts      int       `json:"rcpts,omitempty"`
	Size       int64     `json:"size,omitempty"`
	Attempt    int       `json:"attempt,omitempty"`
	Worker     string    `json:"worker_id,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	Recipients []string  `json:"recipients,omitempty"`
	// Decision is the full decision record (coordinator.Record as JSON) for
	// attempts; kept raw so queue does not depend on coordinator.
	Decision json.RawMessage `json:"decision,omitempty"`
}

// Event publishes ev asynchronously. Events are the record, not the state:
// losing one in a crash loses a history line, never mail, so the publisher
// does not wait for the acknowledgement.
func (q *Queue) Event(typ string, ev *Event) {
	ev.Type = typ
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		q.log.Error().Err(err).Msg("encode event")
		return
	}
	id := ev.ID
	if !validID(id) {
		id = "invalid"
	}
	if _, err := q.js.PublishAsync(subjEvents+typ+"."+id, b); err != nil {
		q.log.Warn().Err(err).Str("event", typ).Str("msg_id", ev.ID).Msg("publish event")
	}
}
