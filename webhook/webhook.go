package webhook

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/queue"
)

// BucketEndpoints is the key-value bucket of webhook endpoints, one entry
// per endpoint id, holding an Endpoint (with its secret).
const BucketEndpoints = "outflow_webhooks"

// BucketDead is the key-value bucket of webhook dead letters: events an
// endpoint refused for good or whose retry budget ran out, keyed
// "<endpoint id>.<webhook-id>". Each expires DeadMaxAge after it was
// parked (the bucket's TTL).
const BucketDead = "outflow_webhook_dead"

// DefaultDeadMaxAge is how long a webhook dead letter is kept, as long as
// mail's dead letters (queue.Options.DeadMaxAge): 14 days.
const DefaultDeadMaxAge = 14 * 24 * time.Hour

// EventReplay is the type of a dead letter moved back into the events
// stream by `webhook replay`: outflow.events.webhook-replay.<endpoint id>,
// its data a DeadLetter, delivered to that endpoint only with its original
// webhook-id and body.
const EventReplay = "webhook-replay"

// replaySubject is where endpoint's replays wait in the events stream.
func replaySubject(endpoint string) string { return queue.EventKeySubject(EventReplay, endpoint) }

// SecretPrefix starts every signing secret (Standard Webhooks).
const SecretPrefix = "whsec_"

// DefaultEvents are the event types an endpoint receives when it names
// none: every outcome that ends or changes a recipient's story, dropped
// (the API's DELETE, an operator's `queue drop`) among them, without which
// an application that follows its mail by webhooks waited for ever on a
// message the API already called dropped.
var DefaultEvents = []string{queue.EventDelivered, queue.EventBounced, queue.EventDeferred,
	queue.EventThrottled, queue.EventDead, queue.EventSuppressed, queue.EventComplained, queue.EventUnsubscribed,
	queue.EventDropped}

// ErrNoEndpoint is returned for an endpoint id that does not exist.
var ErrNoEndpoint = errors.New("no such webhook endpoint")

// Endpoint is one registered webhook.
type Endpoint struct {
	ID      string    `json:"id"`
	Tenant  string    `json:"tenant"`
	URL     string    `json:"url"`
	Events  []string  `json:"events"`
	Secret  string    `json:"secret,omitempty"` // whsec_<base64 of 24 random bytes>; cleared, and left out, where an endpoint is listed
	Created time.Time `json:"created"`
	// PrevSecret, after a rotation (Store.Rotate), is the secret before
	// it, which deliveries are also signed with until PrevUntil: the
	// receiver can take the new secret into use meanwhile, with no
	// delivery that it cannot verify. Cleared where listed, as Secret.
	PrevSecret string    `json:"prev_secret,omitempty"`
	PrevUntil  time.Time `json:"prev_until,omitzero"`
	// Disabled is set by a 410 Gone; Replay clears it.
	Disabled       bool   `json:"disabled,omitempty"`
	DisabledReason string `json:"disabled_reason,omitempty"`
}

// consumerName is the durable consumer of endpoint id on the events stream.
func consumerName(id string) string { return "outflow-webhook-" + id }

// Store holds the endpoints, their dead letters and their breakers.
type Store struct {
	kv       jetstream.KeyValue
	dead     jetstream.KeyValue
	breakers jetstream.KeyValue
	events   EventStream
}

// EventStream is what webhooks need of the events stream: each endpoint's
// durable consumer, and the replays published back into it. *queue.Queue.
type EventStream interface {
	EventConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error)
	DeleteEventConsumer(ctx context.Context, name string) error
	PublishKeyedEvent(ctx context.Context, typ, key string, data []byte, msgID string) error
}

// Bucketer opens key-value buckets and reaches the events stream:
// *queue.Queue.
type Bucketer interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
	EventStream
}

// Open opens (creating them if need be) the endpoint, dead-letter and
// breaker buckets, dead letters kept DefaultDeadMaxAge.
func Open(ctx context.Context, b Bucketer) (*Store, error) {
	return OpenRetention(ctx, b, DefaultDeadMaxAge)
}

// OpenRetention is Open with dead letters kept deadMaxAge (the daemon's
// webhook-dead-max-age; it sets the bucket's TTL where b may set up
// buckets, and an admin connection leaves it as the daemon made it).
func OpenRetention(ctx context.Context, b Bucketer, deadMaxAge time.Duration) (*Store, error) {
	if deadMaxAge <= 0 {
		deadMaxAge = DefaultDeadMaxAge
	}
	kv, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketEndpoints, Description: "outflow webhook endpoints", History: 1})
	if err != nil {
		return nil, err
	}
	dead, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketDead, Description: "outflow webhook dead letters", History: 1,
		TTL: deadMaxAge})
	if err != nil {
		return nil, err
	}
	br, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketBreakers, Description: "outflow webhook breakers", History: 1})
	if err != nil {
		return nil, err
	}
	return &Store{kv: kv, dead: dead, breakers: br, events: b}, nil
}

