package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/defaults"
)

// Stream, bucket and consumer names. They are part of outflow's on-disk
// contract: renaming one orphans existing data.
const (
	StreamWork      = "OUTFLOW_WORK"
	StreamRetry     = "OUTFLOW_RETRY"
	StreamRateLimit = "OUTFLOW_RATELIMIT"
	StreamDead      = "OUTFLOW_DEAD"
	StreamEvents    = "OUTFLOW_EVENTS"

	BucketBodies = "outflow_bodies"
	// bodyStreamName is the stream behind BucketBodies (nats.go names an
	// Object Store's stream OBJ_<bucket>).
	bodyStreamName = "OBJ_" + BucketBodies
	BucketSent     = "outflow_sent"

	consumerRetry     = "outflow-retry"
	consumerRateLimit = "outflow-ratelimit"
)

// Options say how to reach NATS and how to lay out the streams.
type Options struct {
	// URL of an external NATS server or cluster (comma-separated). Ignored
	// when InProcess is set.
	URL string
	// CredsFile is a NATS .creds file (JWT + nkey) for URL.
	CredsFile string
	// User and Password authenticate to URL or to the embedded server.
	User, Password string
	// InProcess connects to an embedded server without a socket.
	InProcess *server.Server
	// Name is the connection name shown by the server (e.g. the worker id).
	Name string
	// Replicas for every stream and bucket: 1 on the embedded server, 3 on
	// a cluster. Default DefaultReplicas.
	Replicas int
	// SentTTL is how long SENT markers are kept: longer than any redelivery
	// can take. Default DefaultSentTTL.
	SentTTL time.Duration
	// EventsMaxAge is how long the events stream keeps outcomes. Default
	// DefaultEventsMaxAge.
	EventsMaxAge time.Duration
	// DeadMaxAge is how long dead letters (and bodies) are kept. Default
	// DefaultDeadMaxAge.
	DeadMaxAge time.Duration
	// DedupWindow is the publish deduplication window of the work stream,
	// which bounds how late an `outflow submit --idempotency-key` retry is
	// still recognised: after it, the key makes a new message with ids of
	// its own (Enqueue). Keep SentTTL at least this long: the key's record
	// is in the SENT bucket. Default DefaultDedupWindow.
	DedupWindow time.Duration
	// AckWait is how long a worker holds an envelope before the server
	// redelivers it, unless the worker reports progress. Default
	// DefaultAckWait.
	AckWait time.Duration
	// MaxAckPending bounds envelopes in flight per lane across all workers.
	// Default DefaultMaxAckPending.
	MaxAckPending int
	// DeadlineAfter is the wall-clock budget of a message counted from
	// submission: the envelope's Deadline, stamped at enqueue and at replay,
	// is this long after. It is not the worker's backoff.Budget.MaxAge,
	// which counts from the first attempt; serve sets both from --max-age.
	// Default backoff.DefaultBudget().MaxAge, the same as the worker's.
	// Setup publishes it on the work stream (metaDeadlineAfter), and a
	// NoSetup client (`outflow submit`, `queue replay`) that leaves it
	// zero takes the daemon's from there, so that it stamps what serve
	// would with its --max-age; the default only when no daemon wrote it.
	DeadlineAfter time.Duration
	// InlineBodyMax is the largest body of one destination that travels
	// inside its envelope; larger ones go to the Object Store. Default and
	// maximum InlineBodyMax; negative: every body goes to the Object Store.
	InlineBodyMax int
	// PerRecipient, when set, says which tenants' mail Enqueue splits per
	// recipient, as Submission.PerRecipient does for one submission: serve
	// sets it for the tenants whose mail goes out with a return path, so
	// that every way in (SMTP, the API, the bounce listener's forwards,
	// notices) splits alike.
	PerRecipient func(tenant string) bool
	// NoSetup skips creating or updating streams and buckets (admin clients).
	NoSetup bool
	// Syncer, when set, makes every write whose loss could lose mail
	// durable before it is reported done: Enqueue's envelopes and bodies
	// before it returns the ids (the 250), a schedule or a dead letter
	// before the original is acknowledged. The daemon on the embedded
	// server sets it (Embedded.Syncer, --durability disk); nil means the
	// server's acknowledgement is enough (replicas, none). With Syncer
	// set, Connect also answers other processes' RemoteSync requests.
	Syncer Syncer
	// RemoteSync asks the daemon on the same server (over NATS) for the
	// group-committed sync that Syncer gives in process: `outflow submit`
	// and the admin verbs set it. When no daemon answers (it runs with
	// --durability replicas or none), the server's acknowledgement stands.
	RemoteSync bool
	Logger     zerolog.Logger
}

