package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/queue"
)

// EventTest is the type of the event `outflow webhook test` publishes: it
// goes through the daemon's whole delivery path, to one endpoint only
// (named in the event's dest).
const EventTest = "webhook-test"

// Defaults applied by New to zero-valued Config fields; the CLI's flags and
// docs/configuration.md use these.
const (
	DefaultMaxAttempts  = 8
	DefaultTimeout      = 10 * time.Second
	DefaultBreakerAfter = 3
)

// DefaultBackoff is the retry schedule of a failing endpoint: mail's retry
// lane shape (full jitter, per-worker offset) with a 5 minute cap, so an
// endpoint back from an outage hears again within minutes.
func DefaultBackoff() backoff.Backoff {
	return backoff.Backoff{Lane: "webhook", Base: 2 * time.Second, Min: time.Second, Cap: 5 * time.Minute,
		Multiplier: 2, ContentionWindow: 2 * time.Second}
}

// Config configures a Dispatcher. Zero values take the documented default.
type Config struct {
	Store *Store
	// Events creates each endpoint's consumer on the events stream:
	// *queue.Queue. Required.
	Events EventStream
	// WorkerID names this process in decision lines and the backoff's
	// contention offset.
	WorkerID string
	// Backoff is the retry schedule. Default DefaultBackoff().
	Backoff backoff.Backoff
	// MaxAttempts is how many POSTs one event gets before it goes to the
	// dead letters. Default DefaultMaxAttempts.
	MaxAttempts int
	// BreakerAfter is how many events in a row may spend their budget
	// before the endpoint's breaker opens: then its events are held in
	// the stream and the current one is retried at the backoff's pace,
	// without a budget, until the endpoint answers 2xx again; they are not
	// burnt into the dead letters one by one. Default DefaultBreakerAfter.
	BreakerAfter int
	// Timeout bounds one POST, connection included. Default DefaultTimeout.
	Timeout time.Duration
	// AllowPrivate lets endpoints resolve to loopback, private and
	// link-local addresses (webhook-allow-private). Default false.
	AllowPrivate bool
	Logger       zerolog.Logger // carries the worker id already (serve's does); the dispatcher adds component, endpoint and tenant

	// ackWait is the endpoint consumers' ack wait (eventAckWait; tests
	// shorten it). The event in hand is kept from it every quarter.
	ackWait time.Duration
}

// eventAckWait is how long the server waits for a dispatcher's ack (or
// its word that it is still working on the event) before it hands the
// event to another daemon of the fleet.
const eventAckWait = time.Minute

// Dispatcher delivers events to every enabled endpoint; Run starts it.
type Dispatcher struct {
	cfg    Config
	client *http.Client
	log    zerolog.Logger
	br     *breakers // set by Run before any runner starts
}

// New returns a Dispatcher for cfg.
func New(cfg Config) (*Dispatcher, error) {
	if cfg.Store == nil || cfg.Events == nil {
		return nil, errors.New("webhook: Store and Events are required")
	}
	if cfg.Backoff == (backoff.Backoff{}) {
		cfg.Backoff = DefaultBackoff()
	}
	defaults.Set(&cfg.MaxAttempts, DefaultMaxAttempts)
	defaults.Set(&cfg.Timeout, DefaultTimeout)
	defaults.Set(&cfg.BreakerAfter, DefaultBreakerAfter)
	defaults.Set(&cfg.ackWait, eventAckWait)
	return &Dispatcher{cfg: cfg, client: NewClient(cfg.AllowPrivate, cfg.Timeout),
		log: cfg.Logger.With().Str("component", "webhook").Logger()}, nil
}

