package resolver

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the cache's collectors; they exist (unregistered) even
// without a Registerer, so the code counts unconditionally.
type metrics struct {
	hits   prometheus.Counter // outflow_dns_cache_hits_total
	misses prometheus.Counter // outflow_dns_cache_misses_total
}

func newMetrics(reg prometheus.Registerer, entries func() int) (*metrics, error) {
	m := &metrics{
		hits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outflow_dns_cache_hits_total", Help: "DNS lookups answered from the resolver's cache (negative answers included).",
		}),
		misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "outflow_dns_cache_misses_total", Help: "DNS lookups that were not in the cache and needed a query (or joined one in flight).",
		}),
	}
	if reg == nil {
		return m, nil
	}
	size := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outflow_dns_cache_entries", Help: "Answers held in the resolver's cache, expired ones not yet dropped included.",
	}, func() float64 { return float64(entries()) })
	for _, c := range []prometheus.Collector{m.hits, m.misses, size} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return nil, errors.New("resolver: metrics already registered: one Resolver per registry")
			}
			return nil, err
		}
	}
	return m, nil
}
