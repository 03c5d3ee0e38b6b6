package worker

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/outflow/outflow/queue"
)

// passWaits are the first passes this process waits on, open when a part
// recorded its note in them (queue.RecordPass): at each one's deadline,
// DSNConfig.PassTimeout after the note, it closes the pass
// (queue.ClosePass) and sends the report with the notes the record holds,
// unless a part completed the pass first. Parts reaching their pass after
// that report on their own.
//
// Why a timer in the process that wrote the note, rather than the parts'
// own later attempts or a scan of the records: the part that holds the
// pass is by definition not running, and the parts that wrote notes are
// usually finished (delivered or bounced, acknowledged), so no attempt is
// left to notice the deadline; a scan would read every pass record of the
// SENT bucket's lifetime, one per multi-part message, to find the few that
// are stuck. The timer costs nothing in the KV store for a pass its own
// process completes, and one read for a pass another process completed.
//
// The timer alone was lost with its process: one that stopped before the
// deadline left the pass to the part still missing, and when that part
// never came (dropped by an operator, so it never reaches its pass) the
// sender never heard of its other recipients' failures. So the note's
// writer also records the wait in the SENT bucket (queue.WaitPass) before
// its durable step, and every process takes up the waits recorded there
// when it starts and every PassTimeout after (adoptPasses), at their
// deadline plus one sweep, so that the writer, if it still runs, goes
// first. Whoever comes first closes the pass (compare-and-set), sends the
// report and removes the wait; a later one finds the wait gone and does
// nothing, or, in the moment between, sends the same report again under
// the same queue id, which the work stream's deduplication absorbs.
type passWaits struct {
	mu sync.Mutex
	m  map[string]*passWait // by message id
}

// passWait is one pass waited on: a part of its message (the report's
// per-message fields come from it), the body the report returns, and when.
type passWait struct {
	e    *queue.Envelope
	body []byte
	due  time.Time
}

const (
	// maxPassWaits bounds the passes one process waits on; past it a pass
	// waits for its parts as it would without a deadline.
	maxPassWaits = 10_000
	// passWaitBody is the most of an original a waiting pass keeps for
	// its report; a longer one is returned as its header (RET=HDRS), so
	// that thousands of waits stay small.
	passWaitBody = 16 << 10
)

// wait remembers e's pass until due.
func (p *passWaits) wait(e *queue.Envelope, body []byte, due time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.m[e.MsgID]; ok || len(p.m) >= maxPassWaits {
		return
	}
	if p.m == nil {
		p.m = map[string]*passWait{}
	}
	c, body := waitCopy(e, body)
	p.m[e.MsgID] = &passWait{e: c, body: body, due: due}
}

// waitCopy is what a pass waited on keeps of its part e and of the body
// the part's attempt sent: the part without its body and history, and at
// most passWaitBody of the original. Applied to its own result it changes
// nothing (an adopted wait was made by it).
func waitCopy(e *queue.Envelope, body []byte) (*queue.Envelope, []byte) {
	c := e.Clone()
	c.History, c.Body = nil, nil
	if !e.Inline() {
		// The part's own copy (a DKIM-signed one) goes with it; the
		// original stays while the part that holds the pass exists.
		c.BodyRef = e.MsgID
	}
	if body == nil && e.Inline() {
		body = e.Body
	}
	if len(body) > passWaitBody {
		// A copy: a slice of the attempt's body would keep all of it.
		body = append([]byte(nil), body[:passWaitBody]...)
		if c.DSN != nil {
			d := *c.DSN
			d.Ret = "HDRS"
			c.DSN = &d
		}
	}
	return c, body
}

// done forgets msgID's pass: a part completed it.
func (p *passWaits) done(msgID string) {
	p.mu.Lock()
	delete(p.m, msgID)
	p.mu.Unlock()
}

// take removes and returns the passes whose deadline is not after now.
func (p *passWaits) take(now time.Time) []*passWait {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*passWait
	for id, w := range p.m {
		if !w.due.After(now) {
			out = append(out, w)
			delete(p.m, id)
		}
	}
	return out
}

// passSweepEvery is how often a pool looks for passes past their
// deadline: a quarter of the timeout, at most 30 s.
func passSweepEvery(timeout time.Duration) time.Duration {
	return min(max(timeout/4, 10*time.Millisecond), 30*time.Second)
}

// sweepPasses closes the passes past their deadline until ctx ends,
// taking up the waits recorded in the SENT bucket at its start and every
// PassTimeout after.
func (p *Pool) sweepPasses(ctx context.Context) {
	every := passSweepEvery(p.dsn.cfg.PassTimeout)
	t := time.NewTicker(every)
	defer t.Stop()
	w := &deliverer{Pool: p, id: p.cfg.WorkerID + "/pass"}
	w.adoptPasses(ctx)
	adopted := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if time.Since(adopted) >= p.dsn.cfg.PassTimeout {
				w.adoptPasses(ctx)
				adopted = time.Now()
			}
			w.closePasses(ctx)
		}
	}
}

// adoptPasses waits on every pass the SENT bucket lists as waited on
// (queue.PassWaits) that this process does not wait on already, until
// the deadline recorded plus one sweep. The deadline is on its writer's
// clock; workers' clocks a few seconds apart move it by as much, against
// a timeout of minutes. A listing that fails is tried again at the next.
func (w *deliverer) adoptPasses(ctx context.Context) {
	waits, err := w.cfg.Queue.PassWaits(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("pass waits recorded by other processes not read; trying again later")
		}
		return
	}
	grace := passSweepEvery(w.dsn.cfg.PassTimeout)
	for _, pw := range waits {
		w.dsn.passes.wait(pw.Env, pw.Body, pw.Due.Add(grace))
	}
}

// closePasses sends the report of every pass past its deadline that no
// part completed, and removes its recorded wait. One that fails (NATS
// unavailable) is tried again at the next sweep.
func (w *deliverer) closePasses(ctx context.Context) {
	for _, pw := range w.dsn.passes.take(w.now()) {
		e := pw.e
		waited, err := w.cfg.Queue.PassWaited(ctx, e.MsgID)
		if err == nil && !waited {
			continue // completed, or reported at its deadline by another process
		}
		var notes []json.RawMessage
		owed := false
		if err == nil {
			notes, owed, err = w.cfg.Queue.ClosePass(ctx, e.MsgID)
		}
		if err == nil && owed {
			w.log.Info().Str("msg_id", e.MsgID).Int("parts", e.Parts).Int("noted", len(notes)).
				Msg("first pass past its deadline; reporting the parts that reached it")
			err = w.passNotices(ctx, e, w.readNotes(e, notes), pw.body, passReportKey(e.MsgID))
		}
		if err != nil {
			w.log.Warn().Err(err).Str("msg_id", e.MsgID).Msg("pass report at the deadline not sent; trying again")
			w.dsn.passes.wait(e, pw.body, w.now())
			continue
		}
		w.endPassWait(ctx, e.MsgID)
	}
}

// endPassWait removes msgID's recorded wait once its report is sent or
// owed by nobody. A failure is logged: the wait left behind ends at its
// deadline, in this process or another, finding nothing owed or sending
// the report again under its one queue id.
func (w *deliverer) endPassWait(ctx context.Context, msgID string) {
	if err := w.cfg.Queue.EndPassWait(ctx, msgID); err != nil {
		w.log.Warn().Err(err).Str("msg_id", msgID).Msg("pass wait not removed; it ends at its deadline")
	}
}
