package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Delivery is one envelope pulled from a lane by a worker. The worker must
// end it with exactly one of Delivered, Reschedule, Hold, Dead, Bounce or
// Skip; each writes the next durable state first and acknowledges the
// original last.
type Delivery struct {
	Env  *Envelope
	Lane Lane
	// Redelivered is true when the server has handed this message out
	// before: a worker died or timed out holding it.
	Redelivered bool
	// Deliveries is how many times the server has handed it out, this
	// time included.
	Deliveries uint64
	// Fetched is when this process received it: the server's ack wait
	// runs from about then, not from when a worker took it.
	Fetched time.Time
	msg     jetstream.Msg
	q       *Queue
	// dropped caches Dropped's answer once droppedAsked.
	dropped, droppedAsked bool
	// givenBack is set by the first GiveBack: a second one sends nothing
	// (only its holder gives an envelope back, so no lock).
	givenBack bool
	// held is the Holding of the pulls that fetched it, if any: GiveBack
	// asks it about their pull requests still open.
	held *Holding
}

// Messages starts pulling envelopes from lane and sends them on the
// returned channel until ctx ends. buffer bounds how many envelopes this
// process holds un-started, so that a slow destination cannot leave pulled
// messages waiting past the ack wait. Undecodable messages never reach the
// channel: they are parked in dead letters with the reason and logged.
func (q *Queue) Messages(ctx context.Context, lane Lane, buffer int) (<-chan *Delivery, error) {
	if buffer < 1 {
		buffer = 1
	}
	out := make(chan *Delivery)
	if lane == LaneWork {
		go q.workMessages(ctx, buffer, out)
		return out, nil
	}
	name := map[Lane]string{LaneRetry: consumerRetry, LaneRateLimit: consumerRateLimit}[lane]
	stream := q.lanes[lane]
	if name == "" || stream == nil {
		return nil, fmt.Errorf("unknown lane %q", lane)
	}
	cons, err := stream.Consumer(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("consumer %s: %w", name, err)
	}
	go func() {
		defer close(out)
		q.pull(ctx, cons, lane, buffer, out)
	}()
	return out, nil
}

// pull feeds out from one consumer until ctx ends.
func (q *Queue) pull(ctx context.Context, cons jetstream.Consumer, lane Lane, buffer int, out chan<- *Delivery) {
	// Fetching can fail without ctx ending: a NATS failover, a consumer
	// leader moving, a stream restarted from disk. A worker that stopped
	// pulling a lane then would strand its mail, so pulling starts again
	// (with a growing pause) until ctx ends.
	wait := 250 * time.Millisecond
	for ctx.Err() == nil {
		if q.pullOnce(ctx, cons, lane, buffer, out) {
			wait = 250 * time.Millisecond
		}
		if ctx.Err() != nil {
			return
		}
		q.log.Warn().Str("lane", string(lane)).Dur("retry_in", wait).Msg("pull ended; starting again")
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(wait*2, 5*time.Second)
	}
}

// pullWait is how long one pull request waits at the server for mail.
// Every batch ends within it (plus a second, on the client's own clock),
// so a pull request that a failover lost is replaced within that time.
const pullWait = 5 * time.Second

// laneTimes are the work lane's waits: the package's constants, unless a
// test sets its own on the Queue before it pulls.
type laneTimes struct {
	wait       time.Duration // pullWait
	refresh    time.Duration // tenantRefresh
	wakeGap    time.Duration // wakeGap
	tenantIdle time.Duration // tenantIdle
	look       time.Duration // lookEvery's answer
}

func (q *Queue) pullWait() time.Duration      { return cmp.Or(q.times.wait, pullWait) }
func (q *Queue) tenantRefresh() time.Duration { return cmp.Or(q.times.refresh, tenantRefresh) }
func (q *Queue) tenantIdle() time.Duration    { return cmp.Or(q.times.tenantIdle, tenantIdle) }
func (q *Queue) wakeGap() time.Duration       { return cmp.Or(q.times.wakeGap, wakeGap) }

// pullOnce fetches batches of up to buffer envelopes and hands them out
// until a fetch fails; it reports whether it got any message (so the
// caller's pause starts small again).
//
// It fetches rather than keeping one long-lived iterator (Consumer.Messages):
// when a cluster's server is killed, an iterator can go silent for good (no
// pull request left at the server, no error, no heartbeat error) with
// envelopes pending. A fetch is one pull request with an expiry that the
// client enforces too, so a lost request costs at most one pullWait.

func (q *Queue) pullOnce(ctx context.Context, cons jetstream.Consumer, lane Lane, buffer int, out chan<- *Delivery) (got bool) {
	for ctx.Err() == nil {
		g, _, err := q.fetchOnce(ctx, cons, lane, buffer, out)
		got = got || g > 0
		if err != nil {
			return got
		}
	}
	return got
}

