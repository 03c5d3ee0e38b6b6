package queue

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// DepthCollector reports how many envelopes wait in each lane, read from
// the streams and consumers when Prometheus scrapes (at most once a second;
// each read is a handful of JetStream API calls, independent of the
// backlog's size):
//
//	outflow_queue_depth{lane="work|retry|ratelimit|dead"}  stored messages
//	outflow_queue_due{lane="work|retry|ratelimit"}         ready for a worker (pending + in flight)
//	outflow_queue_oldest_seconds{lane}                     age of the oldest stored message (0 when empty)
type DepthCollector struct {
	q      *Queue
	depth  *prometheus.Desc
	due    *prometheus.Desc
	oldest *prometheus.Desc
	mu     sync.Mutex
	at     time.Time
	last   []prometheus.Metric
}

// NewDepthCollector returns a collector for q; register it once.
func NewDepthCollector(q *Queue) *DepthCollector {
	return &DepthCollector{
		q:     q,
		depth: prometheus.NewDesc("outflow_queue_depth", "Messages stored per lane (retry and rate-limit lanes: schedules, due and held envelopes).", []string{"lane"}, nil),
		due:   prometheus.NewDesc("outflow_queue_due", "Envelopes ready for a worker per lane (pending plus in flight).", []string{"lane"}, nil),
		oldest: prometheus.NewDesc("outflow_queue_oldest_seconds", "Age of the oldest message stored in the lane (its last write: a deferral rewrites it); 0 when empty.",
			[]string{"lane"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *DepthCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.depth
	ch <- c.due
	ch <- c.oldest
}

// Collect implements prometheus.Collector.
func (c *DepthCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > time.Second {
		c.last = c.read()
		c.at = time.Now()
	}
	for _, m := range c.last {
		ch <- m
	}
}

func (c *DepthCollector) read() []prometheus.Metric {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var out []prometheus.Metric
	streams := []struct {
		lane string
		s    jetstream.Stream
	}{{string(LaneWork), c.q.lanes[LaneWork]}, {string(LaneRetry), c.q.lanes[LaneRetry]}, {string(LaneRateLimit), c.q.lanes[LaneRateLimit]}, {"dead", c.q.dead}}
	for _, st := range streams {
		info, err := st.s.Info(ctx)
		if err != nil {
			continue
		}
		out = append(out, prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(info.State.Msgs), st.lane))
		age := 0.0
		if info.State.Msgs > 0 && !info.State.FirstTime.IsZero() {
			age = time.Since(info.State.FirstTime).Seconds()
		}
		out = append(out, prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, st.lane))
		if st.lane == "dead" {
			continue
		}
		var due uint64
		lister := st.s.ListConsumers(ctx)
		for ci := range lister.Info() {
			due += ci.NumPending + uint64(ci.NumAckPending)
		}
		out = append(out, prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(due), st.lane))
	}
	return out
}
