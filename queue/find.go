package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/ascii"
	"github.com/outflow/outflow/internal/jsonenc"
)

// DefaultFindLimit is EventQuery.Limit's default.
const DefaultFindLimit = 100

// EventQuery selects the events FindEvents returns: those naming a
// recipient, optionally of one tenant, of some types, since a time.
type EventQuery struct {
	// Rcpt is the recipient the events must name (in Recipients),
	// compared as NormalizeAddress compares. Required.
	Rcpt string
	// Tenant, when set, reads that tenant's shard of the events only
	// (about a sixty-fourth of them) and keeps its events.
	Tenant string
	// Types, when set, reads those event types only.
	Types []string
	// Since, when set, starts at the events stored since then; zero reads
	// all the events stream keeps.
	Since time.Time
	// Limit is how many of the newest matches are returned; 0 means
	// DefaultFindLimit.
	Limit int
}

// FindEvents answers "what became of mail to this address": the newest
// q.Limit events that name q.Rcpt, oldest first, and how many events it
// read to find them. The events are not indexed by recipient, so it reads
// through the stream (one pass, as `grep` reads a mail log): Tenant, Types
// and Since narrow what is read, and the read fails with ctx.
func (q *Queue) FindEvents(ctx context.Context, fq EventQuery) (_ []Event, scanned int, err error) {
	addr := NormalizeAddress(fq.Rcpt)
	if addr == "" {
		return nil, 0, errors.New("find events: no recipient")
	}
	if err := CheckEventTypes(fq.Types); err != nil {
		return nil, 0, fmt.Errorf("find events: %w", err)
	}
	limit := fq.Limit
	if limit <= 0 {
		limit = DefaultFindLimit
	}
	if err := q.asyncStored(ctx); err != nil {
		return nil, 0, fmt.Errorf("find events: %w", err)
	}
	// The address as the events' JSON writes it, for a quick look at each
	// event's bytes before it is decoded: ASCII letters in either case.
	// An address with other letters is looked for in every decoded event.
	needle := jsonenc.AppendString(nil, addr)
	needle = needle[1 : len(needle)-1]
	if !ascii.Is(needle) {
		needle = nil
	}
	// A tenant's shard holds other tenants' events too: those are skipped
	// by their tenant field, before the recipient, and not counted, so
	// that scanned says nothing of another tenant's mail.
	var tenantField []byte
	if fq.Tenant != "" {
		tenantField = jsonenc.AppendString([]byte(`"tenant":`), fq.Tenant)
	}
	// The newest limit matches: a ring, in order from next once full.
	ring, next := make([]Event, 0, min(limit, 64)), 0
	err = q.scanEvents(ctx, findFilters(fq.Tenant, fq.Types), fq.Since, func(m jetstream.Msg) {
		data := m.Data()
		if tenantField != nil && !bytes.Contains(data, tenantField) {
			return
		}
		scanned++
		if needle != nil && !containsFoldASCII(data, needle) {
			return
		}
		var ev Event
		if json.Unmarshal(data, &ev) != nil || fq.Tenant != "" && ev.Tenant != fq.Tenant {
			return
		}
		if !slices.ContainsFunc(ev.Recipients, func(r string) bool { return NormalizeAddress(r) == addr }) {
			return
		}
		if len(ring) < limit {
			ring = append(ring, ev)
			return
		}
		ring[next] = ev
		next = (next + 1) % limit
	})
	if err != nil {
		return nil, scanned, fmt.Errorf("find events: %w", err)
	}
	out := append(ring[next:len(ring):len(ring)], ring[:next]...)
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out, scanned, nil
}

// findFilters are the events stream's subject filters FindEvents reads:
// every event, or those of some types, in tenant's shard when tenant is
// set, in both subject layouts (events.go).
func findFilters(tenant string, types []string) []string {
	if len(types) == 0 {
		types = []string{"*"}
	}
	var out []string
	for _, typ := range types {
		switch {
		case tenant != "":
			out = append(out, subjEvents+typ+"."+eventTenantShard(tenant)+".*", subjEvents+typ+".*")
		case typ == "*":
			out = append(out, subjEvents+">")
		default:
			out = append(out, EventTypeFilter(typ))
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// scanEvents hands visit every event on filters stored since since (zero:
// all), in stream order, through one ephemeral consumer.
func (q *Queue) scanEvents(ctx context.Context, filters []string, since time.Time, visit func(jetstream.Msg)) error {
	cfg := jetstream.ConsumerConfig{
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if len(filters) == 1 {
		cfg.FilterSubject = filters[0]
	} else {
		cfg.FilterSubjects = filters
	}
	if !since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &since
	}
	cons, err := q.events.CreateConsumer(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = q.events.DeleteConsumer(context.WithoutCancel(ctx), cons.CachedInfo().Name) }()
	// What was stored when the scan began, and no more: events keep
	// coming, and a scan that followed them might not end. A batch cut
	// short by its wait is not the end (a large stream read from disk);
	// an empty one is (what remained expired, events max age), and so is
	// a message after which the consumer has nothing left.
	for left := cons.CachedInfo().NumPending; left > 0; {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch, err := cons.Fetch(int(min(left, 1000)), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		var last jetstream.Msg
		n := uint64(0)
		for m := range batch.Messages() {
			last = m
			n++
			visit(m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if last == nil {
			break
		}
		left -= min(n, left)
		if md, err := last.Metadata(); err != nil {
			return err
		} else if md.NumPending == 0 {
			break
		}
	}
	return nil
}

// containsFoldASCII reports whether b contains needle, ASCII letters
// compared without case; needle is lower-case.
func containsFoldASCII(b, needle []byte) bool {
	if len(needle) == 0 {
		return true
	}
	first, upper := needle[0], needle[0]
	if 'a' <= first && first <= 'z' {
		upper = first - 'a' + 'A'
	}
	for i := 0; i+len(needle) <= len(b); i++ {
		if c := b[i]; c != first && c != upper {
			continue
		}
		j := 1
		for ; j < len(needle); j++ {
			c := b[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != needle[j] {
				break
			}
		}
		if j == len(needle) {
			return true
		}
	}
	return false
}
