package queue

import (
	"cmp"
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
// its subjects. The consumer for a tenant is created by whoever first
// enqueues for it (and found again by listing the stream's subjects when
// mail arrives without one), so tenants need no configuration; the server
// removes it after tenantIdle without a pull.
//
// A worker process pulls only the tenants that have mail (workPuller): a
// tenant's pull loop starts when a wake-up names its consumer and stops
// after one pull request that waited pullWait and got nothing, so a
// thousand tenants that sent yesterday cost no goroutine and no waiting
// pull request at the server. Whoever stores mail for a tenant (Enqueue,
// Replay) sends the wake-up after the store, on core NATS (subjWorkWake, at
// most one a wakeGap per tenant and sending process, the last one
// trailing); a wake-up lost with a connection, or mail stored by a process
// that sends none, is found by the periodic look at the consumers' pending
// counts (lookEvery). All loops feed the same hand-off channel; Go
// serves goroutines blocked on a channel send in turn, so every tenant with
// mail ready gets an equal share of the deliverers, and one tenant's
// backlog of a hundred thousand messages never sits in front of another
// tenant's fresh message. Each pull asks for an equal share of what the
// process may hold pulled and not yet started (batch): the larger of the
// buffer and what it starts in a quarter of the ack wait, so however many
// tenants have mail, nothing pulled waits in the process for long.

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
// each one once per process, and paces the wake-ups this process sends.
type tenantSet struct {
	mu   sync.Mutex
	seen map[string]*tenantMeta // by tenant name
}

// tenantMeta is what this process knows of one tenant's work consumer.
type tenantMeta struct {
	name []byte // the consumer's name, the wake-up's payload
	// ensured is when this process last created or updated the consumer
	// (see tenantIdle).
	ensured time.Time
	// lastWake is when the last wake-up went out; trailing, that one is
	// due at lastWake + wakeGap. All three under tenantSet.mu.
	lastWake time.Time
	trailing bool
}

// tenantIdle is how long a tenant's work consumer may go without a pull
// request before the server removes it (the consumer's InactiveThreshold):
// workers pull only tenants with mail, so a tenant that stopped sending
// would otherwise keep its consumer's state in the server for ever. Mail
// that comes later makes it again: a process that ensured the consumer more
// than half of tenantIdle ago ensures it again before it publishes, and
// mail that finds the consumer gone all the same (removed just after that)
// is orphaned mail, which the workers' periodic look adopts.
const tenantIdle = 24 * time.Hour

// ensureTenant creates the tenant's work consumer unless this process did
// within half of tenantIdle. It is idempotent on the server.
func (q *Queue) ensureTenant(ctx context.Context, tenant string) (*tenantMeta, error) {
	return q.createTenant(ctx, tenant, false)
}

// createTenant is ensureTenant; force creates the consumer whatever this
// process remembers (adopting orphaned mail: the consumer is gone).
func (q *Queue) createTenant(ctx context.Context, tenant string, force bool) (*tenantMeta, error) {
	idle := q.tenantIdle()
	q.tenants.mu.Lock()
	meta := q.tenants.seen[tenant]
	fresh := meta != nil && time.Since(meta.ensured) < idle/2
	q.tenants.mu.Unlock()
	if fresh && !force {
		return meta, nil
	}
	name := tenantConsumer(tenant)
	cfg := jetstream.ConsumerConfig{
		Durable:           name,
		Description:       "outflow workers: fresh mail of tenant " + tenant,
		AckPolicy:         jetstream.AckExplicitPolicy,
		AckWait:           q.opts.AckWait,
		MaxDeliver:        -1,
		MaxAckPending:     q.opts.MaxAckPending,
		FilterSubject:     tenantWorkSubjects(Token(tenant)),
		Replicas:          q.opts.Replicas,
		InactiveThreshold: idle,
	}
	if q.opts.NoSetup {
		// A client that sets nothing up (outflow submit) knows neither the
		// daemons' ack wait nor the cluster's replicas: it creates a missing
		// consumer like the daemons' retry-lane one (which they keep up to
		// date), with the work stream's replicas (0), and leaves an existing
		// one as the daemons made it.
		// Both asked again while a cluster elects leaders (lookUp), as
		// the command's other look-ups are: a request sent during the
		// election waited out the whole --timeout.
		lane, err := lookUp(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return q.js.Consumer(ctx, StreamRetry, consumerRetry)
		})
		if err != nil {
			return nil, fmt.Errorf("the daemons' retry-lane consumer (is outflow serve running?): %w", err)
		}
		lc := lane.CachedInfo().Config
		cfg.AckWait, cfg.MaxAckPending, cfg.Replicas = lc.AckWait, lc.MaxAckPending, 0
		if _, err := lookUp(ctx, func(ctx context.Context) (jetstream.Consumer, error) {
			return q.js.CreateConsumer(ctx, StreamWork, cfg)
		}); err != nil && !errors.Is(err, jetstream.ErrConsumerExists) {
			return nil, err
		}
	} else if _, err := q.js.CreateOrUpdateConsumer(ctx, StreamWork, cfg); err != nil {
		return nil, err
	}
	q.durableMeta(StreamWork, name)
	_ = q.nc.Publish(subjTenantKick, []byte(name))
	q.tenants.mu.Lock()
	defer q.tenants.mu.Unlock()
	if q.tenants.seen == nil {
		q.tenants.seen = map[string]*tenantMeta{}
	}
	if meta = q.tenants.seen[tenant]; meta == nil {
		meta = &tenantMeta{name: []byte(name)}
		q.tenants.seen[tenant] = meta
	}
	meta.ensured = time.Now()
	return meta, nil
}

