package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/defaults"
)

// Limits are a destination's configured limits, for the whole fleet.
type Limits struct {
	// Rate is the most messages per second sent to the destination by all
	// workers together; 0 means unlimited. Each live worker takes an equal
	// share.
	Rate float64 `json:"rate"`
	// Conns is the most concurrent deliveries (connections) to the
	// destination by all workers together; 0 means unlimited. Each worker
	// may hold Conns/live workers, and one more for the first Conns%live
	// of them by place (shareConns), so that the fleet holds Conns
	// exactly: with fewer connections than workers, some hold none.
	Conns int `json:"conns"`
	// MaxMsgsPerConn is the most messages the sender should deliver over
	// one connection before opening another; 0 means no limit. The
	// Throttle only carries it, to the sender (Permit.Limits).
	MaxMsgsPerConn int `json:"max_msgs_per_conn"`
}

// Defaults of Config.
const (
	DefaultBreakerFailures = 10
	DefaultBreakerCooldown = 3 * time.Second
	DefaultSourceBlockHold = time.Hour
	DefaultMaxWait         = 2 * time.Second
	DefaultDecreaseFactor  = 0.5
	DefaultDecreaseFor     = 60 * time.Second
	DefaultIncreaseStep    = 0.1
	DefaultIncreaseEvery   = 10 * time.Second
	DefaultMinFactor       = 0.05
	DefaultHeartbeat       = 5 * time.Second
	DefaultWorkerTTL       = 15 * time.Second
)

// Timings that are not worth a knob.
const (
	connsRetry   = time.Second            // Refusal{Reason: "conns"} comes back after this
	windowRetry  = 250 * time.Millisecond // Refusal{Reason: "window"} comes back after this at first (see windowRefusal)
	tickEvery    = 200 * time.Millisecond // maintenance: expiries, dead workers, metrics
	opTimeout    = 5 * time.Second        // one KV transition
	idleEvict    = 10 * time.Minute       // a destination with no state and no use is forgotten
	stateIdleTTL = time.Hour              // a shared state with nothing in force is deleted this long after its last write
	markerTTL    = time.Hour              // how long the marker of a deleted state stays (Config.StateStream)
	opsBuffer    = 256                    // queued KV transitions before new ones are dropped (logged)
	readyTimeout = 10 * time.Second       // initial load of the buckets

	// maxSuspendRefusal caps the Until of a "suspended" refusal, so that
	// envelopes of a long (or "until resumed") suspension look again
	// hourly even if no OnRecover release comes (or the end was moved
	// earlier by a new Suspend).
	maxSuspendRefusal = time.Hour

	// A destination that can take no attempt now (its first-contact
	// window full, its breaker open, or half-open with the probe out)
	// holds the envelopes it refuses for a while (holding): holdBudget is
	// how many of them a second it aims to see come back in total,
	// whatever their number, holdMax the longest it holds one, and
	// probeSpares how many (per worker) it keeps coming back at an open
	// breaker's probe time.
	holdBudget  = 20.0
	holdMax     = 10 * time.Minute
	probeSpares = 2
)