// fetchOnce makes one pull request for up to n envelopes, waiting up to
// pullWait, and hands out what it gets; it reports how many it got, how
// many of them a worker took (the others were given back), and the
// request's failure, logged. Once ctx has ended it makes none.
//
// The server's ack wait for an envelope runs from the fetch, not from the
// moment a worker takes it. While every worker is busy (a destination
// that holds its sessions for minutes), an envelope fetched and not taken
// within half the ack wait is given back (a nak: the server hands it out
// again at once, to whichever fleet member asks first): left waiting, the
// server handed it out again after the ack wait while its stale copy was
// still to be taken here, and both copies were sent. Given back unstarted,
// it cannot be sent twice, and a worker that takes one keeps it alive
// from then on.
//
// A pull request still open at the stop stays open, and is read, until
// it ends at the server (pullWait at most): nats.go ends one early only
// by unsubscribing its inbox, and drops whatever the server sent it
// meanwhile, which then waited for the ack wait (mail published in the
// same instant by this process, or by any other). The requests open are
// counted in the Holding, with when they end, so that a give-back does
// not come due while one of them could take it (GiveBack).
//
// On a tenant's work lane it hands out only what the Admission ctx
// carries admits (admission.go): the lane is all one tenant's, and what
// waits for the tenant's turn waits as what waits for a free worker does.
// The retry and rate-limit lanes, which every tenant shares, ask none: an
// envelope left waiting there held back the other tenants' envelopes
// behind it, and one carried over to the next pull held the lane's
// envelopes out of the fleet's reach; the worker sends one of a tenant at
// its share back to its lane for later instead (worker's slots.go).
func (q *Queue) fetchOnce(ctx context.Context, cons jetstream.Consumer, lane Lane, n int, out chan<- *Delivery) (got, taken int, err error) {
	held, adm := holdingOf(ctx), admissionOf(ctx)
	if lane != LaneWork {
		adm = nil
	}
	key := held.pullKey(cons)
	// No pull request once the stop has come: the give-backs' own wake-up
	// started a loop for their tenant, whose request, open for pullWait,
	// the server handed them to 10 ms later, while this process was
	// closing its connection; the restarted server, or another process,
	// then waited for the ack wait.
	if !held.startPull(ctx, key, time.Now().Add(q.pullWait())) {
		return 0, 0, ctx.Err()
	}
	open := true // the request, counted in held until it ends
	ended := func() {
		if open {
			open = false
			held.endPull(key)
		}
	}
	defer ended()
	q.count(OpFetch)
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(q.pullWait()))
	if err != nil {
		if ctx.Err() == nil {
			q.log.Warn().Err(err).Str("lane", string(lane)).Msg("pull")
		}
		return 0, 0, err
	}
	var waiting []*Delivery          // not yet taken, oldest first
	var maxWait, stale time.Duration // set at the first envelope (waitLimits)
	var check *time.Ticker
	var checkC <-chan time.Time
	defer func() {
		if check != nil {
			check.Stop()
		}
	}()
	msgs, done := batch.Messages(), ctx.Done()
	for msgs != nil || len(waiting) > 0 {
		// A copy that waited past stale (this process stood still: a
		// pause, a stalled VM, between the checks below) is neither
		// handed out nor given back: the server has handed it out again,
		// or is about to, and a nak now would have it hand out the new
		// copy once more while a worker holds it.
		for len(waiting) > 0 && time.Since(waiting[0].Fetched) >= stale {
			q.count(OpGivenBack)
			held.add(-1, 0)
			waiting[0] = nil
			waiting = waiting[1:]
		}
		var send chan<- *Delivery
		var head *Delivery
		var changed <-chan struct{} // set while none waiting is admitted
		at := nextAdmitted(adm, waiting)
		if at < 0 && len(waiting) > 0 {
			// Watched first, asked again second: a delivery that ends
			// in between is not missed.
			changed = adm.Changed()
			if at = nextAdmitted(adm, waiting); at >= 0 {
				changed = nil
			}
		}
		if at >= 0 {
			send, head = out, waiting[at]
		}
		if len(waiting) > 0 && check == nil {
			// A worker ready now takes it without the ticker: it is
			// armed only for envelopes that have to wait.
			if send != nil {
				select {
				case send <- head:
					taken++
					held.add(-1, 0)
					started(adm, head)
					waiting = slices.Delete(waiting, at, at+1)
					continue
				default:
				}
			}
			check = time.NewTicker(max(maxWait/4, time.Millisecond))
			checkC = check.C
		}
		select {
		case m, ok := <-msgs:
			if !ok {
				msgs = nil
				ended()
				continue
			}
			got++
			if got >= n {
				ended() // its last message: the server took it off its list
			}
			q.count(OpFetched)
			held.add(1, 0) // until a worker takes it, or it goes back
			if ctx.Err() != nil {
				// Fetched after the stop (the pull request was still
				// open at the server): not started, so it goes back.
				held.add(-1, q.giveBackAll(lane, []*Delivery{{Lane: lane, msg: m, q: q, held: held}}))
				continue
			}
			d, err := q.decode(m, lane)
			if err != nil {
				q.parkMalformed(ctx, m, err)
				held.add(-1, 0)
				continue
			}
			d.Fetched = time.Now()
			d.held = held
			if stale == 0 {
				maxWait, stale = waitLimits(q.opts.AckWait, cons)
			}
			waiting = append(waiting, d)
		case send <- head:
			taken++
			held.add(-1, 0)
			started(adm, head)
			waiting = slices.Delete(waiting, at, at+1)
		case <-changed:
		case now := <-checkC:
			for len(waiting) > 0 && now.Sub(waiting[0].Fetched) > maxWait {
				q.count(OpGivenBack)
				held.add(-1, 0)
				_ = waiting[0].msg.Nak()
				waiting[0] = nil
				waiting = waiting[1:]
			}
		case <-done:
			// The process stops: what no worker took goes back now, for
			// another process or this one restarted, rather than after
			// the ack wait. The select took this case instead of handing
			// the head to a worker, so none of them is being started. A
			// copy past stale is left, as above.
			var back []*Delivery
			for _, d := range waiting {
				if time.Since(d.Fetched) < stale {
					back = append(back, d)
				} else {
					q.count(OpGivenBack)
				}
			}
			held.add(-len(waiting), q.giveBackAll(lane, back))
			waiting, done = nil, nil
		}
	}
	if err := batch.Error(); err != nil {
		if ctx.Err() == nil {
			q.log.Warn().Err(err).Str("lane", string(lane)).Msg("pull")
		}
		return got, taken, err
	}
	return got, taken, nil
}