// pruneTenants forgets the tenants this process ensured a consumer for
// whose consumer is gone: not in listed (the consumers a look listed at
// listedAt; nil: no listing) though ensured before the listing, or
// ensured longer than tenantIdle before now, so that the server may have
// removed it. The tenant's next mail ensures the consumer again (an
// idempotent create). Without this, a process remembered every tenant it
// ever stored mail for, and for up to half of tenantIdle trusted a
// consumer an operator had removed, leaving the tenant's mail to the
// workers' look to adopt.
func (q *Queue) pruneTenants(listed map[string]bool, listedAt, now time.Time) {
	idle := q.tenantIdle()
	q.tenants.mu.Lock()
	defer q.tenants.mu.Unlock()
	for tenant, meta := range q.tenants.seen {
		if listed != nil && !listed[string(meta.name)] && meta.ensured.Before(listedAt) || now.Sub(meta.ensured) > idle {
			delete(q.tenants.seen, tenant)
		}
	}
}

// forgetConsumer forgets the tenant whose work consumer is name, found
// gone: its next mail makes the consumer again.
func (q *Queue) forgetConsumer(name string) {
	q.tenants.mu.Lock()
	defer q.tenants.mu.Unlock()
	for tenant, meta := range q.tenants.seen {
		if string(meta.name) == name {
			delete(q.tenants.seen, tenant)
			return
		}
	}
}

// wakeGap is the shortest time between two wake-ups one process sends for
// one tenant. A worker's pull loop, once woken, waits pullWait for more
// mail, so a busy tenant needs no wake-up per message; the gap only bounds
// how many go out (and how late a trailing one can be: see wake).
const wakeGap = 100 * time.Millisecond

