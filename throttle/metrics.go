package throttle

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// throttleMetrics are the Throttle's collectors. The dest label only ever
// carries destinations that have shared state (a suspension, a cut, a
// breaker, an override), and is removed when the state is deleted, so its
// cardinality is that of the outflow_dest bucket, not of all domains.
type throttleMetrics struct {
	reg         prometheus.Registerer
	suspended   *prometheus.GaugeVec   // outflow_dest_suspended{dest}
	factor      *prometheus.GaugeVec   // outflow_dest_rate_factor{dest}
	breaker     *prometheus.GaugeVec   // outflow_dest_breaker_state{dest}
	learned     *prometheus.GaugeVec   // outflow_dest_learned_rate{dest}
	learnedConn *prometheus.GaugeVec   // outflow_dest_learned_conns{dest}
	plateau     *prometheus.GaugeVec   // outflow_dest_learned_plateau{dest}
	live        prometheus.Gauge       // outflow_workers_live
	transitions *prometheus.CounterVec // outflow_dest_transitions_total{change}
	panics      prometheus.Counter     // outflow_coordinator_panics_total
	collectors  []prometheus.Collector // what this Throttle registered
}

// destGauge is a gauge with one series per destination.
func destGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"dest"})
}

func newThrottleMetrics(reg prometheus.Registerer) *throttleMetrics {
	m := &throttleMetrics{
		reg:         reg,
		suspended:   destGauge("outflow_dest_suspended", "1 while the destination is suspended."),
		factor:      destGauge("outflow_dest_rate_factor", "Adaptive rate factor of the destination (1 = configured rate)."),
		breaker:     destGauge("outflow_dest_breaker_state", "Circuit breaker of the destination: 0 closed, 1 half-open, 2 open."),
		learned:     destGauge("outflow_dest_learned_rate", "Fleet rate (msgs/s) learned from throttled replies; 0 = unknown."),
		learnedConn: destGauge("outflow_dest_learned_conns", "Fleet connection limit learned from too-many-connections replies; 0 = unknown."),
		plateau:     destGauge("outflow_dest_learned_plateau", "Where the learned rate's steps stop after a cut (msgs/s), under the rate the last throttle answered; 0 = none."),
		live: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outflow_workers_live", Help: "Workers registered and alive, as this worker sees them.",
		}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_dest_transitions_total", Help: "Destination state transitions written by this worker, by change.",
		}, []string{"change"}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outflow_coordinator_panics_total", Help: "Coordinator goroutines and callbacks that panicked (recovered).",
		}),
	}
	if reg == nil {
		return m
	}
	m.suspended = register(m, m.suspended)
	m.factor = register(m, m.factor)
	m.breaker = register(m, m.breaker)
	m.learned = register(m, m.learned)
	m.learnedConn = register(m, m.learnedConn)
	m.plateau = register(m, m.plateau)
	m.live = register(m, m.live)
	m.transitions = register(m, m.transitions)
	m.panics = register(m, m.panics)
	return m
}

// register registers c, or adopts the collector already registered under
// the same name (a second Throttle in one process).
func register[C prometheus.Collector](m *throttleMetrics, c C) C {
	if err := m.reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if old, ok := are.ExistingCollector.(C); ok {
				return old
			}
		}
		return c // unregistered: still usable, just not exported
	}
	m.collectors = append(m.collectors, c)
	return c
}

// set exports one destination's state.
func (m *throttleMetrics) set(dest string, s DestState, breaker string, suspended bool) {
	b := 0.0
	switch breaker {
	case BreakerHalfOpen:
		b = 1
	case BreakerOpen:
		b = 2
	}
	sus := 0.0
	if suspended {
		sus = 1
	}
	m.suspended.WithLabelValues(dest).Set(sus)
	m.factor.WithLabelValues(dest).Set(s.RateFactor())
	m.breaker.WithLabelValues(dest).Set(b)
	m.setLearned(dest, s)
}

// setLearned exports a destination's learned limits.
func (m *throttleMetrics) setLearned(dest string, s DestState) {
	m.learned.WithLabelValues(dest).Set(s.LearnedRate)
	m.learnedConn.WithLabelValues(dest).Set(float64(s.LearnedConns))
	m.plateau.WithLabelValues(dest).Set(s.LearnedPlateau)
}

// drop removes a destination's series (its state was deleted).
func (m *throttleMetrics) drop(dest string) {
	m.suspended.DeleteLabelValues(dest)
	m.factor.DeleteLabelValues(dest)
	m.breaker.DeleteLabelValues(dest)
	m.learned.DeleteLabelValues(dest)
	m.learnedConn.DeleteLabelValues(dest)
	m.plateau.DeleteLabelValues(dest)
}

// unregister removes what this Throttle registered.
func (m *throttleMetrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