// Config configures a Throttle. Zero durations and numbers take
// the defaults named on each field.
type Config struct {
	// Defaults are the limits of every destination without an override.
	Defaults Limits
	// Overrides are complete limits by destination (a domain or a group
	// name; domains lower-case, without the trailing dot). A domain with an
	// override is never folded into a group.
	Overrides map[string]Limits
	// Groups are the provider groups used when GroupByMX is set; usually
	// DefaultGroups() plus the config's own.
	Groups []GroupRule
	// GroupByMX makes a recipient domain's destination the group its MX
	// hosts belong to (looked up through Resolver, cached 10 minutes; a
	// failed lookup leaves the domain its own destination for a minute).
	// Off: every domain is its own destination.
	GroupByMX bool
	// GroupBySite, with GroupByMX, makes the destination of a domain whose
	// most preferred MX hosts are in no group and not its own their MX
	// site ("mx:HOST[+HOST]", SitePrefix), shared by every domain on the
	// same hosts.
	GroupBySite bool
	// Automation rules (see AutoRule).
	Automation []AutoRule
	// ClassifyRules are the classify rules replies can be given, name to
	// the scope the rule declares (0: derived from the reply), from the
	// classifier serve uses (embedded rules and the operator's
	// classify-rules file). When set, New refuses an automation rule
	// whose Rule starts none of them (a typo never fires), naming the
	// nearest, and a rate, factor or conns rule that matches only
	// tenant-scoped ones without whole-destination (it would never act).
	// Nil: not checked.
	ClassifyRules map[string]classify.Scope

	// BreakerFailures is the number of consecutive failed attempts (seen
	// by one worker) that opens the destination's breaker. Default
	// DefaultBreakerFailures.
	BreakerFailures int
	// BreakerCooldown is how long an open breaker stays open before one
	// probe per worker is let through. Default DefaultBreakerCooldown.
	BreakerCooldown time.Duration
	// SourceBlockHold is how long a (destination, source) pair is
	// suspended after a reply about its source address (a blocklist, a
	// refused reverse DNS; sourceblock.go). Default DefaultSourceBlockHold.
	SourceBlockHold time.Duration
	// MaxWait is how long Admit may block for a rate token before it
	// refuses with the token's time instead. Default DefaultMaxWait;
	// negative: never block.
	MaxWait time.Duration
	// DecreaseFactor multiplies the rate factor on a throttled reply
	// (multiplicative decrease). Default DefaultDecreaseFactor; must be in
	// (0, 1).
	DecreaseFactor float64
	// DecreaseFor is how long a cut holds before the ramp back may begin;
	// a worker cuts a destination at most once per DecreaseFor. Default
	// DefaultDecreaseFor.
	DecreaseFor time.Duration
	// IncreaseStep is added to the factor per IncreaseEvery of success
	// without a throttle (additive increase), up to 1. Default
	// DefaultIncreaseStep.
	IncreaseStep float64
	// IncreaseEvery is the ramp's step interval; at most one KV write per
	// destination per interval, fleet-wide. Default DefaultIncreaseEvery.
	IncreaseEvery time.Duration
	// MinFactor is the floor of the factor. Default DefaultMinFactor.
	MinFactor float64

	// NoLearn turns learned limits off: a destination without a
	// configured rate is then never slowed by throttles (see learn.go).
	NoLearn bool
	// LearnWindow is the sliding window of the fleet's delivered rate
	// that seeds and bounds the cuts of a learned rate. Default
	// DefaultLearnWindow.
	LearnWindow time.Duration
	// LearnHold is the least time between two cuts of a learned limit,
	// fleet-wide, and from a cut to the first step up. Default
	// DefaultLearnHold.
	LearnHold time.Duration
	// LearnEvery is the interval of the learned limits' steps up.
	// Default DefaultLearnEvery.
	LearnEvery time.Duration
	// LearnStep is a learned rate's additive step as a fraction of the
	// rate its last cut set (at least 0.1 msgs/s). Default
	// DefaultLearnStep.
	LearnStep float64
	// LearnForget is the quiet period (no throttle cut) after which
	// learned limits are forgotten. Default DefaultLearnForget.
	LearnForget time.Duration
	// LearnMin is the floor of a learned rate, msgs/s. Default
	// DefaultLearnMin.
	LearnMin float64
	// LearnInitial is the fleet's attempts in flight to a destination
	// with no rate yet, split between the live workers by place (a
	// worker past it has none until another's attempts are delivered);
	// each attempt the server answered with other than a throttle
	// (delivered, bounced, greylisted) widens a worker's share by one
	// (see firstWindow). Default DefaultLearnInitial; negative: no window.
	LearnInitial int
	// TenantWeights weigh tenants' shares of a destination's rate when
	// several have mail waiting for it; a tenant not listed weighs 1.
	TenantWeights map[string]float64
	// OnLearned is called, by the worker that wrote it, after each
	// change of a destination's learned limits (seeded, cut, stepped up,
	// forgotten), with the state after it and the change's name. It runs
	// on the writer goroutine: keep it short (serve publishes an event).
	OnLearned func(dest, change string, s DestState)

	// WorkerID names this worker in the registry, in UpdatedBy and in
	// logs. Default: DefaultWorkerID(), hostname-pid. It need not be
	// unique: the registry key adds a random instance per process, so two
	// processes with one id count as two workers and share the rate.
	WorkerID string
	// State is the shared destination state bucket (outflow_dest).
	// Required.
	State jetstream.KeyValue
	// Registry is the live-worker bucket (outflow_workers, with a TTL).
	// Nil: this worker assumes it is alone.
	Registry jetstream.KeyValue
	// Heartbeat is how often this worker refreshes its registry key.
	// Default DefaultHeartbeat.
	Heartbeat time.Duration
	// WorkerTTL is how long a worker counts as live after its last
	// heartbeat. Default: the registry bucket's TTL, else DefaultWorkerTTL.
	WorkerTTL time.Duration
	// Resolver looks up MX records for GroupByMX. Default net.DefaultResolver.
	Resolver MXResolver
	// OnRecover is called, by exactly one worker of the fleet, when a
	// destination's suspension ends (by time or by Resume) or its breaker
	// closes, with the destination's fleet rate (messages/s, 0 =
	// unlimited): the deferred envelopes of that destination should be
	// released at that rate, oldest first (those whose domain Recovers
	// names: for one domain of a provider group suspended by itself, its
	// own mail, and the rate is the group's). It runs on its own goroutine;
	// Close waits for it, so a long release should watch its own context.
	OnRecover func(dest string, rate float64)
	// Logger receives one line per state transition. It is expected to
	// carry the worker id already (serve's does), so the Throttle does not
	// add it again. Default: disabled.
	Logger zerolog.Logger
	// Registerer, when set, gets the outflow_dest_* and
	// outflow_workers_live collectors.
	Registerer prometheus.Registerer
	// Now is the worker's wall clock (default time.Now); tests give a
	// skewed one. See clock.go for how it is reconciled with the times
	// other workers write.
	Now func() time.Time

	// StateStream, when set, is the stream of the State bucket: the
	// markers that deleted states leave are dropped from it an hour after
	// they were written, when every worker has seen them. Without it they
	// stay, one per destination ever forgotten, and every start reads them
	// all again.
	StateStream jetstream.Stream

	// stateIdleTTL replaces the package's stateIdleTTL (tests).
	stateIdleTTL time.Duration
	// markerTTL replaces the package's markerTTL, and markerSweep the
	// minute between two looks for markers due (tests).
	markerTTL, markerSweep time.Duration
}