// waitLimits are how long a fetched envelope may wait for a worker before
// it is given back, and after which it is dropped unstarted (fetchOnce):
// half and three quarters of the consumer's ack wait, its own should
// another daemon have set it, else ackWait.
func waitLimits(ackWait time.Duration, cons jetstream.Consumer) (giveBack, stale time.Duration) {
	if ci := cons.CachedInfo(); ci != nil && ci.Config.AckWait > 0 {
		ackWait = ci.Config.AckWait
	}
	return ackWait / 2, ackWait * 3 / 4
}

// giveBackDelay is the delay of a give-back's nak (GiveBack), when no
// pull request of the process is open on the envelope's consumer.
const giveBackDelay = time.Nanosecond

// giveBackMargin is added to the time a pull request of the process has
// left at the server, for a give-back's nak on its consumer (GiveBack):
// the server starts the request's wait when it has read the request,
// somewhat after the process sent it.
const giveBackMargin = 500 * time.Millisecond

// GiveBackWait bounds how long a give-back at a stop waits for the
// server's answer, the pulls' and the workers' alike.
const GiveBackWait = 5 * time.Second

// GiveBack hands an envelope this process will not start (its pull or
// its worker is stopping) back to the server, to be handed out again at
// once, and waits for the server's answer. It is for an envelope whose
// attempt sent nothing; nothing else may be done with d afterwards (the
// caller stops its heartbeat first: an InProgress after the give-back
// would set the ack wait running again).
//
// A plain nak is not enough at a stop: the server keeps "hand it out
// again" in memory only (its redelivery queue), while the envelope stays
// pending in the consumer's stored state with the time it was handed out.
// The embedded server of a daemon being restarted stops right after its
// workers, and the new one found the envelope pending and handed it out
// only when the ack wait since then had run out: a minute of "queued,
// attempt 0" after every restart. A nak with a delay moves that stored
// time instead, to one ack wait (less a nanosecond) before now, so the
// envelope is due at once, for a fleet member now or for the server that
// reads its store again. The answer is waited for because the server
// takes acknowledgements off a queue of its own, which a server stopping
// right after may not have read.
//
// While a pull request of this process is still open on the envelope's
// consumer (one made before the stop, waiting for more: fetchOnce), the
// delay runs until that request has ended at the server (pullWait at
// most, plus giveBackMargin) instead: due at once, the envelope went to
// that request, the first waiting, of a process about to close its
// connection, which never saw it, and the server (restarted, or another
// process's) waited for the ack wait. It is no deferral (the design's
// rule against NakWithDelay): it holds the envelope's MaxAckPending slot
// for seconds at most, for a process that stops.
func (d *Delivery) GiveBack(ctx context.Context) error {
	if d.givenBack {
		return nil
	}
	d.givenBack = true
	delay := giveBackDelay
	if md, err := d.msg.Metadata(); err == nil && d.held != nil {
		if until, open := d.held.openUntil(md.Stream + "/" + md.Consumer); open {
			delay = max(delay, time.Until(until)+giveBackMargin)
		}
	}
	// What nats.go's NakWithDelay sends (its nak is not confirmed).
	body := fmt.Appendf(nil, `-NAK {"delay": %d}`, delay.Nanoseconds())
	if _, err := d.q.nc.RequestWithContext(ctx, d.msg.Reply(), body); err != nil {
		return fmt.Errorf("give back %s: %w", d.id(), err)
	}
	if d.Lane == LaneWork && d.Env != nil {
		// Fresh mail is pulled only for tenants that have some: the
		// other processes hear of it now rather than at their next look
		// at the consumers (tenants.go).
		d.q.count(OpWake)
		_ = d.q.nc.Publish(subjWorkWake, []byte(tenantConsumer(d.Env.Tenant)))
	}
	return nil
}

