package worker

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/unsubscribe"
)

// UnknownPolicy says what to do when a message may or may not have been
// delivered (no reply to the final dot).
type UnknownPolicy string

const (
	// UnknownRetry retries on the retry lane: RFC 5321 6.1 prefers a
	// possible duplicate to a possible loss. Default.
	UnknownRetry UnknownPolicy = "retry"
	// UnknownHold parks the envelope for an operator (queue list --state
	// unknown; replay or drop).
	UnknownHold UnknownPolicy = "hold"
)

// Sender delivers one envelope's recipients; *sender.Sender implements it.
type Sender interface {
	Send(ctx context.Context, m *sender.Message) sender.Result
}

// ReturnPather gives an attempt's envelope sender: from itself, or an
// address that brings the envelope's bounces back to outflow.
type ReturnPather interface {
	Address(tenant, id, from string, at time.Time) string
}

// Unsubscriber makes the one-click unsubscribe fields (List-Unsubscribe
// and List-Unsubscribe-Post) naming one recipient of one envelope:
// *unsubscribe.Links.
type Unsubscriber interface {
	Header(t unsubscribe.Target) []byte
}

// Signer signs a message body for its sender's domain, returning it
// unchanged when it has no key for that domain. *sender.DKIMSigner
// implements it.
type Signer interface {
	Sign(from string, body []byte) ([]byte, error)
}

// DefaultWorkers is Config.Workers's default: concurrent deliveries per
// process. A delivery spends most of its time waiting on the network, so
// there are many more than cores.
const DefaultWorkers = 32

// Config configures a Pool.
type Config struct {
	// WorkerID names this process in logs, decision records and the
	// contention offset. Default: throttle.DefaultWorkerID(), hostname-pid.
	WorkerID string
	// Workers is the number of concurrent deliveries. Default
	// DefaultWorkers.
	Workers int
	// Retry and RateLimit are the two lanes' backoff parameters.
	Retry, RateLimit backoff.Backoff
	// ThrottleHold is how close together two throttles of one message
	// count as one overshoot: the second is then paced at its place
	// without the rate-limit lane's minimum (pace.go). serve sets the
	// throttle's learn hold. Default throttle.DefaultLearnHold.
	ThrottleHold time.Duration
	// Budget limits attempts and age; spent budgets go to dead letters.
	Budget backoff.Budget
	// Unknown is the unknown-outcome policy. Default "retry".
	Unknown UnknownPolicy
	// TenantWeights weigh the tenants' shares of the delivery slots while
	// several have deliveries in flight (slots.go), as they weigh their
	// shares of a busy destination's rate (throttle's tenant-weights);
	// default 1 each.
	TenantWeights map[string]float64
	// ProgressEvery is how often a long send tells the server it is still
	// working on the envelope. Default 15s (a quarter of the ack wait).
	ProgressEvery time.Duration

	// Signer adds a DKIM signature before the first attempt; nil sends
	// bodies as submitted.
	Signer Signer
	// Unsubscribe puts the one-click unsubscribe fields in front of the
	// messages whose envelopes ask for them (Envelope.ListUnsubscribe),
	// before they are signed; nil sends them without (and says so once).
	Unsubscribe Unsubscriber

	Queue      *queue.Queue
	Sender     Sender
	Classifier *classify.Classifier
	// Gate is everything the pool gets from the throttle (throttle.Gate:
	// admission per tenant and egress address, the attempt's limits on
	// the permit, the pace of throttled mail, the clock offset to the
	// server). Default throttle.OpenGate: always admitted, never paced.
	Gate throttle.Gate
	// Egress, when it has addresses, picks each attempt's source address
	// (per tenant, round-robin) and the Gate is asked per (destination,
	// source) pair; nil or empty sends from the system's choice.
	Egress *sender.Egress
	// Relay is the smarthost (host:port) Sender delivers everything
	// through, as sender.Config.Relay (serve's --relay); "" for direct MX
	// delivery. Through a relay, a permanent refusal of outflow itself
	// (its address, its session, the relay account) defers the mail
	// instead of bouncing it (refusesOutflow); a 5xx to AUTH does either
	// way.
	Relay string
	// Logger receives the pool's lines (with worker_id added) and the
	// lines about one attempt: the decision lines, the refusals
	// ("coordinator refused") and the redeliveries, whose worker_id is
	// the deliverer's own, "<worker-id>/<n>". It must not carry a
	// worker_id of its own, or those lines would repeat the key.
	Logger zerolog.Logger
	// ReturnPath, when set, gives each attempt its envelope sender (MAIL
	// FROM): a tenant's return-path address, which brings the message's
	// later bounces to outflow's bounce listener (*bounce.ReturnPath);
	// nil sends the envelope's own sender.
	ReturnPath ReturnPather
	// Suppressions receives the recipients of permanent recipient-scope
	// bounces, and answers for the recipient of a bulk envelope (one with
	// an unsubscribe link) before each attempt: one put on it since is not
	// sent the message. Nil keeps no list.
	Suppressions Suppressor
	// DSN turns on delivery status notifications (dsn.go); nil sends
	// none.
	DSN *DSNConfig
	// Metrics receives counters; nil disables them.
	Metrics *Metrics
	// Now is the worker's wall clock (default time.Now); tests give a
	// skewed one. See clock.go for what it is compared with.
	Now func() time.Time
}

