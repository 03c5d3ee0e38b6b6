package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/api"
	"github.com/outflow/outflow/console"
	"github.com/outflow/outflow/internal/certfile"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
	"github.com/outflow/outflow/throttle"
)

// apiConfig is the HTTP API's part of serveConfig; each field is a flag
// and a config-file key of the same name.
type apiConfig struct {
	APIAddr    string  `toml:"api-addr"`
	APITLSCert string  `toml:"api-tls-cert"`
	APITLSKey  string  `toml:"api-tls-key"`
	APIRate    float64 `toml:"api-rate"`
	APIBurst   int     `toml:"api-burst"`
	// APIMaxInflightBytes bounds the memory of the message requests in
	// flight, process-wide (api.Config.MaxInflightBytes).
	APIMaxInflightBytes int64 `toml:"api-max-inflight-bytes"`
}

// bindAPIFlags registers the HTTP API's flags on fs.
func bindAPIFlags(fs *pflag.FlagSet, c *apiConfig) {
	fs.StringVar(&c.APIAddr, "api-addr", api.DefaultAddr, "HTTP submission API listener (\"\" for none)")
	fs.StringVar(&c.APITLSCert, "api-tls-cert", "", "certificate for HTTPS on --api-addr (default plain HTTP)")
	fs.StringVar(&c.APITLSKey, "api-tls-key", "", "key for --api-tls-cert")
	fs.Float64Var(&c.APIRate, "api-rate", api.DefaultRate, "requests per second each API key may make (429 above; negative: no limit)")
	fs.IntVar(&c.APIBurst, "api-burst", api.DefaultBurst, "requests an API key may make at once above --api-rate")
	fs.Int64Var(&c.APIMaxInflightBytes, "api-max-inflight-bytes", api.DefaultMaxInflightBytes,
		"bytes the message requests in flight may hold, each charged 5 times its size (503 when full, 429 past a tenant's half; negative: no bound)")
}

// apiQueue is the queue as the API sees it: its Enqueue fails at once
// while the embedded JetStream is down, like the SMTP listener's.
type apiQueue struct {
	*queue.Queue
	enq enqueuer
}

func (a apiQueue) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	return a.enq.Enqueue(ctx, s)
}

// startAPI serves the HTTP API on --api-addr until the returned stop is
// called; stop lets requests in progress finish (their enqueue, then their
// 202 or 503) within ctx. With --api-addr "" it serves nothing.
func startAPI(ctx context.Context, c *serveConfig, q *queue.Queue, enq enqueuer, sup *queue.Suppressions, limits submission.Quota, t *throttle.Throttle,
	unsub http.Handler, hostname string, reg prometheus.Registerer, log zerolog.Logger) (_ func(context.Context), _ *certfile.Cert, err error) {
	if c.APIAddr == "" {
		return func(context.Context) {}, nil, nil
	}
	var tlsConf *tls.Config
	var cert *certfile.Cert
	if c.APITLSCert != "" || c.APITLSKey != "" {
		if cert, err = certfile.Load(c.APITLSCert, c.APITLSKey); err != nil {
			return nil, nil, usageError{fmt.Errorf("--api-tls-cert/--api-tls-key: %w", err)}
		}
		tlsConf = cert.ServerConfig()
	}
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	senders, err := c.senderDomains()
	if err != nil {
		return nil, nil, err
	}
	srv, err := api.New(setup, api.Config{
		Queue: apiQueue{q, enq}, Buckets: q, Suppressions: sup, Hostname: hostname,
		MaxMessageBytes: c.MaxMessageSize, MaxRecipients: c.MaxRecipients,
		Rate: c.APIRate, Burst: c.APIBurst, MaxInflightBytes: c.APIMaxInflightBytes, IdempotencyTTL: q.DedupWindow(), SenderDomains: senders, Quota: limits, Unsubscribe: unsub, Logger: log,
	})
	if err != nil {
		return nil, nil, err
	}
	if err := registerAPIMetrics(reg, srv); err != nil {
		return nil, nil, err
	}
	// The operator's console shares the listener: /ui/, signed in with
	// an admin key (docs/console.md), and the API's limit on failed
	// authentications per address, so guesses cannot be split between
	// the two.
	con, err := console.New(ctx, console.Config{Queue: q, Keys: srv.Keys(), Suppressions: sup, Secure: tlsConf != nil,
		Local: func(dest string) throttle.DestStatus { return t.Snapshot(t.Group(dest)) }, AuthLimiter: srv.AuthLimiter(), Logger: log})
	if err != nil {
		return nil, nil, err
	}
	if err := registerConsoleMetrics(reg, con); err != nil {
		con.Close()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, con.Handler())
	mux.Handle("/", srv.Handler())
	ln, err := net.Listen("tcp", c.APIAddr)
	if err != nil {
		con.Close()
		return nil, nil, fmt.Errorf("--api-addr: %w", err)
	}
	if tlsConf != nil {
		ln = tls.NewListener(ln, tlsConf)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 5 * time.Minute,
		IdleTimeout: 2 * time.Minute}
	go func() {
		defer func() {
			if p := recover(); p != nil {
				log.Error().Str("panic", fmt.Sprint(p)).Msg("api listener panicked")
			}
		}()
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Msg("api listener stopped")
		}
	}()
	log.Info().Str("api_addr", ln.Addr().String()).Bool("tls", tlsConf != nil).Msg("HTTP API serving")
	return func(ctx context.Context) {
		if err := hs.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("api shutdown")
		}
		con.Close()
	}, cert, nil
}