// NewClient is the HTTP client of deliveries: private addresses refused at
// dial time unless allowPrivate, no redirects followed (a redirect is the
// endpoint's answer, not an instruction), timeout per request.
func NewClient(allowPrivate bool, timeout time.Duration) *http.Client {
	return &http.Client{
		Timeout:       timeout,
		Transport:     &http.Transport{DialContext: dialer(allowPrivate, timeout), MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// runner is one endpoint's delivery goroutine.
type runner struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// Run follows the endpoint bucket until ctx ends: each enabled endpoint has
// one runner, restarted when its entry changes and stopped when it is
// disabled or removed.
func (d *Dispatcher) Run(ctx context.Context) error {
	br, err := watchBreakers(ctx, d.cfg.Store.breakers, func(err error) {
		d.log.Warn().Err(err).Msg("undecodable webhook breaker")
	})
	if err != nil {
		return fmt.Errorf("watch webhook breakers: %w", err)
	}
	d.br = br
	w, err := d.cfg.Store.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch webhook endpoints: %w", err)
	}
	defer func() { _ = w.Stop() }()
	runners := map[string]*runner{}
	stop := func(id string) {
		if r := runners[id]; r != nil {
			r.cancel()
			<-r.done
			delete(runners, id)
		}
	}
	defer func() {
		for id := range runners {
			stop(id)
		}
	}()
	for {
		var e jetstream.KeyValueEntry
		select {
		case <-ctx.Done():
			return nil
		case e = <-w.Updates():
		}
		if e == nil { // the end of the bucket's current contents
			continue
		}
		id := e.Key()
		stop(id)
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		var ep Endpoint
		if err := json.Unmarshal(e.Value(), &ep); err != nil {
			d.log.Warn().Err(err).Str("endpoint", id).Msg("undecodable webhook endpoint")
			continue
		}
		if ep.Disabled {
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		r := &runner{cancel: cancel, done: make(chan struct{})}
		runners[id] = r
		go func() {
			defer close(r.done)
			defer func() {
				if p := recover(); p != nil {
					d.log.Error().Str("panic", fmt.Sprint(p)).Str("endpoint", ep.ID).Msg("webhook runner panicked")
				}
			}()
			d.run(rctx, &ep)
		}()
	}
}

// run delivers ep's events, and the dead letters replayed to it, until
// ctx ends.
func (d *Dispatcher) run(ctx context.Context, ep *Endpoint) {
	log := d.log.With().Str("endpoint", ep.ID).Str("tenant", ep.Tenant).Logger()
	cfg := consumerConfig(ep, d.cfg.ackWait)
	// A consumer that cannot be made (NATS not ready, a leader election)
	// or that goes away (deleted, its stream recreated) is made again at
	// the backoff's pace, for as long as the endpoint exists and is
	// enabled: otherwise the endpoint would stay listed as enabled and
	// hear nothing until it is changed or the daemon restarted.
	for attempt := 1; ; attempt++ {
		started, err := d.consume(ctx, log, ep, cfg)
		if ctx.Err() != nil {
			return
		}
		if started {
			attempt = 1
		}
		cur, _, gerr := d.cfg.Store.Get(ctx, ep.ID)
		if errors.Is(gerr, ErrNoEndpoint) || (gerr == nil && cur.Disabled) {
			return // removed or disabled: the watch stops this runner anyway
		}
		dec := d.cfg.Backoff.Decide(attempt, d.cfg.WorkerID, backoff.NewSeed(), 0)
		log.Error().Err(err).Int("attempt", attempt).Int64("delay_ms", dec.DelayMs).Msg("webhook consumer failed; making it again")
		if !wait(ctx, dec.Delay) {
			return
		}
	}
}

// consume creates or updates ep's consumer and delivers its events until
// ctx ends or the consumer fails. It reports whether the consumer was
// made, and the error that ended it.
// consumerHeartbeat is how often the server tells an endpoint's pull
// iterator that its consumer is there; two missed in a row end the
// iterator, and the runner makes the consumer again.
const consumerHeartbeat = 5 * time.Second

func (d *Dispatcher) consume(ctx context.Context, log zerolog.Logger, ep *Endpoint, cfg jetstream.ConsumerConfig) (bool, error) {
	cons, err := d.cfg.Events.EventConsumer(ctx, cfg)
	if err != nil {
		return false, err
	}
	// Missed heartbeats end the iterator: a consumer deleted while no pull
	// request was waiting on it sends no "consumer deleted" status, and the
	// iterator would otherwise go on pulling from nothing, the endpoint
	// deaf until a restart.
	it, err := cons.Messages(jetstream.PullHeartbeat(consumerHeartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return false, err
	}
	// Stopping the iterator only asks it to end: its unsubscribe follows
	// on another goroutine, and until the server has it, the pull request
	// this runner left there can still be handed the endpoint's next
	// event, which would then wait out the ack wait (a minute) before the
	// runner that replaces this one (an update of the endpoint) saw it.
	// So the runner returns only once the subscription is gone, and an
	// event it took but did not finish goes back at once (Nak).
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			it.Drain()
		case <-done:
		}
	}()
	defer awaitClosed(it)
	// unburied is the event whose dead letter could not be stored, given
	// back to the stream to come again. When it does (to this runner: one
	// event in flight, and the others wait behind it), the endpoint's
	// answer is known already and only the dead letter is written: posting
	// it again would take a whole new budget of attempts (and open a
	// breaker twice) for a write that failed on our side. Another daemon
	// that gets it knows nothing of this and delivers it afresh, which is
	// at least once all the same. It lives as long as this consumer: one
	// made again may be on a stream made again, whose sequences start
	// over.
	var unburied *burial
	for {
		m, err := it.Next()
		if err != nil {
			return true, err
		}
		if ctx.Err() != nil {
			_ = m.Nak()
			continue
		}
		md, err := m.Metadata()
		if err != nil {
			_ = m.Term()
			continue
		}
		if m.Subject() == replaySubject(ep.ID) {
			var dl DeadLetter
			if err := json.Unmarshal(m.Data(), &dl); err != nil || dl.Endpoint != ep.ID {
				_ = m.Ack()
				continue
			}
			log.Info().Str("webhook_id", dl.ID).Str("type", dl.Type).Time("dead_at", dl.At).Msg("webhook dead letter replayed")
			settle(ctx, m, d.handle(ctx, log, ep, &unburied, md.Sequence.Stream, dl.ID, dl.Type, dl.Body, m))
			continue
		}
		var ev queue.Event
		if err := json.Unmarshal(m.Data(), &ev); err != nil || ev.Tenant != ep.Tenant || (ev.Type == EventTest && ev.Dest != ep.ID) {
			_ = m.Ack()
			continue
		}
		data := json.RawMessage(m.Data())
		if w := queue.ForTenant(ev.Worker); w != ev.Worker {
			// An operator's action: the tenant is told "admin", not who.
			ev.Worker = w
			data, _ = json.Marshal(&ev)
		}
		body, _ := json.Marshal(struct {
			Type      string          `json:"type"`
			Timestamp time.Time       `json:"timestamp"`
			Data      json.RawMessage `json:"data"`
		}{ev.Type, ev.Time, data})
		settle(ctx, m, d.handle(ctx, log, ep, &unburied, md.Sequence.Stream, webhookID(md), ev.Type, body, m))
	}
}

// handle delivers the event stored at seq, or, when it is the one in
// *unburied, only stores its dead letter, and says what became of it;
// *unburied is left holding it if its dead letter could not be stored.
func (d *Dispatcher) handle(ctx context.Context, log zerolog.Logger, ep *Endpoint, unburied **burial, seq uint64, id, typ string,
	body []byte, m jetstream.Msg) outcome {
	b := *unburied
	*unburied = nil
	if b == nil || b.seq != seq || b.dl.ID != id {
		var taken bool
		if taken, b = d.deliver(ctx, log, ep, id, typ, body, m); b == nil {
			return outcome{finished: taken}
		}
		b.seq = seq
	}
	o := d.bury(ctx, log, ep, b, m)
	if !o.finished {
		*unburied = b
	}
	return o
}

// webhookID is the webhook-id of the event stored as md says: its
// sequence in the events stream and the time the stream stored it, in
// Unix nanoseconds. The sequence alone starts again at 1 when the events
// stream is made again (deleted and created, by hand or by a new setup of
// the cluster), and a receiver that deduplicates on webhook-id, as
// Standard Webhooks asks, would drop the new stream's events as repeats
// of the old one's. The events carry no id of their own to use instead:
// their id (and Outflow-Event-Id) names the envelope, which has many
// events. Both parts are fixed once the event is stored, so every retry,
// a redelivery to another daemon and a replay send the same id.
func webhookID(md *jetstream.MsgMetadata) string {
	return "evt_" + strconv.FormatUint(md.Sequence.Stream, 10) + "_" + strconv.FormatInt(md.Timestamp.UnixNano(), 10)
}

// outcome is what became of an event, for settle to tell the stream.
type outcome struct {
	// finished: the endpoint took it, or it is in the dead letters.
	finished bool
	// again, when not finished: its dead letter could not be stored, and
	// it is to come back after this long, at the backoff's pace.
	again time.Duration
}

// settle acknowledges an event that is finished with (the endpoint took
// it, or it is in the dead letters). Anything else goes back to the
// stream, never acknowledged: one whose dead letter could not be stored
// after o.again (it keeps the consumer's one ack-pending slot meanwhile,
// so the endpoint's later events wait behind it, in order), and one given
// up on because the runner is stopping at once, for the next runner.
func settle(ctx context.Context, m jetstream.Msg, o outcome) {
	switch {
	case o.finished:
		_ = m.Ack()
	case o.again > 0 && ctx.Err() == nil:
		_ = m.NakWithDelay(o.again)
	default:
		_ = m.Nak()
	}
}

// awaitClosed stops it and waits (up to closeWait) until its subscription
// is gone, so that nothing sent on the connection afterwards can overtake
// the unsubscribe.
func awaitClosed(it jetstream.MessagesContext) {
	it.Drain()
	c, ok := it.(interface{ Closed() <-chan struct{} })
	if !ok {
		return
	}
	t := time.NewTimer(closeWait)
	defer t.Stop()
	select {
	case <-c.Closed():
	case <-t.C:
	}
}

// closeWait bounds awaitClosed: the unsubscribe is one protocol line on a
// live connection, so this only matters when the connection is gone.
const closeWait = 5 * time.Second

// burial is an event on its way to the dead letters: refused for good, out
// of budget, or refused with a 410 Gone.
type burial struct {
	dl    DeadLetter
	gone  bool   // a 410: the endpoint is disabled once dl is stored
	spent bool   // its budget ran out: counted toward the breaker once dl is stored
	seq   uint64 // the event's sequence in the events stream, to know it when it comes back
	tries int    // failed writes of dl so far: the pace of the event's return
}

// deliver POSTs one event until it is taken (true), refused for good or
// out of budget (a burial, which bury finishes: the event is not done with
// until its dead letter is stored), or ctx ends (false and no burial). m,
// when not nil, is told InProgress every quarter of the ack wait for as
// long as deliver has it, through its POSTs as well as the waits between
// them: in a fleet, an event whose ack wait ran out during a slow POST was
// handed to another daemon, and the endpoint got it twice at once, with
// twice the attempts.
func (d *Dispatcher) deliver(ctx context.Context, log zerolog.Logger, ep *Endpoint, id, typ string, body []byte, m jetstream.Msg) (bool, *burial) {
	if m != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			t := time.NewTicker(d.cfg.ackWait / 4)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					_ = m.InProgress()
				}
			}
		}()
	}
	for attempt := 1; ; attempt++ {
		status, hint, err := Post(ctx, d.client, ep, id, body)
		if ctx.Err() != nil {
			return false, nil
		}
		ev := log.Info().Str("webhook_id", id).Str("type", typ).Int("attempt", attempt).Int("status", status)
		if err != nil {
			ev = ev.Str("error", err.Error())
		}
		class := Classify(status, err)
		switch {
		case class == "delivered":
			ev.Str("class", class).Msg("webhook delivered")
			was, err := d.br.reset(context.WithoutCancel(ctx), ep.ID)
			if err != nil {
				log.Warn().Err(err).Msg("reset webhook breaker")
			} else if was.Open {
				log.Info().Time("open_since", was.Since).Msg("webhook breaker closed")
			}
			return true, nil
		case status == http.StatusGone:
			ev.Str("class", "gone").Msg("webhook endpoint gone: to be disabled")
			return false, &burial{dl: deadLetter(ep, id, typ, body, "410 Gone: endpoint disabled"), gone: true}
		case class == "permanent":
			ev.Str("class", class).Msg("webhook refused")
			return false, &burial{dl: deadLetter(ep, id, typ, body, "refused: "+describe(status, err))}
		case attempt >= d.cfg.MaxAttempts && !d.br.get(ep.ID).Open:
			ev.Str("class", class).Msg("webhook budget spent")
			return false, &burial{dl: deadLetter(ep, id, typ, body, fmt.Sprintf("%d attempts, last %s", attempt, describe(status, err))), spent: true}
		}
		seed := backoff.NewSeed()
		dec := d.cfg.Backoff.Decide(attempt, d.cfg.WorkerID, seed, hint)
		next := time.Now().Add(dec.Delay)
		// Every input of the decision is on the line, as on mail's
		// "backoff decision" lines (the worker_id is the logger's), so
		// `outflow schedule --lane webhook` can replay it: --seed
		// jitter_seed, --worker worker_id, --attempts backoff_attempt,
		// --hint hint_ms, and the parameters for a backoff other than
		// the default.
		ev.Str("class", class).Str("lane", d.cfg.Backoff.Lane).Int("backoff_attempt", dec.Attempt).
			Int64("base_ms", dec.BaseMs).Int64("min_ms", dec.MinMs).Float64("multiplier", dec.Multiplier).Int64("window_ms", dec.WindowMs).
			Int64("nominal_ms", dec.NominalMs).Int64("cap_ms", dec.CapMs).
			Str("jitter_seed", strconv.FormatUint(seed, 10)).Int64("jitter_ms", dec.JitterMs).Int64("offset_ms", dec.OffsetMs).
			Int64("hint_ms", dec.HintMs).Int64("delay_ms", dec.DelayMs).Time("next_attempt_at", next).Msg("webhook deferred")
		if !wait(ctx, dec.Delay) {
			return false, nil
		}
	}
}