// Pool runs Workers delivery goroutines over the three lanes.
type Pool struct {
	cfg Config
	dsn *dsnState // nil without Config.DSN
	log zerolog.Logger
	wg  sync.WaitGroup
	// noLinks says once that mail asks for unsubscribe links this
	// process cannot make (no Config.Unsubscribe).
	noLinks sync.Once
	// families: the address families destinations lack, for egress
	// pools that mix IPv4 and IPv6.
	families families
	// panics counts this process's panicked deliveries (safeHandle).
	panics panicCounts
	// relayAlarm paces the error lines about a relay that refuses
	// outflow itself (relayRefused).
	relayAlarm relayAlarm
	// stops counts what the deliverers did with envelopes the stop
	// caught before they were finished (stop.go).
	stops stopCounts
	// slots keeps each tenant to its share of the delivery slots; the
	// pulls hand out only what it admits (slots.go).
	slots *tenantSlots
}

// New checks cfg and returns a Pool; Run starts it.
func New(cfg Config) (*Pool, error) {
	if cfg.Queue == nil || cfg.Sender == nil {
		return nil, errors.New("worker: queue and sender are required")
	}
	defaults.Set(&cfg.Workers, DefaultWorkers)
	if cfg.WorkerID == "" {
		cfg.WorkerID = throttle.DefaultWorkerID()
	}
	if cfg.Unknown == "" {
		cfg.Unknown = UnknownRetry
	}
	if cfg.Unknown != UnknownRetry && cfg.Unknown != UnknownHold {
		return nil, fmt.Errorf("worker: unknown policy %q (want retry or hold)", cfg.Unknown)
	}
	defaults.Set(&cfg.ProgressEvery, 15*time.Second)
	defaults.Set(&cfg.ThrottleHold, throttle.DefaultLearnHold)
	if cfg.Classifier == nil {
		cfg.Classifier = classify.Default()
	}
	if cfg.Gate == nil {
		cfg.Gate = throttle.OpenGate{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Retry == (backoff.Backoff{}) {
		cfg.Retry = backoff.DefaultRetry()
	}
	if cfg.RateLimit == (backoff.Backoff{}) {
		cfg.RateLimit = backoff.DefaultRateLimit()
	}
	if cfg.Budget == (backoff.Budget{}) {
		cfg.Budget = backoff.DefaultBudget()
	}
	return &Pool{cfg: cfg, dsn: newDSNState(cfg.DSN), slots: newTenantSlots(cfg.Workers, cfg.TenantWeights),
		log: cfg.Logger.With().Str("worker_id", cfg.WorkerID).Logger()}, nil
}

// Run pulls and delivers until ctx ends, then waits for the deliveries in
// progress to finish (each has up to grace to do so) and returns.
//
// Envelopes this process holds and has not started sending are given back
// to the server as ctx ends, to be handed out again at once (stop.go):
// those fetched and not yet taken by a worker, those a worker had taken
// but not yet sent (an admission wait, a body fetch), and a send the end
// of the grace cut before its final dot. A send cut after its final dot
// may have been delivered, and is recorded as an unknown outcome instead.
// Only a killed process's envelopes wait for the ack wait.
func (p *Pool) Run(ctx context.Context, grace time.Duration) error {
	lanes := []queue.Lane{queue.LaneWork, queue.LaneRetry, queue.LaneRateLimit}
	chans := make([]<-chan *queue.Delivery, len(lanes))
	// held counts what the pulls hold for the workers, and what they give
	// back when ctx ends.
	held := &queue.Holding{}
	pullCtx := queue.WithAdmission(queue.WithHolding(ctx, held), p.slots)
	for i, l := range lanes {
		ch, err := p.cfg.Queue.Messages(pullCtx, l, p.cfg.Workers)
		if err != nil {
			return err
		}
		chans[i] = ch
	}
	// In-flight deliveries outlive ctx by up to grace: a shutdown must not
	// cut an SMTP transaction in half and turn a delivery into an unknown.
	// The cause names the stop in the text of a reply the cut loses.
	workCtx, cancelWork := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelWork(nil)
	for i := 0; i < p.cfg.Workers; i++ {
		p.wg.Add(1)
		w := &deliverer{Pool: p, id: p.cfg.WorkerID + "/" + strconv.Itoa(i), stop: ctx}
		go func() {
			defer p.wg.Done()
			w.loop(ctx, workCtx, chans[0], chans[1], chans[2])
		}()
	}
	if p.dsn != nil && p.dsn.cfg.PassTimeout > 0 {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.sweepPasses(ctx)
		}()
	}
	<-ctx.Done()
	done := make(chan struct{})
	go func() { p.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		p.log.Warn().Dur("grace", grace).Msg("deliveries still running at the end of the shutdown grace; cancelling them")
		cancelWork(fmt.Errorf("%w (%v)", errGraceEnded, grace))
		<-done
	}
	p.stopped(held)
	return nil
}

// loop is one worker: it takes whichever lane has an envelope ready. Go's
// select picks uniformly among ready cases, so no lane can starve another;
// the work lane never waits behind deferred mail because deferred mail is
// not in any lane until it is due.
func (w *deliverer) loop(ctx, workCtx context.Context, work, retry, rl <-chan *queue.Delivery) {
	for {
		var d *queue.Delivery
		var ok bool
		select {
		case <-ctx.Done():
			return
		case d, ok = <-work:
		case d, ok = <-retry:
		case d, ok = <-rl:
		}
		if !ok {
			if ctx.Err() != nil {
				return
			}
			continue
		}
		w.take(ctx, workCtx, d, work)
	}
}

// take runs d, which this slot took from its lane. work is the work lane,
// for a slot that holds d while it waits for its tenant's turn to serve
// the other tenants' fresh mail meanwhile (nil when d came from there).
func (w *deliverer) take(ctx, workCtx context.Context, d *queue.Delivery, work <-chan *queue.Delivery) {
	if ctx.Err() != nil {
		if d.Lane == queue.LaneWork {
			w.slots.end(d.Env.Tenant, 0) // the hand-off's count (slots.Started)
		}
		// Taken as the pool stopped (select picks at random among
		// ready cases): not started, so it goes back like the
		// envelopes the pulls still held. The pull handed it over
		// and keeps no copy, so it is given back once, here.
		if err := w.giveBack(d, "taken as the workers stopped"); err != nil {
			w.log.Warn().Err(err).Str("msg_id", d.Env.ID).Msg("envelope taken at the stop")
		}
		return
	}
	// The work lane's hand-off counted it for its tenant
	// (slots.Started); a shared lane's is counted here, or, of a tenant
	// holding all it may, waits here or goes back to its lane for later.
	// It is counted out when this slot is done with it.
	if d.Lane != queue.LaneWork {
		switch w.slots.TryStart(d.Env.Tenant) {
		case slotBack:
			w.overShare(workCtx, d)
			return
		case slotWait:
			if !w.waitForSlot(ctx, workCtx, d, work) {
				return
			}
		}
	}
	started := time.Now()
	w.safeHandle(workCtx, d)
	w.slots.end(d.Env.Tenant, time.Since(started))
}

// waitForSlot holds d, taken from a shared lane while its tenant holds
// all the slots it may (its reserve or share, tenantSlots.TryStart), until
// one of its tenant's deliveries ends and it may start, and reports true
// then, counted started. Meanwhile the slot delivers the fresh mail the
// work lane hands it, which is other tenants' (the hand-off gives none of
// a tenant holding all it may), and keeps d's ack alive. At the stop it
// gives d back and reports false.
func (w *deliverer) waitForSlot(ctx, workCtx context.Context, d *queue.Delivery, work <-chan *queue.Delivery) bool {
	stop := w.keepAlive(d)
	defer stop()
	w.log.Debug().Str("msg_id", d.Env.ID).Str("tenant", d.Env.Tenant).Str("dest", d.Env.Dest).Str("lane", string(d.Lane)).
		Msg("waiting in a slot for one of its tenant's deliveries to end: it holds all the slots it may")
	for {
		ended := w.slots.Changed() // before the look, so that an end between them is not missed
		if w.slots.StartWaiting(d.Env.Tenant) {
			return true
		}
		select {
		case <-ctx.Done():
			w.slots.StopWaiting()
			stop()
			if err := w.giveBack(d, "waiting for its tenant's slot as the workers stopped"); err != nil {
				w.log.Warn().Err(err).Str("msg_id", d.Env.ID).Msg("envelope waiting for a slot at the stop")
			}
			return false
		case <-ended:
		case f, ok := <-work:
			if ok {
				w.take(ctx, workCtx, f, nil)
			}
		}
	}
}

// overShare sends d, taken from a shared lane while its tenant holds all
// the slots it may and other slots wait with its envelopes already, back
// to its lane for tenantShareRetry, without an attempt (the throttle's
// refusals take the same way, deliverer.refused). Left waiting in the
// pull, it held back the other tenants' envelopes behind it; handed to a
// slot, it took one past its tenant's share.
func (w *deliverer) overShare(ctx context.Context, d *queue.Delivery) {
	r := throttle.Refusal{Until: w.now().Add(w.slots.BackFor(d.Env.Tenant)), Reason: "tenant-share"}
	if err := w.refused(ctx, d, d.Env.Dest, r, 0); err != nil {
		// Left unacknowledged: the server hands it out again after the
		// ack wait.
		w.log.Error().Err(err).Str("msg_id", d.Env.ID).Str("dest", d.Env.Dest).Msg("envelope over its tenant's share not sent back; it will be redelivered")
	}
}

// tenantShareRetry is the most an envelope of a tenant at its share of
// the slots waits on its lane before it is taken again (tenantSlots.BackFor
// waits less for a tenant whose deliveries end quickly): long enough that
// a large backlog of a tenant whose hosts hold sessions for minutes is
// written back a few hundred times a second at most, short next to the
// retry lane's backoff.
const tenantShareRetry = 30 * time.Second

// safeHandle runs one delivery, turning a panic into a logged error and a
// counted event; the envelope is left unacknowledged so the server hands it
// out again after the ack wait. That holds because handle's own defers run
// while the panic unwinds: they stop the heartbeat that keeps the ack alive
// and give the throttle's permit back (with no results, so the panic
// counts for neither the breaker nor the rate). An envelope whose
// delivery panicked panicHold times (counted across the fleet,
// Delivery.CountPanic) is held for an operator instead (holdPanicked): a
// panic that comes back with the same bytes would otherwise go round for
// ever, a connection left behind each time.
func (w *deliverer) safeHandle(ctx context.Context, d *queue.Delivery) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error().Str("msg_id", d.Env.ID).Uint64("deliveries", d.Deliveries).Interface("panic", r).Bytes("stack", debug.Stack()).Msg("delivery panicked")
			w.cfg.Metrics.panic()
			n, err := d.CountPanic(ctx)
			local := w.panics.add(d.Env)
			if err != nil {
				// The fleet's count cannot be kept: this process's own
				// bounds it. Not the server's hand-outs
				// (Delivery.Deliveries): an envelope given back unstarted
				// while every worker was busy (queue's fetchOnce) comes
				// back with that count raised, and one panic held it.
				w.log.Warn().Err(err).Str("msg_id", d.Env.ID).Int("panics_here", local).Msg("panic count not kept; counting this process's")
				n = local
			}
			if n >= panicHold {
				w.holdPanicked(ctx, d, r, n)
			}
		}
	}()
	if err := w.handle(ctx, d); err != nil {
		// The durable step failed (NATS unavailable): leave the envelope
		// unacknowledged; the server redelivers it after the ack wait and
		// AlreadyHandled sorts out what was done.
		w.log.Error().Err(err).Str("msg_id", d.Env.ID).Str("dest", d.Env.Dest).Msg("delivery step failed; envelope will be redelivered")
	}
}

