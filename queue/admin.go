package queue

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime"
	"net/mail"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/ascii"
)

// State is where an envelope is, as operators see it.
type State string

const (
	StateQueued    State = "queued"    // fresh, in the work lane (possibly being delivered)
	StateDeferred  State = "deferred"  // waiting in the retry lane (or due there)
	StateThrottled State = "throttled" // waiting in the rate-limit lane (or due there)
	StateUnknown   State = "unknown"   // outcome unknown, held for an operator
	StateDead      State = "dead"      // in dead letters
)

// States lists every State, in the order `queue list` shows them.
var States = []State{StateQueued, StateDeferred, StateThrottled, StateUnknown, StateDead}

// Errors of the admin operations, for errors.Is.
var (
	ErrNotFound   = errors.New("no such message")
	ErrWrongState = errors.New("message is in the wrong state for this operation")
)

// Item is one stored envelope and where it is.
type Item struct {
	State      State     `json:"state"`
	Due        bool      `json:"due,omitempty"` // fired, waiting for a worker
	Subject    string    `json:"subject"`
	Seq        uint64    `json:"seq"`
	Stored     time.Time `json:"stored"`
	NextAt     time.Time `json:"next_attempt_at,omitempty"`
	DeadReason string    `json:"dead_reason,omitempty"`
	Env        *Envelope `json:"envelope"`
	// Header is the stored message's NATS headers (attempt metadata).
	Header nats.Header `json:"headers,omitempty"`
}

// Filter selects envelopes for List. Zero fields match everything.
type Filter struct {
	State State
	// Dest is a destination domain, matched as DNS names are: "D.Example."
	// selects the envelopes of d.example. A name without a dot is a
	// provider group, and a name starting "mx:" an MX site
	// (throttle.SitePrefix): the envelopes a worker last found in it
	// (Envelope.Group), and those of a domain of that name.
	Dest   string
	Tenant string
	// Rcpt, when set, keeps the envelopes with this recipient (compared
	// as NormalizeAddress compares).
	Rcpt string
	// Newest lists the newest matches, newest first, reading from the
	// end; with State dead only (the console's page of dead letters).
	Newest bool
	// Limit bounds the result; 0 means 100, and a negative one no bound
	// (queue list --limit 0, for a script that drops or replays all).
	// Listing walks the stream, so a million deferred envelopes are
	// listed a page at a time.
	Limit int
}

// where maps a state to the stream and subject filter that hold it.
func (q *Queue) where(s State, dest string) (jetstream.Stream, []string) {
	d := "*"
	if dest != "" {
		d = Token(dest)
	}
	switch s {
	case StateQueued:
		return q.lanes[LaneWork], []string{workFilter("*", d, "*")}
	case StateDeferred:
		return q.lanes[LaneRetry], []string{schedFilter(LaneRetry, d, "*"), dueFilter(LaneRetry, d, "*")}
	case StateThrottled:
		return q.lanes[LaneRateLimit], []string{schedFilter(LaneRateLimit, d, "*"), dueFilter(LaneRateLimit, d, "*")}
	case StateUnknown:
		return q.lanes[LaneRetry], []string{heldFilter(d, "*")}
	case StateDead:
		return q.dead, []string{deadSubject("*")}
	}
	return nil, nil
}

// List returns stored envelopes matching f, oldest stored first.
func (q *Queue) List(ctx context.Context, f Filter) ([]Item, error) {
	limit := f.Limit
	switch {
	case limit < 0:
		limit = math.MaxInt // all
	case limit == 0:
		limit = 100
	}
	states := States
	if f.State != "" {
		if _, subs := q.where(f.State, ""); subs == nil {
			return nil, fmt.Errorf("unknown state %q (want queued, deferred, throttled, unknown or dead)", f.State)
		}
		states = []State{f.State}
	}
	// Envelopes carry their domain lower-cased without a trailing dot
	// (Domain), in ASCII (submission takes addresses in ASCII only, so an
	// internationalised domain is queued in A-labels), and the subject
	// filter below matches it byte for byte: "Bücher.example." lists the
	// mail of xn--bcher-kva.example.
	f.Dest = ascii.Domain(strings.TrimSpace(f.Dest))
	// A name without a dot is a provider group (google, microsoft), one
	// starting "mx:" an MX site (mx:mx1.hoster.example): its envelopes are
	// found by the group their last attempt found them in, reading the
	// whole lane, since the subjects name domains.
	group := f.Dest != "" && (!strings.Contains(f.Dest, ".") || strings.HasPrefix(f.Dest, "mx:"))
	subjDest := f.Dest
	if group {
		subjDest = ""
	}
	rcpt := NormalizeAddress(f.Rcpt)
	if at := strings.LastIndexByte(rcpt, '@'); at >= 0 {
		rcpt = rcpt[:at+1] + ascii.Domain(rcpt[at+1:])
	}
	var out []Item
	keep := func(st State) func(Item) bool {
		return func(it Item) bool {
			it.State = st
			if f.Dest != "" && it.Env.Dest != f.Dest && (!group || it.Env.Group != f.Dest) {
				return true
			}
			if f.Tenant != "" && it.Env.Tenant != f.Tenant {
				return true
			}
			if rcpt != "" && !slices.ContainsFunc(it.Env.Rcpts, func(r string) bool { return NormalizeAddress(r) == rcpt }) {
				return true
			}
			it.Env.Body = nil // a listing shows no bodies; do not hold them
			out = append(out, it)
			return len(out) < limit
		}
	}
	if f.Newest {
		if f.State != StateDead {
			return nil, errors.New("list: newest first is for dead letters only")
		}
		err := q.scanBack(ctx, q.dead, deadSubject("*"), keep(StateDead))
		return out, err
	}
	for _, st := range states {
		stream, subs := q.where(st, subjDest)
		for _, sub := range subs {
			err := q.scan(ctx, stream, sub, keep(st))
			if err != nil {
				return nil, err
			}
			if len(out) >= limit {
				return out, nil
			}
		}
	}
	return out, nil
}

// scan walks stream's messages on subject in sequence order, calling fn
// until it returns false.
func (q *Queue) scan(ctx context.Context, stream jetstream.Stream, subject string, fn func(Item) bool) error {
	seq := uint64(1)
	for {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", subject, err)
		}
		seq = m.Sequence + 1
		if it, ok := itemOf(m); ok && !fn(it) {
			return nil
		}
	}
}

