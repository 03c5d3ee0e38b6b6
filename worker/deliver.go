package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/unsubscribe"
)

// deliverer is one delivery goroutine of a Pool. Each has its own id,
// "<worker-id>/<n>", so that its contention offset differs from its
// siblings' and a logged decision names the exact goroutine that made it.
type deliverer struct {
	*Pool
	id string
	// stop ends when the pool stops (Run's ctx): an attempt that has not
	// begun its send by then is given back instead (stop.go). Nil in a
	// deliverer made outside Run: it never stops.
	stop context.Context
}

// probePermit stands in for a throttle permit on an operator's probe:
// the attempt was not admitted by the throttle, so its outcome is not
// reported to it either.
type probePermit struct{}

func (probePermit) Done([]classify.Result)  {}
func (probePermit) Limits() throttle.Limits { return throttle.Limits{} }

// outcome groups one attempt's recipients by what happens to them next.
type outcome struct {
	delivered []string
	bounced   []rcptResult
	again     []string // transient, throttled or unknown (retry policy)
	held      []string // unknown under the hold policy
	throttled bool     // any recipient throttled: the rest go to the rate-limit lane
	source    string   // the egress address the attempt went out from, "" for none
	unknown   bool
	// lead is the result that decides the lane and the record of the
	// recipients that stay (again, held): the throttle if any, else the
	// first of their results. A bounced recipient's result never leads.
	lead    classify.Result
	results []classify.Result
	// refused: no attempt, a refusal of the throttle's (a suspension,
	// an open breaker) holds the mail; lead says why (refused).
	refused bool
	// For delivery status notifications (dsn.go): the server that
	// answered, the body sent, the recipients a DSN-capable server took.
	host       string
	addr       string // host's ip:port (the decision record's mx_addr)
	body       []byte
	dsnRelayed map[string]bool
	passed     bool // the notices went into the submission's pass record
	// returnPath says the attempt went out with a return path instead of
	// the envelope's sender: later bounces come to outflow (later.go).
	returnPath bool
	// relayRefusal is the first result that refusesOutflow turned from
	// a bounce into a deferral, nil when none was.
	relayRefusal *rcptResult
	// admitWait is how long the attempt waited for its admission (the
	// throttle's Admit: a token, a learned rate's turn), and deliveries
	// how many times the server had handed the envelope out: the
	// decision records' admit_wait_ms and deliveries (baseRecord).
	admitWait  time.Duration
	deliveries uint64
}

type rcptResult struct {
	rcpt  string
	res   classify.Result
	stage classify.Stage // of the reply (Result.AddressGone)
}