// withDefaults validates c and fills the defaults.
func (c Config) withDefaults() (Config, error) {
	if c.State == nil {
		return c, errors.New("throttle: no state bucket")
	}
	if c.Defaults.Rate < 0 || c.Defaults.Conns < 0 || c.Defaults.MaxMsgsPerConn < 0 {
		return c, errors.New("throttle: default limits must be >= 0")
	}
	ov := make(map[string]Limits, len(c.Overrides))
	for d, l := range c.Overrides {
		if l.Rate < 0 || l.Conns < 0 || l.MaxMsgsPerConn < 0 {
			return c, fmt.Errorf("throttle: limits of %q must be >= 0", d)
		}
		ov[NormalizeDest(d)] = l
	}
	c.Overrides = ov
	defaults.Set(&c.BreakerFailures, DefaultBreakerFailures)
	defaults.Set(&c.BreakerCooldown, DefaultBreakerCooldown)
	defaults.Set(&c.SourceBlockHold, DefaultSourceBlockHold)
	switch {
	case c.MaxWait == 0:
		c.MaxWait = DefaultMaxWait
	case c.MaxWait < 0:
		c.MaxWait = 0
	}
	if c.DecreaseFactor == 0 {
		c.DecreaseFactor = DefaultDecreaseFactor
	}
	if !(c.DecreaseFactor > 0 && c.DecreaseFactor < 1) {
		return c, fmt.Errorf("throttle: decrease factor %v: want 0 < f < 1", c.DecreaseFactor)
	}
	defaults.Set(&c.DecreaseFor, DefaultDecreaseFor)
	defaults.Set(&c.IncreaseStep, DefaultIncreaseStep)
	defaults.Set(&c.IncreaseEvery, DefaultIncreaseEvery)
	if c.MinFactor == 0 {
		c.MinFactor = DefaultMinFactor
	}
	if !(c.MinFactor > 0 && c.MinFactor <= 1) {
		return c, fmt.Errorf("throttle: min factor %v: want 0 < f <= 1", c.MinFactor)
	}
	defaults.Set(&c.LearnWindow, DefaultLearnWindow)
	defaults.Set(&c.LearnHold, DefaultLearnHold)
	defaults.Set(&c.LearnEvery, DefaultLearnEvery)
	defaults.Set(&c.LearnStep, DefaultLearnStep)
	defaults.Set(&c.LearnForget, DefaultLearnForget)
	defaults.Set(&c.LearnMin, DefaultLearnMin)
	if c.LearnInitial == 0 { // negative: no window
		c.LearnInitial = DefaultLearnInitial
	}
	for tenant, w := range c.TenantWeights {
		if !(w > 0) || math.IsInf(w, 0) {
			return c, fmt.Errorf("throttle: tenant %q: weight %v: want > 0", tenant, w)
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	defaults.Set(&c.Heartbeat, DefaultHeartbeat)
	defaults.Set(&c.stateIdleTTL, stateIdleTTL)
	defaults.Set(&c.markerTTL, markerTTL)
	defaults.Set(&c.markerSweep, time.Minute)
	if c.WorkerID == "" {
		c.WorkerID = DefaultWorkerID()
	}
	return c, nil
}

// Throttle is the fleet-coordinated Gate: per-destination limits, shared
// state (suspensions, rate factors, breakers, overrides) watched in the
// outflow_dest bucket, each live worker's share of the rate (workers
// register in outflow_workers), adaptive rate, circuit breakers and
// automation rules. The hot path (Admit, Done) touches only memory; the
// KV is written on transitions only. Create it with New and stop
// it with Close.
type Throttle struct {
	cfg    Config
	rules  []autoRule
	groups *grouper
	log    zerolog.Logger
	m      *throttleMetrics

	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	ops      chan op
	regKey   string    // registryKey(WorkerID, instance)
	instance string    // this process's instance (newInstance)
	started  time.Time // for the registry record
	once     sync.Once

	mu       sync.RWMutex
	dests    map[string]*dest
	stateful map[string]*dest // destinations with stored state

	wmu       sync.Mutex
	workers   map[string]time.Time    // registry key -> last seen
	peers     map[string]workerRecord // registry key -> its last record
	live      atomic.Int64
	rank      atomic.Int64 // this worker's place among the live ones, sorted by key (slots)
	workerTTL time.Duration
	regLost   atomic.Bool   // the registry's watch is lost (keepWatching)
	regRev    atomic.Uint64 // the revision of this worker's last heartbeat
	watching  sync.Map      // watcher name -> its jetstream.KeyWatcher (keepWatching)

	// markers are the markers of deleted states, by key, to be dropped
	// from the bucket's stream markerTTL after they were written
	// (dropMarkers).
	mmu      sync.Mutex
	markers  map[string]marker
	dropping atomic.Bool // a dropMarkers sweep runs

	// offset is the server's clock minus this worker's, in nanoseconds,
	// as last measured from the registry heartbeat (clock.go); offsetKnown
	// says whether it has been.
	offset      atomic.Int64
	offsetKnown atomic.Bool
}

var _ Gate = (*Throttle)(nil)

// Pending KV transitions of a dest (bits of dest.pending), so that a burst
// of results queues one write, not one per message.
const (
	pendRamp uint8 = 1 << iota
	pendExpire
	pendRecover
	pendBreaker
	pendCut
	pendForget
	pendLearn     // a learned-rate change
	pendLearnConn // a learned-connections change
)

// dest is one destination's in-memory state on this worker.
type dest struct {
	name   string
	limits Limits // configured

	mu       sync.Mutex
	state    DestState // shared state as last seen (or as this worker just wrote)
	rev      uint64    // its KV revision
	hasState bool
	evicted  bool

	bucket   bucket
	lastTurn time.Time // the latest turn on the grid given to an admission (slots.go)
	lastSent time.Time // the latest admission's send time (its turn, or when it was admitted)
	// vq is the destination's virtual queue of envelopes deferred for its
	// rate, one end per tenant with mail waiting: the next envelope of a
	// tenant is told to come back at its tenant's end, which then moves on
	// by one interval of that tenant's share of the fleet rate (see slot).
	vq   map[string]vqTail
	park parking
	// thr and thrPark are the same for mail deferred by a throttled
	// reply (Pace), which starts the rate-limit lane's minimum ahead.
	thr      map[string]vqTail
	thrPark  parking
	tenants  map[string]time.Time // tenant -> last asked for admission
	held     map[string]int       // tenant -> its admissions waiting in process for their turns
	served   map[string]time.Time // tenant -> how far its turns given reach at its weighted share (serve)
	inflight int
	probing  bool // a half-open probe is out
	failures int  // consecutive failed attempts
	lastCut  time.Time
	lastThr  time.Time // last throttled reply
	// quietSince is the first cut of the learned rate that read nothing
	// delivered in the fleet's window, and quietTotal this worker's
	// deliveries then: a block while nothing is delivered since (resume).
	// Zero: a delivery since.
	quietSince time.Time
	quietTotal uint64
	lastUsed   time.Time
	pending    uint8
	// gens counts the transitions queued per pending bit (by the bit's
	// index): a retried write that a later transition of the same bit
	// overtook is stale (op.current), and neither runs nor clears the bit.
	gens [8]uint32
	auto []window // by rule index
	// autoTenant are the windows of rules counting replies about one
	// tenant's own mail, by rule index and tenant (AutoRule.WholeDestination).
	autoTenant map[tenantKey]*window

	// ownFlight counts the attempts in flight under the limits set on
	// this domain by itself while it is in a provider group (own.go),
	// apart from inflight: they are the group's attempts, and counted
	// there.
	ownFlight int

	// Learning (learn.go).
	window      int           // this worker's attempts in flight while the rate is unknown (firstWindow); 0: not in use
	deferred    *deferredSeed // a first seed held back for another worker's (cutLearnedRate)
	delivered   rateWindow    // this worker's deliveries, for the seed
	drains      drainMarks    // this worker's throttles, for the rate between them
	burstFrom   time.Time     // the first admission, or the first after LearnWindow without one
	lastConnLim time.Time     // the connection limit last refused an attempt
	lastConnThr time.Time     // last "too many connections" reply
	// After a "too many connections" reply this worker opens no attempt
	// beyond the connAfter still in flight then until connPause
	// (connsRetry later): the refused attempt's place is not taken again
	// at once (connPaused).
	connPause time.Time
	connAfter int

	// The envelopes refused while d can take no attempt (windowRefusal,
	// breakerRefusal): room spaces their returns; stalledAt is when the
	// first-contact window was last found full with no answer since (zero:
	// it is not stalled), turnaround how long the last answered attempt
	// took; probeAt are the places given to the few kept coming back at
	// an open breaker's probe time.
	room       holding
	stalledAt  time.Time
	turnaround time.Duration
	probeAt    [probeSpares]time.Time
}

// op is one KV transition, run by the writer goroutine.
type op struct {
	d      *dest
	forget uint64 // when set: delete the state if still at this revision
	change string // "suspend", "factor-cut", "breaker-open", …
	flag   uint8  // pending bit to clear afterwards
	gen    uint32 // d.gens of flag when it was queued (enqueue)
	fn     func(s *DestState, now time.Time) bool
	after  func(before, after DestState) // on a successful write

	// A write that failed is tried again (Throttle.failed): tries is the
	// failed tries so far, failedAt the first, loggedAt the last logged,
	// retryAt when the next is due.
	tries                       int
	failedAt, loggedAt, retryAt time.Time
}

// New loads the shared state and the live workers, registers this
// worker, and starts watching both buckets. ctx bounds the Throttle's
// life as Close does.
func New(ctx context.Context, cfg Config) (*Throttle, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	rules, err := compileAutoRules(cfg.Automation, cfg.ClassifyRules)
	if err != nil {
		return nil, fmt.Errorf("throttle: %w", err)
	}
	instance := newInstance()
	t := &Throttle{
		cfg:      cfg,
		rules:    rules,
		groups:   newGrouper(cfg.GroupByMX, cfg.GroupBySite, cfg.Groups, cfg.Overrides, cfg.Resolver),
		log:      cfg.Logger.With().Str("component", "throttle").Logger(),
		m:        newThrottleMetrics(cfg.Registerer),
		ops:      make(chan op, opsBuffer),
		regKey:   registryKey(cfg.WorkerID, instance),
		instance: instance,
		started:  cfg.Now().UTC(),
		dests:    map[string]*dest{},
		stateful: map[string]*dest{},
		workers:  map[string]time.Time{},
		peers:    map[string]workerRecord{},
	}
	t.live.Store(1)
	t.ctx, t.cancel = context.WithCancel(ctx)
	if err := t.start(ctx); err != nil {
		// Registered before the state was loaded (start): the other
		// workers would count it live, and give it a share, until its
		// key expired.
		t.shutdown(t.cfg.Registry != nil)
		return nil, err
	}
	return t, nil
}

func (t *Throttle) start(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()

	// The registry first: this worker's own record, read back, measures
	// how far its clock is from the server's (clock.go), and the times in
	// the shared state are moved onto its clock by that as they are read.
	// Loaded before it, every state was moved by an offset of zero, and
	// stayed so until its destination's next write: a learned rate's grid
	// off by the whole offset (a worker 250 ms ahead took its turns with
	// another's on a 4/s grid), and ends a second or more off kept where
	// the server's clock put them.
	if reg := t.cfg.Registry; reg != nil {
		t.workerTTL = t.cfg.WorkerTTL
		if t.workerTTL <= 0 {
			t.workerTTL = DefaultWorkerTTL
			if st, err := reg.Status(lctx); err == nil && st.TTL() > 0 {
				t.workerTTL = st.TTL()
			}
		}
		if err := t.heartbeat(lctx); err != nil {
			return err
		}
		if err := t.follow(lctx, reg, "registry-watch", "workers", t.applyWorker); err != nil {
			return err
		}
		t.goSafe("heartbeat", t.heartbeatLoop)
	}
	if err := t.follow(lctx, t.cfg.State, "state-watch", "dest state", t.applyState); err != nil {
		return err
	}
	t.goSafe("writer", t.writer)
	t.goSafe("maintenance", t.maintain)
	t.log.Info().Int64("workers_live", t.live.Load()).Int("dests_with_state", t.statefulCount()).Msg("throttle started")
	return nil
}

func waitReady(ctx context.Context, ready <-chan struct{}) error {
	select {
	case <-ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Close deregisters this worker (its share goes to the others at once) and
// stops the watchers and background goroutines. It waits for OnRecover
// calls in progress. Safe to call more than once.
func (t *Throttle) Close() error {
	return t.shutdown(true)
}

// shutdown stops everything; deregister deletes the registry key (a crash
// leaves it to expire instead).
func (t *Throttle) shutdown(deregister bool) error {
	var err error
	t.once.Do(func() {
		t.cancel()
		t.wg.Wait()
		if deregister && t.cfg.Registry != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			if e := t.cfg.Registry.Delete(ctx, t.regKey); e != nil && !errors.Is(e, jetstream.ErrKeyNotFound) {
				err = fmt.Errorf("throttle: deregister %q: %w", t.cfg.WorkerID, e)
			}
		}
		t.m.unregister()
		t.log.Info().Msg("throttle stopped")
	})
	return err
}

// goSafe runs fn on an owned goroutine: Close waits for it, and a panic is
// recovered, logged and counted.
func (t *Throttle) goSafe(name string, fn func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		defer func() {
			if r := recover(); r != nil {
				t.m.panics.Inc()
				t.log.Error().Str("goroutine", name).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("throttle goroutine panicked")
			}
		}()
		fn()
	}()
}

// follow watches kv in a goroutine called name and waits, within lctx,
// until its initial values (what, for errors) are applied.
func (t *Throttle) follow(lctx context.Context, kv jetstream.KeyValue, name, what string, apply func(jetstream.KeyValueEntry, bool)) error {
	w, err := kv.WatchAll(t.ctx)
	if err != nil {
		return fmt.Errorf("throttle: watch %s: %w", what, err)
	}
	ready := make(chan struct{})
	t.goSafe(name, func() { t.keepWatching(kv, w, ready, name, apply) })
	if err := waitReady(lctx, ready); err != nil {
		return fmt.Errorf("throttle: load %s: %w", what, err)
	}
	return nil
}

// watch feeds a KV watcher's entries to apply; ready is closed after the
// initial values. It returns when the watcher ends (keepWatching watches
// again).
func (t *Throttle) watch(w jetstream.KeyWatcher, ready chan struct{}, apply func(jetstream.KeyValueEntry, bool)) {
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-t.ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if initial {
					initial = false
					close(ready)
				}
				continue
			}
			apply(e, initial)
		}
	}
}

