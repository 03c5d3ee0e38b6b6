package queue

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/kvpurge"
)

// BucketSuppressions is the key-value bucket of the suppression list: one
// entry per (tenant, address), holding a Suppression. A recipient on the
// list is refused at submission (SMTP RCPT, the HTTP API) instead of being
// mailed again: providers count mail to addresses that hard-bounced against
// the sender's reputation.
const BucketSuppressions = "outflow_suppressions"

// EventSuppressed is the event of a recipient refused at submission
// because it is on its tenant's suppression list.
const EventSuppressed = "suppressed"

// Suppression sources, the Source of a Suppression.
const (
	SuppressBounce = "bounce" // added by a permanent recipient-scope bounce
	SuppressAPI    = "api"    // added over the HTTP API (complaints, unsubscribes)
	SuppressAdmin  = "admin"  // added by `outflow suppress add`
	// SuppressComplaint: added by a spam complaint (an ARF report received
	// at the return path, package bounce).
	SuppressComplaint = "complaint"
	// SuppressUnsubscribe: added by the recipient's one-click unsubscribe
	// (RFC 8058, package unsubscribe).
	SuppressUnsubscribe = "unsubscribe"
)

// SuppressionSources are the sources an entry can have, each the Source
// of the entries one path adds.
var SuppressionSources = []string{SuppressBounce, SuppressAPI, SuppressAdmin, SuppressComplaint, SuppressUnsubscribe}

// FilterSuppressions keeps the entries of list added by source ("" for
// any) at or after since (zero for any; entries are stamped to the
// second, and so is since), in their order: what an application
// reconciles its own lists with ("who unsubscribed since yesterday").
func FilterSuppressions(list []Suppression, source string, since time.Time) []Suppression {
	out := make([]Suppression, 0, len(list)) // never nil: an empty list is []
	for _, s := range list {
		if (source == "" || s.Source == source) && !s.Created.Before(since.Truncate(time.Second)) {
			out = append(out, s)
		}
	}
	return out
}

// ErrNotSuppressed is returned by Suppressions.Remove for an address that
// is not on the list.
var ErrNotSuppressed = errors.New("address is not suppressed")

// Suppression is one entry of a tenant's suppression list.
type Suppression struct {
	Tenant  string    `json:"tenant"`
	Address string    `json:"address"` // lower-cased: the list matches addresses case-insensitively
	Reason  string    `json:"reason,omitempty"`
	Source  string    `json:"source,omitempty"` // SuppressBounce, SuppressAPI, SuppressAdmin, SuppressComplaint or SuppressUnsubscribe
	Created time.Time `json:"created"`
	// Expires is when the entry stops applying; zero means never. Expired
	// entries are ignored by Suppressed and List and deleted when met.
	Expires time.Time `json:"expires,omitzero"`
}

// active reports whether s applies at now.
func (s *Suppression) active(now time.Time) bool {
	return s.Expires.IsZero() || now.Before(s.Expires)
}

// Suppressions is the suppression list, shared by every process through
// BucketSuppressions. Open it with Queue.Suppressions.
type Suppressions struct {
	q  *Queue
	kv jetstream.KeyValue
	// st is kv's stream: an entry removed or expired is dropped from it
	// (kvpurge.DropThrough), leaving no marker. Nobody watches the list
	// (a look-up reads the key), so nobody needs one, and a KV delete's
	// would stay for good, one per address ever lifted.
	st jetstream.Stream
}

// Suppressions opens (creating it if need be) the suppression list.
func (q *Queue) Suppressions(ctx context.Context) (*Suppressions, error) {
	kv, err := q.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketSuppressions,
		Description: "outflow suppression list: tenant, address -> reason", History: 1})
	if err != nil {
		return nil, err
	}
	st, err := lookUp(ctx, func(ctx context.Context) (jetstream.Stream, error) {
		return q.js.Stream(ctx, kvStream(BucketSuppressions))
	})
	if err != nil {
		return nil, fmt.Errorf("suppressions: %w", err)
	}
	return &Suppressions{q: q, kv: kv, st: st}, nil
}

// NormalizeAddress is the form in which the list stores and matches an
// address: trimmed, without angle brackets, lower-cased. RFC 5321 section
// 2.4 lets a local part be case-sensitive, but no mailbox provider in use
// treats it so, and a suppression that a change of case could dodge would
// not protect the sender's reputation.
func NormalizeAddress(addr string) string {
	a := strings.TrimSpace(addr)
	a = strings.TrimSuffix(strings.TrimPrefix(a, "<"), ">")
	return strings.ToLower(a)
}

// suppressTenantKey is the first token of every key of tenant's entries.
func suppressTenantKey(tenant string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(tenant))
}

