package sender

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/outflow/outflow/classify"
)

// The memory of MX addresses that could not be connected to, shared by
// every Send of the Sender, as Exim's host retry records and Postfix's
// per-address handling keep one: after a connect timeout, a refused
// connection or an unreachable host or network (never after a reply: a
// 421 greeting or a 4xx is the server talking), the address is held for
// DeadAddrHold, doubled on each failure in a row up to DeadAddrHoldMax.
// While it is held no Send dials it: each goes on to the host's next
// address or the next MX host, and a Send whose every address is held
// fails at once with a transient connect failure naming them, of the
// same event as the failure that marked them, so that the throttle's
// breaker counts it as it counted the timeout. When the hold ends, one
// Send dials the address again (a probe; the others keep skipping it
// until it ends or ConnectTimeout and a margin pass): a failure holds it
// again, for longer; a connection clears it. So a dead host shared by
// many domains costs one connect timeout per address per hold, not one
// per message, and a host whose first address is dead is reached on its
// second at once. Only MX delivery uses it: the relay is the operator's,
// and its failures must show.

// Defaults of the hold (Config.DeadAddrHold, Config.DeadAddrHoldMax).
const (
	DefaultDeadAddrHold    = time.Minute
	DefaultDeadAddrHoldMax = 5 * time.Minute
)

// deadAddrMax bounds the addresses remembered; past it the one marked
// longest ago is forgotten.
const deadAddrMax = 4096

// probeMargin is how long past ConnectTimeout a probe keeps the other
// Sends off an address whose hold ended, in case its Send never reports.
const probeMargin = 5 * time.Second

// errAddrHeld marks the failure of an MX host all of whose addresses are
// held: nothing was dialled.
var errAddrHeld = errors.New("every address is held after a recent connection failure")

// deadAddrs is the Sender's memory of addresses that failed to connect.
type deadAddrs struct {
	hold, holdMax time.Duration
	probeFor      time.Duration
	now           func() time.Time // time.Now; tests set a clock

	mu  sync.Mutex
	m   map[string]*list.Element // key → *deadAddr
	lru list.List                // front: marked last
}

// deadAddr is one held address.
type deadAddr struct {
	key        string
	addr, host string         // the address dialled, and the MX host it was dialled for
	ev         classify.Event // EventTimeout or EventConnRefused, as dial reported it
	why        string         // the dial's error
	failedAt   time.Time      // when the connection failed
	until      time.Time      // not dialled before then
	fails      int            // failed holds in a row
	probeUntil time.Time      // a Send is dialling it again, until then at most
}

// newDeadAddrs returns the memory for cfg, or nil when it is off
// (DeadAddrHold negative, or a relay).
func newDeadAddrs(cfg *Config) *deadAddrs {
	if cfg.DeadAddrHold < 0 || cfg.Relay != "" {
		return nil
	}
	return &deadAddrs{hold: cfg.DeadAddrHold, holdMax: max(cfg.DeadAddrHoldMax, cfg.DeadAddrHold),
		probeFor: cfg.ConnectTimeout + probeMargin, now: time.Now, m: map[string]*list.Element{}}
}

// deadKey is the memory's key of addr dialled from src: a destination may
// drop one source's packets and not another's.
func deadKey(src *Source, addr string) string {
	if src == nil {
		return addr
	}
	return src.Addr.String() + ">" + addr
}

// dialTicket is claim's answer for an address that may be dialled; its
// done reports how the dial went.
type dialTicket struct {
	d     *deadAddrs
	key   string
	probe bool // the Send dials an address whose hold ended
}

// claim says whether the address of key may be dialled now: held is the
// record of an address that may not (a copy), else the ticket to report
// the dial with. After a hold, the first claim gets the probe, and the
// others are held until it reports or probeFor passes.
func (d *deadAddrs) claim(key string) (dialTicket, *deadAddr) {
	if d == nil {
		return dialTicket{}, nil
	}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	el := d.m[key]
	if el == nil {
		return dialTicket{d: d, key: key}, nil
	}
	e := el.Value.(*deadAddr)
	if d.forgotten(e, now) {
		d.remove(el)
		return dialTicket{d: d, key: key}, nil
	}
	if now.Before(e.until) || now.Before(e.probeUntil) {
		held := *e
		if !now.Before(e.until) {
			held.until = e.probeUntil // another Send is dialling it
		}
		return dialTicket{}, &held
	}
	e.probeUntil = now.Add(d.probeFor)
	return dialTicket{d: d, key: key, probe: true}, nil
}

// forgotten says whether e's hold ended so long ago (DeadAddrHoldMax)
// that a new failure starts from the first hold again.
func (d *deadAddrs) forgotten(e *deadAddr, now time.Time) bool {
	return !now.Before(e.probeUntil) && now.Sub(e.until) > d.holdMax
}

func (d *deadAddrs) remove(el *list.Element) {
	delete(d.m, el.Value.(*deadAddr).key)
	d.lru.Remove(el)
}

// dialOutcome is what a dial says about its address.
type dialOutcome int

const (
	dialNeutral   dialOutcome = iota // nothing (the attempt's own time ran out, a local error, no dial)
	dialConnected                    // a TCP connection was made: whatever the server said, it is there
	dialDead                         // connect timeout, refused, unreachable
)

