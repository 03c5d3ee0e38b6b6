package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/certfile"
	"github.com/outflow/outflow/internal/defaults"
	"github.com/outflow/outflow/internal/gcpolicy"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/submission"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/worker"
)

func init() {
	c := &serveConfig{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "run outflow: submission listener, embedded NATS JetStream and delivery workers",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := loadConfigFile(cmd, c)
			if err != nil {
				err = usageError{err}
			} else {
				err = serve(cmd.Context(), c, cmd.OutOrStdout())
			}
			if err != nil {
				logStop(cmd.ErrOrStderr(), err)
			}
			return err
		},
	}
	bindServeFlags(cmd.Flags(), c)
	rootCmd.AddCommand(cmd)
}

func newLogger(level string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(level))
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger(), nil
}

// logStop writes the error serve stopped on as a log line like the
// daemon's others (level fatal), for a log collector that reads only JSON;
// main still prints it as text for a person at a terminal.
func logStop(w io.Writer, err error) {
	log := zerolog.New(w).With().Timestamp().Logger()
	log.WithLevel(zerolog.FatalLevel).Err(err).Int("exit_code", exitCode(err)).Msg("outflow stopped on an error")
}

// serve runs the daemon until SIGINT or SIGTERM. stdout gets the account
// a first start generates, once the daemon is up.
func serve(parent context.Context, c *serveConfig, stdout io.Writer) error {
	log, err := newLogger(c.LogLevel)
	if err != nil {
		return usageError{err}
	}
	if parent == nil {
		parent = context.Background()
	}
	ctx, stop := signal.NotifyContext(parent, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP reads the users file and the certificates again (reload.go);
	// one that comes while the daemon starts waits until it is up,
	// rather than end it (the default action).
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if err := c.checkFlags(); err != nil {
		return usageError{err}
	}

	// The collector's target paces how often a deferred backlog's
	// long-lived JetStream state is marked again; without a backlog, the
	// floor keeps a small heap from collecting every few MiB
	// (internal/gcpolicy; figures in docs/benchmarks.md).
	gcpolicy.Apply(c.GCPercent, c.GCMinHeap)
	if err := os.MkdirAll(c.Data, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	hostname := c.Hostname
	if hostname == "" {
		hostname, _ = os.Hostname()
	}
	workerID := c.WorkerID
	if workerID == "" {
		workerID = throttle.DefaultWorkerID()
	}
	// base has no worker_id: the delivery pool adds its own, and its
	// decision lines carry the deliverer's id ("<worker-id>/<n>"), so a
	// logger that had one already would repeat the key.
	base := log
	log = log.With().Str("worker_id", workerID).Logger()
	if msg := hostnameWarning(hostname, c.Hostname != ""); msg != "" {
		log.Warn().Str("hostname", hostname).Msg(msg)
	}

	classifier, err := classify.New(classify.Options{ExtraRulesFile: c.ClassifyRules})
	if err != nil {
		return usageError{err}
	}
	retry, rl, budget, err := backoffFromConfig(c)
	if err != nil {
		return usageError{err}
	}
	var trusted []netip.Prefix
	for _, s := range c.TrustedNetworks {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return usageError{fmt.Errorf("--trusted-networks %q: %w", s, err)}
		}
		if err := checkTrustedNetwork(p); err != nil {
			return usageError{fmt.Errorf("--trusted-networks %q: %w", s, err)}
		}
		trusted = append(trusted, p)
	}
	for _, line := range c.secretFileWarnings() {
		log.Warn().Msg(line)
	}

	// The SENT bucket also holds each idempotency key's record, which
	// names the key's message ids for the work stream's deduplication
	// window: expired sooner, a client's retry within the window got new
	// ids the deduplication did not know, and the message went out twice.
	if floor := max(queue.DefaultDedupWindow, 4*c.AckWait); c.SentTTL < floor {
		return usageError{fmt.Errorf("--sent-ttl %v: must be at least %v (24h, the idempotency keys' window, and 4 × --ack-wait): an envelope whose ack was lost comes back after --ack-wait, and its SENT marker must still be there; a retry with an idempotency key within 24h must still find its key's record", c.SentTTL, floor)}
	}

	durability, note, err := c.durability()
	if err != nil {
		return usageError{err}
	}
	if note != "" {
		log.Warn().Msg(note)
	}
	if durability == queue.DurabilityNone {
		log.Warn().Str("durability", string(durability)).Msg("durability none: 250 is answered before mail is on disk; a power loss or kernel crash can lose the last two minutes of accepted mail")
	}

	// The queue splits the mail of a tenant with a return path per
	// recipient (perRecipient). The return path is read once the queue is
	// up (its key is in a bucket), before anything is submitted.
	var returnPath *bounce.ReturnPath

	// NATS: the embedded server unless --nats-url names another.
	qopts := queue.Options{Name: "outflow " + workerID, Replicas: c.NATSReplicas, DeadlineAfter: budget.MaxAge, AckWait: c.AckWait,
		EventsMaxAge: c.EventsMaxAge, SentTTL: c.SentTTL, PerRecipient: perRecipient(&returnPath), Logger: log}
	var emb *queue.Embedded
	if c.NATSURL == "" {
		emb, err = startOrStop(ctx, func() (*queue.Embedded, error) {
			return queue.StartEmbedded(queue.EmbeddedConfig{DataDir: c.Data, ListenAddr: c.NATSAddr, Durability: durability,
				SyncWindow: c.SyncWindow, MaxStore: c.StoreMax, Logger: log})
		})
		if errors.Is(err, errStoppedWhileStarting) {
			log.Warn().Msg("stop asked while the embedded NATS server starts: stopping without waiting for it (its store recovers at the next start, as after a crash)")
			return nil
		}
		if err != nil {
			return err
		}
		defer emb.Shutdown()
		go emb.Supervise(ctx, log, time.Second)
		ci := emb.InProcessInfo()
		qopts.InProcess, qopts.User, qopts.Password = emb.Server(), ci.User, ci.Password
		qopts.Syncer = emb.Syncer()
		log.Info().Str("store", c.Data).Str("client_url", emb.ClientInfo().URL).Str("durability", string(durability)).
			Int64("store_bytes", emb.StoreRoom().Used()).Int64("store_limit_bytes", emb.StoreRoom().Limit()).Msg("embedded NATS JetStream started")
	} else {
		qopts.URL, qopts.CredsFile = c.NATSURL, c.NATSCreds
		// Streams of one replica have one store, and the daemon whose
		// embedded server holds it can fsync it: every write then waits
		// for that daemon's group commit, as its own do (a worker on
		// another machine once answered 250 on the server's
		// acknowledgement alone, the write in its page cache).
		qopts.RemoteSync = c.NATSReplicas <= 1 && durability != queue.DurabilityNone
	}
	setupCtx, cancelSetup := context.WithTimeout(ctx, 60*time.Second)
	q, err := queue.Connect(setupCtx, qopts)
	cancelSetup()
	if err != nil {
		return err
	}
	defer q.Close()
	if qopts.RemoteSync {
		if durability, err = remoteDurability(ctx, q, durability, log); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	reg.MustRegister(queue.NewDepthCollector(q))
	if emb != nil && emb.StoreSyncer() != nil {
		reg.MustRegister(emb.StoreSyncer()) // outflow_store_*: group commits and fsyncs
	}
	if emb != nil {
		reg.MustRegister(emb.StoreRoom()) // outflow_store_bytes, _limit_bytes: the store's use against its limit
	}

	users, pending, err := loadUsers(c, log)
	if err != nil {
		return err
	}
	defer pending.discard()
	var tlsConf *tls.Config
	var smtpCert *certfile.Cert
	if c.TLSCert != "" || c.TLSKey != "" {
		if smtpCert, err = certfile.Load(c.TLSCert, c.TLSKey); err != nil {
			return usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
		}
		tlsConf = smtpCert.ServerConfig()
	}

	res, err := newResolver(&c.deliveryConfig, reg)
	if err != nil {
		return err
	}
	// Said as read: a bare IPv6 address takes no port, so --dns ::1:5353
	// is the server [::1:5353]:53, and only this line shows it.
	log.Info().Strs("dns_servers", res.Servers()).Bool("dns_flag", len(c.DNS) > 0).
		Msg("DNS servers for MX, A/AAAA, TXT and TLSA lookups (--dns, else /etc/resolv.conf; none: the system's resolver)")
	roots, err := rootCAs(c.TLSCAFile)
	if err != nil {
		return err
	}
	sts, tlsa, tlsReport, runReports, err := tlsPolicies(c, res, roots, hostname, workerID, reg, log)
	if err != nil {
		return err
	}
	if runReports != nil {
		// The report loop saves the day's counts when it stops; serve
		// waits for that before it returns.
		rctx, stopReports := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); runReports(rctx) }()
		defer func() { stopReports(); <-done }()
	}
	egress, err := newEgress(&c.deliveryConfig, c.Tenants, c.Relay)
	if err != nil {
		return err
	}
	tlsDest := map[string]sender.TLSPolicy{}
	for d, p := range c.TLSDestinations {
		tlsDest[strings.ToLower(d)] = sender.TLSPolicy(p)
	}
	noChunking := map[string]bool{}
	for _, d := range c.NoChunkingFor {
		noChunking[d] = true // sender.New normalizes the names
	}
	snd, err := sender.New(sender.Config{
		Hostname: hostname, Relay: c.Relay, RelayUsername: c.RelayUser, RelayPassword: c.RelayPassword,
		RelayTLS: sender.RelayTLS(c.RelayTLS), TLS: sender.TLSPolicy(c.TLSPolicy), TLSPerDestination: tlsDest,
		ConnectTimeout: c.ConnectTimeout, GreetingTimeout: c.CommandTimeout, CommandTimeout: c.CommandTimeout, ResetTimeout: c.ResetTimeout,
		DataInitTimeout: c.CommandTimeout, DataBlockTimeout: c.DataTimeout, FinalDotTimeout: c.FinalDotTimeout,
		NoChunking: !c.SMTPChunking, NoChunkingFor: noChunking, Classifier: classifier,
		MXAllowLoopback: c.MXAllowLoopback, MXAddressLimit: mxLimit(c.MXAddressLimit), MXSessionLimit: mxLimit(c.MXSessionLimit),
		Port: c.SMTPPort, Resolver: res, RootCAs: roots, MTASTS: sts, DANE: tlsa, TLSReport: tlsReport, Logger: log,
	})
	if err != nil {
		return usageError{err}
	}
	defer snd.Close()
	var signer worker.Signer
	if len(c.DKIM) > 0 {
		keys := make([]sender.DKIMKey, len(c.DKIM))
		for i, k := range c.DKIM {
			keys[i] = sender.DKIMKey{Domain: k.Domain, Selector: k.Selector, KeyFile: k.KeyFile}
		}
		s, err := sender.NewDKIMSigner(keys)
		if err != nil {
			return usageError{fmt.Errorf("[[dkim]]: %w", err)}
		}
		signer = s
	}

	throttle, err := startThrottle(ctx, c, q, workerID, res, classifier.RuleScopes(), reg, log)
	if err != nil {
		return err
	}
	defer throttle.Close()
	stopStatus, err := serveDestStatus(q, throttle, workerID, egress)
	if err != nil {
		return err
	}
	defer stopStatus()
	suppressions, err := q.Suppressions(ctx)
	if err != nil {
		return err
	}

	returnPath, err = c.returnPath(ctx, q)
	if err != nil {
		return err
	}
	unsubPolicy, links, err := c.unsubscribeLinks(ctx, q, log)
	if err != nil {
		return err
	}
	enq := enqueuer{q: q, emb: emb, unsub: unsubPolicy}
	dsnCfg, err := c.workerDSN(hostname, suppressions, worker.NewDSNMetrics(reg))
	if err != nil {
		return usageError{err}
	}
	pool, err := worker.New(worker.Config{
		WorkerID: workerID, Workers: c.Workers, Retry: retry, RateLimit: rl, ThrottleHold: throttle.LearnHold(), Budget: budget, ProgressEvery: c.AckWait / 4,
		Unknown: worker.UnknownPolicy(c.UnknownPolicy), Queue: q, Sender: snd, Classifier: classifier, Gate: throttle,
		Signer: signer, Egress: egress, Logger: base, Metrics: worker.NewMetrics(reg), Suppressions: suppressions, DSN: dsnCfg,
		ReturnPath: returnPathOrNil(returnPath), Unsubscribe: unsubscriberOrNil(links), Relay: c.Relay,
		TenantWeights: c.File.Throttle.TenantWeights,
	})
	if err != nil {
		return usageError{err}
	}

	senders, err := c.senderDomains()
	if err != nil {
		return err
	}
	for _, line := range c.tenantNearMisses(users.Names()) {
		log.Warn().Msg(line)
	}
	if line := c.openSigning(startTenants(ctx, c, q, users.Names(), trusted), c.dkimDomains()); line != "" {
		log.Warn().Msg(line)
	}
	limits, err := c.sendingLimits(ctx, q)
	if err != nil {
		return err
	}
	sub, err := submission.New(submission.Config{
		Addr: c.SMTPAddr, Hostname: hostname, Users: users, TrustedNetworks: trusted, TLSConfig: tlsConf,
		MaxMessageBytes: c.MaxMessageSize, MaxRecipients: c.MaxRecipients, MaxConnections: c.MaxConnections,
		MaxClientConnections: c.MaxClientConns,
		ReadTimeout:          c.SMTPReadTimeout, DataTimeout: c.SMTPDataTimeout, MaxInflightBytes: c.SMTPMaxInflightBytes,
		Suppressions: suppressions, SenderDomains: senders, Quota: limits, Registerer: reg, Logger: log,
	}, enq)
	if err != nil {
		return usageError{err}
	}
	ln, err := sub.Listen()
	if err != nil {
		return fmt.Errorf("--smtp-addr: %w", err) // named as --api-addr and --http-addr are
	}

	var ready atomic.Bool
	httpSrv, httpLn, err := startHTTP(c.HTTPAddr, reg, &ready, q, emb, durability, log)
	if err != nil {
		ln.Close()
		return err
	}
	stopAPI, apiCert, err := startAPI(ctx, c, q, enq, suppressions, limits, throttle,
		unsubscribeHandler(links, q, suppressions, workerID, reg, log), hostname, reg, log)
	if err != nil {
		ln.Close()
		_ = httpSrv.Close()
		return err
	}

	stopBounces, err := startBounces(c, returnPath, q, enq, pool, suppressions, classifier, hostname, workerID, tlsConf, reg, log)
	if err != nil {
		ln.Close()
		_ = httpSrv.Close()
		stopAPI(ctx)
		return err
	}
	workCtx, stopWork := context.WithCancel(ctx)
	defer stopWork()
	stopWebhooks, err := startWebhooks(workCtx, c, q, workerID, log)
	if err != nil {
		ln.Close()
		_ = httpSrv.Close()
		stopAPI(ctx)
		stopBounces(ctx)
		return err
	}
	// Operator actions and NATS submissions, written by other processes,
	// logged once by one daemon of the fleet (oplog.go).
	stopOperatorLog := startOperatorLog(workCtx, q, log)
	defer stopOperatorLog()
	// Every listener is bound and every setting was taken: only now is
	// a generated account stored and shown.
	if err := pending.commit(stdout); err != nil {
		ln.Close()
		_ = httpSrv.Close()
		stopAPI(ctx)
		stopBounces(ctx)
		stopWork()
		stopWebhooks()
		return err
	}
	poolDone := make(chan error, 1)
	go func() { poolDone <- pool.Run(workCtx, c.ShutdownGrace) }()
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Serve(ln) }()
	ready.Store(true)
	usersPath := ""
	if users != nil {
		usersPath = c.usersFile()
	}
	reloads := newReloader(usersPath, sub, users, reg, log)
	reloads.cert("smtp-tls", smtpCert, reg)
	reloads.cert("api-tls", apiCert, reg)
	go reloads.run(workCtx, hup)
	serving := log.Info().Str("smtp_addr", ln.Addr().String())
	if httpLn != nil {
		serving = serving.Str("http_addr", httpLn.Addr().String())
	}
	serving.Str("relay", c.Relay).Int("workers", effectiveWorkers(c.Workers)).Msg("outflow serving")

	failed, poolFinished := awaitStop(ctx, subDone, poolDone, log)
	ready.Store(false)
	// Order: stop accepting mail (in-flight DATA still finishes and gets
	// its 250 or 451), then stop pulling and let deliveries finish, then
	// drain NATS so pending acks and events reach the server, then stop the
	// embedded server.
	shCtx, cancel := context.WithTimeout(context.Background(), c.ShutdownGrace+10*time.Second)
	defer cancel()
	if err := sub.Shutdown(shCtx); err != nil {
		log.Warn().Err(err).Msg("submission shutdown")
	}
	stopAPI(shCtx)
	stopBounces(shCtx)
	stopWork()
	stopWebhooks()
	stopOperatorLog()
	if !poolFinished {
		select {
		case <-poolDone:
			poolFinished = true
		case <-shCtx.Done():
		}
	}
	if poolFinished {
		// The workers are done: leave the fleet's registry now, while
		// the connection still works (the deferred Close runs after the
		// drain below, and its delete failed), so that the others'
		// shares of rates and connections grow at once, not after the
		// registry's TTL. A restarted process is a new instance: until
		// then the old one counted as a live worker holding its share.
		if err := throttle.Close(); err != nil {
			log.Warn().Err(err).Msg("throttle stop")
		}
	}
	_ = httpSrv.Shutdown(shCtx)
	if err := q.Close(); err != nil {
		log.Warn().Err(err).Msg("nats drain")
	}
	waitClosed(q, 10*time.Second)
	log.Info().Msg("outflow stopped")
	return failed
}