// Breaker returns endpoint id's breaker as the fleet shares it.
func (s *Store) Breaker(ctx context.Context, id string) (BreakerState, error) {
	var st BreakerState
	e, err := s.breakers.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	err = json.Unmarshal(e.Value(), &st)
	return st, err
}

// CheckURL accepts absolute http and https URLs with a host, and nothing
// else (no user:password credentials in the URL either). A token in the
// query or the path is the endpoint's business and is accepted: a failed
// POST's error leaves both out of the log and the dead letters (redactURL).
func CheckURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("webhook URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("webhook URL %q: want http or https", raw)
	}
	if u.Host == "" || u.Hostname() == "" {
		return fmt.Errorf("webhook URL %q: no host", raw)
	}
	if u.User != nil {
		return fmt.Errorf("webhook URL: credentials in the URL are not allowed")
	}
	return nil
}

// LiteralPrivate reports whether a checked URL names, as an IP literal or
// as localhost, an address the daemon refuses without
// webhook-allow-private; `webhook add` says so at once rather than the
// endpoint's first event going to dead letters. A name that resolves to
// such an address is only found at dial time.
func LiteralPrivate(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	h := u.Hostname()
	if a, err := netip.ParseAddr(h); err == nil {
		return private(a)
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// Add registers an endpoint for tenant, with its consumer on the events
// stream (which then holds the tenant's events for it from now on, whether
// or not a daemon runs), and returns it with its secret, which only this
// call and the store hold.
func (s *Store) Add(ctx context.Context, tenant, rawURL string, events []string) (*Endpoint, error) {
	if tenant == "" {
		return nil, errors.New("webhook: empty tenant")
	}
	if err := CheckURL(rawURL); err != nil {
		return nil, err
	}
	events, err := CheckEvents(events)
	if err != nil {
		return nil, err
	}
	var idb [6]byte
	var sec [24]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return nil, err
	}
	if _, err := rand.Read(sec[:]); err != nil {
		return nil, err
	}
	ep := &Endpoint{ID: "wh_" + hex.EncodeToString(idb[:]), Tenant: tenant, URL: rawURL, Events: slices.Clone(events),
		Secret: SecretPrefix + base64.StdEncoding.EncodeToString(sec[:]), Created: time.Now().UTC().Truncate(time.Second)}
	// The consumer is made here, before the endpoint is stored, not left to
	// the daemons' runners: a consumer starts at the events published from
	// its creation on, and one first made when a daemon got round to the
	// endpoint (or not at all while every daemon is down) would skip the
	// events published since the add, the `webhook test` just after it
	// among them. The stream itself marks the start, so no writer's clock
	// is involved; the id is new, so no consumer of a removed endpoint is
	// taken over; and the runners create the same configuration, which
	// leaves this consumer where it is, for one daemon or a fleet.
	name := consumerName(ep.ID)
	if _, err := s.events.EventConsumer(ctx, consumerConfig(ep, eventAckWait)); err != nil {
		return nil, fmt.Errorf("webhook %s: %w", ep.ID, err)
	}
	if err := s.put(ctx, ep, 0); err != nil {
		// No endpoint will ever read it: a durable consumer left behind
		// would be nobody's, kept by the server (and shown in its
		// consumer list) for good.
		if derr := s.events.DeleteEventConsumer(context.WithoutCancel(ctx), name); derr != nil {
			err = fmt.Errorf("%w (and its consumer %s is left: %v)", err, name, derr)
		}
		return nil, err
	}
	return ep, nil
}

// Rotate gives endpoint id a new signing secret and returns the endpoint
// with it, which only this call and the store hold. Until keep has passed,
// deliveries are signed with the old secret as well (a second signature
// in webhook-signature, as the Standard Webhooks specification allows),
// so that the receiver can switch over without a delivery it cannot
// verify; keep 0 ends the old secret at once. A rotation within another's
// overlap ends the older secret: one old secret is kept, the last.
func (s *Store) Rotate(ctx context.Context, id string, keep time.Duration) (*Endpoint, error) {
	if keep < 0 {
		return nil, errors.New("webhook: negative overlap")
	}
	var sec [24]byte
	if _, err := rand.Read(sec[:]); err != nil {
		return nil, err
	}
	fresh := SecretPrefix + base64.StdEncoding.EncodeToString(sec[:])
	var out *Endpoint
	err := s.update(ctx, id, func(ep *Endpoint) {
		ep.PrevSecret, ep.PrevUntil = "", time.Time{}
		if keep > 0 {
			ep.PrevSecret, ep.PrevUntil = ep.Secret, time.Now().Add(keep).UTC().Truncate(time.Second)
		}
		ep.Secret = fresh
		cp := *ep
		out = &cp
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// signature is the webhook-signature header of one delivery to ep at ts:
// the secret's signature, and the previous secret's while it is kept.
func (ep *Endpoint) signature(id string, ts time.Time, body []byte) (string, error) {
	sig, err := Sign(ep.Secret, id, ts, body)
	if err != nil || ep.PrevSecret == "" || !ts.Before(ep.PrevUntil) {
		return sig, err
	}
	prev, err := Sign(ep.PrevSecret, id, ts, body)
	if err != nil {
		return "", err
	}
	return sig + " " + prev, nil
}

// consumerConfig is endpoint ep's durable consumer on the events stream.
// Store.Add and every runner make it with this one configuration, so a
// runner's create-or-update finds nothing to change but the ack wait and
// never moves the consumer's position.
func consumerConfig(ep *Endpoint, ackWait time.Duration) jetstream.ConsumerConfig {
	// The server hands the consumer the events of ep's tenant's shard
	// only, a few tenants' at most, not every tenant's (queue's
	// EventTenantFilters); the dispatcher's tenant check drops the
	// others'.
	filters := append(queue.EventTenantFilters(EventTest, ep.Tenant), replaySubject(ep.ID))
	for _, t := range ep.Events {
		// Each type once, also for an endpoint stored with one twice:
		// overlapping filters would fail the consumer.
		for _, f := range queue.EventTenantFilters(t, ep.Tenant) {
			if !slices.Contains(filters, f) {
				filters = append(filters, f)
			}
		}
	}
	return jetstream.ConsumerConfig{
		Durable: consumerName(ep.ID), Description: "webhook " + ep.ID + " (" + ep.Tenant + ")",
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverNewPolicy, AckPolicy: jetstream.AckExplicitPolicy,
		// One event in flight: an endpoint sees its events in order, and
		// its backlog waits in the stream, not in memory.
		MaxAckPending: 1, AckWait: ackWait, MaxDeliver: -1,
	}
}

// allEvents are the event types an endpoint may ask for: DefaultEvents,
// and the other events of a tenant's mail (queue.EventTypes less the
// malformed envelope's and a destination's learned limits, which belong
// to no tenant).
var allEvents = append(slices.Clone(DefaultEvents), queue.EventExpired, queue.EventQueued, queue.EventHeld,
	queue.EventReplayed, queue.EventFastFwd, queue.EventReleased, queue.EventDSN)

// CheckEvents returns the event types of a new endpoint, each once, in the
// order given (spaces around a name ignored; none: DefaultEvents), or an
// error naming one that is not in allEvents. A type named twice would give
// the endpoint's consumer overlapping filter subjects, which JetStream
// refuses: the endpoint would never get an event.
func CheckEvents(events []string) ([]string, error) {
	var out []string
	for _, e := range events {
		e = strings.TrimSpace(e)
		if e == "" || slices.Contains(out, e) {
			continue
		}
		if !slices.Contains(allEvents, e) {
			return nil, fmt.Errorf("webhook: unknown event %q (want some of %s)", e, strings.Join(allEvents, ","))
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return slices.Clone(DefaultEvents), nil
	}
	return out, nil
}

func (s *Store) put(ctx context.Context, ep *Endpoint, rev uint64) error {
	b, err := json.Marshal(ep)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = s.kv.Create(ctx, ep.ID, b)
	} else {
		_, err = s.kv.Update(ctx, ep.ID, b, rev)
	}
	if err != nil {
		return fmt.Errorf("store webhook %s: %w", ep.ID, err)
	}
	return nil
}

// Get returns endpoint id and its revision.
func (s *Store) Get(ctx context.Context, id string) (*Endpoint, uint64, error) {
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return nil, 0, ErrNoEndpoint
	}
	if err != nil {
		return nil, 0, err
	}
	var ep Endpoint
	if err := json.Unmarshal(e.Value(), &ep); err != nil {
		return nil, 0, err
	}
	return &ep, e.Revision(), nil
}

// update applies f to endpoint id, retrying on a concurrent change.
func (s *Store) update(ctx context.Context, id string, f func(*Endpoint)) error {
	for {
		ep, rev, err := s.Get(ctx, id)
		if err != nil {
			return err
		}
		f(ep)
		err = s.put(ctx, ep, rev)
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
	}
}

// List returns the endpoints of tenant, or of every tenant with "".
func (s *Store) List(ctx context.Context, tenant string) ([]Endpoint, error) {
	lister, err := s.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	var out []Endpoint
	for k := range lister.Keys() {
		ep, _, err := s.Get(ctx, k)
		if err != nil {
			continue
		}
		if tenant == "" || ep.Tenant == tenant {
			out = append(out, *ep)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Created.Before(out[j].Created) || out[i].Created.Equal(out[j].Created) && out[i].ID < out[j].ID
	})
	return out, nil
}

// Remove deletes endpoint id, its consumer, its dead letters and its
// breaker.
func (s *Store) Remove(ctx context.Context, id string) error {
	if _, _, err := s.Get(ctx, id); err != nil {
		return err
	}
	if err := s.kv.Delete(ctx, id); err != nil {
		return err
	}
	if err := s.events.DeleteEventConsumer(ctx, consumerName(id)); err != nil {
		return err
	}
	if keys, err := s.dead.ListKeysFiltered(ctx, id+".*"); err == nil {
		for k := range keys.Keys() {
			_ = s.dead.Purge(ctx, k)
		}
	}
	if err := s.breakers.Purge(ctx, id); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return err
	}
	return nil
}

// Replay moves endpoint id's dead letters back into the events stream,
// addressed to that endpoint, and enables it if a 410 disabled it; it
// returns how many it moved. It needs JetStream only: the endpoint's
// durable consumer holds them until a daemon runs it. Each is published
// (and acknowledged, so it is stored) before its dead letter is removed,
// and removed only at the revision read, so a dead letter parked again
// meanwhile stays; a replay interrupted half-way and run again publishes
// the same message id, which the stream's deduplication absorbs.
func (s *Store) Replay(ctx context.Context, id string) (int, error) {
	ep, _, err := s.Get(ctx, id)
	if err != nil {
		return 0, err
	}
	if ep.Disabled {
		// Enabled before the events go back, and only when it was
		// disabled: the dispatcher restarts an endpoint's runner at every
		// change to it, and a restart in the middle of a delivery (the
		// first replayed event's) sends that event again.
		if err := s.update(ctx, id, func(ep *Endpoint) { ep.Disabled, ep.DisabledReason = false, "" }); err != nil {
			return 0, err
		}
	}
	entries, err := s.deadEntries(ctx, id)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		msgID := fmt.Sprintf("webhook-replay.%s.%s.%d", id, e.d.ID, e.d.At.UnixNano())
		if err := s.events.PublishKeyedEvent(ctx, EventReplay, id, e.raw, msgID); err != nil {
			return 0, fmt.Errorf("replay %s: %w", e.d.ID, err)
		}
	}
	for _, e := range entries {
		err := s.dead.Purge(ctx, e.key, jetstream.LastRevision(e.rev))
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return len(entries), fmt.Errorf("remove replayed dead letter %s: %w", e.d.ID, err)
		}
	}
	return len(entries), nil
}