// id names d in a log line or error: its envelope's id, or the stream
// sequence of a message not decoded.
func (d *Delivery) id() string {
	if d.Env != nil {
		return d.Env.ID
	}
	if md, err := d.msg.Metadata(); err == nil {
		return "stream sequence " + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	return d.msg.Subject()
}

// giveBackAll gives back ds at once, each waiting for its answer within
// GiveBackWait, and returns how many the server confirmed. One that
// failed is left for the ack wait, as a killed process's envelopes are.
func (q *Queue) giveBackAll(lane Lane, ds []*Delivery) int {
	if len(ds) == 0 {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), GiveBackWait)
	defer cancel()
	var ok atomic.Int64
	var wg sync.WaitGroup
	for _, d := range ds {
		wg.Go(func() {
			if err := d.GiveBack(ctx); err != nil {
				q.log.Warn().Err(err).Str("lane", string(lane)).
					Msg("fetched envelope not given back at the stop; it waits for the ack wait")
				return
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	return int(ok.Load())
}

// Holding counts the envelopes a process's pulls hold fetched and not yet
// taken by a worker, and how many of them went back to the server when
// the pulls' context ended (GiveBack). A stopping worker.Pool waits until
// none is held, so that every give-back has its answer before the
// process goes on to close its connection, and says how many went back.
// Messages counts into the Holding its ctx carries (WithHolding).
//
// It keeps the pulls' pull requests open too, by consumer, with when
// they end at the latest, for GiveBack.
type Holding struct {
	mu      sync.Mutex
	held    int
	given   int
	changed chan struct{} // closed at the next change of held, then replaced
	pulls   map[string]*openPulls
}

// openPulls are the pull requests open on one consumer.
type openPulls struct {
	n     int
	until time.Time // the latest end of those open
}

// pullKey names cons in h's pulls: its stream and name ("" without h).
func (h *Holding) pullKey(cons jetstream.Consumer) string {
	if h == nil {
		return ""
	}
	if ci := cons.CachedInfo(); ci != nil {
		return ci.Stream + "/" + ci.Name
	}
	return ""
}

// startPull counts a pull request on the consumer key about to be made,
// waiting at the server until until at most, unless ctx has ended: then
// it counts nothing and reports false, and none may be made. It counts
// first and looks at ctx second, so that a give-back after the stop that
// found no request open (openUntil) is followed by none.
func (h *Holding) startPull(ctx context.Context, key string, until time.Time) bool {
	if h != nil && key != "" {
		h.mu.Lock()
		if h.pulls == nil {
			h.pulls = map[string]*openPulls{}
		}
		p := h.pulls[key]
		if p == nil {
			p = &openPulls{}
			h.pulls[key] = p
		}
		p.n++
		if until.After(p.until) {
			p.until = until
		}
		h.mu.Unlock()
	}
	if ctx.Err() != nil {
		h.endPull(key)
		return false
	}
	return true
}

// endPull counts a pull request on the consumer key ended.
func (h *Holding) endPull(key string) {
	if h == nil || key == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.pulls[key]; p != nil {
		if p.n--; p.n <= 0 {
			delete(h.pulls, key)
		}
	}
}

// openUntil reports whether a pull request is open on the consumer key,
// and until when at the latest.
func (h *Holding) openUntil(key string) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.pulls[key]; p != nil {
		return p.until, true
	}
	return time.Time{}, false
}

type holdingKey struct{}

// WithHolding returns ctx carrying h, for Messages.
func WithHolding(ctx context.Context, h *Holding) context.Context {
	return context.WithValue(ctx, holdingKey{}, h)
}

// holdingOf is the Holding ctx carries, or nil (whose methods do nothing).
func holdingOf(ctx context.Context) *Holding {
	h, _ := ctx.Value(holdingKey{}).(*Holding)
	return h
}

// add counts held more envelopes held (fewer when negative) and given more
// given back.
func (h *Holding) add(held, given int) {
	if h == nil || held == 0 && given == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.held += held
	h.given += given
	if h.changed != nil {
		close(h.changed)
		h.changed = nil
	}
}

// Wait waits until no envelope is held, or ctx ends, and returns how many
// were given back so far. Call it once the pulls' context has ended:
// they then hold envelopes only until they have given them back.
func (h *Holding) Wait(ctx context.Context) (givenBack int, err error) {
	for {
		h.mu.Lock()
		if h.held <= 0 {
			n := h.given
			h.mu.Unlock()
			return n, nil
		}
		if h.changed == nil {
			h.changed = make(chan struct{})
		}
		ch := h.changed
		h.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			h.mu.Lock()
			defer h.mu.Unlock()
			return h.given, ctx.Err()
		}
	}
}

func (q *Queue) decode(m jetstream.Msg, lane Lane) (*Delivery, error) {
	env, err := DecodeEnvelope(m.Data(), m.Headers())
	if err != nil {
		return nil, err
	}
	d := &Delivery{Env: env, Lane: lane, msg: m, q: q}
	if md, err := m.Metadata(); err == nil {
		d.Deliveries = md.NumDelivered
		d.Redelivered = md.NumDelivered > 1
	}
	return d, nil
}

// parkMalformed stores an undecodable message verbatim in dead letters, with
// the reason, then acknowledges it: garbage on a work subject must neither
// crash a worker nor loop forever, and an operator can still look at it.
func (q *Queue) parkMalformed(ctx context.Context, m jetstream.Msg, reason error) {
	id := "malformed-" + nuidNext()
	md, _ := m.Metadata()
	var seq uint64
	if md != nil {
		seq = md.Sequence.Stream
	}
	q.log.Error().Err(reason).Str("subject", m.Subject()).Uint64("seq", seq).Str("dead_id", id).
		Msg("malformed envelope parked in dead letters")
	dm := nats.NewMsg(deadSubject(id))
	dm.Header.Set("Outflow-Dead-Reason", headerSafe(shorten(reason.Error(), 500)))
	dm.Header.Set("Outflow-Original-Subject", m.Subject())
	data := m.Data()
	if len(data) > 64<<10 {
		data = data[:64<<10]
	}
	dm.Data = data
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := q.js.PublishMsg(pctx, dm)
	if err == nil {
		err = q.durable(pctx, StreamDead)
	}
	if err != nil {
		q.log.Error().Err(err).Msg("park malformed envelope; leaving it for redelivery")
		_ = m.NakWithDelay(30 * time.Second)
		return
	}
	q.Event(EventMalformed, &Event{ID: id, Reason: shorten(reason.Error(), 500)})
	_ = m.Ack()
}

// InProgress tells the server the worker is still on it, resetting the ack
// wait; long SMTP sends call it periodically.
func (d *Delivery) InProgress() { _ = d.msg.InProgress() }

// AlreadyHandled reports whether an earlier holder of this envelope already
// finished its current attempt: a SENT marker for this attempt exists, or,
// for a redelivered message, the next step (a schedule, a due or held
// envelope, a dead letter) is already stored. The caller then just calls
// Skip. This is what makes "write next state, then ack" safe when a worker
// dies between the two.
func (d *Delivery) AlreadyHandled(ctx context.Context) (bool, error) {
	e := d.Env
	if h, found, err := d.q.lastHeader(ctx, OpSentGet, sentStreamName, sentSubject(e.SentKey())); err != nil {
		return false, fmt.Errorf("SENT lookup: %w", err)
	} else if found && sameSubmission(h, e) {
		return true, nil
	}
	if !d.Redelivered {
		return false, nil
	}
	// A later step finished already: a holder stored this step's next
	// state (a schedule, a replay) and died before its ack, and the next
	// state was delivered or bounced (its marker, Delivered and Done) and
	// acknowledged before this copy came back. Its schedule is gone then,
	// and only the marker says so.
	if m, found, err := d.q.lastMatching(ctx, OpSentGet, sentStreamName, sentSubject(e.ID)+".*"); err != nil {
		return false, fmt.Errorf("SENT lookup: %w", err)
	} else if found && sameSubmission(m.Header, e) {
		subj := m.Header.Get(nats.JSSubject)
		if step, err := strconv.Atoi(subj[strings.LastIndexByte(subj, '.')+1:]); err == nil && step > e.Step {
			return true, nil
		}
	}
	if d.Scheduled() {
		// Moved to the work lane by a holder that died before its ack:
		// the copy waits there, or was delivered since.
		d.q.count(OpDirectGet)
		if m, err := d.q.lanes[LaneWork].GetLastMsgForSubject(ctx, workSubject(e.Tenant, e.Dest, e.ID)); err == nil && m != nil && laterStep(m.Header, e) {
			return true, nil
		}
	}
	for _, l := range []Lane{LaneRetry, LaneRateLimit} {
		for _, subj := range []string{schedSubject(l, e.Dest, e.ID), dueSubject(l, e.Dest, e.ID)} {
			if subj == d.msg.Subject() {
				continue
			}
			d.q.count(OpDirectGet)
			m, err := d.q.lanes[l].GetLastMsgForSubject(ctx, subj)
			if err == nil && m != nil && laterStep(m.Header, e) {
				return true, nil
			}
		}
	}
	d.q.count(OpDirectGet)
	if m, err := d.q.lanes[LaneRetry].GetLastMsgForSubject(ctx, heldSubject(e.Dest, e.ID)); err == nil && m != nil && laterStep(m.Header, e) {
		return true, nil
	}
	d.q.count(OpDirectGet)
	if m, err := d.q.dead.GetLastMsgForSubject(ctx, deadSubject(e.ID)); err == nil && m != nil && laterStep(m.Header, e) {
		return true, nil
	}
	return false, nil
}

// laterStep reports whether a stored envelope's headers describe a step
// taken after e's current one. Every durable step (reschedule, hold, dead
// letter, replay) increments Step, so "later" is a larger step number.
func laterStep(h nats.Header, e *Envelope) bool {
	s, err := intHeader(h, HdrStep)
	return err == nil && s > e.Step
}

// Scheduled reports whether d is a message sent later (Submission.SendAt)
// whose time has come: the first firing of the schedule Enqueue made on
// the retry lane, not yet tried. An operator's fast-forward (a probe) is
// not: it asked for an attempt now, from where it is.
func (d *Delivery) Scheduled() bool {
	e := d.Env
	return d.Lane == LaneRetry && e.Step == 0 && e.Attempt == 0 && !e.SendAt.IsZero() && !e.Probe
}

// ToWork moves a scheduled message whose time has come (Scheduled) to its
// tenant's fresh mail on the work lane, and acknowledges the original.
// From there it is delivered as fresh mail is: in its tenant's turn, so
// a campaign held for nine o'clock takes its tenant's share of the
// workers, as it would have if it had been sent then, and not every slot
// the retry lane gets, ahead of other tenants' retries that fall due
// after it.
//
// The copy is the next step, published with a deduplication id of the
// envelope and its step and on disk before the ack: a holder that dies
// between the two leaves the original to be handed out again, and
// AlreadyHandled finds the copy (or, once it is delivered, its SENT
// marker); within the work stream's deduplication window a second move
// stores nothing.
func (d *Delivery) ToWork(ctx context.Context) error {
	if err := d.copyToWork(ctx); err != nil {
		return err
	}
	return d.ack(ctx)
}

// copyToWork is ToWork before its ack: the copy stored, on disk, and its
// tenant's workers woken.
func (d *Delivery) copyToWork(ctx context.Context) error {
	if !d.Scheduled() {
		return fmt.Errorf("to work %s: not a scheduled message due for its first attempt", d.Env.ID)
	}
	if d.Dropped(ctx) {
		return nil
	}
	next := d.Env.Clone()
	next.Step = d.Env.Step + 1
	next.NotBefore = time.Time{}
	tenant, err := d.q.ensureTenant(ctx, next.Tenant)
	if err != nil {
		return fmt.Errorf("to work %s: tenant consumer: %w", next.ID, err)
	}
	m, err := next.Encode(workSubject(next.Tenant, next.Dest, next.ID))
	if err != nil {
		return err
	}
	m.Header.Set(jetstream.ExpectedStreamHeader, StreamWork)
	m.Header.Set(jetstream.MsgIDHeader, "due."+next.ID+"."+itoa(next.Step))
	if err := retryStep(ctx, func(ctx context.Context) error {
		d.q.count(OpPublishWork)
		return d.q.publishConfirmed(ctx, m, StreamWork)
	}); err != nil {
		return fmt.Errorf("to work %s: %w", next.ID, err)
	}
	if err := d.q.durable(ctx, StreamWork); err != nil {
		return fmt.Errorf("to work %s: %w", next.ID, err)
	}
	// A drop that came while the copy was written: take the copy back
	// (a worker that took it in these milliseconds finds the SENT marker
	// the drop writes for the copy's step, unless it looked before the
	// marker was written: that one is in flight, and still delivers it).
	d.droppedAsked = false
	if d.Dropped(ctx) {
		d.q.dropLaterCopy(ctx, d.Env)
		return nil
	}
	d.q.wake(tenant)
	return nil
}

// droppedKey is the SENT-bucket key DropBy writes for the envelope e at
// its current step. The submission time tells a keyed envelope submitted
// again under the same id, after its deduplication window, from the one
// dropped. It cannot collide with a SENT marker (<id>.<step>) or a parts
// count: no envelope id is "dropped".
func droppedKey(e *Envelope) string { return markerKey("dropped", e.SentKey(), e) }

// markerKey is a SENT-bucket key about one envelope (id, or id and step,
// as which): prefix, which, and the submission time, which tells a keyed
// envelope submitted again under the same id, after its deduplication
// window, from an earlier one.
func markerKey(prefix, which string, e *Envelope) string {
	return prefix + "." + which + "." + strconv.FormatInt(e.SubmittedAt.UnixNano(), 10)
}

// Dropped reports whether the envelope was dropped (queue drop, a
// tenant's DELETE) while this worker held it. Reschedule, Hold, Dead and
// ToWork then write no next step and only acknowledge: a cancelled message
// does not come back at its next retry. It is asked once, by the first of
// them; a failed look-up counts as not dropped (the step is written, as
// before there was a marker).
func (d *Delivery) Dropped(ctx context.Context) bool {
	if !d.droppedAsked {
		d.droppedAsked = true
		_, _, found, err := d.q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject(droppedKey(d.Env)))
		d.dropped = err == nil && found
	}
	return d.dropped
}

// CountPanic records that this delivery of the envelope panicked and
// returns how many of its deliveries at this step have, across the fleet
// (a counter in the SENT bucket, which expires with it). An error counts
// nothing.
func (d *Delivery) CountPanic(ctx context.Context) (int, error) {
	key := markerKey("panics", d.Env.SentKey(), d.Env)
	for range 10 {
		d.q.count(OpSentGet)
		e, err := d.q.sent.Get(ctx, key)
		n := 0
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			d.q.count(OpSentPut)
			_, err = d.q.sent.Create(ctx, key, []byte("1"))
			n = 1
		case err != nil:
			return 0, err
		default:
			if n, err = strconv.Atoi(string(e.Value())); err != nil {
				return 0, err
			}
			n++
			d.q.count(OpSentPut)
			_, err = d.q.sent.Update(ctx, key, []byte(strconv.Itoa(n)), e.Revision())
		}
		if err == nil {
			return n, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return 0, err
		}
	}
	return 0, errors.New("panic count kept changing")
}