// wake tells every worker process that the tenant's consumer has mail: call
// it after the mail is stored. Every call is followed by a wake-up sent at
// or after it: at once when none went out within wakeGap, otherwise one
// trailing wake-up at the end of the gap, shared by every call in between.
// A worker that stopped pulling the tenant between the mail's store and an
// earlier wake-up therefore still gets one.
func (q *Queue) wake(t *tenantMeta) {
	now := time.Now()
	q.tenants.mu.Lock()
	if since := now.Sub(t.lastWake); since >= q.wakeGap() || since < 0 {
		t.lastWake = now
		q.tenants.mu.Unlock()
		q.count(OpWake)
		_ = q.nc.Publish(subjWorkWake, t.name)
		return
	}
	if t.trailing {
		q.tenants.mu.Unlock()
		return
	}
	t.trailing = true
	due := t.lastWake.Add(q.wakeGap()).Sub(now)
	q.tenants.mu.Unlock()
	time.AfterFunc(due, func() {
		q.tenants.mu.Lock()
		t.trailing, t.lastWake = false, time.Now()
		q.tenants.mu.Unlock()
		q.count(OpWake)
		_ = q.nc.Publish(subjWorkWake, t.name)
	})
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
// "maybe", which only costs the listing.) It returns that listing of the
// consumers, empty while the work stream is.
func (q *Queue) adoptTenants(ctx context.Context) (workCover, error) {
	msgs, _, err := q.workState(ctx, false)
	if err != nil || msgs == 0 {
		return workCover{}, err
	}
	c, err := q.workConsumers(ctx)
	if err != nil || msgs <= c.covered {
		return c, err
	}
	return c, q.adoptSubjects(ctx, c.names)
}

// adoptSubjects lists the work stream's subjects and creates the consumer
// of every tenant among them that has none: one not in have (the tenant
// consumers listed just before), made whatever this process remembers of
// it, once per tenant however many of its envelopes wait. A tenant whose
// consumer exists is left alone: the check that sends here can answer
// "maybe" on a busy stream (adoptTenants).
func (q *Queue) adoptSubjects(ctx context.Context, have map[string]bool) error {
	info, err := q.lanes[LaneWork].Info(ctx, jetstream.WithSubjectFilter(laneSubjects(LaneWork)))
	if err != nil {
		return err
	}
	done := map[string]bool{}
	for subj := range info.State.Subjects {
		if subj == subjWorkKeeper {
			continue
		}
		tenant := Untoken(workTenant(subj))
		if done[tenant] || have[tenantConsumer(tenant)] {
			continue
		}
		done[tenant] = true
		meta, err := q.createTenant(ctx, tenant, true)
		if err != nil {
			return err
		}
		q.wake(meta)
	}
	return nil
}

// workCover is one listing of the work stream's consumers.
type workCover struct {
	names   map[string]bool // the consumers read
	covered uint64          // messages pending or awaiting an ack, on all consumers
	pending []string        // the tenant consumers with mail not yet handed out or not yet acknowledged
}

func (q *Queue) workConsumers(ctx context.Context) (workCover, error) {
	c := workCover{names: map[string]bool{}}
	l := q.lanes[LaneWork].ListConsumers(ctx)
	for ci := range l.Info() {
		c.names[ci.Name] = true
		// The consumer's ack wait as the server has it, for the
		// keep-alives of its sends (ackwait.go): a daemon started since
		// may have changed it.
		q.ackWaits.learn(StreamWork, ci.Name, ci.Config.AckWait)
		c.covered += ci.NumPending + uint64(max(ci.NumAckPending, 0))
		// Mail awaiting its ack counts as well: a worker that died or
		// stopped holding it will not ack, and when the ack wait ends the
		// server hands it out again only to a pull request.
		if (ci.NumPending > 0 || ci.NumAckPending > 0) && strings.HasPrefix(ci.Name, tenantConsumerPrefix) {
			c.pending = append(c.pending, ci.Name)
		}
	}
	return c, l.Err()
}

// tenantRefresh is how often a worker looks at the tenant consumers'
// pending counts, for mail whose wake-up it missed (sent while it was
// disconnected, or never: a process of an earlier release, a client
// publishing straight to the work stream). The look costs nothing while
// the work stream is empty.
const tenantRefresh = 2 * time.Second

// workMessages pulls the work lane for Messages until ctx ends, then
// closes out: it runs the workPuller's wake-ups and looks, and its loops
// send on out.
func (q *Queue) workMessages(ctx context.Context, buffer int, out chan<- *Delivery) {
	p := &workPuller{q: q, ctx: ctx, buffer: buffer, out: out,
		tenants: map[string]*tenantPull{}, look: make(chan struct{}, 1), unknown: make(chan string, 64)}
	defer func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		p.wg.Wait()
		p.mu.Lock()
		q.tenantHandles.Add(-int64(len(p.tenants)))
		p.mu.Unlock()
		close(out)
	}()
	onWake := func(m *nats.Msg) { p.wake(string(m.Data)) }
	for _, subj := range []string{subjWorkWake, subjTenantKick} {
		if sub, err := q.nc.Subscribe(subj, onWake); err == nil {
			defer func() { _ = sub.Unsubscribe() }()
		}
	}
	t := time.NewTicker(q.tenantRefresh())
	defer t.Stop()
	var last time.Time // of the last look
	failed := 0        // looks failed in a row (the first is said)
	every := time.Duration(0)
	reconnects := q.nc.Stats().Reconnects
	p.look <- struct{}{} // the first look at once
	for {
		select {
		case <-ctx.Done():
			return
		case name := <-p.unknown:
			// A consumer gone since its wake-up (removed as idle, or by
			// an operator) is left to the next look.
			if err := p.add(name); err != nil {
				if ctx.Err() == nil {
					q.log.Warn().Err(err).Str("consumer", name).Msg("tenant consumer")
				}
				continue
			}
			p.wake(name)
			continue
		case <-p.look:
		case <-t.C:
			// At once after a reconnection (wake-ups sent meanwhile
			// are lost), otherwise when the look is due.
			if q.nc.Stats().Reconnects == reconnects && time.Since(last) < every {
				continue
			}
		}
		seen := q.nc.Stats().Reconnects
		n, err := p.lookAll()
		if err != nil {
			if ctx.Err() == nil && failed == 0 {
				q.log.Warn().Err(err).Msg("look for tenants with mail failed")
			}
			// A look that failed right after a reconnect (the connection
			// still coming back) is made again at the next ticks; one
			// that goes on failing (a consumer that cannot be made)
			// waits the period, as a look that worked does.
			if failed++; failed < lookRetries {
				continue
			}
		} else if failed > 0 {
			q.log.Info().Int("failed_looks", failed).Msg("look for tenants with mail works again")
			failed = 0
		}
		reconnects, last, every = seen, time.Now(), cmp.Or(q.times.look, lookEvery(n, q.tenantRefresh()))
	}
}