// awaitStop waits for a signal (ctx) or for the submission listener or the
// workers to stop on their own, which is a failure: serve then shuts the
// rest down and exits with it, so that a supervisor restarts the daemon
// instead of taking a daemon without a listener or workers for a clean
// stop. poolFinished says the workers' result was read (not to wait for it
// again).
func awaitStop(ctx context.Context, subDone, poolDone <-chan error, log zerolog.Logger) (failed error, poolFinished bool) {
	stopped := func(what string, err error) error {
		if err == nil {
			err = errors.New("no error given")
		}
		log.Error().Err(err).Msg(what + " stopped; shutting down")
		return fmt.Errorf("%s stopped: %w", what, err)
	}
	select {
	case <-ctx.Done():
		log.Info().Msg("shutting down: no new submissions; finishing deliveries in progress")
		return nil, false
	case err := <-subDone:
		return stopped("submission listener", err), false
	case err := <-poolDone:
		if ctx.Err() != nil {
			// The stop came while the workers were ending because of
			// it (a pool still starting returns "context canceled"):
			// select picks either at random, and the clean stop read as
			// a failure.
			log.Info().Msg("shutting down: no new submissions; the workers have stopped")
			return nil, true
		}
		return stopped("workers", err), true
	}
}

// remoteDurability is what a worker on another server's streams of one
// replica gets: disk, when the daemon that owns that server's store
// answers sync requests; otherwise the server's acknowledgement alone,
// which --durability disk refuses and the default (replicas) warns of.
func remoteDurability(ctx context.Context, q *queue.Queue, asked queue.Durability, log zerolog.Logger) (queue.Durability, error) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	syncs, err := q.ServerSyncs(pctx)
	switch {
	case syncs:
		log.Info().Str("durability", string(queue.DurabilityDisk)).
			Msg("streams of one replica, on the embedded server of another daemon: every write waits for that daemon's fsync")
		return queue.DurabilityDisk, nil
	case asked == queue.DurabilityDisk:
		return "", fmt.Errorf("--durability disk with --nats-url: no outflow daemon fsyncs that server's store (%v); "+
			"point --nats-url at a daemon's embedded server, or use replicas on a cluster", cmp.Or[error](err, errors.New("nobody answers sync requests")))
	default:
		log.Warn().Err(err).Str("durability", string(asked)).
			Msg("streams of one replica and no outflow daemon fsyncs that server's store: a 250 means the server has the write, not its disk; set sync_interval: always on that server, or use a cluster")
		return asked, nil
	}
}