// scanBackWindow is how many sequences scanBack reads forward at a time
// (a test's smaller).
var scanBackWindow uint64 = 512

// scanBack walks stream's messages on subject newest first, calling fn
// until it returns false. It reads windows of sequences from the end, each
// forward as scan does (the server skips the gaps that replays and drops
// leave), and hands each window's items over in reverse.
func (q *Queue) scanBack(ctx context.Context, stream jetstream.Stream, subject string, fn func(Item) bool) error {
	window := scanBackWindow
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	first, last := info.State.FirstSeq, info.State.LastSeq
	if last == 0 || first > last {
		return nil
	}
	for hi := last; ; {
		lo := first
		if hi-first >= window {
			lo = hi - window + 1
		}
		var batch []Item
		for seq := lo; seq <= hi; {
			m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				break
			}
			if err != nil {
				return fmt.Errorf("read %s: %w", subject, err)
			}
			if m.Sequence > hi {
				break
			}
			seq = m.Sequence + 1
			if it, ok := itemOf(m); ok {
				batch = append(batch, it)
			}
		}
		for i := len(batch) - 1; i >= 0; i-- {
			if !fn(batch[i]) {
				return nil
			}
		}
		if lo == first {
			return nil
		}
		hi = lo - 1
	}
}

func itemOf(m *jetstream.RawStreamMsg) (Item, bool) {
	env, err := DecodeEnvelope(m.Data, m.Header)
	it := Item{Subject: m.Subject, Seq: m.Sequence, Stored: m.Time, Header: m.Header}
	if err != nil {
		// Parked malformed messages have no envelope; show what there is.
		env = &Envelope{ID: deadID(m.Subject), Dest: "?", BodyRef: "-"}
	}
	it.Env = env
	it.DeadReason = m.Header.Get("Outflow-Dead-Reason")
	if isDueSubject(m.Subject) {
		it.Due = true
	} else if sch := m.Header.Get("Nats-Schedule"); strings.HasPrefix(sch, "@at ") {
		it.NextAt, _ = time.Parse(time.RFC3339Nano, sch[4:])
	}
	return it, true
}

// Find locates an envelope by id in every lane and in dead letters.
func (q *Queue) Find(ctx context.Context, id string) (*Item, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q is not a message id", ErrNotFound, id)
	}
	probes := []struct {
		st     State
		stream jetstream.Stream
		subj   string
	}{
		{StateQueued, q.lanes[LaneWork], workFilter("*", "*", id)},
		{StateDeferred, q.lanes[LaneRetry], schedFilter(LaneRetry, "*", id)},
		{StateDeferred, q.lanes[LaneRetry], dueFilter(LaneRetry, "*", id)},
		{StateUnknown, q.lanes[LaneRetry], heldFilter("*", id)},
		{StateThrottled, q.lanes[LaneRateLimit], schedFilter(LaneRateLimit, "*", id)},
		{StateThrottled, q.lanes[LaneRateLimit], dueFilter(LaneRateLimit, "*", id)},
		{StateDead, q.dead, deadSubject(id)},
	}
	for _, p := range probes {
		m, err := p.stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(p.subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("find %s: %w", id, err)
		}
		it, _ := itemOf(m)
		it.State = p.st
		return &it, nil
	}
	return nil, fmt.Errorf("%w: %s (delivered, bounced and dropped messages leave only events: see `queue history`)", ErrNotFound, id)
}

// History returns every event recorded for id since since (the zero time:
// all the stream keeps), oldest first by event time. Stream order is not
// that order: the queued (or replayed) event is written after the
// envelope's fsync, and a worker may have delivered the envelope, and
// written its event, by then.
//
// The id's shard holds its events among those of ~1/1,024 of all ids; a
// throwaway consumer reads the shard, in every tenant shard, and the id's
// events are kept; a second one reads the id's shard in the layout before
// tenant shards (events.go), at once when it holds nothing. The server
// finds a shard's messages by walking its file blocks, so a look-up costs
// time in proportion to the events stored after since (measured in
// docs/benchmarks.md), which is what since is for. One consumer with both
// filters took 2.4 times as long, and nats-server 2.15 started it, given
// since, past the first filter's earlier events.
func (q *Queue) History(ctx context.Context, id string, since time.Time) ([]Event, error) {
	return q.history(ctx, "", id, since)
}

// TenantHistory is History for an id of tenant's: it reads the id's shard
// in that tenant's shard only, about a sixty-fourth of the events History
// reads when there are many tenants (a seventh of the time with a hundred,
// docs/benchmarks.md), and reports an id of another tenant as not found.
// Every event of an envelope carries its tenant, so nothing of the id's is
// left out.
func (q *Queue) TenantHistory(ctx context.Context, tenant, id string, since time.Time) ([]Event, error) {
	if tenant == "" {
		return nil, fmt.Errorf("%w: no events for %s", ErrNotFound, id)
	}
	return q.history(ctx, tenant, id, since)
}

