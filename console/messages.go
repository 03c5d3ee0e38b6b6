package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/plot"
	"github.com/outflow/outflow/queue"
)

// itemRow is one envelope in a listing.
type itemRow struct {
	ID, State, Tenant, Dest, LastClass, LastReply, Reason string
	Rcpts, Attempt                                        int
	Due                                                   bool
	Next, Submitted, Stored                               time.Time
}

func rows(items []queue.Item) []itemRow {
	out := make([]itemRow, len(items))
	for i, it := range items {
		out[i] = itemRow{ID: it.Env.ID, State: string(it.State), Tenant: it.Env.Tenant, Dest: it.Env.Dest, LastClass: it.Env.LastClass,
			LastReply: it.Env.LastReply, Reason: it.DeadReason, Rcpts: len(it.Env.Rcpts), Attempt: it.Env.Attempt, Due: it.Due,
			Next: it.NextAt, Submitted: it.Env.SubmittedAt, Stored: it.Stored}
	}
	return out
}

// The queue page's rows a page: queueDefault unless ?limit= says, at most
// queueMax.
const (
	queueDefault = 100
	queueMax     = 1000
)

// queuePage is `outflow queue list` with its filters (and a look-up by
// id), a page at a time (?limit= rows, with a link to the next ones).
func (c *Console) queuePage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	if id := strings.TrimSpace(q.Get("id")); id != "" {
		http.Redirect(w, r, Prefix+"messages/"+url.PathEscape(id), http.StatusSeeOther)
		return
	}
	f := queue.Filter{State: queue.State(q.Get("state")), Dest: strings.TrimSpace(q.Get("dest")), Tenant: strings.TrimSpace(q.Get("tenant")),
		Rcpt: strings.TrimSpace(q.Get("rcpt")), Limit: queueDefault}
	var notice string
	if v := strings.TrimSpace(q.Get("limit")); v != "" {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil || n <= 0:
			notice = fmt.Sprintf("At most (limit): %q is not a number of rows from 1 to %d; showing %d.", short(v, 40), queueMax, queueDefault)
		case n > queueMax:
			f.Limit = queueMax
			notice = fmt.Sprintf("At most (limit): %d is over the %d rows a page can show; showing %d, and a link to the next ones.", n, queueMax, queueMax)
		default:
			f.Limit = n
		}
	}
	at, errs := pageOf(q)
	ctx, cancel := c.ctx(r)
	defer cancel()
	items, more, err := c.listPage(ctx, f, at, f.Limit)
	if err != nil {
		errs = append(errs, err.Error())
	}
	if f.Limit != queueDefault {
		q.Set("limit", strconv.Itoa(f.Limit))
	} else {
		q.Del("limit")
	}
	first, next := pageLinks(Prefix+"queue", q, at, items, more)
	c.render(w, r, s, http.StatusOK, "queue", "Queue", map[string]any{
		"Filter": f, "States": queue.States, "Items": rows(items), "Errors": errs, "FindQuery": rcptQuery(f.Rcpt, f.Tenant),
		"Notice": notice, "From": at.shown + 1, "To": at.shown + len(items), "First": first, "Next": next,
	})
}

// findSinces are the stretches the find page offers, as `queue find
// --since` takes them; the first is the default.
var findSinces = []string{"24h", "1h", "6h", "72h", "168h"}

// findPage is /ui/find?rcpt=ADDR[&tenant=T][&since=D]: what became of
// mail to one address (`outflow queue find`), every event that names it;
// the queue page lists what of it still waits (`queue list --rcpt`).
func (c *Console) findPage(w http.ResponseWriter, r *http.Request, s *session) {
	q := r.URL.Query()
	fq := queue.EventQuery{Rcpt: strings.TrimSpace(q.Get("rcpt")), Tenant: strings.TrimSpace(q.Get("tenant"))}
	since := q.Get("since")
	if !slices.Contains(findSinces, since) {
		since = findSinces[0]
	}
	d, _ := time.ParseDuration(since)
	fq.Since = c.cfg.Now().Add(-d)
	var errs []string
	var evs []queue.Event
	scanned := 0
	if fq.Rcpt != "" {
		ctx, cancel := c.ctx(r)
		defer cancel()
		var err error
		evs, scanned, err = c.cfg.Queue.FindEvents(ctx, fq)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			errs = append(errs, fmt.Sprintf("read %d events without reaching the end: choose a shorter stretch or a tenant", scanned))
		case err != nil:
			errs = append(errs, err.Error())
		}
		slices.Reverse(evs) // newest first, as the dead letters
	}
	c.render(w, r, s, http.StatusOK, "find", "Find", map[string]any{
		"Query": fq, "Since": since, "Sinces": findSinces, "Events": evs, "Scanned": scanned, "Errors": errs,
		"QueueQuery": rcptQuery(fq.Rcpt, fq.Tenant),
	})
}