// throttleFile is the throttle's file as serve applies it: with
// --dest-rate or --dest-conns given as 0 ("unlimited", in an incident),
// [destinations.default]'s limit lifted too, as a value above 0 replaces
// it (ConfigWith takes a 0 as not given, and the file's limit stayed).
//
// Delivering to MX hosts (no relay), group-by-mx defaults to on, so the
// built-in provider groups apply without a [[groups]] table: gmail.com
// and two Workspace domains, each its own destination, learned 9.5, 5.2
// and 5.2/s against Google's one limit and took 110 s for 274 of 300
// messages. Through a relay the destinations stay the domains (the relay
// has its own view of the MX hosts) unless the file says otherwise.
func (c *serveConfig) throttleFile() throttle.File {
	file := c.File
	if file.Throttle.GroupByMX == nil && c.Relay == "" && len(file.Groups) == 0 {
		on := true
		file.Throttle.GroupByMX = &on
	}
	rate, conns := c.destRateSet && c.DestRate == 0, c.destConnsSet && c.DestConns == 0
	if !rate && !conns {
		return file
	}
	file.Destinations = maps.Clone(file.Destinations)
	if file.Destinations == nil {
		file.Destinations = map[string]throttle.LimitsFile{}
	}
	def := file.Destinations[throttle.DefaultDestination]
	if rate {
		def.Rate = new(float64)
	}
	if conns {
		def.Conns = new(int)
	}
	file.Destinations[throttle.DefaultDestination] = def
	return file
}

