package queue

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// eventPublisher publishes events without waiting for them, as
// jetstream.PublishMsgAsync did, and with its rules: at most
// eventMaxPending unacknowledged (a publisher that finds no room waits up
// to eventStallWait, then the event is dropped with a warning), a "no
// responders" answer (a stream without a leader for a moment) published
// again up to twice, 250 ms apart, and the pending ones forgotten when the
// connection is lost. Unlike nats.go's, it gives an acknowledgement
// eventAckTimeout, not forever. What it does not do is nats.go's work per
// acknowledgement that an event has no use for: a future, a random reply
// token and a JSON decode of every PubAck. Each event's reply subject is
// one subscription's prefix and a counter, and a PubAck is read by
// pubAckErr.
//
// A failed store (an error in the PubAck, a publish given up) is logged,
// at most one line a second with the number of events lost since the last
// line: nats.go's futures held the error where nobody read it.
type eventPublisher struct {
	nc     *nats.Conn
	log    zerolog.Logger
	prefix string
	sub    *nats.Subscription

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*pendingEvent
	room    chan struct{}   // closed when pending has room again; nil when nobody waits
	idle    []chan struct{} // closed when nothing is pending
	lost    int             // failures not yet logged
	lastLog time.Time
}

type pendingEvent struct {
	m       *nats.Msg
	retries int
	at      time.Time // last sent
	out     *outEvent // the pooled event m belongs to; nil for others
}

// outEvent is an event on its way: the message, its encoding and its
// header, and its place among the pending, taken from outEvents for each
// event and put back when the server has answered its store (handle).
// Every delivered message publishes two events; their buffers, header
// maps and pending entries were about 7 % of the bytes the pipeline
// allocated per message (docs/benchmarks.md). Only handle puts one back:
// the answer cannot come before nats.go has copied the message into its
// write buffer, so nothing reads it afterwards. An event forgotten
// otherwise (a lost connection, a publish that failed, an answer that
// never came) is left to the collector, since a retry's publish may
// still be copying it.
type outEvent struct {
	msg nats.Msg
	hdr nats.Header // {HdrEventID: ids[:]}, set as msg.Header for an event with an id
	ids [1]string
	pe  pendingEvent
}

// eventBufSize is the encoding buffer a pooled event starts with: a
// delivered event with its decision record takes about 900 bytes.
const eventBufSize = 1024

// eventBufMax is the largest buffer the pool keeps.
const eventBufMax = 16 << 10

var outEvents = sync.Pool{New: func() any {
	o := &outEvent{}
	o.hdr = nats.Header{HdrEventID: o.ids[:]}
	o.msg.Data = make([]byte, 0, eventBufSize)
	return o
}}

// newOutEvent returns a pooled event with an empty buffer and no subject,
// reply or header (release left it so).
func newOutEvent() *outEvent { return outEvents.Get().(*outEvent) }

// release empties o and puts it back for another event; a buffer grown
// past eventBufMax by an unusual event is left to the collector.
func (o *outEvent) release() {
	o.msg.Subject, o.msg.Reply, o.msg.Header, o.msg.Data = "", "", nil, o.msg.Data[:0]
	o.ids[0] = ""
	o.pe = pendingEvent{}
	if cap(o.msg.Data) > eventBufMax {
		o.msg.Data = make([]byte, 0, eventBufSize)
	}
	outEvents.Put(o)
}

const (
	eventMaxPending = 4096
	eventStallWait  = 200 * time.Millisecond
	eventRetries    = 2
	eventRetryWait  = 250 * time.Millisecond
	// eventAckTimeout: an event unacknowledged this long is counted as not
	// stored and forgotten. A request a cluster's stream leader took and
	// then died with gets no answer and no disconnect; without a limit
	// each such loss would hold one of the eventMaxPending places for
	// good.
	eventAckTimeout = 30 * time.Second
)

var errEventStalled = errors.New("too many events waiting for their acknowledgement")

func newEventPublisher(nc *nats.Conn, log zerolog.Logger) (*eventPublisher, error) {
	p := &eventPublisher{nc: nc, log: log, prefix: nc.NewInbox() + ".", pending: map[uint64]*pendingEvent{}}
	sub, err := nc.Subscribe(p.prefix+"*", p.handle)
	if err != nil {
		return nil, err
	}
	if err := sub.SetPendingLimits(-1, -1); err != nil {
		return nil, err
	}
	p.sub = sub
	go p.forget(nc.StatusChanged(nats.RECONNECTING, nats.CLOSED))
	return p, nil
}

// publish sends m with a reply subject of its own and returns; the
// acknowledgement comes to handle.
func (p *eventPublisher) publish(m *nats.Msg) error {
	return p.send(&pendingEvent{m: m})
}

// publishOut publishes a pooled event, which goes back to the pool once
// the server has answered its store.
func (p *eventPublisher) publishOut(o *outEvent) error {
	o.pe = pendingEvent{m: &o.msg, out: o}
	return p.send(&o.pe)
}