// rcptQuery is the query that carries a recipient search from the queue
// page to the find page and back.
func rcptQuery(rcpt, tenant string) template.URL {
	v := url.Values{"rcpt": {rcpt}}
	if tenant != "" {
		v.Set("tenant", tenant)
	}
	return template.URL(v.Encode())
}

// attemptRow is one event of a message's history with its decision.
type attemptRow struct {
	Time       time.Time
	Type       string
	Attempt    int
	Worker     string
	Reason     string
	Recipients []string // the recipients the event names
	Rec        *backoff.Record
	Seed       string
}

// outcomeReason is the reason the message page gives a recipient's
// outcome (queue.RecipientOutcomes): the event's, or, for one without a
// reason (a delivered event names its recipients; its reply is in its
// decision), its attempt's reply.
func outcomeReason(ev queue.Event) string {
	if ev.Reason == "" && len(ev.Decision) > 0 {
		var rec backoff.Record
		if json.Unmarshal(ev.Decision, &rec) == nil {
			return strings.TrimSpace(replyOf(rec))
		}
	}
	return ev.Reason
}

// replyOf is a decision record's reply as the events table shows it.
func replyOf(rec backoff.Record) string {
	if rec.Code != 0 {
		return strings.TrimSpace(fmt.Sprintf("%d %s %s", rec.Code, rec.EnhancedCode, rec.Reply))
	}
	return rec.Reply
}

// maxHeaderLines bounds the header lines shown (as `queue inspect`).
const maxHeaderLines = 60

func (c *Console) messagePage(w http.ResponseWriter, r *http.Request, s *session) {
	id := r.PathValue("id")
	ctx, cancel := c.ctx(r)
	defer cancel()
	var errs []string
	it, ferr := c.cfg.Queue.Find(ctx, id)
	if ferr != nil && !errors.Is(ferr, queue.ErrNotFound) {
		errs = append(errs, ferr.Error())
	}
	// A message still in a lane names its tenant, whose share of the
	// events is all that needs reading.
	var evs []queue.Event
	var herr error
	if it != nil && it.Env.Tenant != "" {
		evs, herr = c.cfg.Queue.TenantHistory(ctx, it.Env.Tenant, id, time.Time{})
	} else {
		evs, herr = c.cfg.Queue.History(ctx, id, time.Time{})
	}
	if herr != nil && !errors.Is(herr, queue.ErrNotFound) {
		errs = append(errs, herr.Error())
	}
	if it == nil && len(evs) == 0 {
		c.fail(w, r, s, http.StatusNotFound, "No message "+id+" in any lane, in dead letters or in the events stream.")
		return
	}
	var headers []string
	if it != nil && it.Env.BodyRef != "-" {
		if body, err := c.cfg.Queue.EnvelopeBody(ctx, it.Env); err == nil {
			headers = headerLines(body, maxHeaderLines)
		} else {
			errs = append(errs, "headers: "+err.Error())
		}
	}
	var attempts []attemptRow
	for _, ev := range evs {
		a := attemptRow{Time: ev.Time, Type: ev.Type, Attempt: ev.Attempt, Worker: ev.Worker, Reason: ev.Reason, Recipients: ev.Recipients}
		if len(ev.Decision) > 0 {
			var rec backoff.Record
			if json.Unmarshal(ev.Decision, &rec) == nil {
				a.Rec = &rec
				if rec.JitterSeed != 0 {
					a.Seed = strconv.FormatUint(rec.JitterSeed, 10)
				}
			}
		}
		attempts = append(attempts, a)
	}
	var meta [][2]string
	if it != nil {
		for _, k := range []string{"Outflow-Attempt", "Outflow-Throttle-Count", "Outflow-First-Attempt", "Outflow-Deadline", "Outflow-Last-Class", "Outflow-Replays", "Nats-Schedule"} {
			if v := it.Header.Get(k); v != "" {
				meta = append(meta, [2]string{k, v})
			}
		}
	}
	// The message's state as GET /v1/messages/{id} gives it: where it is
	// while stored, then its last outcome.
	state, tenant, dest := "", "", ""
	switch {
	case it != nil:
		state, tenant, dest = string(it.State), it.Env.Tenant, it.Env.Dest
		// A delivered envelope's acknowledgement is not waited for, so for
		// a moment it is still on the work lane behind its outcome.
		if out := queue.LastOutcome(evs); it.State == queue.StateQueued && (out == queue.EventDelivered || out == queue.EventBounced) {
			state = out
		}
	case len(evs) > 0:
		state, tenant, dest = queue.LastOutcome(evs), evs[0].Tenant, evs[0].Dest
	}
	// Fast-forward applies to mail its destination deferred, not to mail
	// held for its send_at (queue.FastForward refuses it).
	var sendAt time.Time
	if it != nil && it.Env.SendAt.After(c.cfg.Now()) {
		sendAt = it.Env.SendAt
	}
	canFF := it != nil && (it.State == queue.StateDeferred || it.State == queue.StateThrottled) && sendAt.IsZero()
	c.render(w, r, s, http.StatusOK, "message", "Message "+id, map[string]any{
		"ID": id, "Item": it, "Headers": headers, "Meta": meta, "Attempts": attempts,
		"Timeline": timeline(id, it, evs), "Errors": errs,
		"State": state, "Tenant": tenant, "Dest": dest, "Outcomes": queue.RecipientOutcomes(evs, outcomeReason),
		"CanFastForward": canFF, "SendAt": sendAt,
	})
}