// history is History, and TenantHistory when tenant is not empty.
func (q *Queue) history(ctx context.Context, tenant, id string, since time.Time) ([]Event, error) {
	if !validID(id) {
		return nil, fmt.Errorf("%w: %q is not a message id", ErrNotFound, id)
	}
	// Events are published asynchronously: wait for this process's own
	// to be stored, so a drop or replay shows in the history read next.
	if err := q.asyncStored(ctx); err != nil {
		return nil, fmt.Errorf("history %s: %w", id, err)
	}
	var out []Event
	filters := historyFilters(id)
	if tenant != "" {
		filters = tenantHistoryFilters(tenant, id)
	}
	for _, filter := range filters {
		evs, err := q.readEvents(ctx, id, filter, since)
		if err != nil {
			return nil, fmt.Errorf("history %s: %w", id, err)
		}
		for _, ev := range evs {
			if tenant == "" || ev.Tenant == tenant {
				out = append(out, ev)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w: no events for %s", ErrNotFound, id)
	}
	slices.SortStableFunc(out, func(a, b Event) int { return a.Time.Compare(b.Time) })
	return out, nil
}

// readEvents returns id's events on filter stored since since, in stream
// order.
func (q *Queue) readEvents(ctx context.Context, id, filter string, since time.Time) ([]Event, error) {
	var out []Event
	err := q.scanEvents(ctx, []string{filter}, since, func(m jetstream.Msg) {
		if m.Headers().Get(HdrEventID) != id {
			return
		}
		var ev Event
		if err := json.Unmarshal(m.Data(), &ev); err == nil && ev.ID == id {
			out = append(out, ev)
		}
	})
	return out, err
}

// FastForward makes a deferred or throttled envelope due now, as a probe:
// its next attempt bypasses the throttle (suspension, breaker, rate), so
// an operator can test a destination with one message. It is atomic:
// the due message is published with Nats-Schedule-Next: purge naming the
// schedule, and with the schedule's sequence as the expected last sequence
// of its subject, so it either replaces the schedule (which then cannot
// fire) or fails because the schedule fired meanwhile. An envelope that is
// already due (it fired, or a release made it due) is reported with
// Item.Due set and no error: it is as "now" as it can be.
func (q *Queue) FastForward(ctx context.Context, id string) (*Item, error) {
	return q.FastForwardBy(ctx, id, OperatorAdmin)
}

// FastForwardBy is FastForward in the name of by, the fast-forwarded
// event's worker_id: who asked (`outflow queue fast-forward` passes
// "admin:USER@HOST"; empty is OperatorAdmin).
func (q *Queue) FastForwardBy(ctx context.Context, id, by string) (*Item, error) {
	it, err := q.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	if it.State != StateDeferred && it.State != StateThrottled {
		return it, fmt.Errorf("%w: %s is %s; fast-forward applies to deferred or throttled messages", ErrWrongState, id, it.State)
	}
	if at := it.Env.SendAt; at.After(time.Now()) {
		// Not deferred by a destination: sent later, as its sender asked.
		return it, fmt.Errorf("%w: %s is to be sent at %s (send_at); fast-forward applies to mail deferred by its destination, not to mail whose time has not come",
			ErrWrongState, id, at.UTC().Format(time.RFC3339))
	}
	if it.Due {
		return it, nil
	}
	lane := LaneRetry
	if it.State == StateThrottled {
		lane = LaneRateLimit
	}
	m := nats.NewMsg(dueSubject(lane, it.Env.Dest, id))
	for k, v := range it.Header {
		if strings.HasPrefix(k, "Outflow-") {
			m.Header[k] = v
		}
	}
	if m.Data, err = it.Env.data(); err != nil {
		return it, fmt.Errorf("fast-forward %s: %w", id, err)
	}
	// An operator asked for this attempt now: it bypasses a suspension, an
	// open breaker and the rate, so it can test whether the destination
	// has recovered.
	m.Header.Set(HdrProbe, "1")
	m.Header.Set("Nats-Schedule-Next", "purge")
	m.Header.Set("Nats-Scheduler", it.Subject)
	if _, err := q.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequenceForSubject(it.Seq, it.Subject)); err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
			// It fired (or was released) between our read and our write.
			if again, ferr := q.Find(ctx, id); ferr == nil && again.Due {
				return again, nil
			}
		}
		return it, fmt.Errorf("fast-forward %s: %w", id, err)
	}
	// What changed, for `queue history` and the daemon's log line
	// (OperatorEventTypes): the schedule it had, and that this attempt
	// bypasses the throttle.
	q.Event(EventFastFwd, &Event{ID: id, MsgID: it.Env.MsgID, Tenant: it.Env.Tenant, Dest: it.Env.Dest, Attempt: it.Env.Attempt,
		Worker: operator(by), Reason: fastForwardReason(it, lane), Recipients: it.Env.Rcpts})
	return it, nil
}

// ErrSuppressed matches, with errors.Is, Replay's refusal of a message
// with a recipient on its tenant's suppression list (SuppressedError names
// them).
var ErrSuppressed = errors.New("recipient suppressed")

// SuppressedError is Replay's refusal: the recipients of the envelope that
// are on its tenant's suppression list now (added since the message was
// submitted, most often by its own bounce or a complaint).
type SuppressedError struct {
	ID    string
	Rcpts []string
}

func (e *SuppressedError) Error() string {
	return fmt.Sprintf("%s: not replayed: %d recipient(s) suppressed since it was submitted: %s (lift them with `outflow suppress remove`, or replay with --include-suppressed to send to them all the same)",
		e.ID, len(e.Rcpts), strings.Join(e.Rcpts, ", "))
}

func (e *SuppressedError) Is(target error) bool { return target == ErrSuppressed }

// ReplayOptions are what an operator may ask of a replay (ReplayWith).
type ReplayOptions struct {
	// EditHeaders, when non-empty, is a block of RFC 5322 header lines
	// applied to the message first (see Replay).
	EditHeaders []byte
	// IncludeSuppressed replays a message even to recipients on its
	// tenant's suppression list, which Replay otherwise refuses.
	IncludeSuppressed bool
	// By names who replays it, the replayed event's worker_id
	// (`outflow queue replay` passes "admin:USER@HOST"); empty is
	// OperatorAdmin.
	By string
}

// Replay moves a dead or held envelope back to fresh work with a new
// budget (attempts and age start again). editHeaders, when non-empty, is a
// block of RFC 5322 header lines applied to the message first ("Name:
// value" replaces or adds that header; "Name:" alone removes it); the
// edited body is stored under a new name so other parts of the same
// submission keep the original.
//
// A message with a recipient on its tenant's suppression list (put there
// since it was submitted, often by this very message's bounce) is not
// replayed: the error, a *SuppressedError matching ErrSuppressed, names
// them, and nothing is queued (ReplayWith's IncludeSuppressed overrides).
func (q *Queue) Replay(ctx context.Context, id string, editHeaders []byte) (*Envelope, error) {
	return q.ReplayWith(ctx, id, ReplayOptions{EditHeaders: editHeaders})
}

// SuppressedAmong returns those of rcpts on tenant's suppression list, for
// an intake that stores through the queue alone (`outflow submit`): the
// SMTP listener and the API check the list themselves before they store.
func (q *Queue) SuppressedAmong(ctx context.Context, tenant string, rcpts []string) ([]string, error) {
	return q.suppressedRcpts(ctx, tenant, rcpts)
}