// startThrottle builds the coordinator's per-destination limits from the
// config file sections and the --dest-rate/--dest-conns defaults, checks
// the automation rules against the classifier's rules, shares
// state through the queue's KV buckets, and releases a destination's
// deferred mail at its rate when it recovers.
func startThrottle(ctx context.Context, c *serveConfig, q *queue.Queue, workerID string, res throttle.MXResolver, rules map[string]classify.Scope, reg prometheus.Registerer, log zerolog.Logger) (*throttle.Throttle, error) {
	// --dest-rate and --dest-conns are the defaults every
	// [destinations.X] table inherits what it does not set.
	file := c.throttleFile()
	tc, err := file.ConfigWith(throttle.Limits{Rate: c.DestRate, Conns: c.DestConns})
	if err != nil {
		return nil, usageError{fmt.Errorf("config: %w", err)}
	}
	// The automation rules' rule names are checked against these, the
	// embedded ones and the operator's classify-rules (a typo matched
	// nothing and never fired).
	tc.ClassifyRules = rules
	if err := tc.CheckAutomation(); err != nil {
		return nil, usageError{fmt.Errorf("config: %w", err)}
	}
	if tc.State, err = throttle.OpenState(ctx, q); err != nil {
		return nil, err
	}
	if tc.StateStream, err = q.KVStream(ctx, throttle.BucketState); err != nil {
		return nil, err
	}
	if tc.Registry, err = throttle.OpenRegistry(ctx, q); err != nil {
		return nil, err
	}
	tc.WorkerID = workerID
	tc.Resolver, tc.Logger, tc.Registerer = res, log, reg
	// OnRecover may run before throttle.New returns; it reads the throttle
	// through an atomic pointer.
	var tp atomic.Pointer[throttle.Throttle]
	tc.OnRecover = func(dest string, rate float64) {
		// Ends with the daemon (Close waits for it): a release cut short
		// leaves the rest on their own schedules, each rewrite whole.
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		defer cancel()
		// A plain domain is found through the lane subjects; with provider
		// groups by asking, for each deferred envelope, whether its domain
		// is the destination or belongs to it: a group, or one domain of a
		// group suspended by itself (whose mail the group's match missed).
		dest, _ = throttle.SplitPair(dest) // one egress address recovered: release the destination's mail
		domain, match := dest, (func(string) bool)(nil)
		if t := tp.Load(); tc.GroupByMX && t != nil {
			domain, match = "", func(d string) bool { return t.Recovers(dest, d) }
		}
		var offset time.Duration
		if t := tp.Load(); t != nil {
			offset, _ = t.ClockOffset() // 0 until measured
		}
		released, err := q.ReleaseDest(rctx, workerID, domain, match, rate, offset)
		// One line per envelope re-timed (each also has a released event),
		// so that a postmortem sees when each message was given its new
		// time, as it sees every backoff decision; then the summary.
		for _, r := range released {
			log.Info().Str("msg_id", r.ID).Str("tenant", r.Tenant).Str("dest", r.Dest).Str("recovered", dest).
				Str("lane", string(r.Lane)).Int("position", r.Position).Int("of", r.Of).Float64("rate", rate).
				Time("next_attempt_at", r.At).Msg("released: deferred envelope rescheduled at the recovered destination's rate")
		}
		log.Info().Err(err).Str("dest", dest).Float64("rate", rate).Int("released", len(released)).
			Msg("destination recovered: deferred mail released oldest first at its rate")
	}
	// Every change of a learned limit is an event, beside its log line,
	// so that an application or a dashboard can follow what was learned.
	tc.OnLearned = func(dest, change string, s throttle.DestState) {
		b, _ := json.Marshal(s)
		q.Event(queue.EventLearned, &queue.Event{ID: learnedEventID(dest), Dest: dest, Worker: workerID,
			Reason: change + ": " + s.LearnedReason, State: b})
	}
	t, err := throttle.New(ctx, tc)
	if err != nil {
		return nil, err
	}
	tp.Store(t)
	return t, nil
}