// Skip acknowledges an envelope that needs no further work.
func (d *Delivery) Skip(ctx context.Context) error {
	return d.ack(ctx)
}

// Delivered records that env's recipients (all of them, or the accepted
// part) were delivered in the current attempt: it writes the SENT marker and,
// when done is true (no recipient left for a later attempt), acknowledges the
// envelope and releases the body. With done false the caller has already
// rescheduled the rest.
func (d *Delivery) Delivered(ctx context.Context, rcpts []string, done bool) error {
	err := retryStep(ctx, func(ctx context.Context) error {
		d.q.count(OpSentPut)
		return d.q.putMarker(ctx, d.Env, []byte(strings.Join(rcpts, ",")))
	})
	if err != nil && done {
		return d.ackUnmarked(ctx, err)
	}
	if err != nil {
		return fmt.Errorf("SENT marker: %w", err)
	}
	if !done {
		return nil
	}
	if err := d.ackMarked(); err != nil {
		return err
	}
	d.q.releaseBody(ctx, d.Env)
	return nil
}

// ackMarked acknowledges an envelope whose SENT marker is stored, without
// waiting for the server's confirmation. The marker is what makes a lost
// ack harmless: the envelope comes back after the ack wait (or after a
// crash that kept the marker but not the consumer's state, which is not
// synced either), AlreadyHandled finds the marker, and it is acknowledged
// without a second send. The confirmation would only say sooner what the
// marker already covers; it cost a reply from the server and a request on
// the client per delivered message.
func (d *Delivery) ackMarked() error {
	d.q.count(OpAck)
	if err := d.msg.Ack(); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return fmt.Errorf("ack %s: %w", d.Env.ID, err)
	}
	return nil
}