// suppressedRcpts returns those of rcpts on tenant's suppression list.
func (q *Queue) suppressedRcpts(ctx context.Context, tenant string, rcpts []string) ([]string, error) {
	list, err := q.Suppressions(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, r := range rcpts {
		s, err := list.Suppressed(ctx, tenant, r)
		if err != nil {
			return nil, err
		}
		if s != nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// ReplayWith is Replay with opts.
func (q *Queue) ReplayWith(ctx context.Context, id string, opts ReplayOptions) (*Envelope, error) {
	editHeaders := opts.EditHeaders
	it, err := q.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	if it.State != StateDead && it.State != StateUnknown {
		return nil, fmt.Errorf("%w: %s is %s; replay applies to dead letters and held (unknown) messages", ErrWrongState, id, it.State)
	}
	if it.Env.BodyRef == "-" {
		return nil, fmt.Errorf("%w: %s is a parked malformed message, not an envelope; inspect it and drop it", ErrWrongState, id)
	}
	if !opts.IncludeSuppressed {
		// Submission checks the list and the worker checks it only for
		// bulk mail: a replay is the one way in that would otherwise
		// send to an address suppressed since, e.g. by the hard bounce
		// that made this dead letter.
		sup, err := q.suppressedRcpts(ctx, it.Env.Tenant, it.Env.Rcpts)
		if err != nil {
			return nil, fmt.Errorf("replay %s: suppression list: %w", id, err)
		}
		if len(sup) > 0 {
			return nil, &SuppressedError{ID: id, Rcpts: sup}
		}
	}
	e := it.Env.Clone()
	oldCopy := "" // a signed copy the edit replaces
	if len(editHeaders) > 0 && e.Inline() {
		// The edit applies to the body without outflow's signature; the
		// worker signs the edited body again.
		edited, err := EditHeaders(e.Unsigned(), editHeaders)
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", id, err)
		}
		e.Body, e.Signed, e.SigLen, e.Size = edited, false, 0, int64(len(edited))
		if len(edited) > q.opts.InlineBodyMax {
			// Grown past what an envelope carries: stored as this
			// envelope's edited copy, as a stored body's edit is. Inline,
			// the worker refused it as malformed and the message was
			// lost with the dead letter already deleted.
			ref := EditedBodyRef(e)
			if _, err := q.bodies.PutBytes(ctx, ref, edited); err != nil {
				return nil, fmt.Errorf("replay %s: store edited body: %w", id, err)
			}
			e.Body, e.BodyRef = nil, ref
		}
	} else if len(editHeaders) > 0 {
		// Edit the unsigned body, never a DKIM-signed copy (the edit would
		// break the signature; the worker signs the edited body again
		// before its first attempt): the envelope's earlier edit if it has
		// one, else the submitted original.
		src := e.BodyRef
		if e.Signed {
			src = e.MsgID
			switch _, err := q.bodyInfo(ctx, EditedBodyRef(e)); {
			case err == nil:
				src = EditedBodyRef(e)
			case !errors.Is(err, jetstream.ErrObjectNotFound):
				// Unknown whether an earlier edit exists: editing the
				// original could silently drop it.
				return nil, fmt.Errorf("replay %s: %w", id, err)
			}
			oldCopy = e.BodyRef
		}
		body, err := q.Body(ctx, src)
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", id, err)
		}
		edited, err := EditHeaders(body, editHeaders)
		if err != nil {
			return nil, fmt.Errorf("replay %s: %w", id, err)
		}
		// Named for this envelope: a sibling of the same submission,
		// replayed too, gets its own copy; a later edit replaces it.
		ref := EditedBodyRef(e)
		if _, err := q.bodies.PutBytes(ctx, ref, edited); err != nil {
			return nil, fmt.Errorf("replay %s: store edited body: %w", id, err)
		}
		e.BodyRef, e.Signed, e.Size = ref, false, int64(len(edited))
	}
	if len(editHeaders) == 0 && !e.Inline() {
		// An edit stored a new body above; otherwise the stored one must
		// last as long as the replayed envelope can need it.
		if err := q.refreshBody(ctx, e); err != nil {
			return nil, fmt.Errorf("replay %s: %w", id, err)
		}
	}
	e.Replays++
	e.Step++
	e.Attempt, e.ThrottleCount = 0, 0
	e.FirstAttempt, e.NotBefore = time.Time{}, time.Time{}
	e.Deadline = time.Now().Add(q.opts.DeadlineAfter)
	e.LastClass, e.LastReply = "", ""
	// The tenant's consumer may be gone (deleted by an operator, or the
	// envelope came from a daemon of another fleet).
	tenant, err := q.ensureTenant(ctx, e.Tenant)
	if err != nil {
		return nil, fmt.Errorf("replay %s: tenant consumer: %w", id, err)
	}
	m, err := e.Encode(workSubject(e.Tenant, e.Dest, e.ID))
	if err != nil {
		return nil, err
	}
	// Stamped before the publish, as Enqueue's queued event: a worker may
	// deliver the replayed envelope before its replayed event is written.
	replayed := time.Now().UTC()
	ack, err := q.js.PublishMsg(ctx, m, jetstream.WithMsgID("replay."+e.ID+"."+itoa(e.Replays)))
	if err != nil {
		return nil, fmt.Errorf("replay %s: %w", id, err)
	}
	if ack.Duplicate {
		// Another replay of the same dead letter (a second operator,
		// the console and the CLI at once) published first: the mail is
		// queued once, by it, and it removes the dead letter. Both were
		// told "queued again"; this one is told it was not its doing.
		return nil, fmt.Errorf("%w: %s was replayed by another operator at the same moment (replay %d); this replay did nothing", ErrWrongState, id, e.Replays)
	}
	// The new work envelope (and an edited body) on disk before the dead
	// letter goes.
	if err := q.durable(ctx, StreamWork, bodyStreamName); err != nil {
		return nil, fmt.Errorf("replay %s: %w", id, err)
	}
	q.wake(tenant)
	if _, err := q.deleteItem(ctx, it); err != nil {
		return nil, err
	}
	// Attempt is the attempts spent before the replay; the reason says
	// what the replay changed (OperatorEventTypes).
	q.Event(EventReplayed, &Event{Time: replayed, ID: id, MsgID: e.MsgID, Tenant: e.Tenant, Dest: e.Dest, Attempt: it.Env.Attempt,
		Worker: operator(opts.By), Reason: replayReason(it, e, opts), Recipients: e.Rcpts})
	if oldCopy != "" {
		if err := q.deleteBody(ctx, oldCopy); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			q.log.Warn().Err(err).Str("msg_id", e.MsgID).Str("body", oldCopy).Msg("replay: delete the replaced signed copy")
		}
	}
	return e, nil
}