// learnedEventID is the id under which a destination's dest-learned events
// are kept: "dest-" and the destination with every byte outside
// [a-zA-Z0-9-] written '-', so `outflow queue history dest-gmail-com`
// lists what gmail.com learned.
func learnedEventID(dest string) string {
	b := []byte("dest-" + dest)
	for i := 5; i < len(b); i++ {
		if c := b[i]; !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	if len(b) > 64 {
		b = b[:64]
	}
	return string(b)
}

// serveDestStatus answers dest status requests (the payload is a domain or
// group name, or DEST@SOURCE) with this worker's throttle.WorkerStatus as JSON.
func serveDestStatus(q *queue.Queue, t *throttle.Throttle, workerID string, egress *sender.Egress) (func(), error) {
	return q.ServeDestStatus(func(dest string) []byte {
		domain, source := throttle.SplitPair(strings.TrimSpace(dest))
		name := t.Group(domain)
		st := t.Snapshot(throttle.PairName(name, source))
		b, _ := json.Marshal(throttle.WorkerStatus{Worker: workerID, DestStatus: st, Sources: sourceStatus(t, egress, domain, name, source)})
		return b
	})
}

// errStoppedWhileStarting is startOrStop's answer to a stop that came
// first.
var errStoppedWhileStarting = errors.New("stopped while starting")

// startOrStop runs start (the embedded server's start, which recovers its
// store and may take long with a large one, and takes no context) and
// returns what it returns, unless ctx ends first: then it returns
// errStoppedWhileStarting at once, and the process exits without waiting
// for the start, as it would after a crash, which the store survives. A
// SIGTERM or Ctrl-C during a start went unanswered until the start ended,
// up to its 30 s limit and longer while the store recovered.
func startOrStop[T any](ctx context.Context, start func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := start()
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		var zero T
		return zero, errStoppedWhileStarting
	}
}