// suppressKey is the bucket key of (tenant, addr): both base64url encoded,
// so that any tenant and address fit the key alphabet, and the tenant is
// one token a filter can select.
func suppressKey(tenant, addr string) string {
	return suppressTenantKey(tenant) + "." + base64.RawURLEncoding.EncodeToString([]byte(NormalizeAddress(addr)))
}

// Add puts s on the list, replacing any entry for the same tenant and
// address. Created defaults to now.
func (l *Suppressions) Add(ctx context.Context, s Suppression) error {
	key, b, err := entry(&s)
	if err != nil {
		return err
	}
	if _, err := l.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("suppress %s: %w", s.Address, err)
	}
	return nil
}

// entry checks s, normalises its address, dates it now when it has no
// Created, and returns its bucket key and value.
func entry(s *Suppression) (key string, value []byte, err error) {
	if s.Tenant == "" {
		return "", nil, errors.New("suppress: empty tenant")
	}
	s.Address = NormalizeAddress(s.Address)
	if s.Address == "" || !strings.Contains(s.Address, "@") {
		return "", nil, fmt.Errorf("suppress: %q is not an address", s.Address)
	}
	if s.Created.IsZero() {
		s.Created = time.Now().UTC().Truncate(time.Second)
	}
	value, err = json.Marshal(s)
	return suppressKey(s.Tenant, s.Address), value, err
}

// AddFirst is Add for what a recipient's mail system reports (a hard
// bounce, a complaint): it puts s on the list unless an entry that never
// expires is there already, whose source and time it keeps. An address a
// recipient unsubscribed, and then reported as spam, stays among the
// unsubscribes an application lists (?source=unsubscribe&since=); the
// report is its own event all the same. added says whether s was written.
//
// The read and the write are one compare-and-set, so that of a complaint
// and an unsubscribe that come together the first written stays.
func (l *Suppressions) AddFirst(ctx context.Context, s Suppression) (added bool, err error) {
	key, b, err := entry(&s)
	if err != nil {
		return false, err
	}
	for range 10 {
		e, err := l.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = l.kv.Create(ctx, key, b)
		case err != nil:
			return false, fmt.Errorf("suppression %s: %w", s.Address, err)
		default:
			var cur Suppression
			if json.Unmarshal(e.Value(), &cur) == nil && cur.active(time.Now()) && cur.Expires.IsZero() {
				return false, nil
			}
			_, err = l.kv.Update(ctx, key, b, e.Revision())
		}
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return false, fmt.Errorf("suppress %s: %w", s.Address, err)
		}
	}
	return false, fmt.Errorf("suppress %s: the entry kept changing", s.Address)
}

// Remove takes addr off tenant's list, or returns ErrNotSuppressed when
// no entry applies (none, or one that has expired, which List does not
// show either).
func (l *Suppressions) Remove(ctx context.Context, tenant, addr string) error {
	key := suppressKey(tenant, addr)
	s, rev, err := l.entryAt(ctx, tenant, addr)
	if err != nil {
		return err
	} else if s == nil {
		return ErrNotSuppressed
	}
	// Through this revision only: an entry added again meanwhile stays.
	if err := kvpurge.DropThrough(ctx, l.st, BucketSuppressions, key, rev); err != nil {
		return fmt.Errorf("unsuppress %s: %w", addr, err)
	}
	return nil
}

// Suppressed returns tenant's entry for addr if one applies now, or nil.
func (l *Suppressions) Suppressed(ctx context.Context, tenant, addr string) (*Suppression, error) {
	s, _, err := l.entryAt(ctx, tenant, addr)
	return s, err
}

// entryAt is Suppressed with the entry's revision.
func (l *Suppressions) entryAt(ctx context.Context, tenant, addr string) (*Suppression, uint64, error) {
	key := suppressKey(tenant, addr)
	// One direct get (lastMsg), as KeyValue.Get makes but cheaper, or on
	// the embedded server none for an address not on the list: it is made
	// for every recipient submitted.
	value, rev, found, err := l.q.lastMsg(ctx, OpSuppressGet, kvStream(BucketSuppressions), kvSubject(BucketSuppressions, key))
	if err != nil {
		return nil, 0, fmt.Errorf("suppression %s: %w", addr, err)
	}
	if !found {
		return nil, 0, nil
	}
	var s Suppression
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, 0, fmt.Errorf("suppression %s: %w", addr, err)
	}
	if !s.active(time.Now()) {
		// Only this revision: a fresh Add meanwhile must survive.
		_ = kvpurge.DropThrough(ctx, l.st, BucketSuppressions, key, rev)
		return nil, 0, nil
	}
	return &s, rev, nil
}