// handle delivers one envelope and records exactly one durable outcome. An
// error means the durable step could not be written; the envelope stays
// unacknowledged and comes back.
//
// An attempt the stop catches before its send (the pool stopping, ctx
// cancelled at the end of the shutdown grace) gives the envelope back
// instead, to be handed out again at once (stop.go): whatever failed, no
// server was offered the message. Durable steps it may have begun (a move
// to the work lane, a deferral's schedule) are found by AlreadyHandled
// when the envelope comes back.
func (w *deliverer) handle(ctx context.Context, d *queue.Delivery) (err error) {
	e := d.Env
	sending := false
	defer func() {
		// Runs after the heartbeat's stop and the permit's release
		// (deferred later, so run earlier): nothing resets the ack
		// wait after the give-back.
		if err != nil && !sending && (ctx.Err() != nil || w.stopping()) {
			err = w.giveBack(d, "stopped before its send: "+err.Error())
		}
	}()
	checked := time.Now()
	done, err := d.AlreadyHandled(ctx)
	if err != nil {
		return err
	}
	if done {
		if d.Dropped(ctx) {
			// A copy the drop could not remove (a schedule firing while
			// it ran, or one fetched here already): its SENT marker.
			w.log.Info().Str("msg_id", e.ID).Int("step", e.Step).Msg("dropped by an operator; acknowledging without sending")
		} else {
			w.log.Info().Str("msg_id", e.ID).Int("step", e.Step).Msg("redelivered envelope was already handled; acknowledging")
		}
		return d.Skip(ctx)
	}
	// Keep the ack alive from here to the outcome: an admission wait for
	// a learned rate, a body fetch during a failover and the SMTP
	// conversation can each outlast the ack wait, and an envelope the
	// server hands out again meanwhile is sent by a second worker while
	// this one sends it too (the check before the send cannot see a send
	// in flight). The deferred stop matters when Send panics: a heartbeat
	// left running would keep the envelope from ever being handed out
	// again.
	stop := w.keepAlive(d)
	defer stop() // after the outcome's writes: a slow group commit is no reason to hand the envelope out again
	if d.Scheduled() {
		// A message sent later whose time has come joins its tenant's
		// fresh mail, and waits for its tenant's turn there.
		if err := d.ToWork(ctx); err != nil {
			return err
		}
		if w.droppedMeanwhile(ctx, d, "to work") {
			return nil
		}
		w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", e.Dest).Time("send_at", e.SendAt).
			Msg("scheduled message due: moved to its tenant's fresh mail")
		return nil
	}
	if d.Redelivered {
		w.redelivered(d)
	}
	now := w.now()
	dest := w.cfg.Gate.Group(e.Dest)
	// Every next state (a deferral, a dead letter) is cloned from e and
	// carries its group, for an operator to find the group's mail by.
	e.Group = ""
	if dest != e.Dest {
		e.Group = dest
	}
	// The first of the two max-age limits: the deadline, counted from
	// submission by the process that accepted the message
	// (queue.Options.DeadlineAfter). The second, Budget.MaxAge counted from the
	// first attempt, is deferRest's.
	if !e.Deadline.IsZero() && w.expiryNow(d, now).After(e.Deadline) {
		return w.dead(ctx, d, e.Clone(), dest, queue.EventExpired, "max-age: deadline "+e.Deadline.Format(time.RFC3339)+" passed", nil)
	}

	if e.ListUnsubscribe {
		// Bulk mail waits (send_at, retries) after the link went out in
		// an earlier message: a recipient who left since is not sent it.
		if gone, err := w.unsubscribed(ctx, e); err != nil {
			return err
		} else if gone {
			return d.Done(ctx)
		}
	}

	var permit throttle.Permit = probePermit{}
	var src *sender.Source // egress address; nil without [[egress]]
	// admitWait is how long the admission held the attempt back: a
	// refused envelope comes back just after its turn on a learned rate's
	// grid and waits here for the next one, up to 1/rate after the
	// next_attempt_at its refusal logged. The decision record says so
	// (admit_wait_ms), or that time is in no line.
	var admitWait time.Duration
	if e.Probe {
		w.log.Info().Str("msg_id", e.ID).Str("dest", dest).Msg("operator probe (fast-forward): bypassing the coordinator for this attempt")
		src = w.probeSource(e)
	} else {
		// An admission wait (a learned rate's grid, a connection
		// limit) ends at the stop: the envelope goes back rather than
		// wait out the grace for a send that may not finish in it.
		var refusal throttle.Refusal
		admitStart := time.Now()
		permit, refusal, src = w.admitFrom(w.admitCtx(ctx), e)
		admitWait = time.Since(admitStart)
		if permit == nil {
			if w.stopping() {
				return errStopping
			}
			return w.refused(ctx, d, dest, refusal, admitWait)
		}
	}
	// From here on the permit is given back exactly once, whatever happens:
	// with the attempt's results when it ran to the end, with none when it
	// returned early or panicked. No results is the neutral outcome: the
	// in-flight slot (and a half-open breaker's probe) is returned, but
	// neither the breaker, the adaptive rate nor an automation rule learns
	// anything. A panic is a fault of ours, not a signal from the
	// destination; counting it as a failure would let one bug open the
	// breakers of healthy destinations, and outflow's own signals never
	// feed the throttle.
	released := false
	release := func(results []classify.Result) {
		if !released {
			released = true
			permit.Done(results)
		}
	}
	defer release(nil)

	body, err := w.cfg.Queue.EnvelopeBody(ctx, e)
	if err != nil {
		release(nil)
		if errors.Is(err, queue.ErrBodyMissing) {
			// A missing body cannot heal by itself: park it with the
			// reason, once the stream's leader confirms it (a lagging
			// replica answers "not found" for a body just written).
			gone, gerr := w.cfg.Queue.BodyGone(ctx, e.BodyRef)
			if gerr != nil {
				return fmt.Errorf("body %s not found by a replica; %w", e.BodyRef, gerr)
			}
			if gone {
				return w.dead(ctx, d, e.Clone(), dest, queue.EventDead, "body missing: "+err.Error(), nil)
			}
			return fmt.Errorf("body %s not found by a replica but stored at the leader; leaving it for redelivery: %w", e.BodyRef, err)
		}
		// Anything else (a timeout during a NATS failover) is not the
		// message's fault: leave it for redelivery.
		return err
	}

	if e.ListUnsubscribe && !e.Signed {
		body = w.listUnsubscribe(e, body)
	}
	if w.cfg.Signer != nil && !e.Signed {
		if body, err = w.sign(ctx, e, body); err != nil {
			return err
		}
	}

	if time.Since(checked) > recheckAfter {
		if done, err := finishedElsewhere(ctx, d); err != nil {
			return err
		} else if done {
			release(nil)
			w.log.Info().Str("msg_id", e.ID).Int("step", e.Step).Dur("since_check", time.Since(checked)).
				Msg("another worker finished the envelope while this one waited; acknowledging without sending")
			return d.Skip(ctx)
		}
	}

	from := w.envelopeSender(e)
	msg := &sender.Message{ID: e.ID, From: from, Rcpts: e.Rcpts, Domain: e.Dest, Body: body, DSN: messageDSN(e), Source: src,
		MaxMsgsPerConn: permit.Limits().MaxMsgsPerConn}
	if w.stopping() {
		// The last moment to go back unstarted: from the send on, the
		// grace decides.
		return errStopping
	}
	sending = true
	res := w.cfg.Sender.Send(ctx, msg)
	if res.WrongFamily && src != nil {
		// Nothing left this host: the destination has no MX address of
		// src's family. That is no failure of the message or the
		// destination; the attempt goes out from the other family, if
		// the tenant has an address of it, and is not counted otherwise.
		release(nil)
		// Later attempts to the destination leave src's family out
		// (families), for about the address records' TTL.
		w.families.lack(e.Dest, src.Addr, w.now())
		admitStart := time.Now()
		next, nextSrc, refusal := w.otherFamily(ctx, e, src)
		admitWait += time.Since(admitStart)
		w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", dest).Str("source", src.String()).
			Str("next_source", nextSrc.String()).Bool("refused", refusal != nil).
			Msg("destination has no MX address of the source's family")
		if refusal != nil {
			stop()
			return w.refused(ctx, d, dest, *refusal, admitWait)
		}
		if next != nil {
			permit, released, src = next, false, nextSrc
			msg.Source, msg.MaxMsgsPerConn = src, permit.Limits().MaxMsgsPerConn
			res = w.cfg.Sender.Send(ctx, msg)
		}
	} else if src != nil && res.Unreached && ctx.Err() == nil && otherFamilyHas(res.MXFamilies, src.Addr) {
		// No MX server was reached from src: every MX address of its
		// family failed to connect (timed out, refused, unreachable),
		// or is held after such a failure, and the MX hosts have
		// addresses of the other family. As for a wrong family, the
		// same attempt goes out from an address of the other family
		// if the tenant has one: without egress addresses the sender
		// would have gone on to those addresses itself, and deferred,
		// the message waited out a backoff (or the hold) for an
		// address that one of the other family never needed. Unlike a
		// wrong family, the failure is the pair's: the throttle hears
		// it for src (its breaker counts it), as it would have without
		// the retry. When the throttle refuses the other family too, or
		// the tenant has none, the failure is the attempt's outcome.
		failed := w.outcomeOf(e, res, src)
		release(failed.results)
		admitStart := time.Now()
		next, nextSrc, refusal := w.otherFamily(ctx, e, src)
		admitWait += time.Since(admitStart)
		w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", dest).Str("source", src.String()).
			Str("next_source", nextSrc.String()).Bool("refused", refusal != nil).Str("reply", failed.lead.Text).
			Msg("no MX address of the source's family connected; the destination has addresses of the other family")
		if next != nil {
			permit, released, src = next, false, nextSrc
			msg.Source, msg.MaxMsgsPerConn = src, permit.Limits().MaxMsgsPerConn
			res = w.cfg.Sender.Send(ctx, msg)
		}
	}

	o := w.outcomeOf(e, res, src)
	o.admitWait, o.deliveries = admitWait, d.Deliveries
	if !res.HeldUntil.IsZero() && ctx.Err() == nil {
		// Nothing was dialled: every address of the destination's MX
		// hosts failed to connect lately and is held (the sender's
		// dead-address memory). The throttle hears the failure (its
		// breaker counts it, as the dial's own failure would have
		// been), but the envelope spends no attempt and comes back when
		// the first hold ends: retried on the lane's backoff, a replay
		// of dead letters after an MX was mended spent five attempts in
		// 80 s against one 4-minute hold, and its sender got a second
		// failure notice for mail that was never tried again.
		release(o.results)
		stop()
		at := res.HeldUntil
		if soon := w.now().Add(time.Second); at.Before(soon) {
			at = soon // a hold that ended meanwhile: its probe is another delivery's
		}
		return w.refused(ctx, d, dest, throttle.Refusal{Until: at, Reason: "addr-held", Detail: o.lead.Text}, admitWait)
	}
	if ctx.Err() != nil {
		// The end of the shutdown grace cut the send: our own doing, no
		// signal from the destination for the throttle.
		release(nil)
		if cutBeforeDot(e, res, o) {
			// No server took the message: back for another process at
			// once, with no attempt spent.
			stop()
			if err := w.giveBack(d, "its send cut before the final dot at the end of the shutdown grace"); err != nil {
				return err
			}
			w.stops.cutBeforeDot.Add(1)
			return nil
		}
		// The message may have been taken (a final dot without its
		// reply), or some recipients were answered: the outcome is
		// recorded as any other, a lost reply to the final dot by the
		// unknown policy, with a context the cut did not end.
		if o.unknown {
			w.stops.cutAfterDot.Add(1)
		}
		var cancel context.CancelFunc
		ctx, cancel = recordAfterCut(ctx)
		defer cancel()
	}
	if o.relayRefusal != nil {
		w.relayRefused(e, dest, res.Host, o.relayRefusal)
	}
	o.noteDSN(res, body)
	o.source = src.String()
	o.returnPath = from != e.From
	release(o.results)
	return w.record(ctx, d, dest, o, now)
}