// bodyKeepSlack is what refreshBody keeps a replayed envelope's body
// beyond the latest its dead letter could need it, as the bucket's TTL has
// a day of slack.
const bodyKeepSlack = 24 * time.Hour

// refreshBody stores e's body again, under the same name, when the Object
// Store's TTL would take it before the replayed envelope could need it
// last: dead-lettered again at its new deadline (DeadlineAfter from now)
// and kept there the dead letters' age. The bucket's TTL counts from
// when the body was stored, and outlives every dead letter of the first
// life only: a body stored at T0, dead at T0+1d, replayed at T0+14d and
// dead again by T0+15d, its dead letter kept to T0+29d, expired at T0+19d,
// and a second replay found "body missing". Storing it again replaces the
// object (new chunk and info, the old chunk purged) with the same bytes,
// which the submission's other envelopes share unchanged. A DKIM-signed
// envelope's unsigned original, which a replay with --edit-headers
// reads, is refreshed too when it is still there.
func (q *Queue) refreshBody(ctx context.Context, e *Envelope) error {
	deadAge := q.opts.DeadMaxAge
	if q.dead != nil && q.dead.CachedInfo() != nil && q.dead.CachedInfo().Config.MaxAge > 0 {
		deadAge = q.dead.CachedInfo().Config.MaxAge // the daemons' --dead-max-age, whatever this client's
	}
	need := time.Now().Add(q.opts.DeadlineAfter + deadAge + bodyKeepSlack)
	refs := []string{e.BodyRef}
	if e.Signed && e.BodyRef != e.MsgID {
		refs = append(refs, e.MsgID)
	}
	for i, ref := range refs {
		until, err := q.BodyKeptUntil(ctx, &Envelope{BodyRef: ref})
		if errors.Is(err, jetstream.ErrObjectNotFound) && i > 0 {
			continue // the original of a signed copy, already gone: nothing delivers it
		}
		if err != nil {
			return fmt.Errorf("body %s: %w", ref, err)
		}
		if !until.Before(need) {
			continue
		}
		body, err := q.Body(ctx, ref)
		if err != nil {
			if i > 0 && errors.Is(err, ErrBodyMissing) {
				continue
			}
			return err
		}
		if err := q.putBody(ctx, ref, body); err != nil {
			return fmt.Errorf("store body %s again: %w", ref, err)
		}
		// The info Body remembered names the chunk just replaced: a
		// release would purge that one and leave the new one.
		q.bodyInfos.take(ref)
		q.log.Info().Str("msg_id", e.ID).Str("body", ref).Time("was_kept_until", until).
			Msg("replay: body stored again to outlive the replayed envelope")
	}
	return nil
}

// Drop removes an envelope wherever it waits and records a "dropped" event
// by an operator. An envelope a worker is delivering at this moment may
// still be delivered by that attempt, but its next step (a retry, a hold, a
// dead letter) is not written: the worker finds the drop's marker
// (Delivery.Dropped). A copy a worker has fetched and not yet started, or
// one its schedule fires while the drop runs, is not sent (see drop).
func (q *Queue) Drop(ctx context.Context, id string) (*Item, error) {
	return q.DropBy(ctx, id, OperatorAdmin)
}

