package worker

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
)

// Metrics are the worker's Prometheus collectors. Labels are bounded:
// class, lane, and the destination only where a destination is the point
// (throttles, a destination's bounces); never message ids or addresses.
// The destinations with series of their own are bounded too (destSeries).
type Metrics struct {
	Attempts        *prometheus.CounterVec   // outflow_attempts_total{class,lane}
	Delivered       prometheus.Counter       // outflow_delivered_recipients_total
	Bounced         prometheus.Counter       // outflow_bounced_recipients_total
	DeadLetters     prometheus.Counter       // outflow_dead_letters_total
	Unknown         prometheus.Counter       // outflow_unknown_outcomes_total
	Throttles       *prometheus.CounterVec   // outflow_throttle_events_total{dest}
	DestAttempts    *prometheus.CounterVec   // outflow_dest_attempts_total{dest,class}
	DeliveryLatency prometheus.Histogram     // outflow_delivery_latency_seconds (submission to delivery)
	RetryDelay      *prometheus.HistogramVec // outflow_retry_delay_seconds{lane}
	Panics          prometheus.Counter       // outflow_worker_panics_total
	Refusals        *prometheus.CounterVec   // outflow_gate_refusals_total{reason}

	dests    destSeries
	deferred deferredAges // outflow_deferred_message_age_seconds{lane}
}

// deferredAges keeps, per lane, the age of the oldest message deferred to
// it: how long ago it was ready to go (Envelope.ReadyAt). A message still
// being retried six hours after submission is what an operator wants to
// hear of (OutflowLongLivedRetries); the lane's oldest write does not say
// it, since every deferral rewrites the message, and a message sent later
// sits in the lane for as long as it was asked to. The gauge is the
// largest age a message had when it was deferred, in the current span of
// deferredSpan or the one before: a message still deferred is deferred
// again within a span (retry-cap and ratelimit-cap are under it by
// default) and keeps it up at its age then; one delivered since does not
// age there, and it falls to 0 two spans after the last deferral.
type deferredAges struct {
	mu        sync.Mutex
	start     time.Time          // of the current span
	cur, prev map[string]float64 // lane -> the largest age at a deferral in the span, in seconds
	now       func() time.Time   // time.Now; a test's clock
}

// deferredSpan is a span of deferredAges.
const deferredSpan = 30 * time.Minute

// rotate moves the spans on to now. a.mu held.
func (a *deferredAges) rotate(now time.Time) {
	switch since := now.Sub(a.start); {
	case since >= 2*deferredSpan:
		a.cur, a.prev, a.start = map[string]float64{}, map[string]float64{}, now
	case since >= deferredSpan:
		a.prev, a.cur, a.start = a.cur, map[string]float64{}, a.start.Add(deferredSpan)
	}
}

func (a *deferredAges) observe(lane string, ready time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	a.rotate(now)
	if age := now.Sub(ready).Seconds(); age > a.cur[lane] {
		a.cur[lane] = age
	}
}

// age is the largest age at a deferral of the two spans.
func (a *deferredAges) age(lane string) float64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.rotate(a.now())
	return max(a.cur[lane], a.prev[lane])
}

// Per-destination series (outflow_dest_attempts_total,
// outflow_throttle_events_total) are kept for at most destSeriesMax
// destinations at a time, and a destination's are removed after
// destSeriesIdle without an attempt. A sender reaches tens of thousands of
// recipient domains a day, most of them once: a series for each, kept for
// the life of the process, would grow the process and every scrape
// without end. The large destinations, the ones alerts are about, are
// never idle for long; a destination past the limit is counted under
// dest="other" until a place frees up.
const (
	destSeriesMax  = 1000
	destSeriesIdle = time.Hour
	// otherDest is the dest label of destinations past destSeriesMax.
	otherDest = "other"
)