// envelopeSender is the attempt's MAIL FROM: the tenant's return path
// (Config.ReturnPath) for an envelope of one recipient, else the
// envelope's own sender. A return path names an envelope, and the bounce
// listener takes a report to it as about the recipients the envelope was
// delivered to; shared by several, it let any of them (or anyone a copy
// is forwarded to) mail a report naming another and have that address
// suppressed and its sender told of a failure, and a forwarding mailbox's
// real report, which names the address it forwarded to, matched none of
// them. Envelopes of a tenant with a return path are split per recipient
// when they are queued (queue.Submission.PerRecipient); one with several
// recipients was queued by an intake that did not split it, or before the
// return path was turned on, and goes with its own sender, its bounces to
// the application as before.
//
// One recipient now is not enough when an earlier attempt had more (the
// others delivered or bounced since): their delivered events are the same
// envelope's, and a report to the return path could name them. The
// history shows it when the envelope was deferred with several; a first
// attempt that delivered all but one leaves no trace in the envelope, so
// such an envelope, queued before its tenant's mail was split, still gets
// a return path on its retry (docs/delivery.md, "Limits").
func (w *deliverer) envelopeSender(e *queue.Envelope) string {
	if w.cfg.ReturnPath == nil {
		return e.From
	}
	rp := w.cfg.ReturnPath.Address(e.Tenant, e.ID, e.From, time.Now())
	if rp == e.From || oneRecipient(e) {
		return rp
	}
	w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Int("rcpt_count", len(e.Rcpts)).
		Msg("envelope of several recipients sent with its own sender, not a return path: a return path names one recipient's envelope")
	return e.From
}

// oneRecipient reports whether e is an envelope of one recipient as far as
// it shows: one now, and no earlier attempt that left it more.
func oneRecipient(e *queue.Envelope) bool {
	if len(e.Rcpts) != 1 {
		return false
	}
	for _, a := range e.History {
		if a.Rcpts > 1 {
			return false
		}
	}
	return true
}

// keepAlive tells the server every progressEvery(d) that d is still being
// worked on, until the returned stop is called (any number of times).
func (w *deliverer) keepAlive(d *queue.Delivery) (stop func()) {
	every := w.progressEvery(d)
	if !d.Fetched.IsZero() && time.Since(d.Fetched) > every/2 {
		// It waited in the process before a worker took it, and the
		// server's ack wait ran meanwhile: reset it now, not at the
		// first tick.
		d.InProgress()
	}
	done := make(chan struct{})
	var once sync.Once
	go func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				d.InProgress()
				// A daemon started meanwhile may have changed the
				// consumer's ack wait.
				if e := w.progressEvery(d); e != every {
					every = e
					t.Reset(every)
				}
			}
		}
	}()
	return func() { once.Do(func() { close(done) }) }
}

// progressEvery is how often a send of d tells the server it is still
// being worked on: ProgressEvery, or a quarter of the ack wait of the
// consumer that handed d out when that is shorter. ProgressEvery follows
// this process's --ack-wait, but the server goes by the consumer's, which
// the last daemon of the fleet started set: a worker that kept to its own
// longer one let the server hand a long send out again, and it went out
// twice.
func (w *deliverer) progressEvery(d *queue.Delivery) time.Duration {
	every := w.cfg.ProgressEvery
	if aw := d.AckWait(); aw > 0 {
		every = min(every, max(aw/4, time.Millisecond))
	}
	return every
}

// recheckAfter is how long after the first AlreadyHandled check an attempt
// looks again before it sends. The time in between (an admission wait for
// the rate, a body fetch during a failover) is kept alive by the
// heartbeat, but a process stopped by SIGSTOP, a stalled VM or a lost
// connection sends none, so the server may have handed the envelope to
// another worker, which may have finished it since. A quick
// attempt skips the second look and its round trip: nobody else can have
// had the envelope within a small fraction of the ack wait.
const recheckAfter = 500 * time.Millisecond

// finishedElsewhere is AlreadyHandled asked as if d had been redelivered:
// after a long wait, any later durable step counts (another worker's SENT
// marker, but also its schedule, hold or dead letter), not only the SENT
// marker a fresh delivery is checked for.
func finishedElsewhere(ctx context.Context, d *queue.Delivery) (bool, error) {
	again := *d
	again.Redelivered = true
	return again.AlreadyHandled(ctx)
}

// sign adds the DKIM signature before the first attempt and keeps the
// signed bytes, so every retry sends exactly the same ones. e (the working
// copy every next state is cloned from) then carries the signed body
// inline, or names a signed copy stored in the Object Store.
func (w *deliverer) sign(ctx context.Context, e *queue.Envelope, body []byte) ([]byte, error) {
	signed, err := w.cfg.Signer.Sign(e.From, body)
	if err != nil {
		w.log.Warn().Err(err).Str("msg_id", e.ID).Msg("DKIM signing failed; sending unsigned")
		return body, nil
	}
	if len(signed) == len(body) {
		return body, nil // no key for this sender domain
	}
	sigLen := len(signed) - len(body)
	if e.Inline() && len(signed) <= queue.InlineSignedMax && bytes.Equal(signed[sigLen:], body) {
		// The signature is a prefix: a replay that edits headers can
		// take it off again (Envelope.Unsigned).
		e.Body, e.Signed, e.SigLen, e.Size = signed, true, sigLen, int64(len(signed))
		return signed, nil
	}
	ref := queue.SignedBodyRef(e)
	if err := w.cfg.Queue.PutBody(ctx, ref, signed); err != nil {
		return nil, err
	}
	e.BodyRef, e.Body, e.Signed, e.SigLen, e.Size = ref, nil, true, 0, int64(len(signed))
	return signed, nil
}

// listUnsubscribe puts the one-click unsubscribe fields naming the
// envelope's one recipient into body, below its trace fields (Received,
// Return-Path), unless the message has a List-Unsubscribe of its own. The
// link is the same at every attempt, so an unsigned message need not be
// stored again: the fields are added afresh to the stored original, and a
// signed one keeps them inside its signature (sign stores those bytes).
func (w *deliverer) listUnsubscribe(e *queue.Envelope, body []byte) []byte {
	if len(e.Rcpts) != 1 || unsubscribe.Has(body) {
		return body
	}
	if signsField(body, "List-Unsubscribe", "List-Unsubscribe-Post") {
		// The application's own DKIM signature says no such field is to
		// be added (it lists a field the message does not have): adding
		// it would break that signature.
		w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).
			Msg("message's own DKIM signature covers List-Unsubscribe; sent without a link")
		return body
	}
	if w.cfg.Unsubscribe == nil {
		w.noLinks.Do(func() {
			w.log.Warn().Str("msg_id", e.ID).Str("tenant", e.Tenant).
				Msg("mail asks for one-click unsubscribe links, but this process has no --unsubscribe-url; sending it without")
		})
		return body
	}
	fields := w.cfg.Unsubscribe.Header(unsubscribe.Target{Tenant: e.Tenant, Rcpt: e.Rcpts[0], ID: e.ID})
	at := afterTrace(body)
	out := make([]byte, 0, len(body)+len(fields))
	out = append(out, body[:at]...)
	out = append(out, fields...)
	return append(out, body[at:]...)
}

