package unsubscribe

import "github.com/prometheus/client_golang/prometheus"

// Results of a request, the result label of
// outflow_unsubscribe_requests_total.
const (
	ResultUnsubscribed = "unsubscribed" // a POST recorded: the event stored, the address on the list
	ResultAlready      = "already"      // a POST for an address its unsubscribe already put on the list
	ResultInvalid      = "invalid"      // a token that does not open (404)
	ResultPage         = "page"         // a GET or HEAD shown the page that asks to confirm
	ResultError        = "error"        // a POST not recorded, answered 503
)

// Metrics are the handler's Prometheus collectors.
type Metrics struct {
	Requests *prometheus.CounterVec // outflow_unsubscribe_requests_total{result}
}

// NewMetrics creates the handler's collectors and registers them on reg
// (none when reg is nil).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "outflow_unsubscribe_requests_total",
		Help: "Requests to the one-click unsubscribe links, by what became of them.",
	}, []string{"result"})}
	// Every result exists from the start, at 0, so that a rate or a ratio
	// over them is not empty before the first of its kind.
	for _, r := range []string{ResultUnsubscribed, ResultAlready, ResultInvalid, ResultPage, ResultError} {
		m.Requests.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.Requests)
	}
	return m
}

// count adds a request with result; a no-op on a nil *Metrics.
func (m *Metrics) count(result string) {
	if m != nil {
		m.Requests.WithLabelValues(result).Inc()
	}
}