// lookRetries is how many looks in a row may fail, one a tick, before the
// next waits the period.
const lookRetries = 3

// lookEvery is how often a worker looks at every tenant consumer when
// there are n of them: each look reads all n (about 70 µs each on the
// embedded server, BenchmarkLookAtTenants), so the period grows with them,
// from refresh (2 s) up to a minute from 6,000 consumers on. Wake-ups do
// the work; the look is for those lost with a connection (a reconnection
// brings it forward), mail from processes that send none, and envelopes a
// dead worker held, which wait for the ack wait anyway.
func lookEvery(n int, refresh time.Duration) time.Duration {
	return min(max(refresh, time.Duration(n)*10*time.Millisecond), time.Minute)
}

// workPuller pulls the work lane for one worker process: one pull loop for
// each tenant with mail, none for the others (see the top of this file).
type workPuller struct {
	q      *Queue
	ctx    context.Context
	buffer int
	out    chan<- *Delivery
	look   chan struct{} // a look at every consumer, at once
	// unknown has the names of consumers a wake-up named that this
	// process has no handle for yet; workMessages looks them up (a
	// request, which the wake-up's callback must not make).
	unknown chan string

	mu      sync.Mutex
	tenants map[string]*tenantPull // by consumer name
	running int                    // pull loops running
	// rate is the envelopes the loops got per second, averaged over
	// windows of a second or more (received); rateN have been got since
	// rateFrom.
	rate     float64
	rateN    int
	rateFrom time.Time
	closed   bool // no more loops start
	wg       sync.WaitGroup
}