// unsubscribed reports whether the one recipient of a bulk envelope (one
// with an unsubscribe link) is on its tenant's suppression list now, and
// then records a suppressed event: the caller finishes the envelope
// without sending it. A failed look is an error, and the envelope comes
// back.
func (w *deliverer) unsubscribed(ctx context.Context, e *queue.Envelope) (bool, error) {
	if w.cfg.Suppressions == nil || len(e.Rcpts) != 1 {
		return false, nil
	}
	s, err := w.cfg.Suppressions.Suppressed(ctx, e.Tenant, e.Rcpts[0])
	if err != nil || s == nil {
		return false, err
	}
	reason := "on the suppression list (" + s.Source + ") since it was queued: not sent"
	w.event(queue.EventSuppressed, e, e.Attempt, e.Rcpts, reason, nil)
	w.log.Info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("rcpt", e.Rcpts[0]).Str("source", s.Source).
		Msg("bulk mail to a recipient suppressed since it was queued; not sent")
	return true, nil
}

// signsField reports whether a DKIM-Signature field in msg's header names
// one of fields in its h= tag.
func signsField(msg []byte, fields ...string) bool {
	for len(msg) > 0 {
		end := bytes.IndexByte(msg, '\n')
		if end < 0 {
			end = len(msg) - 1
		}
		line := msg[:end+1]
		if len(bytes.TrimRight(line, "\r\n")) == 0 {
			return false // the end of the header
		}
		msg = msg[end+1:]
		if !hasFieldName(line, "DKIM-Signature") {
			continue
		}
		// The field with its folded lines.
		value := line
		for len(msg) > 0 && (msg[0] == ' ' || msg[0] == '\t') {
			next := bytes.IndexByte(msg, '\n')
			if next < 0 {
				next = len(msg) - 1
			}
			value = append(value[:len(value):len(value)], msg[:next+1]...)
			msg = msg[next+1:]
		}
		_, tags, _ := bytes.Cut(value, []byte(":"))
		for tag := range bytes.SplitSeq(tags, []byte(";")) {
			name, list, ok := bytes.Cut(tag, []byte("="))
			if !ok || string(bytes.TrimSpace(name)) != "h" {
				continue
			}
			for h := range bytes.SplitSeq(list, []byte(":")) {
				h = bytes.TrimSpace(h)
				for _, f := range fields {
					if bytes.EqualFold(h, []byte(f)) {
						return true
					}
				}
			}
		}
	}
	return false
}

// afterTrace is the offset in msg just past its leading trace fields
// (Received and Return-Path, RFC 5322 3.6.7, with their folded lines):
// fields a relay adds go below the ones it found on top, in order.
func afterTrace(msg []byte) int {
	at := 0
	trace := false
	for at < len(msg) {
		end := bytes.IndexByte(msg[at:], '\n')
		if end < 0 {
			return at
		}
		line := msg[at : at+end+1]
		switch {
		case line[0] == ' ' || line[0] == '\t':
			if !trace {
				return at
			}
		case hasFieldName(line, "Received"), hasFieldName(line, "Return-Path"):
			trace = true
		default:
			return at
		}
		at += len(line)
	}
	return at
}

// hasFieldName reports whether line starts the header field name
// (case-insensitive), its colon after optional white space.
func hasFieldName(line []byte, name string) bool {
	if len(line) <= len(name) || !bytes.EqualFold(line[:len(name)], []byte(name)) {
		return false
	}
	rest := bytes.TrimLeft(line[len(name):], " \t")
	return len(rest) > 0 && rest[0] == ':'
}

// outcomeOf classifies each recipient's reply to the attempt from src (nil
// without egress addresses) and groups the recipients by what happens to
// them next.
func (w *deliverer) outcomeOf(e *queue.Envelope, res sender.Result, src *sender.Source) *outcome {
	o := &outcome{}
	byRcpt := make(map[string]classify.Input, len(res.Rcpts))
	for _, r := range res.Rcpts {
		byRcpt[r.Rcpt] = r.Outcome
	}
	for _, rcpt := range e.Rcpts {
		in, ok := byRcpt[rcpt]
		if !ok {
			// The sender reported nothing for this recipient: treat it as
			// an unanswered attempt, never as delivered.
			in = classify.Input{Stage: classify.StageUnknown, Event: classify.EventConnLost}
		}
		r := w.cfg.Classifier.Classify(in)
		if r.Class == classify.Permanent && w.refusesOutflow(in, r) {
			// The smarthost refused outflow itself (our credentials, our
			// address, the relay account), not this message: every
			// message of every tenant would get the same answer, and
			// bouncing them all loses the queue to one configuration
			// problem. Defer rather than bounce (as Postfix's
			// smtp_sasl_auth_soft_bounce does for AUTH); the attempt
			// budget still ends in dead letters, and relayRefused says
			// so at error level. The sender holds an AUTH refusal for a
			// while, so waiting mail costs no logins.
			r.Class, r.Rule = classify.Transient, r.Rule+"/soft-bounce"
			if o.relayRefusal == nil {
				o.relayRefusal = &rcptResult{rcpt, r, in.Stage}
			}
		}
		if r.Class == classify.Permanent && r.Scope == classify.ScopeSource && w.hasOtherSource(e, src, res.MXFamilies) {
			// The receiver refused the address the attempt went out
			// from (a blocklist, its reverse DNS), not the message:
			// the throttle suspends that (destination, source) pair
			// (throttle/sourceblock.go), and the retry goes out from
			// another of the tenant's addresses. Bounced, the message
			// would be lost to a block on one address of several.
			r.Class, r.Rule = classify.Transient, r.Rule+"/other-source"
		}
		o.results = append(o.results, r)
		switch r.Class {
		case classify.Delivered:
			o.delivered = append(o.delivered, rcpt)
			continue
		case classify.Permanent:
			// Not a candidate for lead: a bounced recipient's reply must
			// not describe the deferral of the others.
			o.bounced = append(o.bounced, rcptResult{rcpt, r, in.Stage})
			continue
		case classify.Unknown:
			o.unknown = true
			if w.cfg.Unknown == UnknownHold {
				o.held = append(o.held, rcpt)
			} else {
				o.again = append(o.again, rcpt)
			}
		case classify.Throttled:
			o.throttled = true
			o.again = append(o.again, rcpt)
		default:
			o.again = append(o.again, rcpt)
		}
		if o.lead.Class == 0 || r.Class == classify.Throttled && o.lead.Class != classify.Throttled {
			o.lead = r
		}
	}
	return o
}

// sourceBlocks is what hasOtherSource asks of a Gate that keeps
// suspensions (the throttle's).
type sourceBlocks interface {
	SourceBlocked(domain, source string) bool
}