// destSeries tracks which destinations have series, and since when they
// were last counted.
type destSeries struct {
	mu    sync.Mutex
	last  map[string]time.Time
	swept time.Time
	now   func() time.Time // time.Now; a test's clock
	max   int              // destSeriesMax; a test's
}

// destLabel is the dest label to count dest under: dest itself, or
// otherDest when destSeriesMax others have series. Every minute or so it
// removes the series of destinations idle for destSeriesIdle.
func (m *Metrics) destLabel(dest string) string {
	d := &m.dests
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	if now.Sub(d.swept) >= time.Minute {
		d.swept = now
		for name, at := range d.last {
			if now.Sub(at) >= destSeriesIdle {
				delete(d.last, name)
				for _, class := range attemptClasses {
					m.DestAttempts.DeleteLabelValues(name, class)
				}
				m.Throttles.DeleteLabelValues(name)
			}
		}
	}
	if _, ok := d.last[dest]; !ok && len(d.last) >= d.max {
		return otherDest
	}
	d.last[dest] = now
	return dest
}

// NewMetrics creates and registers the worker collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_attempts_total", Help: "Delivery attempts by reply class and the lane the envelope came from.",
		}, []string{"class", "lane"}),
		Delivered:   prometheus.NewCounter(prometheus.CounterOpts{Name: "outflow_delivered_recipients_total", Help: "Recipients delivered."}),
		Bounced:     prometheus.NewCounter(prometheus.CounterOpts{Name: "outflow_bounced_recipients_total", Help: "Recipients bounced (permanent failure)."}),
		DeadLetters: prometheus.NewCounter(prometheus.CounterOpts{Name: "outflow_dead_letters_total", Help: "Envelopes moved to dead letters (budget spent or expired)."}),
		Unknown:     prometheus.NewCounter(prometheus.CounterOpts{Name: "outflow_unknown_outcomes_total", Help: "Attempts with no reply to the final dot."}),
		Throttles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_throttle_events_total", Help: "Throttled replies by destination.",
		}, []string{"dest"}),
		// Per destination, so that an alert can see one destination's
		// share of permanent outcomes jump (a block or a broken list).
		DestAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_dest_attempts_total", Help: "Delivery attempt outcomes by destination and reply class.",
		}, []string{"dest", "class"}),
		DeliveryLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "outflow_delivery_latency_seconds", Help: "Time from submission to delivery.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600},
		}),
		RetryDelay: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "outflow_retry_delay_seconds", Help: "Computed delay of each deferral, by lane.",
			Buckets: []float64{.1, .5, 1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600},
		}, []string{"lane"}),
		Panics: prometheus.NewCounter(prometheus.CounterOpts{Name: "outflow_worker_panics_total", Help: "Deliveries that panicked (recovered)."}),
		Refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_gate_refusals_total", Help: "Envelopes deferred by the coordinator without an attempt, by reason.",
		}, []string{"reason"}),
		dests:    destSeries{last: map[string]time.Time{}, now: time.Now, max: destSeriesMax},
		deferred: deferredAges{cur: map[string]float64{}, prev: map[string]float64{}, now: time.Now},
	}
	m.deferred.start = m.deferred.now()
	// Every class and lane is exported from the start, at 0: a series
	// that does not exist yet makes a ratio or comparison in PromQL empty,
	// so OutflowRetryStorm (docs/alerts.yaml), which compares failures with
	// deliveries, could not fire on a process that has delivered nothing
	// since it started, which is the worst storm.
	for _, class := range attemptClasses {
		for _, lane := range []queue.Lane{queue.LaneWork, queue.LaneRetry, queue.LaneRateLimit} {
			m.Attempts.WithLabelValues(class, string(lane))
		}
	}
	reg.MustRegister(m.Attempts, m.Delivered, m.Bounced, m.DeadLetters, m.Unknown, m.Throttles, m.DestAttempts,
		m.DeliveryLatency, m.RetryDelay, m.Panics, m.Refusals)
	for _, lane := range []queue.Lane{queue.LaneRetry, queue.LaneRateLimit} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "outflow_deferred_message_age_seconds",
			Help:        "The largest age (since it was ready to go: submitted, or its send_at) a message had when this process deferred it to the lane, in the last 30 to 60 minutes; 0 when none.",
			ConstLabels: prometheus.Labels{"lane": string(lane)},
		}, func() float64 { return m.deferred.age(string(lane)) }))
	}
	return m
}