// Group maps a recipient domain to its destination: the domain, or with
// GroupByMX the provider group of its MX hosts.
func (t *Throttle) Group(domain string) string {
	return t.groups.group(t.ctx, domain)
}

// Admit decides whether an attempt to domain's destination, for tenant's
// envelope and from the egress address source, may start now. In order: a
// suspension refuses ("suspended", until its end, at most an hour ahead;
// with a source, a suspension of the destination as a whole comes first,
// then the pair's own); an open breaker refuses ("breaker-open": a few
// envelopes until the cooling period ends, the rest held past it,
// breakerRefusal); a half-open breaker lets one probe per worker through
// and refuses the rest ("breaker-half-open", likewise from a cooling
// period ahead); the connection share refuses ("conns", for a second);
// the first-contact window refuses ("window", for 250 ms, or held while it
// is stalled, windowRefusal); and the
// rate share either grants (after waiting up to MaxWait for its token) or
// refuses with the time of the token it reserved ("rate"), so deferred
// envelopes come back spaced at the rate, in the tenant's share of the
// destination's virtual queue (see slot). An admission waiting for its
// token is refused as a new one would be when a suspension, an open
// breaker, or a slower rate that puts its turn beyond MaxWait or its
// tenant over its share comes meanwhile. A domain folded into a provider
// group is held first to the limits set on it by itself, of the whole
// domain and from source (a suspension, a rate pin, a connection limit;
// own.go), then to the group's. From a source, the pin and the connection
// limit set on the whole destination (the group, or the domain) hold on
// the total from every source, after the domain's own and before the
// pair's (own.go). A context cancelled while waiting refuses with
// "canceled".
func (t *Throttle) Admit(ctx context.Context, domain, tenant, source string) (Permit, Refusal) {
	name := t.Group(domain)
	var up above
	if d := NormalizeDest(domain); name != d {
		// One domain of a provider group with limits of its own (`dest
		// suspend a.test`, `dest rate a.test --max 1`, or the same of
		// a.test@SOURCE, while a.test is in google's group) is held to
		// them; the group's limits and state go on for the rest (own.go).
		up.domain = d
		if source != "" {
			up.pair = PairName(d, source)
		}
	}
	if source != "" {
		up.dest = name
		name = PairName(name, source)
	}
	if r, suspended := t.suspendedAbove(up); suspended {
		return nil, r
	}
	var holds []ownHold
	if up != (above{}) {
		var r Refusal
		var ok bool
		if holds, r, ok = t.admitAbove(ctx, up, tenant); !ok {
			return nil, r
		}
		if len(holds) > 0 {
			// It may have waited for the domain's or the whole
			// destination's token: what came meanwhile stops it as it
			// would a new admission.
			if r, suspended := t.suspendedAbove(up); suspended {
				t.releaseOwn(holds, true)
				return nil, r
			}
		}
	}
	for {
		p, r, again := t.admit(ctx, t.getDest(name), tenant, up)
		if again {
			continue
		}
		if p == nil {
			t.releaseOwn(holds, true)
		} else {
			pm := p.(*permit)
			pm.own = holds
			if source != "" {
				pm.blocks = PairName(NormalizeDest(domain), source)
			}
		}
		return p, r
	}
}

