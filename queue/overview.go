package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LaneStat is how much waits in one lane, as the depth metrics and the
// console show it. Each is read from the stream and consumer info, a
// handful of JetStream API calls whatever the backlog.
type LaneStat struct {
	Lane string `json:"lane"` // work, retry, ratelimit, held or dead
	// Depth is the messages stored: for the deferred lanes their
	// schedules, due and (retry) held envelopes.
	Depth uint64 `json:"depth"`
	// Due is what is ready for a worker (pending plus in flight); 0 for
	// held and dead, which wait for an operator.
	Due uint64 `json:"due"`
	// Oldest is the time of the oldest stored message (its last write: a
	// deferral rewrites it); zero when the lane is empty.
	Oldest time.Time `json:"oldest,omitzero"`
}

// LaneHeld names the held envelopes (unknown outcomes waiting for an
// operator) in LaneStats; they are stored in the retry lane's stream.
const LaneHeld = "held"

// LaneStats reports every lane: work, retry, ratelimit, held, dead. The
// retry lane's Depth counts its held envelopes too (as the
// outflow_queue_depth metric does); the held entry counts them apart.
func (q *Queue) LaneStats(ctx context.Context) ([]LaneStat, error) {
	var out []LaneStat
	streams := []struct {
		lane string
		s    jetstream.Stream
	}{{string(LaneWork), q.lanes[LaneWork]}, {string(LaneRetry), q.lanes[LaneRetry]}, {string(LaneRateLimit), q.lanes[LaneRateLimit]}, {"dead", q.dead}}
	var errs []error
	for _, st := range streams {
		ls := LaneStat{Lane: st.lane}
		var err error
		if st.lane == string(LaneWork) {
			ls.Depth, ls.Oldest, err = q.workState(ctx, true) // the keeper left out
		} else {
			ls.Depth, ls.Oldest, err = streamState(ctx, st.s)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("lane %s: %w", st.lane, err))
			continue
		}
		if st.lane != "dead" {
			lister := st.s.ListConsumers(ctx)
			for ci := range lister.Info() {
				ls.Due += ci.NumPending + uint64(ci.NumAckPending)
			}
		}
		out = append(out, ls)
		if st.lane == string(LaneRetry) {
			held, err := q.heldStat(ctx)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			out = append(out, held)
		}
	}
	return out, errors.Join(errs...)
}

// streamState is a stream's message count and the time of its oldest
// message (zero when it holds none).
func streamState(ctx context.Context, s jetstream.Stream) (uint64, time.Time, error) {
	info, err := s.Info(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	if info.State.Msgs == 0 {
		return 0, time.Time{}, nil
	}
	return info.State.Msgs, info.State.FirstTime, nil
}

// heldStat counts the held envelopes: the retry stream's held subjects,
// one per envelope, and the oldest of them.
func (q *Queue) heldStat(ctx context.Context) (LaneStat, error) {
	ls := LaneStat{Lane: LaneHeld}
	s := q.lanes[LaneRetry]
	filter := heldFilter("*", "*")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return ls, fmt.Errorf("lane held: %w", err)
	}
	for _, n := range info.State.Subjects {
		ls.Depth += n
	}
	if ls.Depth > 0 {
		m, err := s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
		if err == nil {
			ls.Oldest = m.Time
		}
	}
	return ls, nil
}

// Waiting is how much mail waits for one destination.
type Waiting struct {
	Dest      string `json:"dest"`
	Queued    uint64 `json:"queued"`    // fresh, in the work lane
	Deferred  uint64 `json:"deferred"`  // in the retry lane (scheduled or due)
	Throttled uint64 `json:"throttled"` // in the rate-limit lane (scheduled or due)
}

// Total is all the destination's waiting mail.
func (w Waiting) Total() uint64 { return w.Queued + w.Deferred + w.Throttled }

// WaitingByDest counts the waiting envelopes per destination, most first.
// It lists the lanes' subjects (one per envelope), so it costs time in
// proportion to the backlog: about half a second for 200,000 envelopes.
func (q *Queue) WaitingByDest(ctx context.Context) ([]Waiting, error) {
	by := map[string]*Waiting{}
	get := func(tok string) *Waiting {
		d := Untoken(tok)
		w := by[d]
		if w == nil {
			w = &Waiting{Dest: d}
			by[d] = w
		}
		return w
	}
	lanes := []struct {
		lane Lane
		add  func(w *Waiting, n uint64)
	}{
		{LaneWork, func(w *Waiting, n uint64) { w.Queued += n }},
		{LaneRetry, func(w *Waiting, n uint64) { w.Deferred += n }},
		{LaneRateLimit, func(w *Waiting, n uint64) { w.Throttled += n }},
	}
	for _, l := range lanes {
		info, err := q.lanes[l.lane].Info(ctx, jetstream.WithSubjectFilter(laneSubjects(l.lane)))
		if err != nil {
			return nil, fmt.Errorf("waiting mail in lane %s: %w", l.lane, err)
		}
		for subj, n := range info.State.Subjects {
			// outflow.work.<tenant>.<dest>.<id>, outflow.<lane>.sched|due.<dest>.<id>;
			// held envelopes wait for an operator, not for the destination.
			tok := strings.Split(subj, ".")
			if len(tok) != 5 || tok[2] == "held" {
				continue
			}
			l.add(get(tok[3]), n)
		}
	}
	out := make([]Waiting, 0, len(by))
	for _, w := range by {
		out = append(out, *w)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Total() != out[j].Total() {
			return out[i].Total() > out[j].Total()
		}
		return out[i].Dest < out[j].Dest
	})
	return out, nil
}
