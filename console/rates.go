package console

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// chartTypes are the event types the overview charts, in their order.
var chartTypes = []string{queue.EventDelivered, queue.EventDeferred, queue.EventThrottled, queue.EventBounced}

// chartMinutes is the charts' span: one bar per minute.
const chartMinutes = 60

// maxBounces is how many recent bounced events are kept for the
// destinations' pages (the bounce-storm alert links there).
const maxBounces = 500

// bounce is one recent permanent failure.
type bounce struct {
	Time   time.Time
	ID     string
	Tenant string
	Dest   string
	Reply  string
}

// rates counts recipients per outcome and minute over the last hour, from
// the events stream, and keeps the newest bounces.
//
// The unit is the recipient, for every chart: a delivered, deferred or
// throttled event is one per attempt and lists the recipients it was for,
// a bounced event one per recipient; counting events would put a delivery
// to fifty recipients beside one bounce as one each. A deferred event
// without an attempt (a suspension's refusal, "suspended: …", which has
// no decision record) is left out, as the retry timeline leaves it out:
// no server was asked. A bounce mailed back after delivery (Async) is
// counted: the recipient did bounce.
type rates struct {
	now     func() time.Time
	mu      sync.Mutex
	counts  map[int64]*[4]int // minute (Unix seconds / 60) -> count per chartTypes
	bounces []bounce          // newest last
	since   time.Time         // when following started (the charts are complete after it)
}

func newRates(now func() time.Time) *rates {
	return &rates{now: now, counts: map[int64]*[4]int{}}
}

// chartEvent is what the charts read of an event.
type chartEvent struct {
	ID         string          `json:"id"`
	Tenant     string          `json:"tenant"`
	Dest       string          `json:"dest"`
	Reason     string          `json:"reason"`
	Rcpts      int             `json:"rcpts"`
	Recipients []string        `json:"recipients"`
	Decision   json.RawMessage `json:"decision"`
}

// recipients is how many recipients ev counts for in the charts: those it
// names (or counts), one when it says neither; 0 for a deferral that was
// no attempt.
func (ev *chartEvent) recipients(typ string) int {
	if (typ == queue.EventDeferred || typ == queue.EventThrottled) && len(ev.Decision) == 0 {
		return 0
	}
	switch {
	case len(ev.Recipients) > 0:
		return len(ev.Recipients)
	case ev.Rcpts > 0:
		return ev.Rcpts
	}
	return 1
}

// add counts the event of type typ stored at at, whose JSON is data.
func (r *rates) add(typ string, at time.Time, data []byte) {
	i := -1
	for k, t := range chartTypes {
		if t == typ {
			i = k
		}
	}
	if i < 0 {
		return
	}
	var ev chartEvent
	if json.Unmarshal(data, &ev) != nil {
		return
	}
	n := ev.recipients(typ)
	if n == 0 {
		return
	}
	min := at.Unix() / 60
	r.mu.Lock()
	defer r.mu.Unlock()
	oldest := r.now().Unix()/60 - chartMinutes
	if min <= oldest {
		return
	}
	c := r.counts[min]
	if c == nil {
		c = &[4]int{}
		r.counts[min] = c
		for m := range r.counts {
			if m <= oldest {
				delete(r.counts, m)
			}
		}
	}
	c[i] += n
	if typ == queue.EventBounced {
		r.bounces = append(r.bounces, bounce{Time: at, ID: ev.ID, Tenant: ev.Tenant, Dest: ev.Dest, Reply: ev.Reason})
		if len(r.bounces) > maxBounces {
			r.bounces = append(r.bounces[:0:0], r.bounces[len(r.bounces)-maxBounces:]...)
		}
	}
}

// series returns, per chart type, the recipients of the last chartMinutes
// minutes, oldest first (the current minute last).
func (r *rates) series() [][]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now().Unix() / 60
	out := make([][]int, len(chartTypes))
	for i := range out {
		out[i] = make([]int, chartMinutes)
	}
	for k := 0; k < chartMinutes; k++ {
		if c := r.counts[now-int64(chartMinutes-1-k)]; c != nil {
			for i := range chartTypes {
				out[i][k] = c[i]
			}
		}
	}
	return out
}

// recentBounces returns the newest bounces for dest ("" for all), newest
// first, at most n.
func (r *rates) recentBounces(dest string, n int) []bounce {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []bounce
	for i := len(r.bounces) - 1; i >= 0 && len(out) < n; i-- {
		if dest == "" || strings.EqualFold(r.bounces[i].Dest, dest) {
			out = append(out, r.bounces[i])
		}
	}
	return out
}

// follow reads the events stream from an hour back until ctx ends, with
// an ordered consumer (it recreates itself when the server loses it),
// starting again after an error.
func (r *rates) follow(ctx context.Context, q *queue.Queue, log zerolog.Logger) {
	filters := make([]string, len(chartTypes))
	for i, t := range chartTypes {
		filters[i] = queue.EventTypeFilter(t)
	}
	for ctx.Err() == nil {
		start := r.now().Add(-chartMinutes * time.Minute)
		r.mu.Lock()
		r.counts = map[int64]*[4]int{}
		r.bounces = nil
		r.since = r.now()
		r.mu.Unlock()
		err := r.consume(ctx, q, filters, start)
		if ctx.Err() != nil {
			return
		}
		log.Warn().Err(err).Msg("console: following the events stream; again in 5s")
		select {
		case <-ctx.Done():
			return
		case <-time.After(5 * time.Second):
		}
	}
}

func (r *rates) consume(ctx context.Context, q *queue.Queue, filters []string, start time.Time) error {
	cons, err := q.EventReader(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: filters, DeliverPolicy: jetstream.DeliverByStartTimePolicy, OptStartTime: &start,
	})
	if err != nil {
		return err
	}
	it, err := cons.Messages()
	if err != nil {
		return err
	}
	// Stopped when the console ends (to wake a Next that waits) and when
	// this follow ends on an error, before the next one starts.
	stop := context.AfterFunc(ctx, it.Stop)
	defer func() {
		stop()
		it.Stop()
	}()
	for {
		m, err := it.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		meta, merr := m.Metadata()
		if merr != nil {
			continue
		}
		// outflow.events.<type>.<tenant shard>.<id shard>, or, as written
		// before tenant shards, outflow.events.<type>.<shard>
		tok := strings.Split(m.Subject(), ".")
		if len(tok) != 4 && len(tok) != 5 {
			continue
		}
		r.add(tok[2], meta.Timestamp, m.Data())
	}
}