// above names what an admission meets before its destination's own
// state: the domain, when it is one of a provider group's (its own
// suspension, pin and connection limit; own.go), and that domain from the
// admission's source (pair); and the whole destination, when the
// admission is for a (destination, source) pair (its suspension, and its
// pin and connection limit on the total from every source; own.go).
// Empty: none.
type above struct{ domain, pair, dest string }

// suspendedAbove refuses an admission that a suspension above its
// destination's own state stops (see above).
func (t *Throttle) suspendedAbove(up above) (Refusal, bool) {
	for _, name := range [...]string{up.domain, up.pair, up.dest} {
		if name == "" {
			continue
		}
		if r, suspended := t.wholeSuspended(name); suspended {
			return r, true
		}
	}
	return Refusal{}, false
}

// maxWait is how long an admission may wait for turn k: MaxWait, or on a
// learned rate's grid one of this worker's turns when that is longer. A
// refused envelope is told to come back at its turn and comes back a
// little after it (the lane's schedule fires late by milliseconds), when
// the turn has passed. The grid's turns are fixed times, so with turns
// further apart than MaxWait the next one was always too far again: two
// daemons sharing a learned 0.4/s refused their last four envelopes for
// five minutes. Waiting one turn admits it. (A configured rate's bucket
// has no fixed turns: a token not taken is there for the late return.)
func (t *Throttle) maxWait(k turn) time.Duration {
	if k.segs == nil {
		return t.cfg.MaxWait
	}
	return max(t.cfg.MaxWait, time.Duration(float64(k.n)/k.rate*float64(time.Second)))
}

// suspendedRefusal refuses an attempt to a destination suspended until
// until, capped at maxSuspendRefusal ahead: look again now and then, the
// suspension may be shortened.
func suspendedRefusal(name string, s DestState, now time.Time) Refusal {
	until := s.SuspendedUntil
	if cap := now.Add(maxSuspendRefusal); until.After(cap) {
		until = cap
	}
	detail := name
	if s.Reason != "" {
		detail += ": " + s.Reason
	}
	return Refusal{Until: until, Reason: "suspended", Detail: detail}
}

