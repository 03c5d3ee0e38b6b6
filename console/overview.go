package console

import (
	"html/template"
	"net/http"
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
	Flags     []string // suspended, throttled, learning, breaker open
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
	for _, st := range stats {
		if st.Lane == queue.LaneHeld {
			held = st.Depth
		}
	}
	var lanes []laneRow
	for _, st := range stats {
		l := laneRow{Lane: st.Lane, Label: laneLabels[st.Lane].label, State: laneLabels[st.Lane].state, Depth: st.Depth, Due: st.Due, Oldest: st.Oldest}
		if st.Lane == "retry" {
			l.Depth -= min(held, l.Depth) // shown on their own line
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
	dests, derrs := c.destRows(r, 10)
	errs = append(errs, derrs...)
	c.render(w, r, s, http.StatusOK, "overview", "Overview", map[string]any{
		"Lanes": lanes, "Charts": charts, "Workers": workers, "Dests": dests, "Errors": errs,
		"Since": c.rates.startedAt(),
	})
}

func (r *rates) startedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.since
}

// destRows joins the shared state of every destination that has one with
// the mail waiting per destination: those with waiting mail first (most
// first), then the rest by name. limit bounds the rows (0: all).
func (c *Console) destRows(r *http.Request, limit int) ([]destRow, []string) {
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
		st, ok := byName[name]
		if !ok {
			st = throttle.DestState{Dest: name}
		}
		row := destRow{Dest: name, State: st, Waiting: w, Suspended: st.Suspended(now), Breaker: st.BreakerAt(now)}
		if c.cfg.Local != nil {
			l := c.cfg.Local(name)
			row.Local = &l
		}
		if row.Suspended {
			row.Flags = append(row.Flags, "suspended")
		}
		if st.RateFactor() < 1 || w.Throttled > 0 {
			row.Flags = append(row.Flags, "throttled")
		}
		if st.LearnedRate > 0 || st.LearnedConns > 0 {
			row.Flags = append(row.Flags, "learning")
		}
		if row.Breaker != "" && row.Breaker != "closed" {
			row.Flags = append(row.Flags, "breaker "+row.Breaker)
		}
		rows = append(rows, row)
		seen[name] = true
	}
	for _, w := range waiting {
		addRow(w.Dest, w)
	}
	for _, st := range states {
		if !seen[st.Dest] {
			addRow(st.Dest, queue.Waiting{Dest: st.Dest})
		}
	}
	if limit > 0 && len(rows) > limit {
		rows = rows[:limit]
	}
	return rows, errs
}