// dialResult reads the error of open (nil: connected) for the memory.
// ctx is the Send's: when it is over, a failed connect says nothing of
// the address.
func dialResult(ctx context.Context, err error) (dialOutcome, classify.Event) {
	if err == nil {
		return dialConnected, 0
	}
	var se *stepErr
	if !errors.As(err, &se) {
		return dialNeutral, 0
	}
	if se.in.Stage != classify.StageConnect {
		return dialConnected, 0 // connected, then failed: a greeting, EHLO, TLS …
	}
	if se.err == nil || ctxOver(ctx) {
		return dialNeutral, 0
	}
	switch {
	case se.in.Event == classify.EventTimeout, errors.Is(se.err, syscall.ETIMEDOUT):
		return dialDead, classify.EventTimeout
	case errors.Is(se.err, syscall.ECONNREFUSED), errors.Is(se.err, syscall.EHOSTUNREACH),
		errors.Is(se.err, syscall.ENETUNREACH), errors.Is(se.err, syscall.EHOSTDOWN):
		return dialDead, classify.EventConnRefused
	}
	// A local failure (no such source address, out of file
	// descriptors): not the address's doing.
	return dialNeutral, 0
}

// done reports the dial of the ticket's address. For a dead address it
// returns the record when this failure marked it (the caller logs it),
// nil when it was held already (a dial that began before another
// failed). A connection clears the record; it returns whether there was
// one.
func (tk dialTicket) done(out dialOutcome, ev classify.Event, host, addr, why string) (marked *deadAddr, cleared bool) {
	d := tk.d
	if d == nil {
		return nil, false
	}
	now := d.now()
	d.mu.Lock()
	defer d.mu.Unlock()
	el := d.m[tk.key]
	var e *deadAddr
	if el != nil {
		e = el.Value.(*deadAddr)
	}
	switch out {
	case dialConnected:
		if e != nil {
			d.remove(el)
			return nil, true
		}
	case dialNeutral:
		if e != nil && tk.probe {
			e.probeUntil = time.Time{}
		}
	case dialDead:
		if e != nil && now.Before(e.until) {
			return nil, false
		}
		if e == nil || d.forgotten(e, now) {
			if e != nil {
				d.remove(el)
			}
			e = &deadAddr{key: tk.key}
			el = d.lru.PushFront(e)
			d.m[tk.key] = el
		} else {
			d.lru.MoveToFront(el)
		}
		e.fails++
		hold := d.hold
		for i := 1; i < e.fails && hold < d.holdMax; i++ {
			hold *= 2
		}
		e.addr, e.host, e.ev, e.why = addr, host, ev, why
		e.failedAt, e.until, e.probeUntil = now, now.Add(min(hold, d.holdMax)), time.Time{}
		d.sweep(now)
		m := *e
		return &m, false
	}
	return nil, false
}

// sweep forgets, from the one marked longest ago, records whose hold
// ended long ago, and any past deadAddrMax.
func (d *deadAddrs) sweep(now time.Time) {
	for el := d.lru.Back(); el != nil; el = d.lru.Back() {
		if d.lru.Len() <= deadAddrMax && !d.forgotten(el.Value.(*deadAddr), now) {
			return
		}
		d.remove(el)
	}
}

// len is the number of addresses remembered (tests).
func (d *deadAddrs) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.m)
}

// heldError is the failure of MX host host whose every address is held:
// a connect failure of the event that marked the first, with a synthetic
// text naming each address, when it failed, why and until when it is
// held. No address was dialled.
func heldError(host string, held []deadAddr) error {
	parts := make([]string, len(held))
	first := held[0].until
	for i, h := range held {
		parts[i] = fmt.Sprintf("%s failed to connect at %s (%s), not dialled again before %s",
			h.addr, h.failedAt.UTC().Format(time.RFC3339), h.why, h.until.UTC().Format(time.RFC3339))
		if h.until.Before(first) {
			first = h.until
		}
	}
	return &stepErr{in: classify.Input{Stage: classify.StageConnect, Event: held[0].ev,
		Text: syntheticText(fmt.Sprintf("MX host %s: not connecting, every address is held after a recent connection failure: %s",
			host, strings.Join(parts, "; ")))}, err: &heldErr{until: first}}
}

// heldErr is errAddrHeld with the end of the first of the host's holds:
// when one of its addresses may be dialled again (Result.HeldUntil).
type heldErr struct{ until time.Time }

func (e *heldErr) Error() string { return errAddrHeld.Error() }
func (e *heldErr) Unwrap() error { return errAddrHeld }

// noteDial reports to the memory how the dial of addr for host went (err
// is open's), and logs an address it marks, once per hold, and one it
// finds again.
func (s *Sender) noteDial(ctx context.Context, log *msgLog, tk dialTicket, host, addr string, err error) {
	if tk.d == nil {
		return
	}
	out, ev := dialResult(ctx, err)
	why := ""
	if out == dialDead {
		why = inputOf(err).Text
		if se := (*stepErr)(nil); errors.As(err, &se) && se.err != nil {
			why = se.err.Error() // "dial tcp 192.0.2.1:25: i/o timeout"
		}
	}
	marked, cleared := tk.done(out, ev, host, addr, why)
	switch {
	case marked != nil:
		log.Warn().Str("addr", addr).Str("mx", host).Str("error", why).Int("failures", marked.fails).Time("until", marked.until).
			Msg("MX address failed to connect; no delivery dials it until then (the host's other addresses and the next MX hosts are tried)")
	case cleared:
		log.Info().Str("addr", addr).Str("mx", host).Msg("MX address held after a connection failure connects again")
	}
}