// wait sleeps d, or until ctx ends, reporting false.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// bury stores b's dead letter, and only then does what follows from it: a
// 410's disable, a spent budget's count toward the breaker. Until the dead
// letter is stored the event is not finished: acknowledged without it, the
// event would be nowhere, neither in the stream nor in the dead letters
// for `webhook replay`, and a 410 would leave a disabled endpoint with
// nothing to replay. So a failed write (the bucket in a leader election,
// timing out, its stream full or gone) hands the event back to the stream
// at the backoff's pace (outcome.again), and its next delivery tries the
// write again; the endpoint stays enabled meanwhile.
func (d *Dispatcher) bury(ctx context.Context, log zerolog.Logger, ep *Endpoint, b *burial, m jetstream.Msg) outcome {
	if err := d.dead(ctx, b.dl); err != nil {
		b.tries++
		dec := d.cfg.Backoff.Decide(b.tries, d.cfg.WorkerID, backoff.NewSeed(), 0)
		log.Error().Err(err).Str("webhook_id", b.dl.ID).Str("type", b.dl.Type).Str("reason", b.dl.Reason).Int("attempt", b.tries).
			Int64("delay_ms", dec.DelayMs).Time("next_attempt_at", time.Now().Add(dec.Delay)).
			Msg("webhook dead letter not stored; event kept in the stream")
		return outcome{again: dec.Delay}
	}
	if b.tries > 0 {
		log.Info().Str("webhook_id", b.dl.ID).Int("failed_writes", b.tries).Msg("webhook dead letter stored")
	}
	switch {
	case b.gone:
		if m != nil {
			// Before the disable stops this runner: the event is in
			// the dead letters now, not to be delivered again.
			_ = m.Ack()
		}
		if err := d.cfg.Store.disable(context.WithoutCancel(ctx), ep.ID, "410 Gone"); err != nil {
			log.Warn().Err(err).Msg("disable webhook endpoint")
		} else {
			log.Info().Str("webhook_id", b.dl.ID).Msg("webhook endpoint disabled: 410 Gone")
		}
	case b.spent:
		s, opened, err := d.br.spend(context.WithoutCancel(ctx), ep.ID, d.cfg.WorkerID, d.cfg.BreakerAfter)
		if err != nil {
			log.Warn().Err(err).Msg("count webhook breaker")
		} else if opened {
			log.Warn().Int("spent", s.Spent).Msg("webhook breaker open: events held until the endpoint answers")
		}
	}
	return outcome{finished: true}
}

