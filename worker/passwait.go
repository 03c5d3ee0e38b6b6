package worker

import (
	"context"
	"sync"
	"time"

	"github.com/outflow/outflow/queue"
)

// passWaits are the first passes this process recorded a note in that were
// still open (queue.RecordPass): at each one's deadline, DSNConfig.
// PassTimeout after the note, it closes the pass (queue.ClosePass) and
// sends the report with the notes the record holds, unless a part
// completed the pass first. Parts reaching their pass after that report
// on their own.
//
// Why a timer in the process that wrote the note, rather than the parts'
// own later attempts or a scan of the records: the part that holds the
// pass is by definition not running, and the parts that wrote notes are
// usually finished (delivered or bounced, acknowledged), so no attempt is
// left to notice the deadline; a scan would read every pass record of the
// SENT bucket's lifetime, one per multi-part message, to find the few that
// are stuck. The timer costs nothing in the KV store for a pass its own
// process completes, and one read for a pass another process completed.
// Every process holding a note of the pass waits on it: whichever comes
// first closes it (compare-and-set), a later one finds it closed and sends
// the same report again under the same queue id, which the work stream's
// deduplication absorbs; so the report is lost only if every one of them
// stops before the deadline, and then it waits for the missing part as it
// would without a deadline.
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
	p.m[e.MsgID] = &passWait{e: c, body: body, due: due}
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

// sweepPasses closes the passes past their deadline until ctx ends.
func (p *Pool) sweepPasses(ctx context.Context) {
	t := time.NewTicker(passSweepEvery(p.dsn.cfg.PassTimeout))
	defer t.Stop()
	w := &deliverer{Pool: p, id: p.cfg.WorkerID + "/pass"}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.closePasses(ctx)
		}
	}
}

// closePasses sends the report of every pass past its deadline that no
// part completed. One that fails (NATS unavailable) is tried again at the
// next sweep.
func (w *deliverer) closePasses(ctx context.Context) {
	for _, pw := range w.dsn.passes.take(w.now()) {
		e := pw.e
		notes, owed, err := w.cfg.Queue.ClosePass(ctx, e.MsgID)
		if err == nil && owed {
			w.log.Info().Str("msg_id", e.MsgID).Int("parts", e.Parts).Int("noted", len(notes)).
				Msg("first pass past its deadline; reporting the parts that reached it")
			err = w.passNotices(ctx, e, w.readNotes(e, notes), pw.body, passReportKey(e.MsgID))
		}
		if err != nil {
			w.log.Warn().Err(err).Str("msg_id", e.MsgID).Msg("pass report at the deadline not sent; trying again")
			w.dsn.passes.wait(e, pw.body, w.now())
		}
	}
}