// headerLines returns up to max header lines of an RFC 5322 message, with
// folded lines kept as they are; never the body.
func headerLines(body []byte, max int) []string {
	head := body
	if i := bytes.Index(head, []byte("\r\n\r\n")); i >= 0 {
		head = head[:i]
	} else if i := bytes.Index(head, []byte("\n\n")); i >= 0 {
		head = head[:i]
	} else {
		head = head[:min(len(head), 16<<10)]
	}
	lines := strings.Split(strings.ReplaceAll(string(head), "\r\n", "\n"), "\n")
	if len(lines) > max {
		lines = append(lines[:max], "…")
	}
	return lines
}

// attemptEvents are the events that record a delivery attempt.
var attemptEvents = map[string]bool{queue.EventDelivered: true, queue.EventDeferred: true, queue.EventThrottled: true,
	queue.EventBounced: true, queue.EventUnknown: true, queue.EventHeld: true, queue.EventDead: true, queue.EventExpired: true}

// timeline draws the message's retries with the code of `outflow schedule
// --plot`: one strip per retry at its time since the first failure, the
// attempts made (from the events) and the one scheduled next. Nil when
// there is no retry to draw.
//
// A replay starts a new run (its attempts have a new budget, and the old
// run ended in dead letters or held): only the run since the last
// replayed event is drawn, the earlier ones are in the events table.
func timeline(id string, it *queue.Item, evs []queue.Event) template.HTML {
	var first, last, replayed time.Time
	var at [][]int64
	for _, ev := range evs {
		if ev.Type == queue.EventReplayed {
			first, last, replayed, at = time.Time{}, time.Time{}, ev.Time, nil
			continue
		}
		// One attempt can end in several events (some recipients
		// delivered, others bounced), published together.
		// A bounce mailed back later (Async) was no attempt, nor was a
		// suspension's refusal (a deferred event without a decision
		// record; every attempt's deferral has one).
		if !attemptEvents[ev.Type] || ev.Async || (ev.Type == queue.EventDeferred && ev.Decision == nil) ||
			ev.Time.Sub(last) < 50*time.Millisecond {
			continue
		}
		last = ev.Time
		if first.IsZero() {
			first = ev.Time
			continue
		}
		at = append(at, []int64{ev.Time.Sub(first).Milliseconds()})
	}
	next := ""
	if it != nil && !it.NextAt.IsZero() && !first.IsZero() {
		at = append(at, []int64{it.NextAt.Sub(first).Milliseconds()})
		next = fmt.Sprintf(", the last strip the attempt scheduled for %s", it.NextAt.UTC().Format(time.RFC3339))
	}
	if len(at) == 0 {
		return ""
	}
	var b bytes.Buffer
	heading := "Retry timeline (time since the first failure, log scale)"
	title := fmt.Sprintf("message %s: first failure %s%s", id, first.UTC().Format(time.RFC3339), next)
	if !replayed.IsZero() {
		title = fmt.Sprintf("message %s: since its replay at %s, first failure %s%s", id, replayed.UTC().Format(time.RFC3339),
			first.UTC().Format(time.RFC3339), next)
	}
	if err := plot.Retries(&b, heading, title, at); err != nil {
		return ""
	}
	// plot.Retries escapes the only text it is given (the title); the
	// rest is numbers and fixed words.
	return template.HTML(b.String())
}