func (t *Throttle) admit(ctx context.Context, d *dest, tenant string, up above) (Permit, Refusal, bool) {
	now := t.now()
	live := t.liveCount()
	d.mu.Lock()
	if d.evicted {
		d.mu.Unlock()
		return nil, Refusal{}, true
	}
	if d.burstFrom.IsZero() || now.Sub(d.lastUsed) > t.cfg.LearnWindow {
		d.burstFrom = now
	}
	d.lastUsed = now
	d.seen(tenant, now)
	st := &d.state
	probe := false
	if r, refused := t.stateRefuses(d, now, &probe); refused {
		d.mu.Unlock()
		return nil, r, false
	}
	if r, refused := tenantRefuses(d, tenant, now); refused {
		// A rule suspended this tenant's part only (automateTenant).
		d.probing = d.probing && !probe
		d.mu.Unlock()
		return nil, r, false
	}
	if c, limited := t.connShare(d, live, now); limited && d.inflight >= c {
		// A worker whose share is none refuses every attempt: the
		// envelope goes back to its lane, where a worker with a
		// connection may take it, and comes back here no sooner than
		// connsRetry, as from a full share.
		d.lastConnLim = now
		d.probing = d.probing && !probe
		d.mu.Unlock()
		return nil, Refusal{Until: now.Add(connsRetry), Reason: "conns"}, false
	}
	if d.connPaused(now) {
		d.probing = d.probing && !probe
		d.mu.Unlock()
		return nil, Refusal{Until: d.connPause, Reason: "conns"}, false
	}
	fleet := t.fleetRate(d.limits, *st, now)
	if fleet <= 0 && d.bucket.rate > 0 {
		// No rate any more: the next one starts its bucket from the last
		// send (startAfter), and nothing waits for a token now.
		d.bucket = bucket{gen: d.bucket.gen + 1}
	}
	// A seed held back at first contact (cutLearnedRate) keeps the window
	// shut while it waits.
	fleet, seedWaits := t.seedDeferred(d, now, fleet)
	peerDelivered := func() bool {
		load, _ := t.peerLoad(d.name, now)
		return load.Rate > 0
	}
	place := func() int { return t.place(d.name, live) }
	idle := d.inflight == 0 && d.failures == 0
	if w, on := d.firstWindow(&t.cfg, fleet, live, place, peerDelivered); on && (d.inflight >= w || seedWaits) {
		d.probing = d.probing && !probe
		r := Refusal{Until: now.Add(windowRetry), Reason: "window"} // a seed held back: 250 ms
		if !seedWaits {
			r = t.windowRefusal(d, w, now)
		}
		d.mu.Unlock()
		return nil, r, false
	} else if !on || idle {
		// No window, or one with nothing in flight whose last attempt
		// reached the server: not stalled.
		d.stalledAt = time.Time{}
	}
	var at time.Time
	if fleet > 0 {
		d.setShare(now, fleet/float64(live))
		// Whether this worker keeps its rate busy, for the reading
		// between throttles (drainMarks.press).
		d.drains.press(now, d.bucket.next, d.bucket.period(), fleet)
		due := d.bucket.reserve(now)
		// Sent on this worker's next turn of the fleet's grid (slots.go),
		// never one it already gave out.
		k := t.turnOf(d, fleet, live, now)
		at = k.next(laterOf(due, d.lastTurn.Add(time.Nanosecond)))
		// A tenant with a backlog in the virtual queue does not hold a
		// delivery slot and a reservation waiting for a token while another
		// tenant sends to the destination: its envelope takes its own
		// tenant's next place at once, and the tokens go to whoever is
		// within its share (see fairShare).
		if at.Sub(now) > t.maxWait(k) || due.After(now) && d.overShare(tenant, now, t.weight) {
			// Too long to wait here. The refused envelope goes back to a
			// lane and may return to any worker, so this worker keeps no
			// token for it: it hands the token back and gives the envelope
			// a place in the destination's virtual queue, spaced at the
			// fleet rate. A backlog then returns at the pace the whole
			// fleet can send, whichever worker refused it; each return
			// still takes a real token from the worker that admits it.
			d.bucket.refund(due)
			until := d.slot(tenant, at, now, fleet, t.weight, t.horizon(d, now))
			d.probing = d.probing && !probe
			d.mu.Unlock()
			return nil, Refusal{Until: until, Reason: "rate"}, false
		}
	}
	if at.After(d.lastTurn) {
		d.lastTurn = at
		d.bucket.spend(at) // the token is used at the turn, not now
	}
	d.inflight++
	d.lastSent = laterOf(now, at)
	if at.After(now) {
		d.hold(tenant, 1)
		defer d.release(tenant)
	}
	var served time.Duration // the turn's part of its tenant's share (serve); taken back if unused
	if fleet > 0 {
		served = d.serve(tenant, now, t.weight)
	}
	factor := d.state.RateFactor()
	gen := d.bucket.gen
	reserved, cutSeen, connsHold := now, d.state.LearnedCutAt, d.state.LearnedConnsHold
	d.mu.Unlock()

	for {
		wait := time.Until(at)
		if wait <= 0 {
			break
		}
		tm := time.NewTimer(wait)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
			d.mu.Lock()
			d.unreserve(probe)
			d.unserve(tenant, served)
			d.bucket.refund(at) // the token was not used
			d.mu.Unlock()
			return nil, Refusal{Until: t.now(), Reason: "canceled"}, false
		}
		// What came while this admission waited refuses it as it would
		// refuse a new one: a suspension (of the destination, or above
		// it), an open breaker, a half-open one whose probe is out.
		// Before, a send due 2 s after a suspension went out 1.8 s into it.
		if r, suspended := t.suspendedAbove(up); suspended {
			d.mu.Lock()
			d.unreserve(probe)
			d.unserve(tenant, served)
			d.bucket.refund(at)
			d.mu.Unlock()
			return nil, r, false
		}
		live := t.liveCount()
		d.mu.Lock()
		now = t.now()
		r, refused := t.stateRefuses(d, now, &probe)
		if !refused {
			r, refused = tenantRefuses(d, tenant, now)
		}
		if refused {
			d.unreserve(probe)
			d.unserve(tenant, served)
			d.bucket.refund(at)
			d.mu.Unlock()
			return nil, r, false
		}
		// When the rate went down while this admission waited, its turn
		// was given at the old spacing: it takes the next turn at the new
		// one rather than send at a rate just cut. The admissions waiting
		// wake in the order their turns were given and take their new
		// turns in that order, so each tenant keeps its place: a tenant's
		// mail within its share is not sent behind a backlog's
		// re-reservations into the virtual queue.
		fleet := t.fleetRate(d.limits, d.state, now)
		if fleet > 0 {
			d.setShare(now, fleet/float64(live))
		}
		if fleet <= 0 || d.bucket.gen == gen {
			d.mu.Unlock()
			break
		}
		due := d.bucket.reserve(now)
		k := t.turnOf(d, fleet, live, now)
		next := k.next(laterOf(due, d.lastTurn.Add(time.Nanosecond)))
		if next.Sub(now) > t.maxWait(k) || due.After(now) && d.overShareWaiting(tenant, now, served, t.weight) {
			// The new turn is further than a new admission would wait
			// for: this one does not hold its delivery slot and its
			// place in flight for it either (30 admissions waiting at
			// 20/s when an operator pinned 1/s held theirs for up to
			// 27 s). Nor when its tenant is over its share of the
			// destination at the new spacing, as a new admission is
			// asked (overShare): a tenant whose campaign filled the
			// delivery slots kept them all across the cut, and its
			// waiting admissions took every new turn before another
			// tenant's mail. It hands the token back and takes its
			// tenant's next place in the virtual queue, as a new
			// admission would.
			d.bucket.refund(due) // the new turn's; the old one's went with the cut
			until := d.slot(tenant, next, now, fleet, t.weight, t.horizon(d, now))
			d.unreserve(probe)
			d.unserve(tenant, served)
			d.mu.Unlock()
			return nil, Refusal{Until: until, Reason: "rate"}, false
		}
		gen, reserved, cutSeen = d.bucket.gen, now, d.state.LearnedCutAt
		at = next
		if at.After(d.lastTurn) {
			d.lastTurn = at
			d.bucket.spend(at)
		}
		d.lastSent = laterOf(d.lastSent, at)
		d.mu.Unlock()
	}
	return &permit{t: t, d: d, tenant: tenant, probe: probe, factor: factor, sent: laterOf(reserved, at), cutSeen: cutSeen, connsHold: connsHold}, Refusal{}, false
}

// connPaused reports whether an admission at now would open an attempt
// beyond those in flight at the last "too many connections" reply, within
// connsRetry of it. The refused attempt ends within milliseconds of its
// greeting and gives its place in flight back; taken again at once, it
// met the provider's limit again, and between a learned limit's cuts (one
// per hold) a worker refused dozens of connections a second. Attempts may
// still reuse the places that were working. d.mu held.
func (d *dest) connPaused(now time.Time) bool {
	return now.Before(d.connPause) && d.inflight >= d.connAfter
}