// hasOtherSource reports whether e's tenant has an egress address besides
// src that its destination may take mail from: one of a family the
// destination has MX addresses of, and not refused by it as blocked too
// (a whole range is often listed; another suspension, an automation
// rule's or an operator's, ends, and the message waits for it). With
// none, a block of src bounces the message, as with one address:
// deferred, it would go from blocked address to suspension until max-age.
//
// The families are those the attempt found (fams, the sender's lookup of
// every MX host of the destination), and those an earlier attempt's miss
// taught (families). A miss alone would not do: an attempt that drew the
// address of the family the destination has, before any drew the other,
// knows nothing of the other yet, and a block of its only reachable
// address would defer the message for source-block-hold, to be refused
// again by the same address.
func (w *deliverer) hasOtherSource(e *queue.Envelope, src *sender.Source, fams sender.Families) bool {
	if src == nil {
		return false
	}
	pool := w.cfg.Egress.Pool(e.Tenant)
	if len(pool) < 2 {
		return false
	}
	blocks, _ := w.cfg.Gate.(sourceBlocks)
	for _, s := range pool {
		if s.Addr == src.Addr || fams.Lacks(s.Addr) || w.families.lacks(e.Dest, s.Addr, w.now()) {
			continue
		}
		if blocks != nil && blocks.SourceBlocked(e.Dest, s.String()) {
			continue
		}
		return true
	}
	return false
}

// refusesOutflow reports whether a permanent result refuses outflow
// itself (its connection, credentials or relay account) rather than the
// message or a recipient, so that bouncing would be wrong: every message
// would get the same answer until a person fixes it.
//
// A 5xx to AUTH always does: only a smarthost is sent AUTH. Through a
// relay (Config.Relay) so does
//   - a 5xx before MAIL (a lookup of the relay's name, the connection,
//     the greeting, EHLO/HELO, STARTTLS): nothing of the message has been
//     said yet ("554 5.7.1 Client host rejected: access denied" when the
//     relay's allowlist lost our address). Postfix defers a 5xx greeting
//     too (smtp_skip_5xx_greeting);
//   - a refusal the classifier scopes to the tenant: the relay account or
//     the sender identity at it ("421 4.7.0 Your account has been
//     suspended", relay-account-state; an RFC 4954 code), at any stage;
//   - a MAIL refused because the relay wants an AUTH outflow did not give
//     (no relay user configured): 530-538, or a 5.7.x that names
//     authentication, like go-smtp's "502 5.7.0 Please authenticate
//     first", which the enhanced code's rule scopes to the message;
//   - a MAIL or RCPT refused as relaying ("554 5.7.1 <r@x>: Relay access
//     denied", deniesRelaying): the relay does not relay for outflow, or
//     not to that domain, and either is its configuration's to mend.
//
// Refusals of one recipient or of this message (550 5.1.1 at RCPT, 552
// too big, 554 5.7.1 spam at the final dot) still bounce. Direct MX
// delivery keeps every permanent result: a domain whose every MX host
// greets with 5xx refuses that destination's mail (the sender has tried
// its other hosts), and one broken destination cannot hold the rest.
func (w *deliverer) refusesOutflow(in classify.Input, r classify.Result) bool {
	if in.Stage == classify.StageAuth {
		return true
	}
	if w.cfg.Relay == "" {
		return false
	}
	switch in.Stage {
	case classify.StageDNS, classify.StageConnect, classify.StageGreeting, classify.StageEHLO, classify.StageTLS:
		return true
	case classify.StageMail:
		if r.Code >= 530 && r.Code <= 538 ||
			strings.HasPrefix(r.Enhanced, "5.7.") && strings.Contains(strings.ToLower(r.Text), "authenticat") {
			return true
		}
	}
	if in.Stage == classify.StageMail || in.Stage == classify.StageRcpt {
		if deniesRelaying(in.Text) {
			return true
		}
	}
	// relay-account-state by name too: an operator's rule of that name
	// replaces the embedded one and may not say its scope.
	return r.Scope == classify.ScopeTenant || r.Rule == "relay-account-state"
}

// relayDenials are the phrasings of a relay that does not relay for its
// client, lower-cased: Postfix's and Sendmail's "Relay access denied",
// Yahoo's "relaying denied", Exchange Online's "Unable to relay".
var relayDenials = []string{"relay access denied", "relaying denied", "relay denied",
	"relay not permitted", "relaying not permitted", "relaying not allowed",
	"not permitted to relay", "unable to relay", "we do not relay", "relay prohibited"}

// deniesRelaying reports whether a reply refuses to relay. From a
// smarthost it refuses outflow, not the recipient: the relay does not
// count outflow among its clients (a lost login, an address no longer
// allowed) or does not relay to that domain, and either is the
// operator's to fix, for every message alike.
func deniesRelaying(text string) bool {
	t := strings.ToLower(text)
	for _, p := range relayDenials {
		if strings.Contains(t, p) {
			return true
		}
	}
	return false
}

// relayRefused tells the operator, at error level, that mail through the
// relay is being deferred because the relay refuses outflow itself: the
// deferrals' decision lines alone read like any retry, and the messages
// spend their attempt budget until a person acts. One line a minute per
// process at most (relayAlarm), each with how many refusals it stands
// for; the decision lines still say it of every message (rule
// ".../soft-bounce").
func (w *deliverer) relayRefused(e *queue.Envelope, dest, relay string, rr *rcptResult) {
	n, ok := w.relayAlarm.note(time.Now())
	if !ok {
		return
	}
	if relay == "" {
		relay = w.cfg.Relay
	}
	r := rr.res
	w.log.Error().Str("relay", relay).Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", dest).
		Str("stage", rr.stage.String()).Str("scope", r.Scope.String()).Str("rule", r.Rule).Int("code", r.Code).
		Str("enhanced_code", r.Enhanced).Str("reply", oneLine(r.Text)).Int("refusals", n).
		Msg("the relay refuses outflow itself (connection, credentials or account), not the message: mail deferred instead of bounced until this is fixed, and sent to dead letters when its budget (max-attempts, max-age) ends")
}

// relayAlarm paces relayRefused's lines. A relay that refuses outflow
// refuses every attempt alike: a queue of a hundred thousand messages
// would write as many error lines, and the first of them says it all.
type relayAlarm struct {
	mu     sync.Mutex
	last   time.Time
	unsaid int // refusals since the last line
}

// relayAlarmEvery is how often relayRefused may write a line.
const relayAlarmEvery = time.Minute

// note counts one refusal and says whether to write a line now, and for
// how many refusals (this one and those not written since the last).
func (a *relayAlarm) note(now time.Time) (int, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.unsaid++
	if !a.last.IsZero() && now.Sub(a.last) < relayAlarmEvery {
		return 0, false
	}
	n := a.unsaid
	a.last, a.unsaid = now, 0
	return n, true
}

