package main

import (
	"context"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/certfile"
	"github.com/outflow/outflow/submission"
)

// reloader reads again, on SIGHUP, what a daemon can take up without a
// restart: the users file (SMTP accounts) and the TLS certificates of the
// submission and API listeners. A file that does not load is logged and
// the one in use stays. Every other setting takes a restart.
type reloader struct {
	log zerolog.Logger
	// usersPath is the users file; "" when AUTH is off (no accounts).
	usersPath string
	sub       *submission.Server
	users     *submission.Users // the accounts in use, for the log's diff
	certs     []reloadCert
	reloads   *prometheus.CounterVec // outflow_reloads_total{what,result}
}

// reloadCert is one listener's certificate.
type reloadCert struct {
	what string // "smtp-tls", "api-tls"
	cert *certfile.Cert
}

func newReloader(usersPath string, sub *submission.Server, users *submission.Users, reg prometheus.Registerer, log zerolog.Logger) *reloader {
	r := &reloader{log: log, usersPath: usersPath, sub: sub, users: users,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outflow_reloads_total",
			Help: "What a SIGHUP read again (what: users, smtp-tls, api-tls) and whether it was taken (result: ok, error).",
		}, []string{"what", "result"})}
	reg.MustRegister(r.reloads)
	return r
}

// cert adds a listener's certificate, nil for a listener without TLS, and
// exports when it expires.
func (r *reloader) cert(what string, c *certfile.Cert, reg prometheus.Registerer) {
	if c == nil {
		return
	}
	r.certs = append(r.certs, reloadCert{what, c})
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "outflow_tls_certificate_expiry_timestamp_seconds",
		Help:        "When the certificate a listener serves expires (Unix seconds); a reload (SIGHUP) takes up a renewed one.",
		ConstLabels: prometheus.Labels{"listener": strings.TrimSuffix(what, "-tls")},
	}, func() float64 { return float64(c.NotAfter().Unix()) }))
}

// run reloads on each signal from hup until ctx ends.
func (r *reloader) run(ctx context.Context, hup <-chan os.Signal) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			r.reload()
		}
	}
}

// reload reads the users file and the certificates again.
func (r *reloader) reload() {
	if r.usersPath != "" {
		u, err := submission.LoadUsers(r.usersPath)
		if err == nil {
			err = r.sub.SetUsers(u)
		}
		if err != nil {
			r.reloads.WithLabelValues("users", "error").Inc()
			r.log.Error().Err(usersFileError(err)).Str("users_file", r.usersPath).
				Msg("reload: users file not taken; the accounts in use stay")
		} else {
			added, removed, changed := u.Diff(r.users)
			r.users = u
			r.reloads.WithLabelValues("users", "ok").Inc()
			r.log.Info().Str("users_file", r.usersPath).Int("accounts", u.Len()).Strs("added", added).Strs("removed", removed).
				Strs("password_changed", changed).Msg("reload: users file taken; sessions of removed or changed accounts end at their next MAIL")
		}
	}
	for _, c := range r.certs {
		if err := c.cert.Reload(); err != nil {
			r.reloads.WithLabelValues(c.what, "error").Inc()
			r.log.Error().Err(err).Str("what", c.what).Msg("reload: certificate not taken; the one in use stays")
			continue
		}
		r.reloads.WithLabelValues(c.what, "ok").Inc()
		r.log.Info().Str("what", c.what).Time("not_after", c.cert.NotAfter()).Msg("reload: certificate taken")
	}
}
