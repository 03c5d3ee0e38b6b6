package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// Event subjects: outflow.events.<type>.<tenant shard>.<id shard>. The
// tenant shard is two hex digits of a hash of the event's tenant, one of
// 64 (eventTenantShard); the id shard three hex digits of a hash of the
// envelope id, one of 1,024 (eventIDShard). The id itself is in the
// HdrEventID header and the JSON, the tenant in the JSON.
//
// Not outflow.events.<type>.<id>: nats-server indexes every subject of a
// stream in memory, so a subject per message would make the events stream
// cost server memory per delivered message for as long as events are kept
// (docs/benchmarks.md, "Memory that stays behind delivered mail"). With
// shards the stream has at most 65,536 subjects per type whatever the
// volume and the number of tenants.
//
// The tenant's shard is what a webhook endpoint's consumer filters on
// (EventTenantFilters): the server hands it its own tenant's events and
// those of the tenants that share their shard, not every tenant's. Each
// event a consumer is handed and drops costs a delivery, a decode and an
// acknowledgement, 55 µs of CPU (docs/benchmarks.md, "Webhook endpoints
// of many tenants"). `queue history <id>` receives the id's shard of every
// tenant shard, 1/1,024 of the stream, and keeps the events that carry the
// id (the server walks the stream to find them: see History).
//
// Events written before this layout are on outflow.events.<type>.<shard>,
// the shard three hex digits of the id's hash, one of 4,096
// (legacyEventShard). History and the webhook consumers read that layout
// too, until the events stream's max age (`--events-max-age`, 7 days) has
// taken its last events, and while a daemon of an older release in the
// fleet still writes it.
const (
	eventTenantShards = 64
	eventIDShards     = 1024
	legacyEventShards = 4096
	// HdrEventID names the envelope an event belongs to.
	HdrEventID = "Outflow-Event-Id"
)

// appendShard appends n, under 16^digits, as digits hex digits.
func appendShard(b []byte, n uint32, digits int) []byte {
	const hex = "0123456789abcdef"
	for i := digits - 1; i >= 0; i-- {
		b = append(b, hex[n>>(4*i)&0xf])
	}
	return b
}

// fnv32 is the 32-bit FNV-1a hash of s, which the shards are taken from.
func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// The shard tokens of an event's subject (eventSubject, historyFilters).
func eventTenantShard(tenant string) string {
	return string(appendShard(nil, fnv32(tenant)%eventTenantShards, 2))
}

func eventIDShard(id string) string { return string(appendShard(nil, fnv32(id)%eventIDShards, 3)) }

// legacyEventShard is the shard token of id's events in the layout before
// tenant shards (outflow.events.<type>.<shard>).
func legacyEventShard(id string) string {
	return string(appendShard(nil, fnv32(id)%legacyEventShards, 3))
}

// Event types, the third token of an event's subject.
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
	// EventReleased: a recovered destination's deferred or throttled
	// envelope was given a new time at the destination's rate
	// (ReleaseDest); Reason has the time written and its place in the
	// release.
	EventReleased  = "released"
	EventMalformed = "malformed" // an undecodable envelope was parked
	// EventComplained: a recipient reported the delivered message as
	// spam (an ARF feedback report received at the return path, package
	// bounce); Reason is the feedback type.
	EventComplained = "complained"
	// EventUnsubscribed: a recipient followed the message's one-click
	// unsubscribe link (RFC 8058, package unsubscribe) and went on the
	// tenant's suppression list.
	EventUnsubscribed = "unsubscribed"
	// EventDSN: a delivery status notification about this envelope was
	// queued; Reason names its action, its queue id and its recipient.
	EventDSN = "dsn"
	// EventLearned: a destination's learned limits changed (seeded, cut,
	// stepped up, forgotten). Its id is the destination as a subject token,
	// its state the destination's shared state after the change.
	EventLearned = "dest-learned"
)

// EventTypes are the types of every event outflow publishes (webhook
// endpoints' test events aside), for the look-ups that take types to refuse
// a misspelt one rather than find nothing.
var EventTypes = []string{EventQueued, EventDelivered, EventDeferred, EventThrottled, EventBounced, EventUnknown,
	EventHeld, EventDead, EventExpired, EventDropped, EventReplayed, EventFastFwd, EventReleased, EventMalformed, EventComplained,
	EventUnsubscribed, EventDSN, EventSuppressed, EventLearned}

// CheckEventTypes returns an error naming the first of types that is not
// in EventTypes.
func CheckEventTypes(types []string) error {
	for _, t := range types {
		if !slices.Contains(EventTypes, t) {
			return fmt.Errorf("%q is not an event type (want some of %s)", t, strings.Join(EventTypes, ","))
		}
	}
	return nil
}