// keyRow is one key as `apikey list` shows it: never the key itself.
type keyRow struct {
	ID      string    `json:"id"`
	Tenant  string    `json:"tenant"`
	Admin   bool      `json:"admin"`
	Created time.Time `json:"created"`
}

func init() {
	a := &adminFlags{}
	kc := &cobra.Command{Use: "apikey", Short: "create, list and revoke HTTP API keys"}
	a.bind(kc)

	withKeys := func(cmd *cobra.Command, f func(ctx context.Context, keys *api.Keys) error) error {
		return runWith(a, cmd, func(ctx context.Context, q *queue.Queue) (*api.Keys, error) { return api.OpenKeys(ctx, q) },
			func(ctx context.Context, _ *queue.Queue, keys *api.Keys) error { return f(ctx, keys) })
	}

	var tenant string
	var admin bool
	create := &cobra.Command{
		Use:   "create --tenant T [--admin]",
		Short: "create a key for a tenant and print it (it is shown only now; only its hash is stored)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant == "" {
				return usageError{errors.New("--tenant is required")}
			}
			return withKeys(cmd, func(ctx context.Context, keys *api.Keys) error {
				key, info, err := keys.Create(ctx, tenant, admin)
				if err != nil {
					return usageError{err}
				}
				if a.json {
					return printJSON(cmd.OutOrStdout(), struct {
						Key string `json:"key"`
						*api.KeyInfo
					}{key, info})
				}
				fmt.Fprintln(cmd.OutOrStdout(), key)
				fmt.Fprintf(os.Stderr, "outflow: key %s for tenant %s created; it is shown only now\n", info.ID, info.Tenant)
				return nil
			})
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant the key submits as (as an SMTP AUTH user does)")
	create.Flags().BoolVar(&admin, "admin", false, "the key may also read every tenant's messages (and sign in to the console)")

	list := &cobra.Command{
		Use:   "list",
		Short: "list keys: id, tenant, admin, created (never the key itself)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withKeys(cmd, func(ctx context.Context, keys *api.Keys) error {
				infos, err := keys.List(ctx)
				if err != nil {
					return err
				}
				rows := make([]keyRow, len(infos))
				for i, k := range infos {
					rows[i] = keyRow{k.ID, k.Tenant, k.Admin, k.Created}
				}
				return printList(cmd.OutOrStdout(), a.json, rows, "ID\tTENANT\tADMIN\tCREATED", func(k keyRow) string {
					return fmt.Sprintf("%s\t%s\t%t\t%s", k.ID, k.Tenant, k.Admin, k.Created.Format(time.RFC3339))
				})
			})
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke ID",
		Short: "revoke a key by the id `apikey list` shows; it is refused from the next request on",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withKeys(cmd, func(ctx context.Context, keys *api.Keys) error {
				info, err := keys.Revoke(ctx, args[0])
				if err != nil {
					return err
				}
				return report(cmd, a.json, map[string]any{"id": info.ID, "tenant": info.Tenant, "revoked": true},
					"revoked %s (tenant %s)", info.ID, info.Tenant)
			})
		},
	}
	kc.AddCommand(create, list, revoke)
	rootCmd.AddCommand(kc)
}