// enqueuer hands submissions to the queue, failing at once while the
// embedded JetStream is down (disk full), so clients get their 451 without
// waiting for a publish timeout.
//
// It also applies the tenants' one-click unsubscribe setting to the
// submissions that do not choose for themselves. Each recipient of a
// tenant whose mail goes out with a return path gets an envelope of its
// own in the queue itself (perRecipient), whichever way the mail came in.
type enqueuer struct {
	q     *queue.Queue
	emb   *queue.Embedded // nil with --nats-url
	unsub listUnsubscribe
}

func (e enqueuer) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	if e.emb != nil {
		if err := e.emb.Healthy(); err != nil {
			return nil, err
		}
	}
	e.prepare(s)
	return e.q.Enqueue(ctx, s)
}

// prepare applies the tenant's settings that s does not choose itself.
func (e enqueuer) prepare(s *queue.Submission) {
	e.unsub.apply(s)
}

// perRecipient is queue.Options.PerRecipient: a tenant whose mail goes out
// with a return path has each recipient in an envelope of its own, so that
// each sees a return path of its own (bounce/doc.go). *rp is read at each
// submission: serve sets it once the queue is up, before taking mail; nil
// is no return path.
func perRecipient(rp **bounce.ReturnPath) func(tenant string) bool {
	return func(tenant string) bool { return (*rp).Applies(tenant) }
}

