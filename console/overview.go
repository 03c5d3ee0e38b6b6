package console

import (
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/throttle"
)

// laneRow is one lane of the overview.
type laneRow struct {
	Lane   string
	Label  string
	Depth  uint64
	Due    uint64
	Oldest time.Time
	State  queue.State // what `queue list --state` calls it
	// OldestNote qualifies Oldest when it is not the lane's oldest
	// envelope ("" when it is).
	OldestNote string
}

var laneLabels = map[string]struct {
	label string
	state queue.State
}{
	"work":      {"work (fresh mail)", queue.StateQueued},
	"retry":     {"retry (deferred)", queue.StateDeferred},
	"ratelimit": {"rate-limit (throttled)", queue.StateThrottled},
	"held":      {"held (unknown outcome)", queue.StateUnknown},
	"dead":      {"dead letters", queue.StateDead},
}

type chart struct {
	Type  string
	Total int
	SVG   template.HTML
}

// destRow is one destination in the tables.
type destRow struct {
	Dest      string
	State     throttle.DestState
	Local     *throttle.DestStatus
	Waiting   queue.Waiting
	Suspended bool
	Breaker   string
	Flags     []string // suspended, pinned, throttled, learning, breaker open
	// Notable: its shared state is worth seeing whatever mail waits (a
	// suspension, a pinned rate or connection limit, an open or half-open
	// breaker, a rate factor under 1, learned limits).
	Notable bool
}

// destQuery selects the rows of destRows.
type destQuery struct {
	limit        int    // at most this many rows (0: all)
	match        string // only the destinations whose name contains it ("": all)
	notableFirst bool   // the Notable rows before the others
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request, s *session) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	var errs []string
	stats, err := c.cfg.Queue.LaneStats(ctx)
	if err != nil {
		errs = append(errs, err.Error())
	}
	var held uint64
	var heldOldest time.Time
	for _, st := range stats {
		if st.Lane == queue.LaneHeld {
			held, heldOldest = st.Depth, st.Oldest
		}
	}
	var lanes []laneRow
	for _, st := range stats {
		l := laneRow{Lane: st.Lane, Label: laneLabels[st.Lane].label, State: laneLabels[st.Lane].state, Depth: st.Depth, Due: st.Due, Oldest: st.Oldest}
		if st.Lane == "retry" {
			l.Depth -= min(held, l.Depth) // shown on their own line
			if held > 0 && !heldOldest.After(st.Oldest) {
				// The held envelopes share the retry lane's stream, and its
				// oldest message is one of them: its age is the held line's.
				oldest, note, err := c.oldestDeferred(r, l)
				if err != nil {
					errs = append(errs, err.Error())
				}
				l.Oldest, l.OldestNote = oldest, note
			}
		}
		lanes = append(lanes, l)
	}
	series := c.rates.series()
	charts := make([]chart, len(chartTypes))
	for i, t := range chartTypes {
		total := 0
		for _, n := range series[i] {
			total += n
		}
		charts[i] = chart{Type: t, Total: total, SVG: minuteChart(t, series[i])}
	}
	workers, err := throttle.ListWorkers(ctx, c.registry)
	if err != nil {
		errs = append(errs, err.Error())
	}
	dests, _, derrs := c.destRows(r, destQuery{limit: 10})
	errs = append(errs, derrs...)
	c.render(w, r, s, http.StatusOK, "overview", "Overview", map[string]any{
		"Lanes": lanes, "Charts": charts, "Workers": workers, "Dests": dests, "Errors": errs,
		"Since": c.rates.startedAt(),
	})
}

// oldestDeferred is the retry lane's oldest deferred envelope, held
// envelopes left out, for when the lane's stream has a held envelope
// first: the first scheduled deferral (queue list --state deferred reads
// the scheduled ones first, a single look-up). Deferrals already due and
// waiting for a worker are not read (they would take reading every
// scheduled one first): when there are some, note says the age is that
// of the scheduled ones. Zero when none is scheduled.
func (c *Console) oldestDeferred(r *http.Request, l laneRow) (time.Time, string, error) {
	if l.Depth == 0 {
		return time.Time{}, "", nil
	}
	ctx, cancel := c.ctx(r)
	defer cancel()
	items, err := c.cfg.Queue.List(ctx, queue.Filter{State: queue.StateDeferred, Limit: 1})
	if err != nil || len(items) == 0 {
		return time.Time{}, "", err
	}
	note := ""
	if !items[0].Due && l.Due > 0 { // a due one was listed: none is scheduled
		note = "of those scheduled; not of those due now"
	}
	return items[0].Stored, note, nil
}

func (r *rates) startedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.since
}

// destRows joins the shared state of every destination that has one with
// the mail waiting per destination: those with waiting mail first (most
// first), then the rest by name; with q.notableFirst, the Notable rows
// before the others, each part in that order. It returns at most q.limit
// rows and how many there are in all.
func (c *Console) destRows(r *http.Request, q destQuery) ([]destRow, int, []string) {
	ctx, cancel := c.ctx(r)
	defer cancel()
	var errs []string
	states, err := throttle.ListStates(ctx, c.state)
	if err != nil {
		errs = append(errs, err.Error())
	}
	waiting, err := c.cfg.Queue.WaitingByDest(ctx)
	if err != nil {
		errs = append(errs, err.Error())
	}
	byName := map[string]throttle.DestState{}
	for _, st := range states {
		byName[st.Dest] = st
	}
	now := c.cfg.Now()
	var rows []destRow
	seen := map[string]bool{}
	addRow := func(name string, w queue.Waiting) {
		seen[name] = true
		if q.match != "" && !strings.Contains(name, q.match) {
			return
		}
		st, ok := byName[name]
		if !ok {
			st = throttle.DestState{Dest: name}
		}
		row := destRow{Dest: name, State: st, Waiting: w, Suspended: st.Suspended(now), Breaker: st.BreakerAt(now)}
		pinRate, pinConns := st.OwnLimits(now)
		learned := st.LearnedRate > 0 || st.LearnedConns > 0
		open := row.Breaker != "" && row.Breaker != throttle.BreakerClosed
		row.Notable = row.Suspended || pinRate > 0 || pinConns > 0 || open || st.RateFactor() < 1 || learned
		if row.Suspended {
			row.Flags = append(row.Flags, "suspended")
		}
		if pinRate > 0 || pinConns > 0 {
			row.Flags = append(row.Flags, "pinned")
		}
		if st.RateFactor() < 1 || w.Throttled > 0 {
			row.Flags = append(row.Flags, "throttled")
		}
		if learned {
			row.Flags = append(row.Flags, "learning")
		}
		if open {
			row.Flags = append(row.Flags, "breaker "+row.Breaker)
		}
		rows = append(rows, row)
	}
	for _, w := range waiting {
		addRow(w.Dest, w)
	}
	for _, st := range states {
		if !seen[st.Dest] {
			addRow(st.Dest, queue.Waiting{Dest: st.Dest})
		}
	}
	if q.notableFirst {
		slices.SortStableFunc(rows, func(a, b destRow) int {
			switch {
			case a.Notable == b.Notable:
				return 0
			case a.Notable:
				return -1
			}
			return 1
		})
	}
	total := len(rows)
	if q.limit > 0 && len(rows) > q.limit {
		rows = rows[:q.limit]
	}
	if c.cfg.Local != nil {
		for i := range rows {
			l := c.cfg.Local(rows[i].Dest)
			rows[i].Local = &l
		}
	}
	return rows, total, errs
}