// record writes the durable outcome of one attempt. Order matters: the next
// state (schedule, hold, dead letter, bounce event) is stored before the
// SENT marker, and the acknowledgement comes last, so a crash at any point
// leaves either the original (redelivered and recognised by
// AlreadyHandled) or the next state, never neither.
func (w *deliverer) record(ctx context.Context, d *queue.Delivery, dest string, o *outcome, started time.Time) error {
	e := d.Env
	lane := string(d.Lane)
	now := w.now()

	for _, b := range o.bounced {
		w.cfg.Metrics.attempt("permanent", lane, dest)
		rec := w.baseRecord(e, dest, o, b.res)
		w.logRecord(rec, "bounced", []string{b.rcpt})
		w.event(queue.EventBounced, e, e.Attempt+1, []string{b.rcpt}, b.res.Text, &rec)
		w.suppressBounce(ctx, e, b)
	}
	if err := w.attemptNotices(ctx, e, o); err != nil {
		return err
	}
	w.cfg.Metrics.bounced(len(o.bounced))
	if o.unknown {
		w.cfg.Metrics.unknown()
	}

	remaining := len(o.again) + len(o.held)
	// acked is set when the next state's own step acknowledged the original
	// (Hold and Dead do); nothing may acknowledge it twice.
	acked := false
	if remaining > 0 {
		next := e.Clone()
		next.Attempt = e.Attempt + 1
		if next.FirstAttempt.IsZero() {
			next.FirstAttempt = w.serverTime(started) // on the clock expiryNow compares it with
		}
		next.LastClass = o.lead.Class.String()
		next.LastReply = replyLine(o.lead)
		if len(o.held) > 0 {
			next.Rcpts = append(append([]string(nil), o.held...), o.again...)
			w.cfg.Metrics.attempt("unknown", lane, dest)
			rec := w.baseRecord(e, dest, o, o.lead)
			w.logRecord(rec, "held for an operator (unknown-policy hold)", next.Rcpts)
			next.AddAttempt(attemptOf(rec, now, len(next.Rcpts)))
			if err := d.Hold(ctx, next); err != nil {
				return err
			}
			acked = true
			w.event(queue.EventHeld, e, next.Attempt, next.Rcpts, w.attemptReason(ctx, d, "held", o.lead.Text), &rec)
		} else {
			next.Rcpts = o.again
			var err error
			if acked, err = w.deferRest(ctx, d, next, dest, o); err != nil {
				return err
			}
		}
	}

	if remaining == 0 {
		w.endDelay(ctx, e)
	}
	if len(o.delivered) > 0 {
		w.cfg.Metrics.attempt("delivered", lane, dest)
		w.cfg.Metrics.delivered(len(o.delivered), e.ReadyAt())
		rec := w.baseRecord(e, dest, o, classify.Result{Class: classify.Delivered, Rule: "delivered"})
		if r := firstDelivered(o); r != nil {
			rec = w.baseRecord(e, dest, o, *r)
		}
		w.logRecord(rec, "delivered", o.delivered)
		if err := w.successNotice(ctx, e, o); err != nil {
			return err
		}
		if err := d.Delivered(ctx, o.delivered, remaining == 0); err != nil {
			return err
		}
		w.eventNotify(queue.EventDelivered, e, e.Attempt+1, o.delivered, "", &rec, w.laterNotify(e, o))
		if remaining > 0 && !acked {
			return d.Skip(ctx)
		}
		return nil
	}
	if remaining > 0 {
		if acked {
			return nil
		}
		return d.Skip(ctx)
	}
	// Every recipient bounced.
	return d.Done(ctx)
}

// deferRest schedules the remaining recipients on the retry or rate-limit lane,
// or sends them to dead letters when the budget is spent. A schedule does
// not acknowledge the original (record does that last); a dead letter
// does, and acked says so.
func (w *deliverer) deferRest(ctx context.Context, d *queue.Delivery, next *queue.Envelope, dest string, o *outcome) (acked bool, err error) {
	e := d.Env
	now := w.now()
	lane, bo, evType, class := queue.LaneRetry, w.cfg.Retry, queue.EventDeferred, o.lead.Class.String()
	if o.throttled {
		lane, bo, evType = queue.LaneRateLimit, w.cfg.RateLimit, queue.EventThrottled
		next.ThrottleCount = e.ThrottleCount + 1
		w.cfg.Metrics.throttled(dest)
	}
	w.cfg.Metrics.attempt(class, string(d.Lane), dest)
	// The attempt budget: Budget.MaxAttempts, and Budget.MaxAge counted
	// from the first attempt (the deadline from submission was handle's).
	if over, why := w.cfg.Budget.Exhausted(next.Spent(), next.FirstAttempt, w.expiryNow(d, now)); over {
		rec := w.baseRecord(e, dest, o, o.lead)
		next.AddAttempt(attemptOf(rec, now, len(next.Rcpts)))
		ev := queue.EventDead
		if why == "max-age" {
			ev = queue.EventExpired
		}
		// The last attempt is a decision like the others: its line and
		// its event carry the reply, the rule and the worker that made it.
		w.logRecord(rec, ev, next.Rcpts)
		return true, w.dead(ctx, d, next, dest, ev, why+": "+replyLine(o.lead), &rec)
	}
	// The retry number is the exponent: the first retry after the first
	// failure is 1. Throttled attempts use the rate-limit lane's own count.
	retryN := next.Spent()
	if o.throttled {
		retryN = next.ThrottleCount
	}
	seed := backoff.NewSeed()
	dec := bo.Decide(retryN, w.id, seed, o.lead.RetryAfter)
	at := dec.At(now)
	var pacedBy string
	if o.throttled {
		if pat, by, ok := w.pace(e, o.source, now, &dec); ok {
			at, pacedBy = pat, by
		}
	}
	if end := w.expiresAt(next); !end.IsZero() && at.After(end) {
		// A draw, a server's hint (up to days) or a pace past the
		// message's end: the attempt comes at the end, where the
		// message expires with its notice, not when the wait was over.
		ms := max(0, (end.Sub(now) + time.Millisecond - 1).Milliseconds())
		dec.DelayMs, dec.Delay = ms, time.Duration(ms)*time.Millisecond
		at, pacedBy = now.Add(dec.Delay), "deadline"
	}
	rec := w.baseRecord(e, dest, o, o.lead)
	rec.Lane = string(lane)
	rec.Attempt = next.Attempt
	rec.Decision = dec
	rec.PacedBy = pacedBy
	rec.NextAttemptAt = at
	w.logRecord(rec, "deferred", next.Rcpts)
	w.cfg.Metrics.retryDelay(string(lane), dec.Delay)
	w.cfg.Metrics.deferredTo(string(lane), e.ReadyAt())
	next.AddAttempt(attemptOf(rec, now, len(next.Rcpts)))
	if err := w.delayNotice(ctx, e, next, o); err != nil {
		return false, err
	}
	if err := d.Reschedule(ctx, next, lane, w.serverTime(at), false); err != nil {
		return false, err
	}
	w.event(evType, e, next.Attempt, next.Rcpts, w.attemptReason(ctx, d, "deferred", o.lead.Text), &rec)
	return false, nil
}

// expiresAt is when e's age ends, a moment past which its next pickup
// moves it to dead letters as expired: the earlier of its deadline from
// submission and Budget.MaxAge from its first attempt; zero for neither.
// A retry is never scheduled after it (deferRest; a refusal, after the
// deadline): scheduled at a server's hint of days, or at a suspension's
// end, the message stayed deferred past the Will-Retry-Until its delay
// notice gave, and its failure notice came that much later.
func (w *deliverer) expiresAt(e *queue.Envelope) time.Time {
	end := e.Deadline
	if ma := w.cfg.Budget.MaxAge; ma > 0 && !e.FirstAttempt.IsZero() {
		if byAge := e.FirstAttempt.Add(ma); end.IsZero() || byAge.Before(end) {
			end = byAge
		}
	}
	if end.IsZero() {
		return end
	}
	return end.Add(expirySlack)
}