// waitClosed waits for a drained connection to finish closing.
func waitClosed(q *queue.Queue, max time.Duration) {
	deadline := time.Now().Add(max)
	for !q.Closed() && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}

func backoffFromConfig(c *serveConfig) (backoff.Backoff, backoff.Backoff, backoff.Budget, error) {
	retry, rl, budget := backoff.DefaultRetry(), backoff.DefaultRateLimit(), backoff.DefaultBudget()
	set := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	set(&retry.Base, c.RetryBase)
	set(&retry.Min, c.RetryMin)
	set(&retry.Cap, c.RetryCap)
	if c.RetryMultiplier > 0 {
		retry.Multiplier = c.RetryMultiplier
	}
	set(&rl.Base, c.RateLimitBase)
	set(&rl.Cap, c.RateLimitCap)
	set(&rl.Min, c.RateLimitMin)
	if c.MaxAttempts > 0 {
		budget.MaxAttempts = c.MaxAttempts
	}
	set(&budget.MaxAge, c.MaxAge)
	if err := retry.Validate(); err != nil {
		return retry, rl, budget, fmt.Errorf("retry lane: %w", err)
	}
	if err := rl.Validate(); err != nil {
		return retry, rl, budget, fmt.Errorf("rate-limit lane: %w", err)
	}
	return retry, rl, budget, nil
}