// attemptClasses are the class label values of outflow_attempts_total.
var attemptClasses = []string{classify.Delivered.String(), classify.Transient.String(), classify.Throttled.String(),
	classify.Permanent.String(), classify.Unknown.String()}

// The methods below are the only way the worker touches its metrics: each
// is a no-op on a nil *Metrics (a Pool without Config.Metrics).

func (m *Metrics) panic() {
	if m != nil {
		m.Panics.Inc()
	}
}

func (m *Metrics) attempt(class, lane, dest string) {
	if m != nil {
		m.Attempts.WithLabelValues(class, lane).Inc()
		dest = m.destLabel(dest)
		m.DestAttempts.WithLabelValues(dest, class).Inc()
		// A destination's permanent series exists, at 0, from its first
		// attempt on: OutflowBounceStorm compares its share with the day
		// before (offset 15m), and a destination that had never bounced
		// would have no series there, so the rule would stay silent
		// through the first 15 minutes of its first storm.
		if class != "permanent" {
			m.DestAttempts.WithLabelValues(dest, "permanent")
		}
	}
}

func (m *Metrics) delivered(n int, submitted time.Time) {
	if m != nil && n > 0 {
		m.Delivered.Add(float64(n))
		m.DeliveryLatency.Observe(time.Since(submitted).Seconds())
	}
}

func (m *Metrics) bounced(n int) {
	if m != nil && n > 0 {
		m.Bounced.Add(float64(n))
	}
}

func (m *Metrics) unknown() {
	if m != nil {
		m.Unknown.Inc()
	}
}

func (m *Metrics) throttled(dest string) {
	if m != nil {
		m.Throttles.WithLabelValues(m.destLabel(dest)).Inc()
	}
}

func (m *Metrics) retryDelay(lane string, d time.Duration) {
	if m != nil {
		m.RetryDelay.WithLabelValues(lane).Observe(d.Seconds())
	}
}

// deferredTo counts a message deferred to lane, ready to go since ready.
func (m *Metrics) deferredTo(lane string, ready time.Time) {
	if m != nil {
		m.deferred.observe(lane, ready)
	}
}

func (m *Metrics) refusal(reason string) {
	if m != nil {
		m.Refusals.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) deadLetter() {
	if m != nil {
		m.DeadLetters.Inc()
	}
}

// DSNMetrics counts notifications.
type DSNMetrics struct {
	Sent    *prometheus.CounterVec // outflow_dsn_total{action}
	Skipped *prometheus.CounterVec // outflow_dsn_skipped_total{reason}
}

// NewDSNMetrics creates and registers the notification counters on reg.
func NewDSNMetrics(reg prometheus.Registerer) *DSNMetrics {
	m := &DSNMetrics{
		Sent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_dsn_total", Help: "Delivery status notifications queued, by action (failed, delayed, relayed).",
		}, []string{"action"}),
		Skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_dsn_skipped_total", Help: "Notifications not sent, by reason (null-sender, report, tenant-off, notify, suppressed, rate-limited).",
		}, []string{"reason"}),
	}
	reg.MustRegister(m.Sent, m.Skipped)
	return m
}

// sent and skipped count a notice; like Metrics's methods, each is a no-op
// on a nil *DSNMetrics (a DSNConfig without Metrics).

func (m *DSNMetrics) sent(action string) {
	if m != nil {
		m.Sent.WithLabelValues(action).Inc()
	}
}

func (m *DSNMetrics) skipped(reason string) {
	if m != nil {
		m.Skipped.WithLabelValues(reason).Inc()
	}
}