// holding spaces the returns of the envelopes a destination refuses while
// it can take no attempt now: its first-contact window is full (the
// attempts in flight are not answered: an MX that hangs) or its breaker is
// open (or half-open with its probe out). Told to come back after a fixed
// short time, every one of them came back that often whatever their
// number: 2,000 queued to a new domain whose MX hung were refused 2,592
// times a second, 62 % of a core, for two attempts in flight, and an open
// breaker refused each of them every cooldown.
//
// Each is held instead for a horizon h, spread evenly over [h, 2h - base]
// from its earliest useful return: long enough that the envelopes held
// (those whose return is still ahead, counted by when it falls) come back
// at about holdBudget a second in total, so h is their number over 1.5
// times the budget; at least base, at most limit (how long the caller may
// hold one) and holdMax. A backlog then costs about holdBudget returns a
// second, not one per envelope per 250 ms, and enough of them come back
// to take an attempt the destination can take again within a fraction of
// a second. They are not queued one after another: what they wait for
// (an answer, a probe) comes at no rate they could be spaced at, and
// nothing held is recalled when it comes (a breaker's recovery releases
// the destination's mail: Config.OnRecover).
type holding struct {
	ring []int32 // envelopes held, by the holdSlot their return falls in (mod holdSlots); nil until used
	from int64   // the first slot still counted
	n    int     // the ring's sum: envelopes held whose return is still ahead
	seq  uint64  // spreads them
}

// The ring of holding counts returns in slots of holdSlot, holdSlots of
// them (34 minutes: past holdMax twice and a cooldown); a return beyond
// it is counted in its last slot.
const (
	holdSlot  = 2 * time.Second
	holdSlots = 1024
)

// place holds one more envelope at now, from (the earliest time its return
// is any use; not before now), and returns its place and the horizon.
func (r *holding) place(now, from time.Time, base, limit time.Duration) (time.Time, time.Duration) {
	r.expire(now)
	h := time.Duration(float64(r.n+1) / (1.5 * holdBudget) * float64(time.Second))
	h = max(base, min(h, limit, holdMax))
	r.seq++
	frac := float64(r.seq*11400714819323198485>>11) / (1 << 53) // golden ratio: consecutive ones apart
	at := laterOf(now, from).Add(h + time.Duration(frac*float64(h-base)))
	k := min(at.UnixNano()/int64(holdSlot), r.from+holdSlots-1)
	r.ring[k%holdSlots]++
	r.n++
	return at, h
}

// expire drops from the count the envelopes whose return has passed.
func (r *holding) expire(now time.Time) {
	k := now.UnixNano() / int64(holdSlot)
	switch {
	case r.ring == nil:
		r.ring = make([]int32, holdSlots)
	case k-r.from >= holdSlots:
		clear(r.ring)
		r.n = 0
	default:
		for ; r.from < k; r.from++ {
			r.n -= int(r.ring[r.from%holdSlots])
			r.ring[r.from%holdSlots] = 0
		}
	}
	r.from = max(r.from, k)
}

// held says, for a refusal's detail, what the horizon was computed from.
func (r *holding) held() string {
	return strconv.Itoa(r.n) + " held"
}

// windowRefusal refuses an admission beyond this worker's first-contact
// window w (attempts in flight) at now. The window widens on answers, and
// the refused envelope comes back when the next one is due: a turnaround
// (how long the last answered attempt took) after the window was found
// full, or after windowRetry when that is later, as every refusal did
// before. A healthy destination answering within milliseconds admits it
// then, as before; one answering each attempt in seconds (or after a
// minute, a tarpit) is asked once per round trip instead of every 250 ms,
// and its window doubles as fast. When no answer has come for windowRetry
// past its due time (an MX that accepted the connection and hangs), the
// envelope is held (holding) for no longer than the answer is overdue: a
// window that starts moving again finds every held envelope back within
// twice as long, and meanwhile a backlog costs about holdBudget returns a
// second once it is overdue by its size over the budget. A worker whose
// share of the window is none (w = 0) waits for no more than a heartbeat:
// it opens when another's reports deliveries. d.mu held.
func (t *Throttle) windowRefusal(d *dest, w int, now time.Time) Refusal {
	if d.stalledAt.IsZero() {
		d.stalledAt = now
	}
	most := holdMax
	if w == 0 {
		most = t.cfg.Heartbeat
	}
	due := d.stalledAt.Add(d.turnaround) // the next answer
	overdue := now.Sub(due)
	if overdue < windowRetry {
		until := laterOf(now.Add(windowRetry), due)
		if last := now.Add(most); until.After(last) {
			until = last
		}
		r := Refusal{Until: until, Reason: "window"}
		if until.Sub(now) > windowRetry {
			r.Detail = "first-contact window full (" + strconv.Itoa(w) + " in flight): back when its next answer is due, the last took " +
				d.turnaround.Round(time.Millisecond).String()
		}
		return r
	}
	until, h := d.room.place(now, now, windowRetry, min(overdue, most))
	r := Refusal{Until: until, Reason: "window"}
	if h > windowRetry {
		r.Detail = "first-contact window full (" + strconv.Itoa(w) + " in flight), its next answer overdue by " +
			overdue.Round(time.Millisecond).String() + " (the last took " + d.turnaround.Round(time.Millisecond).String() +
			"): held " + h.Round(time.Millisecond).String() + "+, " + d.room.held()
	}
	return r
}

// stateRefuses is what d's state refuses an admission at now for: a
// suspension, an open breaker, a half-open one whose probe is out
// (otherwise the admission becomes the probe, *probe). It is asked of a
// new admission and again of one waiting for its turn at each wake-up,
// so that what came meanwhile stops it as it would stop a new one.
// d.mu held.
func (t *Throttle) stateRefuses(d *dest, now time.Time, probe *bool) (Refusal, bool) {
	st := &d.state
	if st.Suspended(now) {
		return suspendedRefusal(d.name, *st, now), true
	}
	switch st.BreakerAt(now) {
	case BreakerOpen:
		return t.breakerRefusal(d, "breaker-open", st.BreakerUntil, now), true
	case BreakerHalfOpen:
		if !*probe {
			if d.probing {
				return t.breakerRefusal(d, "breaker-half-open", now.Add(t.cfg.BreakerCooldown), now), true
			}
			d.probing, *probe = true, true
		}
	}
	return Refusal{}, false
}

// unreserve undoes an admission refused while it waited for its turn: its
// place in flight, and its probe. d.mu held.
func (d *dest) unreserve(probe bool) {
	d.inflight--
	if probe {
		d.probing = false
	}
}

// setShare sets this worker's share of the destination's rate on its
// bucket. A slower share restarts the bucket's chain (bucket.setRate), and
// the turns given at the old spacing are to be taken again (the admissions
// waiting for them take new ones when they wake): the next may come from
// now. d.mu held.
func (d *dest) setShare(now time.Time, share float64) {
	if d.bucket.setRate(now, share) && d.lastTurn.After(now) {
		d.lastTurn = now
	}
	d.bucket.startAfter(d.lastSent)
}