// MaxSendAhead is how far ahead a message may be sent later
// (Submission.SendAt; the API's send_at, submit --send-at): three days, as
// hosted sending services allow, so that a typo in a year does not park a
// message for a decade. Bodies are kept for it.
const MaxSendAhead = 72 * time.Hour

// Defaults of Options, which the CLI's flags and docs/configuration.md
// take from here.
const (
	DefaultReplicas      = 1
	DefaultSentTTL       = 72 * time.Hour
	DefaultEventsMaxAge  = 7 * 24 * time.Hour
	DefaultDeadMaxAge    = 14 * 24 * time.Hour
	DefaultDedupWindow   = 24 * time.Hour
	DefaultAckWait       = 60 * time.Second
	DefaultMaxAckPending = 4096
)

func (o *Options) defaults() {
	defaults.Set(&o.Replicas, DefaultReplicas)
	defaults.Set(&o.SentTTL, DefaultSentTTL)
	defaults.Set(&o.EventsMaxAge, DefaultEventsMaxAge)
	defaults.Set(&o.DeadMaxAge, DefaultDeadMaxAge)
	defaults.Set(&o.DedupWindow, DefaultDedupWindow)
	defaults.Set(&o.DeadlineAfter, backoff.DefaultBudget().MaxAge)
	defaults.Set(&o.AckWait, DefaultAckWait)
	defaults.Set(&o.MaxAckPending, DefaultMaxAckPending)
	if o.InlineBodyMax == 0 || o.InlineBodyMax > InlineBodyMax {
		o.InlineBodyMax = InlineBodyMax
	}
}

// Queue is a connection to outflow's JetStream state.
type Queue struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	opts   Options
	log    zerolog.Logger
	bodies jetstream.ObjectStore
	// bodyStream is the Object Store's stream, for the direct reads and
	// writes of enqueue.go's fast path.
	bodyStream jetstream.Stream
	bodyInfos  infoCache
	sent       jetstream.KeyValue
	ev         *eventPublisher
	lanes      map[Lane]jetstream.Stream
	dead       jetstream.Stream
	events     jetstream.Stream
	// tenants remembers the per-tenant work consumers already ensured.
	tenants tenantSet
	// syncer makes writes durable before they are reported done (nil:
	// the server's acknowledgement is enough). See storesync.go.
	syncer Syncer
	// metaSyncs collapses concurrent metadata syncs (durableMeta).
	metaSyncs flights
	// ops counts JetStream operations by kind (ops.go).
	ops opCounts
	// local answers look-ups that find nothing from the embedded
	// server's store in process (instore.go); nil over a socket.
	local *localStore
	// keeper keeps the work stream's last block file (keeper.go).
	keeper keeper
	// pulling counts the tenants' pull loops running (tenants.go).
	pulling atomic.Int64
	// tenantHandles counts the tenant consumers' handles the work
	// pullers hold (tenants.go).
	tenantHandles atomic.Int64
	// times are the work lane's waits; zero: the package's (lanes.go).
	times laneTimes
	// ackWaits are the consumers' ack waits as the server last gave them
	// (Delivery.AckWait, ackwait.go).
	ackWaits ackWaits
	// sentSt is the SENT bucket's stream, once sentStream looked it up.
	sentSt   jetstream.Stream
	sentStMu sync.Mutex
	// remote is the daemon's last answer about its store's room, for a
	// process that stores through another's embedded server (roomFor).
	remote remoteRoom
}

// connectTimeout bounds the NATS connection handshake.
const connectTimeout = 10 * time.Second