// messageAction runs fast-forward, replay or drop after a confirmation
// page: the first POST shows what will happen, the second (confirm=yes)
// does it.
func (c *Console) messageAction(w http.ResponseWriter, r *http.Request, s *session) {
	id, action := r.PathValue("id"), r.PathValue("action")
	f := r.PostForm
	labels := map[string]string{"fast-forward": "Fast-forward", "replay": "Replay", "drop": "Drop"}
	if labels[action] == "" {
		c.fail(w, r, s, http.StatusNotFound, "No such action.")
		return
	}
	edits := strings.ReplaceAll(f.Get("edits"), "\r\n", "\n")
	var eb []byte // the edits as queue.Replay takes them
	if action == "replay" && strings.TrimSpace(edits) != "" {
		eb = []byte(strings.ReplaceAll(strings.TrimRight(edits, "\n")+"\n", "\n", "\r\n"))
		// Bad input is the operator's to fix, not the store's failure: the
		// edits are checked (queue.EditHeaders, which the replay applies)
		// on a stand-in message before the confirmation and again before
		// the replay, and refused with 400 and the reason.
		if _, err := queue.EditHeaders([]byte("Subject: check\r\n\r\n"), eb); err != nil {
			c.fail(w, r, s, http.StatusBadRequest, labels[action]+" not done: the header edits cannot be applied: "+err.Error())
			return
		}
	}
	if f.Get("confirm") != "yes" {
		c.render(w, r, s, http.StatusOK, "confirm", labels[action]+" "+id+"?", map[string]any{
			"ID": id, "Action": action, "Label": labels[action], "Edits": edits, "Back": f.Get("back"),
		})
		return
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	back := Prefix + "messages/" + url.PathEscape(id)
	var msg string
	var err error
	// The message's event names the session, as `outflow queue` names
	// the operator (its tenant is told "admin": queue.ForTenant).
	by := queue.OperatorAdmin + ":" + author(s)
	switch action {
	case "fast-forward":
		var it *queue.Item
		if it, err = c.cfg.Queue.FastForwardBy(ctx, id, by); err == nil {
			msg = id + ": due now (was " + string(it.State) + "); its next attempt bypasses the destination's throttle."
			if it.Due {
				msg = id + ": already due, waiting for a worker."
			}
		}
	case "replay":
		var e *queue.Envelope
		if e, err = c.cfg.Queue.ReplayWith(ctx, id, queue.ReplayOptions{EditHeaders: eb, By: by}); err == nil {
			msg = fmt.Sprintf("%s: queued again for %d recipient(s) (replay %d).", e.ID, len(e.Rcpts), e.Replays)
		}
	case "drop":
		var it *queue.Item
		if it, err = c.cfg.Queue.DropBy(ctx, id, by); err == nil {
			msg = id + ": dropped (was " + string(it.State) + ")."
			if b := f.Get("back"); safeNext(b) {
				back = b
			}
		}
	}
	if err != nil {
		// 502 is for a store that could not be read or written; the
		// message's state or its recipients' refuse the action (409).
		status := http.StatusBadGateway
		switch {
		case errors.Is(err, queue.ErrNotFound):
			status = http.StatusNotFound
		case errors.Is(err, queue.ErrWrongState), errors.Is(err, queue.ErrSuppressed):
			status = http.StatusConflict
		}
		c.fail(w, r, s, status, labels[action]+" failed: "+err.Error())
		return
	}
	c.log.Info().Str("msg_id", id).Str("action", action).Str("by", author(s)).Msg("console message action")
	c.done(w, r, s, back, msg)
}