// DropBy is Drop in the name of by (the dropped event's worker_id:
// "admin:USER@HOST" from `outflow queue drop`, "api" for a tenant's own
// cancellation; empty is OperatorAdmin).
func (q *Queue) DropBy(ctx context.Context, id, by string) (*Item, error) {
	it, err := q.Find(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := q.drop(ctx, it, by); err != nil {
		return nil, err
	}
	return it, nil
}

// drop is DropBy for the item Find returned.
//
// The server may fire a schedule between Find's read and the delete
// here: nats-server stores the due copy and then removes the schedule,
// both inside the stream, and the delete by the schedule's sequence finds
// nothing. The drop then removes that due copy too, and, for a copy a
// worker fetched before the removal (and for a queued envelope fetched
// and not yet started), writes the SENT marker of the envelope's step (an
// empty one, as a bounce's Done writes): the worker's first look,
// AlreadyHandled, finds it and acknowledges the copy without sending it.
// The dropped marker alone is asked only before a next step is written,
// after the send. Before, a drop that lost that race stopped with an
// error ("no message found", msgGone) and no dropped event, and the due
// copy was sent; or, when its attempt was deferred, it vanished with no
// event saying why.
func (q *Queue) drop(ctx context.Context, it *Item, by string) error {
	id := it.Env.ID
	// The markers first: a worker holding the envelope now checks them
	// before it sends (the SENT marker) and before it writes the
	// envelope's next step (the dropped marker).
	q.count(OpSentPut)
	if _, err := q.sent.Put(ctx, droppedKey(it.Env), nil); err != nil {
		return fmt.Errorf("drop %s: %w", id, err)
	}
	marks := []*Envelope{it.Env}
	if it.State == StateDeferred && scheduledFirst(it.Env) {
		// A message sent later is moved to the work lane at the next
		// step when it fires (Delivery.ToWork): a worker that fetched
		// that copy before dropLaterCopy below removes it finds this
		// marker.
		moved := it.Env.Clone()
		moved.Step++
		marks = append(marks, moved)
	}
	for _, e := range marks {
		q.count(OpSentPut)
		if err := q.putMarker(ctx, e, nil); err != nil {
			return fmt.Errorf("drop %s: %w", id, err)
		}
	}
	deleted, err := q.deleteItem(ctx, it)
	if err != nil {
		return err
	}
	if !deleted && !it.Due && (it.State == StateDeferred || it.State == StateThrottled) {
		// The schedule was gone: fired, made due by a fast-forward or
		// rewritten by a release since Find read it.
		q.dropFiredCopy(ctx, it)
	}
	if it.State != StateQueued {
		// A scheduled message moved to the work lane between the look
		// above and the marker (Delivery.ToWork): its copy goes too.
		q.dropLaterCopy(ctx, it.Env)
	}
	q.Event(EventDropped, &Event{ID: id, MsgID: it.Env.MsgID, Tenant: it.Env.Tenant, Dest: it.Env.Dest, Attempt: it.Env.Attempt,
		Worker: operator(by), Reason: dropReason(it), Recipients: it.Env.Rcpts})
	if it.Env.BodyRef != "-" {
		q.releaseBody(ctx, it.Env)
	}
	return nil
}

// scheduledFirst reports whether e is a message sent later that has not
// been tried yet: the schedule Enqueue made, whose firing a worker moves
// to the work lane (Delivery.Scheduled).
func scheduledFirst(e *Envelope) bool {
	return e.Step == 0 && e.Attempt == 0 && !e.SendAt.IsZero() && !e.Probe
}

// dropFiredCopy deletes what holds the envelope of the schedule it at the
// same step now that the schedule itself is gone: its due copy (the
// schedule fired, or a fast-forward made it due), or a schedule that
// replaced it (a release rewrites the schedule under a new sequence). A
// later step is another envelope's: a worker's retry written before it
// saw the drop's marker.
func (q *Queue) dropFiredCopy(ctx context.Context, it *Item) {
	lane := LaneRetry
	if it.State == StateThrottled {
		lane = LaneRateLimit
	}
	for _, subj := range []string{dueSubject(lane, it.Env.Dest, it.Env.ID), schedSubject(lane, it.Env.Dest, it.Env.ID)} {
		m, err := q.lanes[lane].GetLastMsgForSubject(ctx, subj)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err == nil {
			step, serr := intHeader(m.Header, HdrStep)
			if serr != nil || step != it.Env.Step || m.Sequence == it.Seq {
				continue
			}
			err = q.lanes[lane].DeleteMsg(ctx, m.Sequence)
		}
		if err != nil && !msgGone(err) {
			q.log.Warn().Err(err).Str("msg_id", it.Env.ID).Str("subject", subj).
				Msg("drop: a copy of a schedule that fired or moved meanwhile not removed; a worker acknowledges it unsent")
		}
	}
}

// dropLaterCopy deletes the work lane's copy of e at a later step, if
// there is one.
func (q *Queue) dropLaterCopy(ctx context.Context, e *Envelope) {
	m, err := q.lanes[LaneWork].GetLastMsgForSubject(ctx, workSubject(e.Tenant, e.Dest, e.ID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return
	}
	if err == nil && laterStep(m.Header, e) {
		err = q.lanes[LaneWork].DeleteMsg(ctx, m.Sequence)
	}
	if err != nil && !msgGone(err) {
		q.log.Warn().Err(err).Str("msg_id", e.ID).Msg("drop: the work lane's copy of a scheduled message not removed")
	}
}

// deleteItem deletes the stored message it names, and reports whether it
// was still there.
func (q *Queue) deleteItem(ctx context.Context, it *Item) (bool, error) {
	var s jetstream.Stream
	switch it.State {
	case StateQueued:
		s = q.lanes[LaneWork]
	case StateDeferred, StateUnknown:
		s = q.lanes[LaneRetry]
	case StateThrottled:
		s = q.lanes[LaneRateLimit]
	case StateDead:
		s = q.dead
	}
	err := s.DeleteMsg(ctx, it.Seq)
	if msgGone(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", it.Env.ID, err)
	}
	return true, nil
}

// msgGone reports whether a DeleteMsg error says the message was no
// longer stored (removed meanwhile: a schedule that fired, an envelope a
// worker acknowledged). nats.go does not return ErrMsgNotFound for it: it
// wraps the server's answer as text after ErrMsgDeleteUnsuccessful, and
// nats-server answers a missing sequence with JSStreamMsgDeleteFailedF
// (10057) carrying its store's ErrStoreMsgNotFound, "no message found",
// or with JSSequenceNotFoundErrF (10043) when the store removed nothing
// (jsMsgDeleteRequest in server/jetstream_api.go). Taken for a failure,
// a drop that lost the race with a firing stopped half-way with an error.
func msgGone(err error) bool {
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		return err != nil
	}
	if !errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
		return false
	}
	s := err.Error()
	return strings.Contains(s, "err_code=10057 description=no message found") || strings.Contains(s, "err_code=10043 ")
}

// Released is one envelope a release rescheduled (ReleaseDest).
type Released struct {
	ID     string
	MsgID  string
	Tenant string
	Dest   string
	Lane   Lane
	// Position is the envelope's place in the release, from 1, oldest
	// submission first; with Rate, it gives At.
	Position int
	// Of is how many envelopes the release found.
	Of   int
	Rate float64
	// At is the time written to the envelope's schedule (HdrNotBefore,
	// Nats-Schedule), on the NATS server's clock.
	At time.Time
}