// permit is one admitted attempt.
type permit struct {
	t      *Throttle
	d      *dest
	tenant string // the admission's tenant
	probe  bool
	// factor is the destination's rate factor when the attempt was
	// admitted: a throttled reply to it cuts from there (cutFactor).
	factor float64
	// sent is when the attempt went out (its turn, or its admission when
	// it waited for none), and cutSeen the last learned cut (or seed) this
	// worker knew of when it reserved that turn: a throttled reply to an
	// attempt paced at the rate that cut set shows the rate is still too
	// high, and cuts again within the hold (cutRate, DestState.pacedAt).
	sent, cutSeen time.Time
	// connsHold is the hold of the last cut of the learned connection
	// limit this worker knew of when it admitted the attempt: a "too many
	// connections" reply to it says the limit that cut set is too high
	// (cutConns' paced).
	connsHold time.Time
	// own are its places under the limits set on its domain by itself,
	// inside a provider group (own.go).
	own []ownHold
	// blocks is the (domain, source) pair a reply about the source
	// suspends (sourceblock.go): the recipient domain's from the
	// admission's source, also inside a provider group; "" without a
	// source.
	blocks string
	done   atomic.Bool
}

// Done records the attempt's outcome: in-flight, breaker, adaptive rate
// and automation. Only the first call counts.
func (p *permit) Done(results []classify.Result) {
	if !p.done.CompareAndSwap(false, true) {
		return
	}
	p.t.releaseOwn(p.own, false)
	p.t.done(p, results)
}

// Limits are the admitted destination's configured limits.
func (p *permit) Limits() Limits { return p.t.limitsOf(p.d.name) }

// done is Permit.Done: memory only, plus at most a queued KV transition.
func (t *Throttle) done(p *permit, results []classify.Result) {
	d, probe := p.d, p.probe
	now := t.now()
	o := outcomeOf(results)
	type match struct {
		rule   int
		tenant bool   // the reply was about the tenant's mail (scope tenant): the tenant's part
		reply  string // the reply's classify rule
	}
	var fired []match
	for i := range t.rules {
		for j := range results {
			if t.rules[i].match(results[j]) {
				fired = append(fired, match{i, results[j].Scope == classify.ScopeTenant && !t.rules[i].WholeDestination, results[j].Rule})
				break // one match per attempt
			}
		}
	}

	if o.sourceBlocked && p.blocks != "" {
		// Before d.mu: the pair it suspends may be another dest (one
		// domain of a provider group), and no two are locked at once.
		t.blockSource(t.getDest(p.blocks), o.blockWhy, now)
	}

	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight--
	if probe {
		d.probing = false
	}
	cfg := &t.cfg

	// Circuit breaker.
	switch {
	case o.failed:
		d.failures++
		br := d.state.BreakerAt(now)
		if (br == BreakerClosed && d.failures >= cfg.BreakerFailures) || (br == BreakerHalfOpen && probe) {
			t.openBreaker(d, now, br)
		}
	case o.reached:
		d.failures = 0
		if probe && d.state.BreakerAt(now) == BreakerHalfOpen {
			t.closeBreaker(d, now)
		}
	}

	// Adaptive rate: the factor below a configured (or pinned) rate, a
	// learned rate where none is configured (learn.go).
	if o.delivered {
		d.delivered.add(now, 1, cfg.LearnWindow)
	}
	if o.answered {
		// Any answer but a throttle: a destination that bounces or
		// greylists most of what it is sent stayed at LearnInitial in
		// flight for good when only deliveries widened the window.
		d.widen()
		// The window moves again, at this attempt's pace (windowRefusal).
		d.stalledAt, d.turnaround = time.Time{}, max(0, now.Sub(p.sent))
	}
	if o.connThrottled {
		d.lastConnThr = now
		d.connPause, d.connAfter = now.Add(connsRetry), d.inflight
		t.cutLearnedConns(d, now, o.connWhy, p)
	}
	if o.throttled {
		d.lastThr = now
		learns := learnsRate(!cfg.NoLearn, d.limits, d.state, now)
		var drained float64 // read before this throttle's mark
		if learns {
			drained = t.drainedRate(d, now)
		}
		if d.state.LearnedRate > 0 && !d.state.LearnedSlowStart {
			// Not before the first cut: the seed and the doubling after
			// it send under the limit by design, and the provider's
			// bucket fills meanwhile (drainMarks).
			d.drains.mark(now, d.delivered.total)
		}
		if learns {
			t.cutLearnedRate(d, now, o.why, p, drained)
		} else if d.lastCut.IsZero() || now.Sub(d.lastCut) >= cfg.DecreaseFor {
			d.lastCut = now
			t.cutFactor(d, now, p.factor)
		}
	} else if o.delivered {
		if d.pending&pendRamp == 0 && d.state.RateFactor() < 1 &&
			!now.Before(d.state.FactorUntil) && now.Sub(d.lastThr) >= cfg.IncreaseEvery {
			t.rampFactor(d)
		}
		t.raiseLearned(d, now, p.sent)
	}

	// Automation.
	for _, m := range fired {
		r := &t.rules[m.rule]
		w, end := &d.auto[m.rule], autoEnd(d.state, r)
		if m.tenant {
			// A reply about one tenant's own mail acts on that tenant's
			// part only (AutoRule.WholeDestination), counted apart.
			if r.Action != ActionSuspend {
				t.log.Debug().Str("dest", d.name).Str("tenant", p.tenant).Str("rule", r.Name).Str("reply_rule", m.reply).
					Msg("automation rule not counted: the reply is about one tenant's mail, and a " + r.Action + " has no part of one tenant (whole-destination = true acts on every tenant's)")
				continue
			}
			w, end = d.tenantWindow(m.rule, p.tenant), d.state.Rules[r.key+"/"+p.tenant]
		}
		if w.activeUntil.Before(end) {
			// In force, fired by another worker (or before a restart):
			// this one does not count towards firing it again either.
			w.activeUntil = end
		}
		if !w.add(now, r.Threshold, r.Window) {
			continue
		}
		var acted bool
		var why string
		if m.tenant {
			acted, why = t.automateTenant(d, r, p.tenant, now)
		} else {
			acted, why = t.automate(d, r, now)
		}
		if acted {
			// Held for its for only when it changed something: a firing
			// that changed nothing (an operator's lower cap with no end)
			// held the rule silent for its whole for after the cap went.
			w.activeUntil, w.idleLogged = now.Add(r.For), false
			continue
		}
		ev := t.log.Debug()
		if !w.idleLogged {
			ev = t.log.Info() // once until it acts again; then at debug
			w.idleLogged = true
		}
		ev.Str("dest", d.name).Str("rule", r.Name).Str("action", r.Action).Str("why", why).
			Msg("automation rule fired but changed nothing; it may fire again at its next match")
	}
}