// disable marks endpoint id disabled (a 410 Gone).
func (s *Store) disable(ctx context.Context, id, reason string) error {
	return s.update(ctx, id, func(ep *Endpoint) { ep.Disabled, ep.DisabledReason = true, reason })
}

// DeadLetter is one event an endpoint did not take.
type DeadLetter struct {
	Endpoint string          `json:"endpoint"`
	ID       string          `json:"webhook_id"`
	Type     string          `json:"type"`
	Body     json.RawMessage `json:"body"`
	Reason   string          `json:"reason"`
	At       time.Time       `json:"at"`
}

// Dead lists endpoint id's dead letters, oldest first.
func (s *Store) Dead(ctx context.Context, id string) ([]DeadLetter, error) {
	entries, err := s.deadEntries(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]DeadLetter, len(entries))
	for i, e := range entries {
		out[i] = e.d
	}
	return out, nil
}

type deadEntry struct {
	key string
	rev uint64
	raw []byte
	d   DeadLetter
}

func (s *Store) deadEntries(ctx context.Context, id string) ([]deadEntry, error) {
	keys, err := s.dead.ListKeysFiltered(ctx, id+".*")
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, err
	}
	var out []deadEntry
	for k := range keys.Keys() {
		e, err := s.dead.Get(ctx, k)
		if err != nil {
			continue
		}
		var d DeadLetter
		if json.Unmarshal(e.Value(), &d) == nil {
			out = append(out, deadEntry{key: k, rev: e.Revision(), raw: e.Value(), d: d})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].d.At.Before(out[j].d.At) || out[i].d.At.Equal(out[j].d.At) && out[i].d.ID < out[j].d.ID
	})
	return out, nil
}

func deadKey(endpoint, webhookID string) string { return endpoint + "." + webhookID }

func (s *Store) putDead(ctx context.Context, d DeadLetter) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	_, err = s.dead.Put(ctx, deadKey(d.Endpoint, d.ID), b)
	return err
}