// expirySlack puts a retry capped at a message's end just past it, so
// the pickup finds it expired.
const expirySlack = 100 * time.Millisecond

// idleCloser is a Sender that can close its idle pooled connections to a
// destination's hosts (*sender.Sender.CloseIdle).
type idleCloser interface {
	CloseIdle(domain string) int
}

// refused handles a throttle refusal: no attempt was made, so neither
// the attempt count nor the budget changes; the envelope waits in the lane
// it came from (fresh mail in the retry lane) until the refusal ends. A
// "conns" refusal closes the Sender's idle connections to the
// destination's hosts (idleCloser).
func (w *deliverer) refused(ctx context.Context, d *queue.Delivery, dest string, r throttle.Refusal, waited time.Duration) error {
	e := d.Env
	lane := d.Lane
	if lane == queue.LaneWork {
		lane = queue.LaneRetry
	}
	at := r.Until
	if at.IsZero() {
		at = w.now().Add(time.Second)
	}
	if !e.Deadline.IsZero() && at.After(e.Deadline.Add(expirySlack)) {
		// A suspension past the message's deadline: it expires then,
		// at its pickup. (Not Budget.MaxAge's end, which only an
		// attempt's outcome checks: refused again there, the envelope
		// would come straight back.)
		at = e.Deadline.Add(expirySlack)
	}
	w.cfg.Metrics.refusal(r.Reason)
	closed := 0
	if ic, ok := w.cfg.Sender.(idleCloser); ok && r.Reason == "conns" {
		// This worker's deliveries in flight to the destination are at
		// or over its share of the connection limit (none, when its
		// share is none): an idle pooled connection to its hosts is
		// surplus, and holds one of the provider's slots that the worker
		// with the share needs, until its idle timeout.
		closed = ic.CloseIdle(e.Dest)
	}
	// The keys of the decision lines, with their meanings: worker_id is
	// this deliverer's, rcpts the recipients, next_attempt_at in UTC with
	// nanoseconds. No attempt was made, so there is no attempt number:
	// attempts_made counts the ones before (attempt, on a decision line,
	// is that attempt's own number, attempts_made + 1).
	ev := w.info().Strs("rcpts", e.Rcpts).Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", dest).
		Int("attempts_made", e.Attempt).Str("class", "local").Str("rule", "local-"+r.Reason).Str("lane", string(lane))
	if closed > 0 {
		ev = ev.Int("idle_closed", closed)
	}
	if r.Detail != "" {
		ev = ev.Str("detail", r.Detail)
	}
	if ms := waited.Milliseconds(); ms > 0 {
		ev = ev.Int64("admit_wait_ms", ms)
	}
	if d.Deliveries > 1 {
		ev = ev.Uint64("deliveries", d.Deliveries)
	}
	ev.Str("next_attempt_at", at.UTC().Format(time.RFC3339Nano)).Msg("coordinator refused; deferred without an attempt")
	if longRefusal(r.Reason) {
		if err := w.passDeferred(ctx, e); err != nil {
			return err
		}
	}
	w.cfg.Metrics.deferredTo(string(lane), e.ReadyAt())
	next := e.Clone()
	suspended := r.Reason == "suspended" && r.Detail != ""
	switch {
	case suspended && e.Attempt == 0:
		// Not tried yet: `queue list` and the console say why it waits
		// (a source blocked at another domain of the same address, an
		// operator's suspension), where they showed a deferral with no
		// reply at all. A tried message keeps its last reply.
		next.LastClass, next.LastReply = "local", "suspended: "+r.Public()
	case !suspended && e.Attempt == 0 && strings.HasPrefix(e.LastReply, "suspended: "):
		// The suspension has ended: it no longer says why the message
		// waits (a turn at the rate, a connection slot).
		next.LastClass, next.LastReply = "", ""
	}
	if longRefusal(r.Reason) {
		// Held past dsn-delay-warning by a suspension or an open
		// breaker, the sender hears of it as of mail an attempt left
		// deferred: nothing said so, and the first notice was the
		// failure at the deadline.
		o := &outcome{refused: true, lead: classify.Result{Class: classify.Transient, Text: "outflow: " + refusalWhy(r)}}
		if err := w.delayNotice(ctx, e, next, o); err != nil {
			return err
		}
	}
	if err := d.Reschedule(ctx, next, lane, w.serverTime(at), true); err != nil {
		return err
	}
	if suspended && !w.droppedMeanwhile(ctx, d, "deferred") {
		// The application hears that its mail waits, and why, as it
		// does of a deferral after an attempt: once per refusal, which
		// a suspension gives at most hourly (the throttle's
		// maxSuspendRefusal). Other refusals come back within seconds
		// and say nothing about the mail.
		w.event(queue.EventDeferred, e, e.Attempt, e.Rcpts, "suspended: "+r.Public(), nil)
	}
	return nil
}

// refusalWhy says why a refusal holds mail, for a delay notice.
func refusalWhy(r throttle.Refusal) string {
	switch {
	case r.Reason == "suspended" && r.Detail != "":
		return "delivery to the destination is suspended: " + r.Public()
	case r.Reason == "suspended":
		return "delivery to the destination is suspended"
	}
	return "the destination's last attempts failed; delivery resumes once it answers again (" + r.Reason + ")"
}

// longRefusal says whether a refusal's reason keeps an envelope from its
// destination for longer than a moment: a suspension or an open breaker,
// which end its share of the message's first pass (passDeferred) so that
// its siblings' notice is not held. A turn at the rate, a connection slot
// or the first-contact window comes back within seconds, as in a fleet
// splitting `learn-initial` most parts' first admissions do: ending the
// pass there sent a sender one notice per domain instead of one. A long
// wait at the rate is the pass deadline's (`dsn-pass-timeout`).
func longRefusal(reason string) bool {
	switch reason {
	case "suspended", "breaker-open", "breaker-half-open", "addr-held":
		return true
	}
	return false
}

// dead moves the envelope to dead letters with its evidence and reason;
// rec is the decision record of the attempt that spent the budget, nil
// when no attempt was made (a deadline passed while waiting, a body lost).
func (w *deliverer) dead(ctx context.Context, d *queue.Delivery, next *queue.Envelope, dest, evType, reason string, rec *backoff.Record) error {
	e := d.Env
	// attempts_made, not attempt: no attempt is made now when the
	// deadline passed or the body is gone, and after the last attempt
	// its decision line gave its number.
	w.log.Warn().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", dest).Int("attempts_made", next.Attempt).
		Str("reason", reason).Msg("moved to dead letters")
	if err := w.deadNotice(ctx, e, next, reason); err != nil {
		return err
	}
	w.endDelay(ctx, e)
	if err := d.Dead(ctx, next, reason); err != nil {
		return err
	}
	if w.droppedMeanwhile(ctx, d, "dead") {
		if rec != nil {
			// The attempt's evidence, as attemptReason keeps it.
			w.event(evType, e, next.Attempt, next.Rcpts, reason+droppedNote("dead"), rec)
		}
		return nil
	}
	w.cfg.Metrics.deadLetter()
	w.event(evType, e, next.Attempt, next.Rcpts, reason, rec)
	return nil
}

