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

// rates counts events per type and minute over the last hour, from the
// events stream, and keeps the newest bounces.
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

func (r *rates) add(typ string, at time.Time, ev []byte) {
	i := -1
	for k, t := range chartTypes {
		if t == typ {
			i = k
		}
	}
	if i < 0 {
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
	c[i]++
	if typ == queue.EventBounced && ev != nil {
		var e queue.Event
		if json.Unmarshal(ev, &e) == nil {
			r.bounces = append(r.bounces, bounce{Time: at, ID: e.ID, Tenant: e.Tenant, Dest: e.Dest, Reply: e.Reason})
			if len(r.bounces) > maxBounces {
				r.bounces = append(r.bounces[:0:0], r.bounces[len(r.bounces)-maxBounces:]...)
			}
		}
	}
}

// series returns, per chart type, the counts of the last chartMinutes
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
		var body []byte
		if tok[2] == queue.EventBounced {
			body = m.Data()
		}
		r.add(tok[2], meta.Timestamp, body)
	}
}