// send publishes pe.m and holds pe among the pending until its answer.
func (p *eventPublisher) send(pe *pendingEvent) error {
	m := pe.m
	p.mu.Lock()
	var timer *time.Timer
	for len(p.pending) >= eventMaxPending {
		if p.room == nil {
			p.room = make(chan struct{})
		}
		room := p.room
		p.mu.Unlock()
		if timer == nil {
			timer = time.NewTimer(eventStallWait)
			defer timer.Stop()
		}
		select {
		case <-room:
		case <-timer.C:
			return errEventStalled
		}
		p.mu.Lock()
	}
	id := p.next
	p.next++
	pe.at = time.Now()
	p.pending[id] = pe
	p.mu.Unlock()
	m.Reply = p.prefix + strconv.FormatUint(id, 36)
	if err := p.nc.PublishMsg(m); err != nil {
		p.mu.Lock()
		p.remove(id)
		p.mu.Unlock()
		return err
	}
	return nil
}

// handle reads one event's acknowledgement.
func (p *eventPublisher) handle(r *nats.Msg) {
	if len(r.Subject) <= len(p.prefix) {
		return
	}
	id, err := strconv.ParseUint(r.Subject[len(p.prefix):], 36, 64)
	if err != nil {
		return
	}
	p.mu.Lock()
	pe := p.pending[id]
	if pe == nil {
		p.mu.Unlock()
		return
	}
	err = pubAckErr(r, StreamEvents)
	if errors.Is(err, jetstream.ErrNoStreamResponse) && pe.retries < eventRetries {
		pe.retries++
		p.mu.Unlock()
		time.AfterFunc(eventRetryWait, func() { p.retry(id, pe) })
		return
	}
	if err != nil {
		// Logged before remove wakes a Flush, so what it waited for
		// is on record when it returns.
		p.failedLocked(err, pe.m.Subject, 1)
	}
	p.remove(id)
	p.mu.Unlock()
	if pe.out != nil {
		pe.out.release()
	}
}

// retry publishes a pending event again under its own reply subject.
func (p *eventPublisher) retry(id uint64, pe *pendingEvent) {
	p.mu.Lock()
	if p.pending[id] != pe {
		p.mu.Unlock()
		return // forgotten meanwhile
	}
	pe.at = time.Now()
	p.mu.Unlock()
	if err := p.nc.PublishMsg(pe.m); err != nil {
		p.mu.Lock()
		if p.pending[id] == pe {
			p.failedLocked(err, pe.m.Subject, 1)
			p.remove(id)
		}
		p.mu.Unlock()
	}
}

// remove forgets a pending event and wakes whoever waits for room or for
// nothing to be pending. mu is held.
func (p *eventPublisher) remove(id uint64) {
	delete(p.pending, id)
	p.wake()
}

// wake wakes whoever waits for room, or for nothing to be pending, if the
// wait is over. mu is held.
func (p *eventPublisher) wake() {
	if p.room != nil && len(p.pending) < eventMaxPending {
		close(p.room)
		p.room = nil
	}
	if len(p.pending) == 0 {
		for _, c := range p.idle {
			close(c)
		}
		p.idle = nil
	}
}

// failedLocked logs events that were not stored: the first at once, then
// at most a line a second with how many more. mu is held.
func (p *eventPublisher) failedLocked(err error, subject string, n int) {
	p.lost += n
	if now := time.Now(); now.Sub(p.lastLog) >= time.Second {
		p.log.Warn().Err(err).Str("subject", subject).Int("events", p.lost).Msg("events not confirmed as stored")
		p.lost, p.lastLog = 0, now
	}
}

// forget drops the pending events when the connection is lost, as
// nats.go's async publisher fails their futures (their acknowledgements
// will not come), and every eventAckTimeout/3 those waiting longer than
// eventAckTimeout. It returns when the connection is closed.
func (p *eventPublisher) forget(status <-chan nats.Status) {
	tick := time.NewTicker(eventAckTimeout / 3)
	defer tick.Stop()
	for {
		select {
		case st, ok := <-status:
			p.mu.Lock()
			if n := len(p.pending); n > 0 {
				p.failedLocked(nats.ErrDisconnected, "", n)
				for id := range p.pending {
					p.remove(id)
				}
			}
			p.mu.Unlock()
			if !ok || st == nats.CLOSED {
				return
			}
		case now := <-tick.C:
			p.expire(now)
		}
	}
}

// expire forgets the events sent before now less eventAckTimeout, as not
// stored.
func (p *eventPublisher) expire(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for id, pe := range p.pending {
		if now.Sub(pe.at) >= eventAckTimeout {
			n++
			delete(p.pending, id)
		}
	}
	if n > 0 {
		p.failedLocked(nats.ErrTimeout, "", n)
		p.wake()
	}
}

// complete returns a channel closed when no event waits for its
// acknowledgement.
func (p *eventPublisher) complete() <-chan struct{} {
	c := make(chan struct{})
	p.mu.Lock()
	if len(p.pending) == 0 {
		close(c)
	} else {
		p.idle = append(p.idle, c)
	}
	p.mu.Unlock()
	return c
}