// deadLetter is the dead letter of an event of ep's, parked now; it is
// made once, so a write tried again stores the same.
func deadLetter(ep *Endpoint, id, typ string, body []byte, reason string) DeadLetter {
	return DeadLetter{Endpoint: ep.ID, ID: id, Type: typ, Body: body, Reason: reason, At: time.Now().UTC()}
}

// dead stores dl, and says whether it could: the caller must not let the
// event go without it.
func (d *Dispatcher) dead(ctx context.Context, dl DeadLetter) error {
	return d.cfg.Store.putDead(context.WithoutCancel(ctx), dl)
}

func describe(status int, err error) string {
	if err != nil {
		return err.Error()
	}
	return strconv.Itoa(status)
}

// Classify maps one POST's outcome to mail's classes: delivered (2xx),
// transient (408, 429, 5xx, no answer) or permanent (any other status).
func Classify(status int, err error) string {
	switch {
	case err != nil:
		var pe *ErrPrivateAddress
		if errors.As(err, &pe) {
			return "permanent"
		}
		return "transient"
	case status >= 200 && status < 300:
		return "delivered"
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500:
		return "transient"
	}
	return "permanent"
}

// Post sends one signed delivery and returns the status and the
// Retry-After it asked for (0 if none).
func Post(ctx context.Context, c *http.Client, ep *Endpoint, id string, body []byte) (int, time.Duration, error) {
	ts := time.Now()
	sig, err := ep.signature(id, ts, body)
	if err != nil {
		return 0, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, ep.URL, bytes.NewReader(body))
	if err != nil {
		return 0, 0, redactURL(err)
	}
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("User-Agent", "outflow-webhook/1")
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", strconv.FormatInt(ts.Unix(), 10))
	h.Set("webhook-signature", sig)
	res, err := c.Do(req)
	if err != nil {
		return 0, 0, redactURL(err)
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
	return res.StatusCode, retryAfter(res.Header.Get("Retry-After"), time.Now()), nil
}

// redactURL takes the endpoint's URL out of an HTTP client error, whose
// text (a *url.Error's: Post "<the whole URL>": dial tcp …) is logged on
// every failed POST and kept in the dead letter's reason, which `webhook
// list`, the dead-letter listing and the API show. A URL may carry a
// credential that CheckURL cannot refuse: a token in the query (Azure's
// sig=, many a ?token=) or in the path (Slack's hooks.slack.com/services/…).
// What is kept is the operation, the scheme and host (the dial error names
// them anyway), and the inner error, still wrapped for errors.As
// (ErrPrivateAddress); the log line names the endpoint by its id.
func redactURL(err error) error {
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err
	}
	where := "endpoint"
	if u, perr := url.Parse(ue.URL); perr == nil && u.Host != "" && (u.Scheme == "http" || u.Scheme == "https") {
		where = u.Scheme + "://" + u.Host
		if u.Path != "" || u.RawQuery != "" || u.Fragment != "" {
			where += "/…"
		}
	}
	return &postError{op: ue.Op, where: where, err: ue.Err}
}

// postError is a *url.Error without the URL's path and query.
type postError struct {
	op, where string
	err       error
}

func (e *postError) Error() string { return fmt.Sprintf("%s %q: %v", e.op, e.where, e.err) }
func (e *postError) Unwrap() error { return e.err }

// Timeout answers as the *url.Error did.
func (e *postError) Timeout() bool {
	t, ok := e.err.(interface{ Timeout() bool })
	return ok && t.Timeout()
}

// retryAfter parses Retry-After (RFC 9110 section 10.2.3): delay seconds
// or an HTTP date. Anything else, or a time past, is 0.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(min(n, 86400)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return min(t.Sub(now), 24*time.Hour)
	}
	return 0
}