// tenantPull is one tenant consumer as this process pulls it.
type tenantPull struct {
	name    string // the consumer's
	cons    jetstream.Consumer
	running bool // its pull loop runs
	// idleSince is when the handle was got or its loop last stopped:
	// a handle idle past tenantIdle is dropped (pruneHandles), as the
	// server drops the consumer.
	idleSince time.Time
	// woken: a wake-up came while the loop ran, so it pulls once more
	// before it stops, whatever its last pull got.
	woken bool
}

// wake starts the pull loop of the named consumer, or has the running one
// pull once more before it stops.
func (p *workPuller) wake(name string) {
	if !strings.HasPrefix(name, tenantConsumerPrefix) {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	t := p.tenants[name]
	switch {
	case p.closed:
	case t == nil:
		select {
		case p.unknown <- name:
		default:
			select {
			case p.look <- struct{}{}:
			default:
			}
		}
	case t.running:
		t.woken = true
	default:
		t.running, t.woken = true, false
		p.running++
		p.q.pulling.Add(1)
		p.wg.Add(1)
		go p.run(t)
	}
}

// add gets a handle on the named consumer, once.
func (p *workPuller) add(name string) error {
	p.mu.Lock()
	known := p.tenants[name] != nil
	p.mu.Unlock()
	if known {
		return nil
	}
	cons, err := p.q.lanes[LaneWork].Consumer(p.ctx, name)
	if err != nil {
		return err
	}
	p.mu.Lock()
	if p.tenants[name] == nil {
		p.tenants[name] = &tenantPull{name: name, cons: cons, idleSince: time.Now()}
		p.q.tenantHandles.Add(1)
	}
	p.mu.Unlock()
	return nil
}

// consumerGone reports whether err says a consumer no longer exists: not
// found by a look-up, deleted under a pull, or a pull request nobody
// answered (a consumer's pull requests are answered by the consumer).
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerDoesNotExist) || errors.Is(err, nats.ErrNoResponders)
}

// drop forgets the named consumer's handle, under p.mu, unless its loop
// runs.
func (p *workPuller) drop(name string) {
	if t := p.tenants[name]; t != nil && !t.running {
		delete(p.tenants, name)
		p.q.tenantHandles.Add(-1)
	}
}

// pruneHandles drops, under p.mu, the handles of consumers whose loops do
// not run and that are gone or idle: not in listed (the consumers a look
// listed at listedAt, nil when it listed none) though idle since before
// the listing, or idle longer than tenantIdle at now, after which the
// server has removed the consumer. A tenant that sends again is woken by
// name, and its handle got again (add). Without this, a worker process
// kept a handle for every tenant it ever pulled.
func (p *workPuller) pruneHandles(listed map[string]bool, listedAt, now time.Time) {
	idle := p.q.tenantIdle()
	for name, t := range p.tenants {
		if t.running {
			continue
		}
		if listed != nil && !listed[name] && t.idleSince.Before(listedAt) || now.Sub(t.idleSince) > idle {
			p.drop(name)
		}
	}
}

// lookAll wakes the loop of every tenant consumer with mail pending, and
// adopts mail that no consumer covers (adoptTenants); it returns how many
// consumers it read. Nothing to do, and no listing, while the work stream
// is empty.
func (p *workPuller) lookAll() (int, error) {
	listedAt := time.Now()
	c, err := p.q.adoptTenants(p.ctx)
	// What this process remembers of tenants whose consumers are gone,
	// or idle past the server's threshold, goes; only on a whole
	// listing (none while the work stream is empty: idleness alone).
	listed := c.names
	if err != nil {
		listed = nil
	}
	now := time.Now()
	p.mu.Lock()
	p.pruneHandles(listed, listedAt, now)
	p.mu.Unlock()
	p.q.pruneTenants(listed, listedAt, now)
	return len(c.names), errors.Join(err, p.wakeEach(c.pending))
}