// attemptReason is the reason of the event that records an attempt's
// outcome and the step it leads to (held, deferred): reason, or, when the
// message was dropped while the attempt ran, reason saying that step was
// not written. The event is written either way: it is the only record of
// the attempt, whose server may have taken the message (an unknown
// outcome after the final dot), and without it the history said only
// queued and dropped. A held, deferred, throttled, dead or expired event
// after a dropped one leaves the message dropped (the API's state, the
// console's).
func (w *deliverer) attemptReason(ctx context.Context, d *queue.Delivery, step, reason string) string {
	if w.droppedMeanwhile(ctx, d, step) {
		return reason + droppedNote(step)
	}
	return reason
}

func droppedNote(step string) string {
	return " (dropped while this attempt ran: not " + step + ")"
}

// droppedMeanwhile reports whether d was dropped (queue drop, the API's
// DELETE) while this worker held it, in which case its next step was not
// written (queue.Delivery.Dropped); the line logged here says what became
// of it.
func (w *deliverer) droppedMeanwhile(ctx context.Context, d *queue.Delivery, step string) bool {
	if !d.Dropped(ctx) {
		return false
	}
	w.log.Info().Str("msg_id", d.Env.ID).Str("tenant", d.Env.Tenant).Str("dest", d.Env.Dest).Str("instead_of", step).
		Msg("dropped while being delivered; its next step not written")
	return true
}

// baseRecord is the decision record of the attempt o is the outcome of,
// for result r: attempt is this attempt's number (e.Attempt+1), worker_id
// this deliverer's own.
func (w *deliverer) baseRecord(e *queue.Envelope, dest string, o *outcome, r classify.Result) backoff.Record {
	return backoff.Record{
		MsgID: e.ID, Tenant: e.Tenant, Dest: dest, Attempt: e.Attempt + 1, WorkerID: w.id,
		Class: r.Class.String(), Rule: r.Rule, Code: r.Code, EnhancedCode: r.Enhanced, Reply: r.Text,
		AdmitWaitMs: o.admitWait.Milliseconds(), Deliveries: o.deliveries,
		MX: o.host, MXAddr: o.addr, Source: o.source,
	}
}

// info starts an Info line about one envelope's attempt (or the lack of
// one) with this deliverer's own worker_id, "<worker-id>/<n>", as the
// decision lines have it; w.log's is the process's.
func (w *deliverer) info() *zerolog.Event {
	return w.cfg.Logger.Info().Str("worker_id", w.id)
}

// redelivered says, for an envelope the server handed out again that no
// earlier holder finished (AlreadyHandled found no next step), that the
// earlier holder's attempt, if it began one, may have reached the server:
// a process killed while it waited for the reply to the final dot leaves
// nothing else in the log, and the attempt made now counts as the same
// one (its decision line has the same attempt number, and deliveries).
// The holder may also have stalled past the ack wait, or given the
// envelope back unsent (the stop, a busy process): deliveries counts
// those hand-outs too, so the line says "may".
func (w *deliverer) redelivered(d *queue.Delivery) {
	e := d.Env
	w.info().Str("msg_id", e.ID).Str("tenant", e.Tenant).Str("dest", e.Dest).Int("attempts_made", e.Attempt).
		Uint64("deliveries", d.Deliveries).Str("lane", string(d.Lane)).Int("step", e.Step).Strs("rcpts", e.Rcpts).
		Msg("redelivered: an earlier holder did not finish its attempt; if it had begun its send, that attempt may have reached the server (a possible duplicate)")
}

// logRecord writes the decision line. Decision lines are never sampled.
func (w *deliverer) logRecord(rec backoff.Record, msg string, rcpts []string) {
	rec.LogOutcome(w.cfg.Logger, msg, rcpts)
}

func attemptOf(rec backoff.Record, at time.Time, rcpts int) queue.Attempt {
	a := queue.Attempt{At: at.UTC(), Attempt: rec.Attempt, Worker: rec.WorkerID, Class: rec.Class, Rule: rec.Rule,
		Code: rec.Code, Enhanced: rec.EnhancedCode, Reply: rec.Reply, Lane: rec.Lane, DelayMs: rec.DelayMs, Rcpts: rcpts}
	if rec.JitterSeed != 0 {
		a.JitterSeed = strconv.FormatUint(rec.JitterSeed, 10)
	}
	return a
}

func firstDelivered(o *outcome) *classify.Result {
	for i := range o.results {
		if o.results[i].Class == classify.Delivered {
			return &o.results[i]
		}
	}
	return nil
}

func replyLine(r classify.Result) string {
	s := oneLine(r.Text)
	if r.Enhanced != "" {
		s = r.Enhanced + " " + s
	}
	if r.Code != 0 {
		s = strconv.Itoa(r.Code) + " " + s
	}
	return s
}

// event publishes one of e's outcomes: typ, for rcpts, at attempt, with
// the reply or reason and, when rec is not nil, the decision record.
func (w *deliverer) event(typ string, e *queue.Envelope, attempt int, rcpts []string, reason string, rec *backoff.Record) {
	w.eventNotify(typ, e, attempt, rcpts, reason, rec, nil)
}

// eventNotify is event with the delivered event's Notify (later.go).
func (w *deliverer) eventNotify(typ string, e *queue.Envelope, attempt int, rcpts []string, reason string, rec *backoff.Record, n *queue.Notify) {
	ev := &queue.Event{ID: e.ID, MsgID: e.MsgID, Tenant: e.Tenant, Dest: e.Dest, Attempt: attempt,
		Worker: w.id, Recipients: rcpts, Reason: reason, Notify: n}
	if rec == nil {
		w.cfg.Queue.Event(typ, ev)
		return
	}
	// The record is encoded into a pooled buffer: Queue.Event copies it
	// into the event's own encoding before it returns.
	bp := recordBufs.Get().(*[]byte)
	b, ok := rec.AppendJSON((*bp)[:0])
	if ok {
		ev.Decision, ev.DecisionMarshaled = b, true
	} else {
		ev.Decision, ev.DecisionMarshaled = recordJSON(*rec)
	}
	w.cfg.Queue.Event(typ, ev)
	if cap(b) <= recordBufMax {
		*bp = b[:0]
		recordBufs.Put(bp)
	}
}

// recordBufs holds the buffers decision records are encoded into for
// their events: every delivery's event carries one, about 800 bytes.
var recordBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// recordBufMax is the largest record buffer the pool keeps.
const recordBufMax = 16 << 10

// recordJSON encodes a decision record for its event; a record that cannot
// be encoded becomes an object naming the error, so the event still goes
// out. marshaled says the record was encoded (json.Marshal's bytes, which
// the event encoder copies without checking them again). MarshalJSON is
// called directly: through json.Marshal its output would be parsed once
// more.
func recordJSON(rec backoff.Record) (_ json.RawMessage, marshaled bool) {
	b, err := rec.MarshalJSON()
	if err != nil {
		return json.RawMessage(fmt.Sprintf("{%q:%q}", "error", err.Error())), false
	}
	return b, true
}