// ackUnmarked acknowledges a delivered envelope whose SENT marker the
// store refused (markerErr): full (JetStream's store limit, a full disk)
// or failing. Left unacknowledged, the envelope came back after the ack
// wait with no marker to find, and was sent again: every ack wait, for as
// long as the store refused, each delivered message went to its
// recipients once a minute. An acknowledgement takes no room (it removes
// the envelope); once the server confirms it, nothing comes back, and the
// marker is not needed. Only when the acknowledgement fails too is the
// step an error, and the envelope redelivered.
func (d *Delivery) ackUnmarked(ctx context.Context, markerErr error) error {
	d.q.count(OpAck)
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := d.msg.DoubleAck(actx); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
		return fmt.Errorf("SENT marker: %w; acknowledgement: %v", markerErr, err)
	}
	d.q.log.Warn().Err(markerErr).Str("msg_id", d.Env.ID).Str("dest", d.Env.Dest).
		Msg("SENT marker not stored; the delivered envelope was acknowledged without it")
	d.q.releaseBody(ctx, d.Env)
	return nil
}

// HdrSubmitted stamps a SENT marker with its submission's time (Unix
// nanoseconds). An idempotency-keyed message has the same id every time its
// key is used, and the key may be used again once the work stream's
// deduplication window (a day) has passed, while the markers of the first
// use live on (SentTTL, three days): without the stamp the second message
// was taken for handled by the first's markers, and dropped unsent.
const HdrSubmitted = "Outflow-Submitted"