// wakeEach wakes the named consumers' loops. One that cannot be had does
// not keep the others waiting for the next look: a consumer gone since
// the listing (removed as idle, or by an operator) is skipped, and any
// other error is returned with the rest after all were tried.
func (p *workPuller) wakeEach(names []string) error {
	var errs []error
	for _, name := range names {
		if err := p.add(name); err != nil {
			if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				errs = append(errs, fmt.Errorf("consumer %s: %w", name, err))
			} else {
				p.q.forgetConsumer(name)
			}
			continue
		}
		p.wake(name)
	}
	return errors.Join(errs...)
}

// batch is how many envelopes a loop's next pull asks for, under p.mu: an
// equal share of what the process may hold pulled and not started, which
// is what it starts in a quarter of the ack wait at the rate of its last
// seconds, and at least the buffer; at least one and at most the buffer.
// The more tenants have mail, the smaller each share, until what waits in
// the process would outlast the share of the ack wait: a pull request
// costs the server about as much as a hundred envelopes' hand-off when a
// hundred tenants have consumers (BenchmarkPullTenants), so small pulls
// are kept for when the rate is too low for large ones.
func (p *workPuller) batch() int {
	budget := max(p.buffer, int(p.rate*p.q.opts.AckWait.Seconds()/4))
	return min(p.buffer, max(1, budget/p.running))
}

// received counts n envelopes a loop's pull got, for the rate, under p.mu.
func (p *workPuller) received(n int) {
	p.rateN += n
	now := time.Now()
	if p.rateFrom.IsZero() {
		p.rateFrom = now
	}
	if d := now.Sub(p.rateFrom); d >= time.Second {
		p.rate = (p.rate + float64(p.rateN)/d.Seconds()) / 2
		p.rateN, p.rateFrom = 0, now
	}
}

// run is one tenant's pull loop. Each pull asks for its batch; the loop
// stops after a pull that got nothing (it waited pullWait) or failed,
// unless a wake-up came meanwhile.
func (p *workPuller) run(t *tenantPull) {
	defer p.wg.Done()
	pause := 250 * time.Millisecond
	for {
		p.mu.Lock()
		t.woken = false
		n := p.batch()
		p.mu.Unlock()
		n, taken, err := p.q.fetchOnce(p.ctx, t.cons, LaneWork, n, p.out)
		got := n > 0
		if err != nil && p.ctx.Err() == nil {
			// A failover or a lost consumer: pause before a wake-up may
			// send the loop round again (the periodic look would).
			tm := time.NewTimer(pause)
			select {
			case <-p.ctx.Done():
			case <-tm.C:
			}
			tm.Stop()
			pause = min(pause*2, 5*time.Second)
		} else if got {
			pause = 250 * time.Millisecond
		}
		p.mu.Lock()
		// The rate the batches follow is what the workers take: an
		// envelope given back unstarted is no delivery.
		p.received(taken)
		if p.ctx.Err() != nil || (!got || err != nil) && !t.woken || consumerGone(err) {
			t.running, t.idleSince = false, time.Now()
			p.running--
			p.q.pulling.Add(-1)
			gone := consumerGone(err) && p.ctx.Err() == nil
			// A wake-up that came meanwhile says the tenant has mail
			// now. "No responders" also answers a pull while a
			// cluster elects the consumer's leader: the name is looked
			// up again (and woken if it is there) rather than left to
			// the periodic look, up to a minute away.
			rewake := gone && t.woken
			if gone {
				// Removed as idle, or by an operator: a wake-up for
				// the tenant gets the consumer again, and this
				// process makes it again for the tenant's next mail.
				p.drop(t.name)
			}
			p.mu.Unlock()
			if gone {
				p.q.forgetConsumer(t.name)
			}
			if rewake {
				p.wake(t.name)
			}
			return
		}
		p.mu.Unlock()
	}
}