// Event is one outcome, published as JSON to eventSubject's subject and
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
	// Async marks an outcome reported after the destination accepted the
	// message: a bounce or a complaint mailed back to the return path
	// (package bounce), not a reply to an attempt.
	Async bool `json:"async,omitempty"`
	// Notify is set on the delivered event of an envelope that went out
	// with a return path and whose sender gets notices: what a notice
	// needs when a report on a recipient (a bounce, a delay, a success)
	// comes back to the return path later, by which time the envelope is
	// gone (package bounce hands it to the worker's notices). Nil on
	// every other event.
	Notify *Notify `json:"notify,omitempty"`
	// Decision is the full decision record (backoff.Record as JSON) for
	// attempts; kept raw so that queue stores it without decoding it.
	Decision json.RawMessage `json:"decision,omitempty"`
	// DecisionMarshaled says Decision is what json.Marshal wrote (compact,
	// valid, escaped as encoding/json escapes), as backoff.Record's
	// MarshalJSON writes it: the event is then encoded without parsing
	// Decision again. Not part of the event.
	DecisionMarshaled bool `json:"-"`
	// State is a destination's shared throttle state after the change
	// (dest-learned events); kept raw like Decision.
	State json.RawMessage `json:"state,omitempty"`
}

// Notify is what the notices about a delivered envelope need when a report
// on its recipients comes back later (Event.Notify): the sender the
// application gave (outflow's return path replaced it in MAIL FROM), the
// submitter's ENVID, and the delivered recipients a later report can still
// owe a notice, with the kinds and their ORCPT. RET is not kept: a notice
// can return only the header the reporting server sent back.
type Notify struct {
	Sender    string    `json:"sender"`
	Submitted time.Time `json:"submitted"`
	// Source is how the message came (Envelope.Source): whether the
	// tenant's notices apply is asked again when the report comes.
	Source string `json:"source,omitempty"`
	// MessageID is the original's Message-ID field, for the notice's
	// In-Reply-To.
	MessageID string `json:"message_id,omitempty"`
	// EnvID is the submitter's ENVID, for Original-Envelope-Id.
	EnvID string `json:"envid,omitempty"`
	// Rcpts are the recipients of the event a later report can still owe
	// a notice.
	Rcpts []NotifyRcpt `json:"rcpts"`
}

// NotifyRcpt is one recipient of a Notify, with the DSN parameters it
// was submitted with.
type NotifyRcpt struct {
	Rcpt string `json:"rcpt"`
	// Notify is the notices a later report can still owe the recipient,
	// written out (FAILURE, DELAY, SUCCESS): its NOTIFY, with failures and
	// delays for none given, and without SUCCESS when the server that took
	// it had no DSN (its relayed notice went at delivery). Empty reads as
	// RcptDSN.Notify does: failures and delays.
	Notify    []string `json:"notify,omitempty"`
	ORcpt     string   `json:"orcpt,omitempty"`
	ORcptType string   `json:"orcpt_type,omitempty"`
}

// PublishEvent publishes ev and waits until the events stream has stored
// it: for an outcome that exists nowhere else, such as a bounce received
// by mail, which its sender is told was taken (250) only once it is
// recorded.
func (q *Queue) PublishEvent(ctx context.Context, typ string, ev *Event) error {
	ev.Type = typ
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encode %s event: %w", typ, err)
	}
	m := nats.NewMsg(eventSubject(typ, ev.Tenant, ev.ID))
	m.Data = b
	if validID(ev.ID) {
		m.Header.Set(HdrEventID, ev.ID)
	}
	q.count(OpPublishEvent)
	if _, err := q.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("publish %s event: %w", typ, err)
	}
	return nil
}

// SyncOutcomes returns once what this process has stored in the events
// stream and the suppression list is on disk (a group commit, with
// --durability disk; on a cluster an acknowledged write is already held by
// a majority): for outcomes that exist nowhere else, such as a bounce
// received by mail, whose sender is told 250 only after it.
func (q *Queue) SyncOutcomes(ctx context.Context) error {
	return q.durable(ctx, StreamEvents, kvStream(BucketSuppressions))
}

// Event publishes ev asynchronously. Events are the record, not the state:
// losing one in a crash loses a history line, never mail, so the publisher
// does not wait for the acknowledgement. ev is encoded before Event
// returns and not kept: the caller may reuse what it points to (the
// worker reuses the buffer of Decision).
func (q *Queue) Event(typ string, ev *Event) {
	ev.Type = typ
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	o := newOutEvent()
	b, ok := ev.appendJSON(o.msg.Data)
	if !ok {
		var err error
		if b, err = json.Marshal(ev); err != nil {
			o.release()
			q.log.Error().Err(err).Msg("encode event")
			return
		}
	}
	o.msg.Subject, o.msg.Data = eventSubject(typ, ev.Tenant, ev.ID), b
	if validID(ev.ID) { // an undecodable envelope's id may be anything; the JSON escapes it
		o.ids[0] = ev.ID
		o.msg.Header = o.hdr
	}
	q.count(OpPublishEvent)
	if err := q.ev.publishOut(o); err != nil {
		q.log.Warn().Err(err).Str("event", typ).Str("msg_id", ev.ID).Msg("publish event")
	}
}