// List returns the entries that apply now, of tenant or, with tenant "",
// of every tenant, sorted by tenant and address.
func (l *Suppressions) List(ctx context.Context, tenant string) ([]Suppression, error) {
	filter := ">"
	if tenant != "" {
		filter = suppressTenantKey(tenant) + ".*"
	}
	w, err := l.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("list suppressions: %w", err)
	}
	defer func() { _ = w.Stop() }()
	now := time.Now()
	var out []Suppression
	var expired []jetstream.KeyValueEntry
	defer func() {
		// Entries that have expired go now, each only if unchanged since
		// (an address suppressed again meanwhile stays): they would
		// otherwise stay until their address is looked up again.
		for _, e := range expired {
			_ = kvpurge.DropThrough(ctx, l.st, BucketSuppressions, e.Key(), e.Revision())
		}
	}()
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e == nil { // the initial values are all delivered
			break
		}
		var s Suppression
		if json.Unmarshal(e.Value(), &s) != nil {
			continue
		}
		if !s.active(now) {
			expired = append(expired, e)
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Tenant != out[j].Tenant {
			return out[i].Tenant < out[j].Tenant
		}
		return out[i].Address < out[j].Address
	})
	return out, nil
}

// Page reads a page of the list, in the order the entries were written
// (an entry replaced moves to the end), without reading the rest: up to
// limit entries that apply now, of tenant (every tenant with ""), for
// which keep (nil: every one) is true, from stream sequence from on (0:
// the first), reading at most scan entries. next is the sequence to read
// the rest from, 0 when no entry follows those read; a page can be short,
// or empty, with a next (keep refused the entries read). Expired entries
// met are deleted, as List deletes them.
func (l *Suppressions) Page(ctx context.Context, tenant string, from uint64, limit, scan int, keep func(*Suppression) bool) (page []Suppression, next uint64, err error) {
	filter := ">"
	if tenant != "" {
		filter = suppressTenantKey(tenant) + ".*"
	}
	cfg := jetstream.ConsumerConfig{DeliverPolicy: jetstream.DeliverAllPolicy, AckPolicy: jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute, MemoryStorage: true, Replicas: 1, FilterSubject: kvSubject(BucketSuppressions, filter)}
	if from > 1 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	cons, err := l.st.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("list suppressions: %w", err)
	}
	now := time.Now()
	type revision struct {
		key string
		seq uint64
	}
	var expired []revision
	defer func() {
		_ = l.st.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name)
		for _, e := range expired {
			_ = kvpurge.DropThrough(ctx, l.st, BucketSuppressions, e.key, e.seq)
		}
	}()
	prefix := kvSubject(BucketSuppressions, "")
	page = []Suppression{} // never nil: an empty page is []
	scan = max(scan, limit)
	left, scanned, more := cons.CachedInfo().NumPending, 0, false
	for left > 0 && len(page) < limit && scanned < scan {
		n := min(left, uint64(scan-scanned), uint64(max(limit-len(page), 64)))
		batch, err := cons.Fetch(int(n), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, 0, fmt.Errorf("list suppressions: %w", err)
		}
		got := false
		for m := range batch.Messages() {
			got = true
			if len(page) >= limit || scanned >= scan {
				continue // read, not taken: the next page starts at it
			}
			md, err := m.Metadata()
			if err != nil {
				return nil, 0, fmt.Errorf("list suppressions: %w", err)
			}
			scanned++
			left = md.NumPending
			next, more = md.Sequence.Stream+1, md.NumPending > 0
			if op := m.Headers().Get("KV-Operation"); op == "DEL" || op == "PURGE" {
				continue
			}
			var s Suppression
			if json.Unmarshal(m.Data(), &s) != nil {
				continue
			}
			if !s.active(now) {
				expired = append(expired, revision{strings.TrimPrefix(m.Subject(), prefix), md.Sequence.Stream})
				continue
			}
			if keep == nil || keep(&s) {
				page = append(page, s)
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, 0, fmt.Errorf("list suppressions: %w", err)
		}
		if !got {
			// What was pending went meanwhile (removed, expired).
			more = false
			break
		}
	}
	if !more {
		next = 0
	}
	return page, next, nil
}

// Refused records that a submission to addr was refused because it is
// suppressed: a suppressed event (via names the way in, "smtp" or "api"),
// which has an id of its own since no envelope was made.
func (l *Suppressions) Refused(tenant, addr, via string) {
	l.q.Event(EventSuppressed, &Event{ID: nuidNext(), Tenant: tenant, Recipients: []string{NormalizeAddress(addr)},
		Reason: "recipient suppressed (refused at " + via + ")"})
}