// ReleaseDest reschedules every deferred and throttled envelope of dest,
// oldest submission first, to fire at rate per second from now (all at
// once when rate <= 0). The throttle calls it when a destination
// recovers, so a backlog drains at the destination's pace instead of each
// envelope waiting out its own backoff. Each rewrite replaces the schedule
// on its subject and expects the sequence it read, so an envelope that
// fired meanwhile is left alone. Mail sent later (Submission.SendAt) whose
// time has not come is left alone too. It returns each envelope it
// rescheduled, in order.
//
// dest is a recipient domain, found through the lane subjects. For a
// provider group, pass dest "" and match, which is asked about every
// deferred envelope's domain. offset is how far the NATS server's clock,
// on which the schedules fire, is ahead of this process's (the throttle's
// ClockOffset; 0 when unknown): a release paced on a clock behind the
// server's would be written in the past and fire at once.
//
// Each envelope released gets a "released" event (EventReleased) in the
// name of by (its worker_id) with the time written to its schedule; the
// daemon also logs the returned records.
func (q *Queue) ReleaseDest(ctx context.Context, by, dest string, match func(domain string) bool, rate float64, offset time.Duration) ([]Released, error) {
	var items []Item
	now := time.Now()
	for _, st := range []State{StateDeferred, StateThrottled} {
		stream, subs := q.where(st, dest)
		err := q.scan(ctx, stream, subs[0], func(it Item) bool {
			if match != nil && !match(it.Env.Dest) {
				return true
			}
			if it.Env.SendAt.After(now) {
				// Mail sent later waits for its time, not for the
				// destination: a recovery does not send it early.
				return true
			}
			it.State = st
			it.Env.Body = nil // read again when it is rewritten: a backlog's bodies do not fit in memory
			items = append(items, it)
			return true
		})
		if err != nil {
			return nil, err
		}
	}
	sort.SliceStable(items, func(i, j int) bool { return items[i].Env.SubmittedAt.Before(items[j].Env.SubmittedAt) })
	var out []Released
	for i, it := range items {
		at := now.Add(offset)
		if rate > 0 {
			at = at.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		}
		lane := LaneRetry
		if it.State == StateThrottled {
			lane = LaneRateLimit
		}
		if it.Env.Inline() {
			raw, err := q.lanes[lane].GetMsg(ctx, it.Seq)
			if errors.Is(err, jetstream.ErrMsgNotFound) {
				continue // fired meanwhile
			}
			if err != nil {
				return out, fmt.Errorf("release %s: %w", it.Env.ID, err)
			}
			again, err := DecodeEnvelope(raw.Data, raw.Header)
			if err != nil || again.ID != it.Env.ID {
				continue // replaced meanwhile; the sequence check would refuse it anyway
			}
			it.Env.Body = again.Body
		}
		data, err := it.Env.data()
		if err != nil {
			return out, fmt.Errorf("release %s: %w", it.Env.ID, err)
		}
		m := nats.NewMsg(it.Subject)
		for k, v := range it.Header {
			if strings.HasPrefix(k, "Outflow-") {
				m.Header[k] = v
			}
		}
		m.Data = data
		m.Header.Set(HdrNotBefore, at.UTC().Format(time.RFC3339Nano))
		m.Header.Set("Nats-Schedule", "@at "+at.UTC().Format(time.RFC3339Nano))
		m.Header.Set("Nats-Schedule-Target", dueSubject(lane, it.Env.Dest, it.Env.ID))
		if _, err := q.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequenceForSubject(it.Seq, it.Subject)); err != nil {
			var apiErr *jetstream.APIError
			if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
				continue // fired or changed meanwhile
			}
			return out, fmt.Errorf("release %s: %w", it.Env.ID, err)
		}
		r := Released{ID: it.Env.ID, MsgID: it.Env.MsgID, Tenant: it.Env.Tenant, Dest: it.Env.Dest, Lane: lane,
			Position: i + 1, Of: len(items), Rate: rate, At: at.UTC()}
		out = append(out, r)
		// The envelope's own record of the re-timing, beside the
		// daemon's log line: `queue history` shows when it was released
		// and for when.
		q.Event(EventReleased, &Event{ID: r.ID, MsgID: r.MsgID, Tenant: r.Tenant, Dest: r.Dest, Attempt: it.Env.Attempt,
			Worker: by, Reason: r.reason(), Recipients: it.Env.Rcpts})
	}
	return out, nil
}

// reason is a released event's reason: the time written to the schedule
// and the envelope's place in the release ("next attempt
// 2026-12-01T10:00:01.5Z, 3 of 40 at 2/s, retry lane").
func (r Released) reason() string {
	pace := "all at once"
	if r.Rate > 0 {
		pace = "at " + strconv.FormatFloat(r.Rate, 'g', 4, 64) + "/s"
	}
	return fmt.Sprintf("next attempt %s, %d of %d %s, %s lane", r.At.Format(time.RFC3339Nano), r.Position, r.Of, pace, r.Lane)
}