// panicHold is how many panicked deliveries of an envelope hold it for an
// operator rather than leave it to be handed out again.
const panicHold = 3

// panicCounts counts the panicked deliveries of each envelope step in
// this process: what holds an envelope that keeps panicking while the
// fleet's count (Delivery.CountPanic) cannot be kept. Bounded: past
// maxPanicsTracked entries it starts again from empty, which lets an
// envelope panic a few times more, never holds one sooner.
type panicCounts struct {
	mu sync.Mutex
	m  map[string]int
}

const maxPanicsTracked = 10_000

// add counts one panic of e at its step and returns its count.
func (c *panicCounts) add(e *queue.Envelope) int {
	key := e.SentKey() + "." + strconv.FormatInt(e.SubmittedAt.UnixNano(), 10)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxPanicsTracked {
		c.m = map[string]int{}
	}
	c.m[key]++
	return c.m[key]
}

// holdPanicked parks an envelope whose delivery panicked again with the
// held (unknown-outcome) envelopes, where `queue list --state unknown`
// shows it and `queue replay` sends it once the fault is fixed, with a
// held event giving the panic. Not a dead letter: nothing says the
// message cannot be delivered, and its sender gets no failure notice. A
// panic here leaves it to be handed out again.
func (w *deliverer) holdPanicked(ctx context.Context, d *queue.Delivery, p any, panics int) {
	defer func() {
		if r := recover(); r != nil {
			w.log.Error().Str("msg_id", d.Env.ID).Interface("panic", r).Msg("holding a panicked envelope panicked too; left to be handed out again")
		}
	}()
	reason := oneLine(fmt.Sprintf("outflow: its delivery panicked %d times: %v", panics, p))
	next := d.Env.Clone()
	next.LastClass, next.LastReply = "unknown", reason
	if err := d.Hold(ctx, next); err != nil {
		w.log.Error().Err(err).Str("msg_id", d.Env.ID).Msg("holding a panicked envelope failed; left to be handed out again")
		return
	}
	if w.droppedMeanwhile(ctx, d, "held") {
		return
	}
	w.log.Warn().Str("msg_id", d.Env.ID).Str("tenant", d.Env.Tenant).Str("dest", d.Env.Dest).Uint64("deliveries", d.Deliveries).
		Msg("delivery panicked again: held for an operator (queue replay sends it again)")
	w.event(queue.EventHeld, d.Env, d.Env.Attempt, d.Env.Rcpts, reason, nil)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