// registerAPIMetrics exposes the message requests by result (as
// outflow_submissions_total counts SMTP's), the bound on the message
// requests in flight (--api-max-inflight-bytes): what it holds now, and
// what it refused, and the failed authentications by reason with the
// requests refused for them (as outflow_submission_auth_failures_total
// and outflow_submission_auth_blocked_total count SMTP's).
func registerAPIMetrics(reg prometheus.Registerer, srv *api.Server) error {
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "outflow_api_inflight_bytes",
		Help: "Bytes the POST /v1/messages requests being served are charged against --api-max-inflight-bytes.",
	}, func() float64 { b, _, _ := srv.Inflight(); return float64(b) })
	refused := func(reason string, pick func(full, share uint64) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "outflow_api_inflight_refused_total",
			Help:        "Message requests refused for want of room under --api-max-inflight-bytes, by reason: budget (503) or tenant-share (429).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { _, f, s := srv.Inflight(); return float64(pick(f, s)) })
	}
	cs := []prometheus.Collector{inflight,
		refused("budget", func(f, _ uint64) uint64 { return f }),
		refused("tenant-share", func(_, s uint64) uint64 { return s }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "outflow_api_auth_blocked_total",
			Help: "API requests and console sign-ins refused (429) unchecked because their client address had too many recent failed authentications.",
		}, func() float64 { return float64(srv.AuthLimiter().Refused()) })}
	for i, reason := range api.AuthFailureReasons {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "outflow_api_auth_failures_total",
			Help:        "API requests refused 401, by reason: missing (no Authorization header), malformed (not Bearer KEY), unknown (no such key, or revoked).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(srv.AuthFailures()[i]) }))
	}
	for i, result := range api.Results {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "outflow_api_submissions_total",
			Help:        "POST /v1/messages requests by result: accepted (202, stored), rejected (4xx), tempfail (5xx, or 429 too-much-in-flight: not stored, the client retries).",
			ConstLabels: prometheus.Labels{"result": result},
		}, func() float64 { return float64(srv.Submissions()[i]) }))
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// registerConsoleMetrics exposes the console's failed sign-ins by reason,
// the sibling of outflow_api_auth_failures_total (their refusals for the
// address's limit are in outflow_api_auth_blocked_total: the limiter is
// shared).
func registerConsoleMetrics(reg prometheus.Registerer, con *console.Console) error {
	for i, reason := range console.SignInFailureReasons {
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "outflow_console_signin_failures_total",
			Help:        "Console sign-ins refused for their key, by reason: unknown (no such key, or revoked), not-admin (a tenant's key).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(con.SignInFailures()[i]) })
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// startTenants is every tenant known at start, for openSigning: the users
// file's accounts, trusted for --trusted-networks, and the API keys'
// tenants when the API is served (a key created later is not seen until
// the next start). A failed look-up of the keys leaves them out.
func startTenants(ctx context.Context, c *serveConfig, q *queue.Queue, users []string, trusted []netip.Prefix) []string {
	tenants := slices.Clone(users)
	if len(trusted) > 0 {
		tenants = append(tenants, submission.TrustedTenant)
	}
	if c.APIAddr == "" {
		return tenants
	}
	setup, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	keys, err := api.OpenKeys(setup, q)
	if err != nil {
		return tenants
	}
	infos, err := keys.List(setup)
	if err != nil {
		return tenants
	}
	for _, k := range infos {
		tenants = append(tenants, k.Tenant)
	}
	return tenants
}

// dkimDomains is the domains the [[dkim]] keys sign for.
func (c *serveConfig) dkimDomains() []string {
	out := make([]string, 0, len(c.DKIM))
	for _, k := range c.DKIM {
		out = append(out, strings.ToLower(k.Domain))
	}
	return out
}