// putMarker writes e's SENT marker for its current step, stamped with its
// submission.
func (q *Queue) putMarker(ctx context.Context, e *Envelope, value []byte) error {
	key := e.SentKey()
	if !validKVKey(key) {
		return jetstream.ErrInvalidKey
	}
	m := &nats.Msg{Subject: sentSubject(key), Data: value, Header: nats.Header{}}
	m.Header.Set(HdrSubmitted, strconv.FormatInt(e.SubmittedAt.UnixNano(), 10))
	return q.publishConfirmed(ctx, m, sentStreamName)
}

// sameSubmission reports whether a marker with headers h is one of e's
// submission: stamped with its time, or unstamped (written by an earlier
// release, which could not tell).
func sameSubmission(h nats.Header, e *Envelope) bool {
	v := h.Get(HdrSubmitted)
	return v == "" || v == strconv.FormatInt(e.SubmittedAt.UnixNano(), 10)
}

// sentStreamName is the SENT bucket's stream, and sentSubject a key's
// subject in it.
var sentStreamName = kvStream(BucketSent)

func sentSubject(key string) string { return kvSubject(BucketSent, key) }

// Done acknowledges an envelope that has reached its end without a
// delivery (every recipient bounced, or none left to send to) and releases
// its body. It writes the step's marker first, empty: an earlier step of
// the envelope that comes back after this one ended (its holder died
// between storing this step and its own ack) finds it and is not sent
// again (AlreadyHandled).
func (d *Delivery) Done(ctx context.Context) error {
	if err := retryStep(ctx, func(ctx context.Context) error {
		d.q.count(OpSentPut)
		return d.q.putMarker(ctx, d.Env, nil)
	}); err != nil {
		return fmt.Errorf("SENT marker: %w", err)
	}
	if err := d.ack(ctx); err != nil {
		return err
	}
	d.q.releaseBody(ctx, d.Env)
	return nil
}

