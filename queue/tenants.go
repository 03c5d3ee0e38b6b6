package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Tenant isolation in the work lane.
//
// Fresh mail is published on outflow.work.<tenant>.<dest>.<id>, and every
// tenant has its own durable pull consumer on the work stream, filtered to
// its subjects. Each worker process runs one pull loop per tenant consumer,
// all feeding the same hand-off channel; Go serves goroutines blocked on a
// channel send in turn, so every tenant with mail ready gets an equal share
// of the deliverers, and one tenant's backlog of a hundred thousand messages
// never sits in front of another tenant's fresh message. The consumer for a
// tenant is created by whoever first enqueues for it (and found again at
// start by listing the stream's subjects), so tenants need no configuration.

const tenantConsumerPrefix = "work-"

// tenantConsumer names the work consumer of tenant: the subject token when
// it is a valid consumer name, a hash otherwise.
func tenantConsumer(tenant string) string {
	t := Token(tenant)
	if strings.ContainsAny(t, "%") || len(t) > 48 {
		sum := sha256.Sum256([]byte(tenant))
		return tenantConsumerPrefix + "h" + hex.EncodeToString(sum[:10])
	}
	return tenantConsumerPrefix + t
}

// tenantSet remembers which tenants' consumers exist, so Enqueue creates
// each one once per process.
type tenantSet struct {
	mu   sync.Mutex
	seen map[string]bool // by tenant name
}

// ensureTenant creates the tenant's work consumer if this process has not
// seen it yet. It is idempotent on the server.
func (q *Queue) ensureTenant(ctx context.Context, tenant string) error {
	q.tenants.mu.Lock()
	done := q.tenants.seen[tenant]
	q.tenants.mu.Unlock()
	if done {
		return nil
	}
	name := tenantConsumer(tenant)
	cfg := jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "outflow workers: fresh mail of tenant " + tenant,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       q.opts.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: q.opts.MaxAckPending,
		FilterSubject: tenantWorkSubjects(Token(tenant)),
		Replicas:      q.opts.Replicas,
	}
	if q.opts.NoSetup {
		// A client that sets nothing up (outflow submit) knows neither the
		// daemons' ack wait nor the cluster's replicas: it creates a missing
		// consumer like the daemons' retry-lane one (which they keep up to
		// date), with the work stream's replicas (0), and leaves an existing
		// one as the daemons made it.
		lane, err := q.js.Consumer(ctx, StreamRetry, consumerRetry)
		if err != nil {
			return fmt.Errorf("the daemons' retry-lane consumer (is outflow serve running?): %w", err)
		}
		lc := lane.CachedInfo().Config
		cfg.AckWait, cfg.MaxAckPending, cfg.Replicas = lc.AckWait, lc.MaxAckPending, 0
		if _, err := q.js.CreateConsumer(ctx, StreamWork, cfg); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return err
		}
	} else if _, err := q.js.CreateOrUpdateConsumer(ctx, StreamWork, cfg); err != nil {
		return err
	}
	q.durableMeta(StreamWork, name)
	_ = q.nc.Publish(subjTenantKick, []byte(name))
	q.tenants.mu.Lock()
	if q.tenants.seen == nil {
		q.tenants.seen = map[string]bool{}
	}
	q.tenants.seen[tenant] = true
	q.tenants.mu.Unlock()
	return nil
}

// adoptTenants makes sure every tenant with mail in the work stream has a
// consumer (mail published straight to NATS for a new tenant, or enqueued
// by an older process).
//
// Listing the stream's subjects finds them, but costs time in proportion to
// the backlog (0.55 s for 200,000 fresh envelopes), and this runs every
// tenantRefresh. So it first checks whether any mail is orphaned at all: the
// work stream has work-queue retention, so every message in it but the
// keeper (keeper.go) is pending or awaiting its ack on exactly one
// consumer, and only when the stream holds more messages than its
// consumers account for is there a tenant without one. (A message
// acknowledged between the two reads, or a consumer whose pending count
// has not yet caught up with a fresh store, makes the check answer
// "maybe", which only costs the listing.)
func (q *Queue) adoptTenants(ctx context.Context) error {
	if orphans, err := q.workOrphans(ctx); err == nil && !orphans {
		return nil
	}
	info, err := q.lanes[LaneWork].Info(ctx, jetstream.WithSubjectFilter(laneSubjects(LaneWork)))
	if err != nil {
		return err
	}
	for subj := range info.State.Subjects {
		if subj == subjWorkKeeper {
			continue
		}
		if err := q.ensureTenant(ctx, Untoken(workTenant(subj))); err != nil {
			return err
		}
	}
	return nil
}

// workOrphans reports whether the work stream may hold messages that no
// consumer covers.
func (q *Queue) workOrphans(ctx context.Context) (bool, error) {
	msgs, _, err := q.workState(ctx, false)
	if err != nil {
		return true, err
	}
	if msgs == 0 {
		return false, nil
	}
	var covered uint64
	l := q.lanes[LaneWork].ListConsumers(ctx)
	for ci := range l.Info() {
		covered += ci.NumPending + uint64(max(ci.NumAckPending, 0))
	}
	if err := l.Err(); err != nil {
		return true, err
	}
	return msgs > covered, nil
}

// workMessages runs one pull loop per tenant consumer, discovering new
// tenants every refresh, all sending on out.
// tenantRefresh is how often a worker looks for tenant consumers it missed
// (one created while it was disconnected); new tenants are announced at
// once on subjTenantKick.
var tenantRefresh = 2 * time.Second

func (q *Queue) workMessages(ctx context.Context, buffer int, out chan<- *Delivery) {
	refresh := tenantRefresh
	running := map[string]bool{}
	var wg sync.WaitGroup
	defer func() { wg.Wait(); close(out) }()
	kick := make(chan struct{}, 1)
	if sub, err := q.nc.Subscribe(subjTenantKick, func(*nats.Msg) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
			if !t.Stop() {
				select {
				case <-t.C:
				default:
				}
			}
		}
		if err := q.adoptTenants(ctx); err != nil && ctx.Err() == nil {
			q.log.Warn().Err(err).Msg("discover tenants")
		}
		names := q.lanes[LaneWork].ConsumerNames(ctx)
		for name := range names.Name() {
			if !strings.HasPrefix(name, tenantConsumerPrefix) || running[name] {
				continue
			}
			cons, err := q.lanes[LaneWork].Consumer(ctx, name)
			if err != nil {
				continue
			}
			running[name] = true
			wg.Add(1)
			go func() {
				defer wg.Done()
				q.pull(ctx, cons, LaneWork, buffer, out)
			}()
		}
		if err := names.Err(); err != nil && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
			q.log.Warn().Err(err).Msg("list tenant consumers")
		}
		t.Reset(refresh)
	}
}