// connectCtx is nats.Connect, returning when ctx ends if that is first (a
// command's --timeout bounds its connection as well); a connection made
// after that is closed. The handshake's own timeout stays connectTimeout,
// for the reconnects of a long-lived connection as well.
func connectCtx(ctx context.Context, url string, nopts []nats.Option) (*nats.Conn, error) {
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, nopts...)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		return r.nc, r.err
	case <-ctx.Done():
		go func() {
			if r := <-done; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// Connect connects to NATS and, unless opts.NoSetup, creates or updates
// every stream, bucket and consumer idempotently.
func Connect(ctx context.Context, opts Options) (*Queue, error) {
	return connect(ctx, opts, streamConfigs)
}

// connect is Connect with the streams laid out by layout: streamConfigs,
// or in a test an earlier release's layout to upgrade from.
func connect(ctx context.Context, opts Options, layout func(Options) []jetstream.StreamConfig) (*Queue, error) {
	// An admin client takes the daemon's message age budget unless it
	// was given one (adoptSettings).
	adopt := opts.NoSetup && opts.DeadlineAfter == 0
	opts.defaults()
	nopts := []nats.Option{
		nats.Name(opts.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.PingInterval(10 * time.Second),
		// The handshake (INFO, CONNECT, PING/PONG) gets more than nats.go's
		// 2 s: a daemon starting on a busy machine, or the embedded server
		// answering while bcrypt or a store recovery holds both cores, is
		// slow, not gone. A refused connection still fails at once.
		nats.Timeout(connectTimeout),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				opts.Logger.Warn().Err(err).Msg("nats disconnected")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			opts.Logger.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("nats reconnected")
		}),
		// Asynchronous errors (a slow consumer, a watcher's consumer gone
		// at shutdown) go to the log as JSON lines: without a handler
		// nats.go prints them to stderr as plain text, in the middle of
		// the daemon's JSON log.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := opts.Logger.Warn().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("nats asynchronous error")
		}),
	}
	if opts.User != "" {
		nopts = append(nopts, nats.UserInfo(opts.User, opts.Password))
	}
	if opts.CredsFile != "" {
		nopts = append(nopts, nats.UserCredentials(opts.CredsFile))
	}
	url := opts.URL
	if opts.InProcess != nil {
		nopts = append(nopts, nats.InProcessServer(opts.InProcess))
		url = ""
	} else if url == "" {
		return nil, errors.New("queue: no NATS url")
	}
	nc, err := connectCtx(ctx, url, nopts)
	if err != nil {
		return nil, fmt.Errorf("connect to NATS %s: %w", redact(url), err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	q := &Queue{nc: nc, js: js, opts: opts, log: opts.Logger, lanes: map[Lane]jetstream.Stream{}, syncer: opts.Syncer,
		local: newLocalStore(opts.InProcess)}
	if q.ev, err = newEventPublisher(nc, opts.Logger); err != nil {
		nc.Close()
		return nil, fmt.Errorf("events: %w", err)
	}
	if b, ok := opts.Syncer.(interface{ WorkBlocks() uint64 }); ok {
		q.keeper.blocks = b
	}
	if q.syncer == nil && opts.RemoteSync {
		q.syncer = &remoteSyncer{nc: nc}
	}
	if err := q.setup(ctx, layout); err != nil {
		nc.Close()
		return nil, err
	}
	if adopt {
		q.adoptSettings()
	}
	if all, ok := opts.Syncer.(interface{ SyncAll() error }); ok && !opts.NoSetup {
		// Stream and consumer metadata written by setup.
		if err := all.SyncAll(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("sync store: %w", err)
		}
	}
	if q.storeRoom() != nil && !opts.NoSetup {
		if err := q.serveRoom(); err != nil {
			nc.Close()
			return nil, err
		}
	}
	if opts.Syncer != nil {
		if err := q.serveSync(); err != nil {
			nc.Close()
			return nil, err
		}
		if _, inProcess := opts.Syncer.(interface{ SyncAll() error }); inProcess {
			if err := q.watchFirings(); err != nil {
				nc.Close()
				return nil, err
			}
		}
	}
	return q, nil
}

// Close waits (up to 5 s) for this process's asynchronous publishes, the
// events, to be stored, then drains the connection: subscriptions end
// before it closes. So an admin command's own event (dropped, replayed) is
// in the history by the time the command returns.
func (q *Queue) Close() error {
	if q.nc.IsClosed() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = q.asyncStored(ctx)
	return q.nc.Drain()
}

// asyncStored waits until the server has acknowledged this process's
// asynchronous publishes (envelopes and bodies through nats.go, events
// through q.ev), or ctx ends.
func (q *Queue) asyncStored(ctx context.Context) error {
	for _, c := range []<-chan struct{}{q.js.PublishAsyncComplete(), q.ev.complete()} {
		select {
		case <-c:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// laneDedupWindow is how long a lane remembers a schedule's deduplication
// id (<envelope id>.<step>). A second publish of the same step comes from a
// worker repeating a publish whose answer it lost (seconds later) or from
// the worker the envelope was redelivered to after ackWait: twice the ack
// wait covers both, with two minutes (the server's default) as the floor.
// The window is memory: the server holds every id in it, so a mass deferral
// (a provider throttling everything) costs an id per envelope deferred
// within the window, not for as long as the backlog lasts.
func laneDedupWindow(ackWait time.Duration) time.Duration {
	return max(2*time.Minute, 2*ackWait)
}

// checkReplicas refuses to lower the replication of streams that exist.
// Setup creates or updates every stream with this process's Replicas, so a
// single worker started with --nats-replicas 1 against a fleet's cluster
// would otherwise quietly drop every stream to one copy. Raising is
// allowed: it is how a fleet moves to more replicas.
func (q *Queue) checkReplicas(ctx context.Context, streams []string) error {
	for _, name := range streams {
		s, err := q.js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		if have := s.CachedInfo().Config.Replicas; have > q.opts.Replicas {
			return fmt.Errorf("stream %s has %d replicas and this process asks for %d: start every worker with --nats-replicas %d "+
				"(fewer replicas are set on the streams themselves, e.g. nats stream edit %s --replicas N, not by one worker)",
				name, have, q.opts.Replicas, have, name)
		}
	}
	return nil
}

// streamConfigs is the layout of outflow's streams for o: what setup
// creates, or updates existing streams to. Setup's update is the upgrade
// path, so a field added here must be one the server lets an existing
// stream take (TestUpgradeFromPreviousLayout).
func streamConfigs(o Options) []jetstream.StreamConfig {
	lane := func(name string, l Lane) jetstream.StreamConfig {
		return jetstream.StreamConfig{
			Name:              name,
			Description:       "outflow " + string(l) + " lane: schedules and due envelopes",
			Subjects:          []string{laneSubjects(l)},
			Retention:         jetstream.WorkQueuePolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          o.Replicas,
			Duplicates:        laneDedupWindow(o.AckWait),
			AllowMsgSchedules: true,
			AllowRollup:       true,
			AllowDirect:       true,
			MaxMsgSize:        MaxMsgBytes,
			RePublish:         &jetstream.RePublish{Source: laneDueSubjects(l), Destination: firedSubjects(l), HeadersOnly: true},
		}
	}
	return []jetstream.StreamConfig{
		{
			Name:        StreamWork,
			Description: "outflow fresh mail: one envelope per destination",
			// What admin clients stamp as the daemon does (adoptSettings).
			Metadata:    map[string]string{metaDeadlineAfter: o.DeadlineAfter.String()},
			Subjects:    []string{laneSubjects(LaneWork)},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    o.Replicas,
			Duplicates:  o.DedupWindow,
			AllowDirect: true,
			AllowRollup: true, // the keeper's (keeper.go)
			MaxMsgSize:  MaxMsgBytes,
		},
		lane(StreamRetry, LaneRetry),
		lane(StreamRateLimit, LaneRateLimit),
		{
			Name:              StreamDead,
			Description:       "outflow dead letters, one per envelope id",
			Subjects:          []string{deadSubjects},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          o.Replicas,
			MaxMsgsPerSubject: 1,
			MaxAge:            o.DeadMaxAge,
			AllowDirect:       true,
		},
		{
			Name:        StreamEvents,
			Description: "outflow outcomes: delivered, deferred, throttled, bounced, unknown, dead, dropped",
			Subjects:    []string{eventsSubjects},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    o.Replicas,
			MaxAge:      o.EventsMaxAge,
			AllowDirect: true,
		},
	}
}

// metaDeadlineAfter is the work stream's metadata key under which setup
// publishes Options.DeadlineAfter (a Go duration: serve's --max-age), so
// that `outflow submit` and `queue replay`, which connect without setting
// anything up (NoSetup) and perhaps with no more than --nats-url, stamp a
// message's deadline as the daemons do. Every daemon of a fleet writes it
// at start; the last one started wins, as it does for the body bucket's
// TTL, which is derived from the same value.
const metaDeadlineAfter = "outflow.deadline_after"

// adoptSettings takes, for an admin client given none, the message age
// budget the daemons published on the work stream (metaDeadlineAfter).
// With none published (a daemon of an earlier release), or one that does
// not parse, the default stands.
func (q *Queue) adoptSettings() {
	work := q.lanes[LaneWork]
	if work == nil || work.CachedInfo() == nil {
		return
	}
	v, ok := work.CachedInfo().Config.Metadata[metaDeadlineAfter]
	if !ok {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		q.log.Warn().Str("value", v).Msg("the daemon's published message age budget does not parse: using the default")
		return
	}
	q.opts.DeadlineAfter = d
}

// lookUpAttempt bounds one JetStream look-up of an admin client's setup.
// A replicated stream whose leader was lost answers nothing until its
// group elects another, so a request sent in the election waits out
// whatever deadline it was given; asked again, it is answered.
const lookUpAttempt = 3 * time.Second

// lookUp runs get with lookUpAttempt per try, again while the try timed
// out or found no responder and ctx still has time: `outflow submit`
// against a cluster that has just lost a node then rides out the
// election within its --timeout instead of failing on the first request.
func lookUp[T any](ctx context.Context, get func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, lookUpAttempt)
		v, err := get(actx)
		cancel()
		if err == nil || ctx.Err() != nil ||
			!(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout)) {
			return v, err
		}
		select { // "no responders" comes at once: not a busy loop
		case <-ctx.Done():
			return v, err
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// setup creates or updates the streams (as layout lays them out for the
// options), buckets and consumers, or with NoSetup only looks them up.
func (q *Queue) setup(ctx context.Context, layout func(Options) []jetstream.StreamConfig) error {
	o := q.opts
	cfgs := layout(o)
	if !o.NoSetup {
		names := []string{bodyStreamName, kvStream(BucketSent)}
		for _, c := range cfgs {
			names = append(names, c.Name)
		}
		if err := q.checkReplicas(ctx, names); err != nil {
			return err
		}
	}
	for _, c := range cfgs {
		var s jetstream.Stream
		var err error
		if o.NoSetup {
			s, err = lookUp(ctx, func(ctx context.Context) (jetstream.Stream, error) { return q.js.Stream(ctx, c.Name) })
		} else {
			s, err = q.js.CreateOrUpdateStream(ctx, c)
		}
		if o.NoSetup && errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("stream %s: %w (no outflow serve has run against this NATS)", c.Name, err)
		}
		if err != nil {
			return fmt.Errorf("stream %s: %w", c.Name, err)
		}
		switch c.Name {
		case StreamWork:
			q.lanes[LaneWork] = s
		case StreamRetry:
			q.lanes[LaneRetry] = s
		case StreamRateLimit:
			q.lanes[LaneRateLimit] = s
		case StreamDead:
			q.dead = s
		case StreamEvents:
			q.events = s
		}
	}
	var err error
	if o.NoSetup {
		q.bodies, err = lookUp(ctx, func(ctx context.Context) (jetstream.ObjectStore, error) { return q.js.ObjectStore(ctx, BucketBodies) })
	} else {
		q.bodies, err = q.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket:      BucketBodies,
			Description: "outflow message bodies, stored once per submission",
			Storage:     jetstream.FileStorage,
			Replicas:    o.Replicas,
			// A body outlives every dead letter that can name it: one
			// sent later is written up to MaxSendAhead before its
			// first attempt, dead-lettered up to DeadlineAfter after
			// that, and its dead letter kept DeadMaxAge. A day of
			// slack: the budget's age counts from the first attempt.
			TTL: o.DeadMaxAge + o.DeadlineAfter + MaxSendAhead + 24*time.Hour,
		})
	}
	if err != nil {
		return fmt.Errorf("object store %s: %w", BucketBodies, err)
	}
	if q.bodyStream, err = lookUp(ctx, func(ctx context.Context) (jetstream.Stream, error) { return q.js.Stream(ctx, bodyStreamName) }); err != nil {
		return fmt.Errorf("object store %s: %w", BucketBodies, err)
	}
	kvs := []struct {
		dst *jetstream.KeyValue
		cfg jetstream.KeyValueConfig
	}{
		{&q.sent, jetstream.KeyValueConfig{Bucket: BucketSent, Description: "delivered envelope attempts", TTL: o.SentTTL, Storage: jetstream.FileStorage, Replicas: o.Replicas}},
	}
	for _, k := range kvs {
		var kv jetstream.KeyValue
		if o.NoSetup {
			kv, err = lookUp(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return q.js.KeyValue(ctx, k.cfg.Bucket) })
		} else {
			kv, err = q.js.CreateOrUpdateKeyValue(ctx, k.cfg)
		}
		if err != nil {
			return fmt.Errorf("kv %s: %w", k.cfg.Bucket, err)
		}
		*k.dst = kv
	}
	if o.NoSetup {
		return nil
	}
	// The work stream is read by one consumer per tenant (tenants.go); a
	// work-queue stream refuses overlapping consumers, so an unfiltered
	// "outflow-work" consumer left by an older daemon is removed.
	if err := q.js.DeleteConsumer(ctx, StreamWork, "outflow-work"); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("remove old work consumer: %w", err)
	}
	for _, c := range []struct {
		stream, name, filter string
	}{
		{StreamRetry, consumerRetry, laneDueSubjects(LaneRetry)},
		{StreamRateLimit, consumerRateLimit, laneDueSubjects(LaneRateLimit)},
	} {
		_, err := q.js.CreateOrUpdateConsumer(ctx, c.stream, jetstream.ConsumerConfig{
			Durable:       c.name,
			Description:   "outflow workers",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       o.AckWait,
			MaxDeliver:    -1,
			MaxAckPending: o.MaxAckPending,
			FilterSubject: c.filter,
			Replicas:      o.Replicas,
		})
		if err != nil {
			return fmt.Errorf("consumer %s on %s: %w", c.name, c.stream, err)
		}
		q.ackWaits.learn(c.stream, c.name, o.AckWait)
	}
	return q.updateTenantConsumers(ctx)
}

