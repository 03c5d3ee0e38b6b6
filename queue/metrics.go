package queue

import (
	"context"
	"sync"
	"time"

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
//
// and, read from counters at every scrape, outflow_jetstream_ops_total{op}
// (ops.go) and outflow_work_tenants_pulled, the tenants whose mail this
// process is pulling now (tenants.go).
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
	ch <- opsDesc
	ch <- pulledDesc
}

// pulledDesc describes outflow_work_tenants_pulled.
var pulledDesc = prometheus.NewDesc("outflow_work_tenants_pulled",
	"Tenants whose fresh mail this process is pulling now: those with mail, or with mail within the last pull's wait (5 s).", nil, nil)

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
	c.q.collectOps(ch)
	ch <- prometheus.MustNewConstMetric(pulledDesc, prometheus.GaugeValue, float64(c.q.pulling.Load()))
}

func (c *DepthCollector) read() []prometheus.Metric {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	stats, _ := c.q.LaneStats(ctx) // a lane that cannot be read is left out
	var out []prometheus.Metric
	for _, st := range stats {
		if st.Lane == LaneHeld {
			continue // counted in the retry lane's depth
		}
		out = append(out, prometheus.MustNewConstMetric(c.depth, prometheus.GaugeValue, float64(st.Depth), st.Lane))
		age := 0.0
		if !st.Oldest.IsZero() {
			age = time.Since(st.Oldest).Seconds()
		}
		out = append(out, prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, st.Lane))
		if st.Lane != "dead" {
			out = append(out, prometheus.MustNewConstMetric(c.due, prometheus.GaugeValue, float64(st.Due), st.Lane))
		}
	}
	return out
}
