package worker

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
)

// A graceful stop hands back what this process holds and has not sent, so
// that mail moves on at once, as Postfix and KumoMTA release their
// in-memory queue when they stop. Before, an envelope fetched and not yet
// started, or one whose send the end of the shutdown grace cut, stayed
// pending at the server until the ack wait (a minute by default) ran
// out: after every restart, mail sat as "queued, attempt 0" for a minute
// with nothing said. Now only a killed process's envelopes wait for it.
//
// What the stop catches, and what becomes of it:
//
//   - fetched and not yet taken by a worker: the pull gives it back
//     (queue's fetchOnce, Delivery.GiveBack);
//   - taken by a worker as the pool stopped, or taken and not yet sent
//     (an admission wait, which the stop ends; a body fetch): the worker
//     gives it back;
//   - sent, and cut by the end of the grace before the final dot: no
//     server took the message, so it goes back too, no attempt spent;
//   - cut after the final dot (the reply to it lost), or after a server
//     answered some recipients: the outcome is recorded as any other,
//     with a context the cut did not end. A lost reply to the final dot
//     is the unknown outcome, which the unknown policy decides (a retry
//     after the backoff, or a hold), never an immediate send again.
//
// An envelope is given back by whoever holds it: the pull until it hands
// the envelope to a worker over the lane's channel, the worker after.
// The hand-over is one channel operation, so no envelope is both given
// back and started.

// errStopping ends an attempt the pool's stop caught before its send;
// handle gives the envelope back.
var errStopping = errors.New("the workers are stopping")

// errGraceEnded is the cause of the cancellation at the end of the
// shutdown grace: the text of a reply the cut loses names it.
var errGraceEnded = errors.New("outflow stopping: the shutdown grace ended")

// recordAfterCutWait bounds the durable steps of an attempt cut after its
// final dot (or the give-back of one cut before it: queue.GiveBackWait). serve
// waits the grace and 10 s more for the workers before it closes the
// connection; this and holdingWait together stay within that.
const recordAfterCutWait = 5 * time.Second

// holdingWait bounds Run's wait for the pulls' give-backs. They begin as
// the stop comes, all at once, and each waits for the server's answer at
// most as long as this (queue.GiveBackWait), so they are over by the
// time the deliverers are, but for a server that does not answer.
const holdingWait = 5 * time.Second

// stopCounts counts what the deliverers did with envelopes the stop
// caught.
type stopCounts struct {
	givenBack    atomic.Int64 // given back unsent (any reason)
	cutBeforeDot atomic.Int64 // of which, a send cut before the final dot
	cutAfterDot  atomic.Int64 // a send cut after it, its outcome unknown: recorded
}

// stopping reports whether the pool is stopping.
func (w *deliverer) stopping() bool {
	return w.stop != nil && w.stop.Err() != nil
}

// admitCtx is the context of an admission wait for an attempt in ctx:
// the pool's stop, which ends no later than ctx (Run's work context ends
// only at the end of the grace that follows the stop) and carries the
// same values; ctx itself for a deliverer made outside Run. Nothing is
// derived per attempt: admissions are on every delivery's path.
func (w *deliverer) admitCtx(ctx context.Context) context.Context {
	if w.stop == nil {
		return ctx
	}
	return w.stop
}

// giveBack hands d back to the server unsent (queue.Delivery.GiveBack),
// why saying what stopped it. The caller has stopped d's heartbeat. A
// give-back that fails leaves d for the ack wait, as before: the error
// says so.
func (w *deliverer) giveBack(d *queue.Delivery, why string) error {
	ctx, cancel := context.WithTimeout(context.Background(), queue.GiveBackWait)
	defer cancel()
	if err := d.GiveBack(ctx); err != nil {
		return fmt.Errorf("%s; not given back, so it waits for the ack wait: %w", why, err)
	}
	w.stops.givenBack.Add(1)
	w.log.Debug().Str("msg_id", d.Env.ID).Str("tenant", d.Env.Tenant).Str("dest", d.Env.Dest).Str("lane", string(d.Lane)).
		Str("reason", why).Msg("given back unsent for another process to deliver at once")
	return nil
}

// cutBeforeDot reports whether the cancellation of res's send came before
// any server could take the message: every recipient's outcome is a
// transient failure with no reply, at a stage before the final dot (the
// sender says StageDataEnd from the moment the dot, or the whole BDAT
// chunk, may have left). A reply of any kind, a recipient without an
// outcome, or one at an unknown stage, says otherwise.
func cutBeforeDot(e *queue.Envelope, res sender.Result, o *outcome) bool {
	if len(e.Rcpts) == 0 || len(o.results) != len(e.Rcpts) {
		return false
	}
	byRcpt := make(map[string]classify.Input, len(res.Rcpts))
	for _, r := range res.Rcpts {
		byRcpt[r.Rcpt] = r.Outcome
	}
	for i, rcpt := range e.Rcpts {
		in, ok := byRcpt[rcpt]
		if !ok || o.results[i].Class != classify.Transient || in.Code != 0 || in.Raw != "" ||
			in.Stage < classify.StageDNS || in.Stage >= classify.StageDataEnd {
			return false
		}
	}
	return true
}

// recordAfterCut is the context in which an attempt cut after its final
// dot records its outcome: ctx without its cancellation, for
// recordAfterCutWait.
func recordAfterCut(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), recordAfterCutWait)
}

// stopped waits (within holdingWait) until the pulls have given back
// what they held at the stop, and says at info level what went back.
func (p *Pool) stopped(held *queue.Holding) {
	ctx, cancel := context.WithTimeout(context.Background(), holdingWait)
	defer cancel()
	fetched, err := held.Wait(ctx)
	if err != nil {
		p.log.Warn().Err(err).Int("fetched_given_back", fetched).
			Msg("the pulls were still giving back fetched envelopes; those left wait for the ack wait")
	}
	taken := int(p.stops.givenBack.Load())
	p.log.Info().Int("given_back", fetched+taken).Int("fetched_not_taken", fetched).
		Int("taken_not_sent", taken-int(p.stops.cutBeforeDot.Load())).
		Int64("cut_before_final_dot", p.stops.cutBeforeDot.Load()).
		Int64("cut_after_final_dot", p.stops.cutAfterDot.Load()).
		Msg("workers stopped: envelopes not sent were given back for immediate delivery elsewhere or after the restart; sends cut after the final dot were recorded as unknown outcomes")
}