// startHTTP serves /metrics, /healthz (the process is up) and /readyz (it
// is accepting and delivering: NATS connected, JetStream answering). With
// addr "" it serves nothing: it returns a server that was never started
// (its Close and Shutdown do nothing) and no listener. (net.Listen takes
// "" for every interface at a port of its choosing: metrics and health
// on every address, where "" turns the other listeners off.)
//
// /readyz's body names the durability (`ready (durability disk)`), and says
// what none costs, so a check that reads it sees a weakened promise.
func startHTTP(addr string, reg *prometheus.Registry, ready *atomic.Bool, q *queue.Queue, emb *queue.Embedded, durability queue.Durability, log zerolog.Logger) (*http.Server, net.Listener, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() || !q.Connected() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		if emb != nil {
			if err := emb.Healthy(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			// New mail is refused for want of room: a load balancer
			// sends it to another instance meanwhile.
			if err := emb.StoreRoom().Err(); err != nil {
				http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		if durability == queue.DurabilityNone {
			fmt.Fprintln(w, "ready (durability none: accepted mail is not fsynced before its 250)")
			return
		}
		fmt.Fprintf(w, "ready (durability %s)\n", durability)
	})
	// Idle keep-alive connections end after IdleTimeout: a scraper that
	// opens many and leaves them kept every one for good (500 were open
	// after 150 s in a hunt), each a descriptor and a goroutine.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute,
		WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute}
	if addr == "" {
		return srv, nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--http-addr: %w", err)
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error().Err(err).Str("addr", addr).Msg("metrics and health endpoint stopped")
		}
	}()
	return srv, ln, nil
}

// hostnameWarning is what serve warns of a --hostname that is no
// fully-qualified domain name (no dot: the bare machine name that is the
// default on many hosts), or "". given says whether --hostname set it.
// Receivers that check EHLO (Postfix's reject_non_fqdn_helo_hostname)
// answer such a name 504 5.5.2, a permanent refusal: the mail bounces.
func hostnameWarning(hostname string, given bool) string {
	if strings.Contains(strings.TrimSuffix(hostname, "."), ".") || strings.HasPrefix(hostname, "[") {
		return "" // a domain name, or an address literal ([IPv6:...])
	}
	from := "the host name"
	if given {
		from = "--hostname"
	}
	return fmt.Sprintf("hostname %q (%s) is not a fully-qualified domain name: receivers that require one in EHLO "+
		"(Postfix's reject_non_fqdn_helo_hostname) refuse it with 504 5.5.2 and the mail bounces; "+
		"set --hostname to this host's name in DNS, as mta1.example.com", hostname, from)
}

// effectiveWorkers is the number of concurrent deliveries --workers n
// runs: worker.DefaultWorkers for 0 or less.
func effectiveWorkers(n int) int {
	defaults.Set(&n, worker.DefaultWorkers)
	return n
}
