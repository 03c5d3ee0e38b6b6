package submission

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Submission results, the values of the result label.
const (
	resultAccepted = "accepted" // 250 after DATA: stored in the queue
	resultRejected = "rejected" // 5xx at MAIL FROM or after DATA
	resultTempfail = "tempfail" // 4xx after DATA: the client will retry
)

// Rejection reasons, the values of the reason label. A fixed set: never a
// user name, address or reply text.
const (
	reasonAuthRequired  = "auth_required"
	reasonAuthRevoked   = "auth_revoked"
	reasonBadSender     = "bad_sender"
	reasonBadRecipient  = "bad_recipient"
	reasonTooManyRcpts  = "too_many_recipients"
	reasonTooBig        = "too_big"
	reasonBareLF        = "bare_lf"
	reasonBareCR        = "bare_cr"
	reasonNUL           = "nul"
	reasonLineTooLong   = "line_too_long"
	reasonTimeout       = "timeout"
	reasonAborted       = "aborted"
	reasonQueueError    = "queue_error"
	reasonShuttingDown  = "shutting_down"
	reasonProtocolOrder = "bad_sequence"
	reasonNotOwned      = "sender_not_owned"
)

// metrics are the listener's Prometheus collectors:
//
//	outflow_submissions_total{result}            transactions by outcome
//	outflow_submission_rejections_total{reason}  refused commands by reason
//	outflow_submission_auth_failures_total       failed AUTH attempts
//	outflow_submission_auth_blocked_total        AUTH refused by the per-address limit
//	outflow_submission_connections               open client connections
//	outflow_submission_connections_refused_total connections over MaxConnections
//	outflow_submission_inflight_bytes            bytes charged against MaxInflightBytes
//	outflow_submission_inflight_refused_total{reason} transactions refused for want of room there
type metrics struct {
	submissions   *prometheus.CounterVec
	rejections    *prometheus.CounterVec
	authFailures  prometheus.Counter
	authBlocked   prometheus.Counter
	connections   prometheus.Gauge
	connRejected  prometheus.Counter
	acceptedBytes prometheus.Counter
	// inflightBytes is set by the budget at every change, in order
	// (membudget.Budget.OnChange).
	inflightBytes   prometheus.Gauge
	inflightRefused *prometheus.CounterVec

	accepted prometheus.Counter // submissions{result="accepted"}, looked up once
}

// counter is a counter without labels.
func counter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		submissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_submissions_total",
			Help: "SMTP submission transactions by result: accepted (250, stored), rejected (5xx), tempfail (4xx after DATA).",
		}, []string{"result"}),
		rejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_submission_rejections_total",
			Help: "SMTP submission commands refused, by reason.",
		}, []string{"reason"}),
		authFailures: counter("outflow_submission_auth_failures_total",
			"Failed SMTP AUTH attempts (wrong credentials or malformed exchanges)."),
		authBlocked: counter("outflow_submission_auth_blocked_total",
			"SMTP AUTH attempts refused because the client address had too many recent failures."),
		connections: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outflow_submission_connections",
			Help: "Open SMTP submission client connections.",
		}),
		connRejected: counter("outflow_submission_connections_refused_total",
			"SMTP submission connections refused with 421 because MaxConnections were open."),
		acceptedBytes: counter("outflow_submission_accepted_bytes_total",
			"Bytes of message bodies accepted (as sent by clients)."),
		inflightBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outflow_submission_inflight_bytes",
			Help: "Bytes the SMTP transactions in flight are charged against --smtp-max-inflight-bytes (twice their body octets).",
		}),
		inflightRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_submission_inflight_refused_total",
			Help: "SMTP transactions refused with 452 4.3.1 for want of room under --smtp-max-inflight-bytes, by reason: budget (all of it held) or tenant-share (the tenant's half held).",
		}, []string{"reason"}),
	}
	for _, r := range []string{resultAccepted, resultRejected, resultTempfail} {
		m.submissions.WithLabelValues(r)
	}
	for _, r := range []string{inflightBudget, inflightTenantShare} {
		m.inflightRefused.WithLabelValues(r)
	}
	if reg == nil {
		m.accepted = m.submissions.WithLabelValues(resultAccepted)
		return m, nil
	}
	var err error
	m.submissions = register(reg, m.submissions, &err)
	m.rejections = register(reg, m.rejections, &err)
	m.authFailures = register(reg, m.authFailures, &err)
	m.authBlocked = register(reg, m.authBlocked, &err)
	m.connections = register(reg, m.connections, &err)
	m.connRejected = register(reg, m.connRejected, &err)
	m.acceptedBytes = register(reg, m.acceptedBytes, &err)
	m.inflightBytes = register(reg, m.inflightBytes, &err)
	m.inflightRefused = register(reg, m.inflightRefused, &err)
	if err != nil {
		return nil, err
	}
	m.accepted = m.submissions.WithLabelValues(resultAccepted)
	return m, nil
}

// register registers c, or reuses the identical collector already
// registered (a Server re-created in the same process), recording the first
// other error in *errp.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errp *error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	if *errp == nil {
		*errp = err
	}
	return c
}

// reject counts one refused command; final also counts the transaction as
// rejected (5xx) or tempfailed (4xx).
func (m *metrics) reject(reason string, code int, final bool) {
	m.rejections.WithLabelValues(reason).Inc()
	if !final {
		return
	}
	if code/100 == 4 {
		m.submissions.WithLabelValues(resultTempfail).Inc()
	} else {
		m.submissions.WithLabelValues(resultRejected).Inc()
	}
}