// Reschedule stores next (the envelope with its updated attempt metadata,
// possibly with fewer recipients) as a message schedule on lane, firing at
// at, and then acknowledges the original. The schedule is published with a
// deduplication id of envelope id, attempt and replay count, so a worker
// that crashes before the ack and a second worker that repeats the step
// store one schedule, not two. Reschedule sets next.Step. ack false leaves the original unacknowledged,
// for a caller that still has to record delivered recipients.
func (d *Delivery) Reschedule(ctx context.Context, next *Envelope, lane Lane, at time.Time, ack bool) error {
	next.Step = d.Env.Step + 1
	if d.Dropped(ctx) {
		if !ack {
			return nil
		}
		return d.ack(ctx)
	}
	if err := d.q.schedule(ctx, next, lane, at); err != nil {
		return err
	}
	if !ack {
		return nil
	}
	return d.ack(ctx)
}

func (q *Queue) schedule(ctx context.Context, next *Envelope, lane Lane, at time.Time) error {
	if lane != LaneRetry && lane != LaneRateLimit {
		return fmt.Errorf("reschedule: lane %q has no schedules", lane)
	}
	m, err := scheduleMsg(next, lane, at)
	if err != nil {
		return err
	}
	if err := retryStep(ctx, func(ctx context.Context) error { q.count(OpPublishLane); _, err := q.js.PublishMsg(ctx, m); return err }); err != nil {
		return fmt.Errorf("schedule %s on %s lane: %w", next.ID, lane, err)
	}
	// On disk before the original's ack: the ack may be lost (a
	// duplicate), the schedule must not be (a loss).
	if err := q.durable(ctx, q.lanes[lane].CachedInfo().Config.Name); err != nil {
		return fmt.Errorf("schedule %s on %s lane: %w", next.ID, lane, err)
	}
	return nil
}

// scheduleMsg encodes next as the message schedule that fires it into
// lane's due subject at at.
func scheduleMsg(next *Envelope, lane Lane, at time.Time) (*nats.Msg, error) {
	next.NotBefore = at
	m, err := next.Encode(schedSubject(lane, next.Dest, next.ID))
	if err != nil {
		return nil, err
	}
	// nats.go's WithScheduleAt truncates to whole seconds; sub-second delays
	// matter for the first retries, so the header is set by hand.
	m.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
	m.Header.Set("Nats-Schedule-Target", dueSubject(lane, next.Dest, next.ID))
	m.Header.Set(jetstream.MsgIDHeader, next.ID+"."+itoa(next.Step))
	return m, nil
}

// Hold parks an envelope whose outcome is unknown until an operator decides
// (queue replay or drop), then acknowledges the original.
func (d *Delivery) Hold(ctx context.Context, next *Envelope) error {
	next.Step = d.Env.Step + 1
	if d.Dropped(ctx) {
		return d.ack(ctx)
	}
	m, err := next.Encode(heldSubject(next.Dest, next.ID))
	if err != nil {
		return err
	}
	m.Header.Set(jetstream.MsgIDHeader, "held."+next.ID+"."+itoa(next.Step))
	if err := retryStep(ctx, func(ctx context.Context) error {
		d.q.count(OpPublishLane)
		_, err := d.q.js.PublishMsg(ctx, m)
		return err
	}); err != nil {
		return fmt.Errorf("hold %s: %w", next.ID, err)
	}
	if err := d.q.durable(ctx, StreamRetry); err != nil {
		return fmt.Errorf("hold %s: %w", next.ID, err)
	}
	return d.ack(ctx)
}

// Dead moves an envelope to dead letters with its evidence (the History it
// carries and reason), then acknowledges the original. The body is kept so
// the dead letter can be replayed.
func (d *Delivery) Dead(ctx context.Context, next *Envelope, reason string) error {
	next.Step = d.Env.Step + 1
	if d.Dropped(ctx) {
		return d.ack(ctx)
	}
	if err := d.q.putDead(ctx, next, reason); err != nil {
		return err
	}
	return d.ack(ctx)
}

func (q *Queue) putDead(ctx context.Context, e *Envelope, reason string) error {
	m, err := e.Encode(deadSubject(e.ID))
	if err != nil {
		return err
	}
	m.Header.Set("Outflow-Dead-Reason", headerSafe(shorten(reason, 500)))
	m.Header.Set("Outflow-Dead-At", time.Now().UTC().Format(time.RFC3339Nano))
	if err := retryStep(ctx, func(ctx context.Context) error { q.count(OpPublishDead); _, err := q.js.PublishMsg(ctx, m); return err }); err != nil {
		return fmt.Errorf("dead letter %s: %w", e.ID, err)
	}
	if err := q.durable(ctx, StreamDead); err != nil {
		return fmt.Errorf("dead letter %s: %w", e.ID, err)
	}
	return nil
}

// ack acknowledges and waits for the server's confirmation, so a lost ack
// cannot hand the envelope to another worker after its next state is stored.
func (d *Delivery) ack(ctx context.Context) error {
	err := retryStep(ctx, func(ctx context.Context) error {
		d.q.count(OpAck)
		err := d.msg.DoubleAck(ctx)
		if errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
			return nil // an earlier try got through; only its answer was lost
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("ack %s: %w", d.Env.ID, err)
	}
	return nil
}