// EditHeaders applies edits (RFC 5322 header lines) to body's header block:
// "Name: value" replaces every Name field with that value, and "Name:"
// removes them. A name on several lines sets one field per line, in order
// (two "Comments:" lines leave two Comments fields); a name both removed
// and set is refused, as is a line that is not a header field.
//
// The fields are written as the API writes those of a message it builds,
// since outflow relays without SMTPUTF8 and a raw 8-bit header is refused
// by the next hop (553 5.6.7):
//
//   - A name must be an RFC 5322 field name: printable ASCII (33 to 126)
//     other than ':'.
//   - A value with a control character (a bare CR or LF, NUL, any other
//     C0 or C1 control or DEL; a tab is white space) or that is not UTF-8
//     is refused.
//   - A non-ASCII value of an unstructured field (Subject, Comments, an
//     X- field, any field not named below) is written as RFC 2047 encoded
//     words (mime.QEncoding in UTF-8, what the API's headers and subject
//     get through go-message's SetText).
//   - In an address field (From, Sender, Reply-To, To, Cc, Bcc, their
//     Resent- forms, Disposition-Notification-To), only display names are
//     encoded (net/mail's Address.String, as the API's address fields): a
//     non-ASCII address (its local part or its domain) is refused, since
//     it needs SMTPUTF8 (write an internationalised domain in its A-label,
//     xn--…), and so is a non-ASCII value that is not an address list.
//   - Non-ASCII in a structured field where encoded words are not allowed
//     (Date, Message-ID, In-Reply-To, References, Content-*, MIME-Version,
//     Received, Return-Path, List-*, DKIM-Signature …) is refused.
//   - A field longer than 78 octets is folded at white space into lines
//     of at most 998 octets (RFC 5322 section 2.1.1); a word too long to
//     fit a line of 998 is refused (splitting it would change the value).
func EditHeaders(body, edits []byte) ([]byte, error) {
	type edit struct {
		name   string
		values []string // empty: remove
		line   int      // the first line naming it
		remove int      // the line of a "Name:" without a value, or 0
	}
	addressFields := map[string]bool{"from": true, "sender": true, "reply-to": true, "to": true, "cc": true, "bcc": true,
		"resent-from": true, "resent-sender": true, "resent-to": true, "resent-cc": true, "resent-bcc": true,
		"disposition-notification-to": true}
	structuredFields := map[string]bool{"date": true, "message-id": true, "in-reply-to": true, "references": true,
		"resent-date": true, "resent-message-id": true, "return-path": true, "received": true, "mime-version": true,
		"dkim-signature": true, "arc-seal": true, "arc-message-signature": true, "arc-authentication-results": true,
		"authentication-results": true, "feedback-id": true, "precedence": true, "auto-submitted": true}
	structuredPrefix := []string{"content-", "list-"}
	// encode returns value as it is written after "name: ", or why it
	// cannot be.
	encode := func(name, value string) (string, error) {
		if !utf8.ValidString(value) {
			return "", errors.New("the value is not UTF-8")
		}
		for _, r := range value {
			switch {
			case r == '\r' || r == '\n':
				return "", fmt.Errorf("a CR or LF in the value (%U): a value is one line; long values are folded", r)
			case r == 0:
				return "", errors.New("a NUL in the value")
			case r != '\t' && (r < 0x20 || r == 0x7f || r >= 0x80 && r <= 0x9f):
				return "", fmt.Errorf("a control character in the value (%U)", r)
			}
		}
		if ascii.IsString(value) {
			return value, nil
		}
		lower := strings.ToLower(name)
		switch {
		case addressFields[lower]:
			list, err := mail.ParseAddressList(value)
			if err != nil || len(list) == 0 {
				return "", errors.New("non-ASCII in an address field that is not a list of addresses (write display names as \"Name\" <user@example.com>)")
			}
			out := make([]string, len(list))
			for i, a := range list {
				if !ascii.IsString(a.Address) {
					return "", fmt.Errorf("the address %q is not ASCII: it needs SMTPUTF8, which outflow does not send (write an internationalised domain in its A-label, xn--…); only display names may be non-ASCII", a.Address)
				}
				out[i] = a.String() // a non-ASCII name as encoded words
			}
			return strings.Join(out, ", "), nil
		case structuredFields[lower] || slices.ContainsFunc(structuredPrefix, func(p string) bool { return strings.HasPrefix(lower, p) }):
			return "", errors.New("non-ASCII in a structured field, where RFC 2047 encoded words are not allowed: write it in ASCII")
		}
		return mime.QEncoding.Encode("utf-8", value), nil
	}
	// fold writes "name: value" as lines of at most 78 octets where it
	// can, breaking before white space, and refuses a line over 998.
	fold := func(name, value string) (string, error) {
		field := name + ": " + value
		var b strings.Builder
		line := name + ":"
		for rest := " " + value; rest != ""; {
			// The next part: white space and the word after it.
			i := 0
			for i < len(rest) && (rest[i] == ' ' || rest[i] == '\t') {
				i++
			}
			j := strings.IndexAny(rest[i:], " \t")
			if j < 0 {
				j = len(rest)
			} else {
				j += i
			}
			part := rest[:j]
			rest = rest[j:]
			if len(line)+len(part) > 78 && strings.TrimSpace(line) != name+":" {
				b.WriteString(line + "\r\n")
				line = ""
			}
			line += part
		}
		b.WriteString(line + "\r\n")
		out := b.String()
		for _, l := range strings.Split(strings.TrimSuffix(out, "\r\n"), "\r\n") {
			if len(l) > 998 {
				return "", errors.New("a word too long to fold into lines of 998 octets (folding breaks only at spaces; splitting the word would change the value)")
			}
		}
		if strings.ReplaceAll(out, "\r\n", "") != field {
			return "", errors.New("the value cannot be folded without changing it")
		}
		return out, nil
	}
	short := func(s string) string {
		if len(s) > 80 {
			return s[:80] + "…"
		}
		return s
	}
	var list []*edit
	byName := map[string]*edit{}
	sc := bufio.NewScanner(bytes.NewReader(edits))
	for ln := 1; sc.Scan(); ln++ {
		line := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, fmt.Errorf("edit-headers line %d: %q is not a \"Name: value\" header line", ln, short(line))
		}
		for i := 0; i < len(name); i++ {
			if c := name[i]; c < 33 || c > 126 {
				return nil, fmt.Errorf("edit-headers line %d: %q is not a header field name: RFC 5322 allows only printable ASCII other than ':' (33 to 126)", ln, short(name))
			}
		}
		e := byName[strings.ToLower(name)]
		if e == nil {
			e = &edit{name: name, line: ln}
			byName[strings.ToLower(name)] = e
			list = append(list, e)
		}
		if value = strings.Trim(value, " \t"); value == "" {
			e.remove = ln
		} else {
			enc, err := encode(name, value)
			if err == nil {
				enc, err = fold(name, enc)
			}
			if err != nil {
				return nil, fmt.Errorf("edit-headers line %d: %s: %w", ln, name, err)
			}
			e.values = append(e.values, enc)
		}
		if e.remove != 0 && len(e.values) > 0 {
			return nil, fmt.Errorf("edit-headers line %d: %s is both removed (line %d) and set: say one", ln, e.name, e.remove)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("edit-headers: %w", err)
	}
	end := bytes.Index(body, []byte("\r\n\r\n"))
	if end < 0 {
		return nil, errors.New("message has no header/body separator")
	}
	head, rest := string(body[:end+2]), body[end+2:]
	// Unfold into logical header fields.
	var fields []string
	for _, l := range strings.SplitAfter(head, "\r\n") {
		if l == "" {
			continue
		}
		if (l[0] == ' ' || l[0] == '\t') && len(fields) > 0 {
			fields[len(fields)-1] += l
			continue
		}
		fields = append(fields, l)
	}
	// One pass: the fields an edit names go, the rest keep their order,
	// and the edits' values follow in the order the edits came. (An edit
	// at a time rescanned every field: 16,000 edit lines took 11 s.)
	kept := fields[:0]
	for _, f := range fields {
		n, _, _ := strings.Cut(f, ":")
		if byName[strings.ToLower(strings.TrimSpace(n))] == nil {
			kept = append(kept, f)
		}
	}
	fields = kept
	for _, e := range list {
		fields = append(fields, e.values...) // each "Name: value\r\n", encoded and folded
	}
	var b bytes.Buffer
	for _, f := range fields {
		b.WriteString(f)
	}
	b.Write(rest)
	return b.Bytes(), nil
}