// updateTenantConsumers gives every tenant's work consumer this process's
// AckWait, Replicas and MaxAckPending, and leaves the rest of its
// configuration (its filter, its inactivity threshold) as it is. A
// tenant's consumer is otherwise made or updated only when mail is stored
// for the tenant (createTenant), so one made before a restart kept the
// ack wait of the daemon that made it: with --ack-wait raised, a send
// longer than the old ack wait was handed out again and went out twice.
// A consumer removed between the listing and its update (idle) is not
// made again.
func (q *Queue) updateTenantConsumers(ctx context.Context) error {
	o := q.opts
	stale := map[string]jetstream.ConsumerConfig{} // by consumer name
	l := q.lanes[LaneWork].ListConsumers(ctx)
	for ci := range l.Info() {
		if !strings.HasPrefix(ci.Name, tenantConsumerPrefix) {
			continue
		}
		cfg := ci.Config
		if cfg.AckWait == o.AckWait && cfg.Replicas == o.Replicas && cfg.MaxAckPending == o.MaxAckPending {
			q.ackWaits.learn(StreamWork, ci.Name, cfg.AckWait)
			continue
		}
		cfg.AckWait, cfg.Replicas, cfg.MaxAckPending = o.AckWait, o.Replicas, o.MaxAckPending
		stale[ci.Name] = cfg
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("list the consumers of %s: %w", StreamWork, err)
	}
	for name, cfg := range stale {
		_, err := q.js.UpdateConsumer(ctx, StreamWork, cfg)
		if errors.Is(err, jetstream.ErrConsumerDoesNotExist) || errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("consumer %s on %s: %w", name, StreamWork, err)
		}
		q.ackWaits.learn(StreamWork, name, cfg.AckWait)
	}
	return nil
}

// redact removes user:password@ from each URL of a comma-separated list,
// so credentials never reach a log line or an error message.
func redact(urls string) string {
	if urls == "" {
		return "(in-process)"
	}
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if at := strings.LastIndex(p, "@"); at >= 0 {
			scheme := ""
			if k := strings.Index(p, "://"); k >= 0 && k < at {
				scheme = p[:k+3]
			}
			parts[i] = scheme + "***@" + p[at+1:]
		}
	}
	return strings.Join(parts, ",")
}
