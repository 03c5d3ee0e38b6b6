package main

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/backoff"
	"github.com/outflow/outflow/internal/editdist"
	"github.com/outflow/outflow/internal/gcpolicy"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/sender"
	"github.com/outflow/outflow/submission"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/worker"
)

// serveConfig is every setting of `outflow serve`. Each flag is also a key
// of the config file, with the same name (`smtp-addr = "127.0.0.1:2525"`).
// Precedence: built-in defaults, then the config file, then flags given on
// the command line. docs/configuration.md lists every key and its default.
type serveConfig struct {
	Config          string        `toml:"-"`
	Data            string        `toml:"data"`
	SMTPAddr        string        `toml:"smtp-addr"`
	Hostname        string        `toml:"hostname"`
	Relay           string        `toml:"relay"`
	RelayUser       string        `toml:"relay-user"`
	RelayPassword   string        `toml:"relay-password"`
	RelayTLS        string        `toml:"relay-tls"`
	NATSURL         string        `toml:"nats-url"`
	NATSCreds       string        `toml:"nats-creds"`
	NATSAddr        string        `toml:"nats-addr"`
	NATSReplicas    int           `toml:"nats-replicas"`
	Durability      string        `toml:"durability"`
	SyncWindow      time.Duration `toml:"sync-window"`
	StoreMax        int64         `toml:"store-max"`
	JetStreamSync   string        `toml:"jetstream-sync"` // deprecated: durability
	HTTPAddr        string        `toml:"http-addr"`
	Users           string        `toml:"users"`
	TrustedNetworks []string      `toml:"trusted-networks"`
	TLSCert         string        `toml:"tls-cert"`
	TLSKey          string        `toml:"tls-key"`
	MaxMessageSize  int64         `toml:"max-message-size"`
	MaxRecipients   int           `toml:"max-recipients"`
	MaxConnections  int           `toml:"max-connections"`
	MaxClientConns  int           `toml:"max-client-connections"`
	Workers         int           `toml:"workers"`
	WorkerID        string        `toml:"worker-id"`
	RetryBase       time.Duration `toml:"retry-base"`
	RetryMin        time.Duration `toml:"retry-min"`
	RetryCap        time.Duration `toml:"retry-cap"`
	RetryMultiplier float64       `toml:"retry-multiplier"`
	MaxAttempts     int           `toml:"max-attempts"`
	MaxAge          time.Duration `toml:"max-age"`
	RateLimitBase   time.Duration `toml:"ratelimit-base"`
	RateLimitCap    time.Duration `toml:"ratelimit-cap"`
	RateLimitMin    time.Duration `toml:"ratelimit-min"`
	DestRate        float64       `toml:"dest-rate"`
	DestConns       int           `toml:"dest-conns"`
	// destRateSet and destConnsSet: dest-rate or dest-conns given, on the
	// command line or in the file; a 0 given replaces
	// [destinations.default]'s limit with none (startThrottle).
	destRateSet, destConnsSet bool
	UnknownPolicy             string        `toml:"unknown-policy"`
	ClassifyRules             string        `toml:"classify-rules"`
	LogLevel                  string        `toml:"log-level"`
	ShutdownGrace             time.Duration `toml:"shutdown-grace"`
	GCPercent                 int           `toml:"gc-percent"`
	GCMinHeap                 int64         `toml:"gc-min-heap"`
	SMTPPort                  int           `toml:"smtp-port"`
	TLSPolicy                 string        `toml:"tls-policy"`
	SMTPReadTimeout           time.Duration `toml:"smtp-read-timeout"`
	SMTPDataTimeout           time.Duration `toml:"smtp-data-timeout"`
	AckWait                   time.Duration `toml:"ack-wait"`
	EventsMaxAge              time.Duration `toml:"events-max-age"`
	SentTTL                   time.Duration `toml:"sent-ttl"`
	ConnectTimeout            time.Duration `toml:"connect-timeout"`
	CommandTimeout            time.Duration `toml:"command-timeout"`
	ResetTimeout              time.Duration `toml:"rset-timeout"`
	DataTimeout               time.Duration `toml:"data-timeout"`
	FinalDotTimeout           time.Duration `toml:"final-dot-timeout"`
	SMTPChunking              bool          `toml:"smtp-chunking"`
	NoChunkingFor             []string      `toml:"smtp-chunking-off"`

	// SMTPMaxInflightBytes bounds the memory of the message bodies the
	// submission listener holds at once (submission.Config.MaxInflightBytes).
	SMTPMaxInflightBytes int64 `toml:"smtp-max-inflight-bytes"`

	// Config-file-only sections.
	TLSDestinations map[string]string `toml:"tls-destinations"` // destination domain -> opportunistic|required|none
	DKIM            []dkimConfig      `toml:"dkim"`
	// [throttle], [destinations.X], [[groups]], [[automation]]: see
	// docs/throttling.md.
	throttle.File
	// api-addr and the other HTTP API keys: cmd/outflow/api.go.
	apiConfig
	// webhook-allow-private and the other webhook keys: cmd/outflow/webhook.go.
	webhookConfig
	// dns, tls-ca-file and [[egress]]: cmd/outflow/delivery.go.
	deliveryConfig
	// mta-sts, dane and tls-report-*: cmd/outflow/tlspolicy.go.
	tlsPolicyConfig
	// dsn, dsn-delay-warning, dsn-sender-rate, dsn-pass-timeout and
	// [tenants.NAME]: cmd/outflow/dsn.go.
	dsnConfig
	// return-path and bounce-addr: cmd/outflow/bounce.go.
	bounceConfig
	// max-recipients-per-day: cmd/outflow/quota.go.
	quotaConfig
	// unsubscribe-url and list-unsubscribe: cmd/outflow/unsubscribe.go.
	unsubscribeConfig
}

// dkimConfig is one [[dkim]] section: the key that signs mail whose sender
// domain is Domain.
type dkimConfig struct {
	Domain   string `toml:"domain"`
	Selector string `toml:"selector"`
	KeyFile  string `toml:"key-file"` // PEM, RSA (PKCS#1 or PKCS#8) or Ed25519 (PKCS#8)
}

// bindServeFlags registers the flags on fs, pointing at c's fields, with
// c's current values as defaults.
func bindServeFlags(fs *pflag.FlagSet, c *serveConfig) {
	fs.StringVar(&c.Config, "config", "", "TOML config file; every flag is also a key of it")
	fs.StringVar(&c.Data, "data", "./data", "data directory (JetStream files, generated credentials)")
	fs.StringVar(&c.SMTPAddr, "smtp-addr", submission.DefaultAddr, "submission listener address")
	fs.StringVar(&c.Hostname, "hostname", "", "name used in EHLO and Received headers (default: the host name)")
	fs.StringVar(&c.Relay, "relay", "", "deliver everything through this smarthost (host:port) instead of MX")
	fs.StringVar(&c.RelayUser, "relay-user", "", "SASL user for the smarthost")
	fs.StringVar(&c.RelayPassword, "relay-password", "", "SASL password for the smarthost (prefer the config file)")
	fs.StringVar(&c.RelayTLS, "relay-tls", string(sender.RelaySTARTTLS), "smarthost TLS: starttls, tls or none")
	fs.StringVar(&c.NATSURL, "nats-url", "", "external NATS server or cluster instead of the embedded one")
	fs.StringVar(&c.NATSCreds, "nats-creds", "", "NATS credentials file for --nats-url")
	fs.StringVar(&c.NATSAddr, "nats-addr", "127.0.0.1:4222", "embedded server's client listener (\"\" for none; port 0 picks one)")
	fs.IntVar(&c.NATSReplicas, "nats-replicas", queue.DefaultReplicas, "replicas for streams and buckets (3 on a cluster)")
	fs.StringVar(&c.Durability, "durability", "", "what a 250 waits for: disk (group-committed fsync; default on the embedded server), replicas (a majority of a cluster's replicas; default with --nats-url) or none")
	fs.DurationVar(&c.SyncWindow, "sync-window", queue.DefaultSyncWindow, "durability disk: how long a group commit collects writes before its fsync while the store is busy (the previous one had more than one write, or more are waiting); an isolated write is synced at once (0: never wait; a batch is what arrived during the previous fsync)")
	fs.Int64Var(&c.StoreMax, "store-max", 0, "bytes the embedded JetStream store may hold; new mail is refused (452 4.3.1, API 503) once it is within a tenth of them (at least 64 MiB), kept for the mail already queued (0: 75% of the free disk space and of the store's use at start, nats-server's formula, rising as disk space is freed)")
	fs.StringVar(&c.JetStreamSync, "jetstream-sync", "", "deprecated: --durability (always is disk, default is none)")
	_ = fs.MarkDeprecated("jetstream-sync", "use --durability disk|replicas|none (always = disk, default = none)")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:9090", "metrics and health listener (\"\" for none)")
	fs.StringVar(&c.Users, "users", "", "users file (name:bcrypt-hash lines); default: DATA/users, generated on first start")
	fs.StringSliceVar(&c.TrustedNetworks, "trusted-networks", nil, "client networks that may submit without AUTH (CIDR[,CIDR])")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "certificate for STARTTLS on the submission listener")
	fs.StringVar(&c.TLSKey, "tls-key", "", "key for --tls-cert")
	fs.Int64Var(&c.MaxMessageSize, "max-message-size", submission.DefaultMaxMessageBytes, "largest accepted message in bytes (552 above)")
	fs.IntVar(&c.MaxRecipients, "max-recipients", submission.DefaultMaxRecipients, "most recipients per message (452 above)")
	fs.IntVar(&c.MaxConnections, "max-connections", submission.DefaultMaxConnections, "most concurrent submission connections (421 above)")
	fs.IntVar(&c.MaxClientConns, "max-client-connections", submission.DefaultMaxClientConnections, "most concurrent submission connections from one client address or IPv6 /64, trusted networks not counted (421 above; negative: no limit)")
	fs.DurationVar(&c.SMTPReadTimeout, "smtp-read-timeout", submission.DefaultReadTimeout, "submission: idle time allowed between client commands (RFC 5321 4.5.3.2.7); past it 421 and close")
	fs.DurationVar(&c.SMTPDataTimeout, "smtp-data-timeout", submission.DefaultDataTimeout, "submission: the longest a DATA transfer may take")
	fs.Int64Var(&c.SMTPMaxInflightBytes, "smtp-max-inflight-bytes", submission.DefaultMaxInflightBytes,
		"submission: bytes the message bodies being received may hold, each charged twice its size (452 4.3.1 when full or past a tenant's half; negative: no bound)")
	fs.DurationVar(&c.AckWait, "ack-wait", queue.DefaultAckWait, "how long a worker may hold an envelope without reporting progress before NATS hands it to another")
	fs.DurationVar(&c.EventsMaxAge, "events-max-age", queue.DefaultEventsMaxAge, "how long the events stream keeps outcomes (queue history)")
	fs.DurationVar(&c.SentTTL, "sent-ttl", queue.DefaultSentTTL, "how long a delivery's SENT marker is kept, so an envelope whose ack was lost is not delivered twice (at least 24h and 4 × ack-wait)")
	fs.IntVar(&c.Workers, "workers", worker.DefaultWorkers, "concurrent deliveries in this process")
	fs.StringVar(&c.WorkerID, "worker-id", "", "worker id for logs and the contention offset (default hostname-pid)")
	retry, rl, budget := backoff.DefaultRetry(), backoff.DefaultRateLimit(), backoff.DefaultBudget()
	fs.DurationVar(&c.RetryBase, "retry-base", retry.Base, "retry lane: base delay (nominal = base * multiplier^attempt)")
	fs.DurationVar(&c.RetryMin, "retry-min", retry.Min, "retry lane: minimum delay")
	fs.DurationVar(&c.RetryCap, "retry-cap", retry.Cap, "retry lane: maximum delay")
	fs.Float64Var(&c.RetryMultiplier, "retry-multiplier", retry.Multiplier, "retry lane: multiplier per attempt")
	fs.IntVar(&c.MaxAttempts, "max-attempts", budget.MaxAttempts, "attempt budget per message (throttled attempts do not count)")
	fs.DurationVar(&c.MaxAge, "max-age", budget.MaxAge, "wall-clock budget per message: its deadline from submission, and its age from the first attempt")
	fs.DurationVar(&c.RateLimitBase, "ratelimit-base", rl.Base, "rate-limit lane: base delay")
	fs.DurationVar(&c.RateLimitCap, "ratelimit-cap", rl.Cap, "rate-limit lane: maximum delay")
	fs.DurationVar(&c.RateLimitMin, "ratelimit-min", rl.Min, "rate-limit lane: minimum delay")
	fs.Float64Var(&c.DestRate, "dest-rate", 0, "default messages per second per destination, 0 = unlimited")
	fs.IntVar(&c.DestConns, "dest-conns", 0, "default concurrent connections per destination, 0 = unlimited")
	fs.StringVar(&c.UnknownPolicy, "unknown-policy", string(worker.UnknownRetry), "no reply to the final dot: retry or hold")
	fs.StringVar(&c.ClassifyRules, "classify-rules", "", "extra reply-classification rules (TOML), tried first")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "how long deliveries in progress may take to finish at shutdown")
	fs.IntVar(&c.GCPercent, "gc-percent", gcpolicy.DefaultPercent, "Go GC target (GOGC); the environment's GOGC wins when set")
	fs.Int64Var(&c.GCMinHeap, "gc-min-heap", gcpolicy.DefaultMinHeap, "bytes the heap may grow to before the Go GC runs a cycle, however small the live heap; 0 = none")
	fs.IntVar(&c.SMTPPort, "smtp-port", sender.DefaultPort, "port of MX hosts (tests use another)")
	fs.DurationVar(&c.ConnectTimeout, "connect-timeout", sender.DefaultConnectTimeout, "TCP connect to an MX or the relay")
	fs.DurationVar(&c.CommandTimeout, "command-timeout", sender.DefaultCommandTimeout, "each SMTP command's reply, including the greeting (RFC 5321 4.5.3.2)")
	fs.DurationVar(&c.ResetTimeout, "rset-timeout", sender.DefaultResetTimeout, "the reply to the RSET that starts a transaction on a reused connection (a quiet pooled connection costs this before a fresh one is opened)")
	fs.DurationVar(&c.DataTimeout, "data-timeout", sender.DefaultDataBlockTimeout, "each block of the message body written to the server (RFC 5321 4.5.3.2.5)")
	fs.DurationVar(&c.FinalDotTimeout, "final-dot-timeout", sender.DefaultFinalDotTimeout, "the reply to the final dot; past it the outcome is unknown (RFC 5321 4.5.3.2.6)")
	fs.StringSliceVar(&c.NoChunkingFor, "smtp-chunking-off", nil, "destination domains, or MX or relay host names, always sent DATA, never BDAT, whatever their servers offer (NAME[,NAME])")
	fs.BoolVar(&c.SMTPChunking, "smtp-chunking", true, "send each message as one BDAT chunk to servers that offer CHUNKING (RFC 3030): with PIPELINING one round trip a message instead of two; false keeps to DATA")
	fs.StringVar(&c.TLSPolicy, "tls-policy", string(sender.TLSOpportunistic), "TLS to MX hosts: opportunistic, required or none (per destination: [tls-destinations] in the config)")
	bindAPIFlags(fs, &c.apiConfig)
	bindWebhookFlags(fs, &c.webhookConfig)
	bindDeliveryFlags(fs, &c.deliveryConfig)
	bindTLSPolicyFlags(fs, &c.tlsPolicyConfig)
	bindDSNFlags(fs, &c.dsnConfig)
	bindBounceFlags(fs, &c.bounceConfig)
	bindQuotaFlags(fs, &c.quotaConfig)
	bindUnsubscribeFlags(fs, &c.unsubscribeConfig)
}

// loadConfigFile applies the config file under the flags: it remembers the
// flags given on the command line, decodes the file over the defaults, and
// sets the remembered flags again, so the command line wins.
func loadConfigFile(cmd *cobra.Command, c *serveConfig) error {
	c.destRateSet, c.destConnsSet = cmd.Flags().Changed("dest-rate"), cmd.Flags().Changed("dest-conns")
	if c.Config == "" {
		return nil
	}
	given := map[string]string{}
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			given[f.Name] = strings.Join(sv.GetSlice(), ",")
			return
		}
		given[f.Name] = f.Value.String()
	})
	b, err := os.ReadFile(c.Config)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	md, err := toml.Decode(string(b), c)
	if err != nil {
		hint := quoteHint(reflect.TypeOf(c).Elem(), b, err)
		var pe toml.ParseError
		if errors.As(err, &pe) && secretKey(parseErrorKey(b, pe)) {
			// The parser quotes what it found where a value should be:
			// an unquoted password, written to the log for anyone who
			// reads it. Say where, not what.
			return fmt.Errorf("config %s: line %d: the value of %s is not valid TOML%s", c.Config, pe.Position.Line, parseErrorKey(b, pe), hint)
		}
		return fmt.Errorf("config %s: %w%s", c.Config, err, hint)
	}
	if und := md.Undecoded(); len(und) > 0 {
		return fmt.Errorf("config %s: unknown key %q%s", c.Config, und[0].String(), nearKey(reflect.TypeOf(c).Elem(), und[0]))
	}
	c.destRateSet = c.destRateSet || md.IsDefined("dest-rate")
	c.destConnsSet = c.destConnsSet || md.IsDefined("dest-conns")
	if err := zeroKnobs(md, c.Throttle); err != nil {
		return fmt.Errorf("config %s: %w", c.Config, err)
	}
	// The TOML decoder takes an integer for a time.Duration as
	// nanoseconds, so `shutdown-grace = 30` would be 30 ns and `max-age =
	// 86400` would send every message to dead letters at once.
	for _, k := range md.Keys() {
		if md.Type(k...) == "Integer" && keyType(reflect.TypeOf(c).Elem(), k) == durationType {
			return fmt.Errorf("config %s: %s: a duration is a string with its unit, like \"90s\" or \"15m\" (an integer would be nanoseconds)", c.Config, k)
		}
	}
	for name, v := range given {
		if sv, ok := cmd.Flags().Lookup(name).Value.(pflag.SliceValue); ok {
			var vals []string
			if v != "" {
				vals = strings.Split(v, ",")
			}
			if err := sv.Replace(vals); err != nil {
				return err
			}
			continue
		}
		if err := cmd.Flags().Set(name, v); err != nil {
			return err
		}
	}
	return nil
}

var durationType = reflect.TypeOf(time.Duration(0))

// zeroKnobs refuses a [throttle] number or duration the file sets to 0:
// the throttle takes 0 as "the default" (breaker-failures = 0 was 10,
// max-wait = "0s" 2 s), not what the operator wrote. Left out, a key
// takes its default.
func zeroKnobs(md toml.MetaData, s throttle.Settings) error {
	v := reflect.ValueOf(s)
	for i := range v.NumField() {
		key, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("toml"), ",")
		f := v.Field(i)
		switch f.Kind() {
		case reflect.Int, reflect.Int64, reflect.Float64:
		default:
			continue // a switch (*bool), the weights
		}
		if md.IsDefined("throttle", key) && f.IsZero() {
			return fmt.Errorf("[throttle] %s = 0: the throttle would take its default for it, not 0; leave the key out for the default (docs/configuration.md)", key)
		}
	}
	return nil
}

// keyType returns the Go type the config file's key path decodes into, as
// the TOML decoder finds it (toml tags, embedded structs, map keys, arrays
// of tables), or nil for a key of no field.
func keyType(t reflect.Type, path []string) reflect.Type {
	for _, k := range path {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.Map:
			t = t.Elem() // k is the map's key
		case reflect.Struct:
			if t = fieldByKey(t, k); t == nil {
				return nil
			}
		default:
			return nil
		}
	}
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t
}

// fieldByKey returns the type of struct t's field whose toml name is key,
// looking into embedded structs.
func fieldByKey(t reflect.Type, key string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == key {
			return f.Type
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			if ft := fieldByKey(f.Type, key); ft != nil {
				return ft
			}
		}
	}
	return nil
}

// quoteHint says how to write the value a TOML parse error stopped at
// when it is a string left unquoted: `smtp-addr = 127.0.0.1:2525` is an
// "Invalid float value" to the parser, `shutdown-grace = 30s` a top-level
// item that does not end.
func quoteHint(t reflect.Type, file []byte, err error) string {
	var pe toml.ParseError
	if !errors.As(err, &pe) {
		return ""
	}
	path := parseErrorKey(file, pe)
	if path == "" {
		return ""
	}
	kt := keyType(t, strings.Split(path, "."))
	if kt != nil && kt.Kind() == reflect.Slice {
		kt = kt.Elem()
	}
	if kt == nil || (kt.Kind() != reflect.String && kt != durationType) {
		return ""
	}
	key := path[strings.LastIndexByte(path, '.')+1:]
	if lines := strings.Split(string(file), "\n"); pe.Position.Line > 0 && pe.Position.Line <= len(lines) {
		if _, v, ok := strings.Cut(lines[pe.Position.Line-1], "="); ok && strings.HasPrefix(strings.TrimSpace(v), `"`) {
			// Quoted already: the value itself is wrong (max-age = "2d").
			if kt == durationType {
				return fmt.Sprintf(" (%s is a duration with a unit of h, m, s or ms, like \"48h\")", key)
			}
			return ""
		}
	}
	return fmt.Sprintf(" (%s takes a string: quote it, %s = \"...\")", key, key)
}

// parseErrorKey is the dotted key whose value a TOML parse error stopped
// at, or "" when it cannot tell.
func parseErrorKey(file []byte, pe toml.ParseError) string {
	path := pe.LastKey
	if lines := strings.Split(string(file), "\n"); path == "" && pe.Position.Line > 0 && pe.Position.Line <= len(lines) {
		// The error came before the key was taken; read it off the line,
		// under the table the lines above open.
		k, _, ok := strings.Cut(lines[pe.Position.Line-1], "=")
		if !ok {
			return ""
		}
		path = strings.TrimSpace(k)
		for i := pe.Position.Line - 2; i >= 0; i-- {
			if l := strings.TrimSpace(lines[i]); strings.HasPrefix(l, "[") {
				path = strings.Trim(l, "[] ") + "." + path
				break
			}
		}
	}
	return path
}

// secretKey reports whether a config key holds a secret (relay-password),
// whose value no error message may repeat.
func secretKey(path string) bool {
	k := strings.ToLower(path[strings.LastIndexByte(path, '.')+1:])
	return strings.Contains(k, "password") || strings.Contains(k, "secret")
}

// nearKey suggests the known key nearest an unknown one, in the same
// table: ` (did you mean "smtp-addr"?)`, or for a misspelt table's name
// the table nearest it (` (did you mean "tenants"?)`), or nothing when
// none is close.
func nearKey(t reflect.Type, key toml.Key) string {
	if len(key) == 0 {
		return ""
	}
	// The first part of the path that names nothing is the misspelt one:
	// a table's name (`[tenant.shop]`, whose keys are then unknown too)
	// as well as a key's.
	i := len(key) - 1
	for j := range key {
		if keyType(t, key[:j+1]) == nil {
			i = j
			break
		}
	}
	table := keyType(t, key[:i])
	if table != nil && table.Kind() == reflect.Slice {
		table = table.Elem()
	}
	if table == nil || table.Kind() != reflect.Struct {
		return ""
	}
	name := strings.ToLower(key[i])
	best, bestD := "", len(name)/3+2 // more edits than that is another word
	for _, k := range tomlKeys(table) {
		if d := editdist.Distance(name, k); d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// tomlKeys lists the toml names of struct t's fields, embedded ones
// included.
func tomlKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		switch {
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			keys = append(keys, tomlKeys(f.Type)...)
		case name != "" && name != "-":
			keys = append(keys, name)
		}
	}
	return keys
}

// durability resolves --durability: the flag, else the deprecated
// --jetstream-sync (always = disk, default = none: it named the server's
// two-minute sync), else disk on the embedded server and replicas with
// --nats-url. It returns the deprecation note to log, if any.
func (c *serveConfig) durability() (queue.Durability, string, error) {
	if c.Durability != "" {
		d, err := queue.ParseDurability(c.Durability)
		if err != nil {
			return "", "", fmt.Errorf("--durability: %w", err)
		}
		if d == queue.DurabilityDisk && c.NATSURL != "" && c.NATSReplicas > 1 {
			return "", "", fmt.Errorf("--durability disk needs the embedded server, or with --nats-url the embedded server of another outflow daemon: outflow cannot fsync a cluster's stores; " +
				"on a cluster use replicas (a majority holds every write), and set sync_interval: always on its servers to fsync as well")
		}
		if d == queue.DurabilityReplicas && c.NATSURL == "" {
			return "", "", fmt.Errorf("--durability replicas needs a cluster (--nats-url); the embedded server is one node: use disk")
		}
		return d, "", nil
	}
	switch c.JetStreamSync {
	case "":
	case "always":
		return queue.DurabilityDisk, "jetstream-sync is deprecated: always is --durability disk (now the default)", nil
	case "default":
		return queue.DurabilityNone, "jetstream-sync is deprecated: default is --durability none", nil
	default:
		return "", "", fmt.Errorf("--jetstream-sync %q: want always or default (deprecated: use --durability)", c.JetStreamSync)
	}
	if c.NATSURL != "" {
		return queue.DurabilityReplicas, "", nil
	}
	return queue.DurabilityDisk, "", nil
}

// checkHostname says what is wrong with name as the name this host gives
// in EHLO and its greetings, nil for none ("" is the system's): a domain
// name in ASCII (A-labels for an internationalized one: a receiver reads
// the EHLO argument as such, RFC 5321 4.1.2), labels of letters, digits and
// hyphens, or an address literal ([192.0.2.1], [IPv6:2001:db8::1]; RFC
// 5321 4.1.3, which has no zone). A bare address, a port or a non-ASCII
// name went out as written, and receivers that check EHLO refuse it. The
// errors show the literal the address is written as.
func checkHostname(name string) error {
	if name == "" {
		return nil
	}
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		inner := name[1 : len(name)-1]
		tagged := strings.HasPrefix(inner, "IPv6:")
		ip, err := netip.ParseAddr(strings.TrimPrefix(inner, "IPv6:"))
		switch {
		case err != nil:
			return errors.New("not an address literal, like [192.0.2.1] or [IPv6:2001:db8::1]")
		case ip.Zone() != "":
			// netip takes fe80::1%eth0, but a zone means something only on
			// this host, and the literal's syntax has none.
			return fmt.Errorf("a zone (%%%s) cannot be part of an address literal: %s", ip.Zone(), addrLiteral(ip))
		case ip.Is6() && !tagged:
			return fmt.Errorf("an IPv6 address literal has the tag IPv6: %s", addrLiteral(ip))
		case ip.Is4() && tagged:
			return fmt.Errorf("an IPv4 address literal has no tag: %s", addrLiteral(ip))
		}
		return nil
	}
	if ip, err := netip.ParseAddr(name); err == nil {
		if ip.Zone() != "" {
			return fmt.Errorf("an address goes in brackets, without its zone (%%%s): %s", ip.Zone(), addrLiteral(ip))
		}
		return fmt.Errorf("an address goes in brackets: %s", addrLiteral(ip))
	}
	if len(strings.TrimSuffix(name, ".")) > 253 {
		return errors.New("longer than 253 octets")
	}
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("label %q is not a host name's", label)
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				if r > 127 {
					return errors.New("not ASCII: write an internationalized name as A-labels (xn--…)")
				}
				return fmt.Errorf("%q is not a host name's character", r)
			}
		}
	}
	return nil
}

// Widest trusted networks: an IPv4 /8 (10.0.0.0/8) and an IPv6 /7
// (fc00::/7, the unique local addresses).
const (
	widestTrusted4 = 8
	widestTrusted6 = 7
)

// checkTrustedNetwork says what is wrong with p as one of
// --trusted-networks, whose clients submit without AUTH: a network wider
// than any private range (0.0.0.0/0, ::/0, ::ffff:0:0/96, which is every
// IPv4 client) hands the relay to most of the Internet. Postfix takes such
// a mynetworks silently; outflow is never an open relay (docs/submission.md).
func checkTrustedNetwork(p netip.Prefix) error {
	bits, widest, as := p.Bits(), widestTrusted6, p.Masked().String()
	switch {
	case p.Addr().Is4():
		widest = widestTrusted4
	case p.Addr().Is4In6() && bits >= 96:
		// Compared as the IPv4 network it maps (submission.New).
		bits, widest = bits-96, widestTrusted4
		as = netip.PrefixFrom(p.Addr().Unmap(), bits).Masked().String() + ", every IPv4 client it maps,"
	}
	if bits < widest {
		return fmt.Errorf("%s is wider than /%d: its clients would send to anyone without AUTH, an open relay; list your applications' networks (10.0.0.0/8 at the widest for IPv4, fc00::/7 for IPv6)", as, widest)
	}
	return nil
}

// addrLiteral is ip as an address literal (RFC 5321 4.1.3), without a
// zone: [192.0.2.1], [IPv6:2001:db8::1].
func addrLiteral(ip netip.Addr) string {
	if ip.Is4() {
		return "[" + ip.String() + "]"
	}
	return "[IPv6:" + ip.WithZone("").String() + "]"
}

// checkHostPort says what is wrong with addr as a server to connect to,
// host:port: a host, and a port from 1 to 65535 (a name like "submission"
// is no port here: net.SplitHostPort took any word, and each delivery
// failed on it, deferred until max-age).
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("no host")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// checkFlags refuses, before anything starts, the values that the packages
// below would refuse only once serve builds them, late in the start and in
// their own words, which name a Go field (`sender: RelayTLS "plain"`, not
// --relay-tls), and the numbers they would silently replace
// (checkNumbers). An empty string is the package's default.
func (c *serveConfig) checkFlags() error {
	if err := c.checkNumbers(); err != nil {
		return err
	}
	if floor := int64(2 * queue.MinStoreReserve); c.StoreMax > 0 && c.StoreMax < floor {
		// Started, the store was full at once (its reserve a few bytes):
		// the first message's SENT marker was lost, and no mail was taken
		// after it.
		return fmt.Errorf("--store-max %d: it counts bytes, and at least %d (128 MiB): the store keeps a tenth of it, at least 64 MiB, for the mail already queued (20 GiB is 21474836480; 0 is nats-server's default)", c.StoreMax, floor)
	}
	if err := checkHostname(c.Hostname); err != nil {
		return fmt.Errorf("--hostname %q: %v; want one domain name, like mta1.example.com", c.Hostname, err)
	}
	switch sender.RelayTLS(c.RelayTLS) {
	case "", sender.RelaySTARTTLS, sender.RelayImplicitTLS, sender.RelayNoTLS:
	default:
		return fmt.Errorf("--relay-tls %q: want starttls, tls or none", c.RelayTLS)
	}
	if c.Relay == "" && (c.RelayUser != "" || c.RelayPassword != "") {
		// Ignored, the mail went straight to the recipients' MX hosts.
		return errors.New("--relay-user and --relay-password are the smarthost's: set --relay too, or leave them out to deliver to the recipients' MX hosts")
	}
	if c.NATSURL == "" && c.NATSReplicas > 1 {
		// nats-server said only "replicas > 1 not supported in
		// non-clustered mode", naming no flag.
		return fmt.Errorf("--nats-replicas %d: the embedded server is one node; replicas need a cluster (--nats-url)", c.NATSReplicas)
	}
	if c.NATSURL == "" && c.NATSCreds != "" {
		return errors.New("--nats-creds is for --nats-url: set it too, or leave --nats-creds out for the embedded server")
	}
	if c.Relay != "" {
		if err := checkHostPort(c.Relay); err != nil {
			return fmt.Errorf("--relay %q: want host:port, like smtp.example.com:587 (%w)", c.Relay, err)
		}
	}
	validTLS := func(p string) bool {
		switch sender.TLSPolicy(p) {
		case "", sender.TLSOpportunistic, sender.TLSRequired, sender.TLSNone:
			return true
		}
		return false
	}
	if !validTLS(c.TLSPolicy) {
		return fmt.Errorf("--tls-policy %q: want opportunistic, required or none", c.TLSPolicy)
	}
	for _, d := range slices.Sorted(maps.Keys(c.TLSDestinations)) {
		if p := c.TLSDestinations[d]; p == "" || !validTLS(p) {
			return fmt.Errorf("[tls-destinations] %q = %q: want opportunistic, required or none", d, p)
		}
	}
	switch worker.UnknownPolicy(c.UnknownPolicy) {
	case "", worker.UnknownRetry, worker.UnknownHold:
	default:
		return fmt.Errorf("--unknown-policy %q: want retry or hold", c.UnknownPolicy)
	}
	if _, ok := c.Tenants[submission.OtherTenants]; ok {
		// The key of every tenant without a section of its own
		// (senders.go): a section so named silently replaced the
		// top-level sender-domains.
		return fmt.Errorf("[tenants.%q]: the name is reserved for every tenant without a section of its own; set the top-level sender-domains instead", submission.OtherTenants)
	}
	return nil
}

// numberCheck is one numeric setting as checkNumbers sees it: its flag
// (and key), its value, and what 0 and a negative value mean, when
// docs/configuration.md gives them a meaning ("" refuses them).
type numberCheck struct {
	flag           string
	value          float64
	duration       bool // value is a time.Duration's nanoseconds
	zero, negative string
}

// checkNumbers refuses the numbers and durations that would not do what
// they say. The packages below take a zero or negative value for "unset"
// and put their default in its place (internal/defaults): `max-age =
// "0s"`, meant as "never expire", was a day, `max-attempts = 0` was 250,
// `ack-wait = "-1s"` a minute. So a zero or a negative value is refused,
// naming the key and what it takes, unless the key's row in
// docs/configuration.md gives it a meaning (`dest-rate` 0: unlimited,
// `max-client-connections` negative: no limit), and so is a port out of
// range. --workers keeps its documented "0 or less is the default", and
// --sent-ttl has its own floor (serve).
func (c *serveConfig) checkNumbers() error {
	if c.SMTPPort < 1 || c.SMTPPort > 65535 {
		return fmt.Errorf("--smtp-port %d: want a TCP port, 1 to 65535", c.SMTPPort)
	}
	dur := func(flag string, v time.Duration, zero string) numberCheck {
		return numberCheck{flag: flag, value: float64(v), duration: true, zero: zero}
	}
	num := func(flag string, v float64, zero, negative string) numberCheck {
		return numberCheck{flag: flag, value: v, zero: zero, negative: negative}
	}
	for _, n := range []numberCheck{
		num("nats-replicas", float64(c.NATSReplicas), "", ""),
		dur("sync-window", c.SyncWindow, "never wait"),
		num("store-max", float64(c.StoreMax), "nats-server's default", ""),
		num("max-message-size", float64(c.MaxMessageSize), "", ""),
		num("max-recipients", float64(c.MaxRecipients), "", ""),
		num("max-connections", float64(c.MaxConnections), "", ""),
		num("max-client-connections", float64(c.MaxClientConns), "", "no limit"),
		dur("smtp-read-timeout", c.SMTPReadTimeout, ""),
		dur("smtp-data-timeout", c.SMTPDataTimeout, ""),
		num("smtp-max-inflight-bytes", float64(c.SMTPMaxInflightBytes), "", "no bound"),
		dur("ack-wait", c.AckWait, ""),
		dur("events-max-age", c.EventsMaxAge, ""),
		dur("retry-base", c.RetryBase, ""),
		dur("retry-min", c.RetryMin, ""),
		dur("retry-cap", c.RetryCap, ""),
		num("retry-multiplier", c.RetryMultiplier, "", ""),
		num("max-attempts", float64(c.MaxAttempts), "", ""),
		dur("max-age", c.MaxAge, ""),
		dur("ratelimit-base", c.RateLimitBase, ""),
		dur("ratelimit-cap", c.RateLimitCap, ""),
		dur("ratelimit-min", c.RateLimitMin, ""),
		num("dest-rate", c.DestRate, "unlimited", ""),
		num("dest-conns", float64(c.DestConns), "unlimited", ""),
		dur("shutdown-grace", c.ShutdownGrace, "deliveries in progress are cut at once"),
		num("gc-percent", float64(c.GCPercent), "", ""),
		num("gc-min-heap", float64(c.GCMinHeap), "no floor", ""),
		dur("connect-timeout", c.ConnectTimeout, ""),
		dur("command-timeout", c.CommandTimeout, ""),
		dur("rset-timeout", c.ResetTimeout, ""),
		dur("data-timeout", c.DataTimeout, ""),
		dur("final-dot-timeout", c.FinalDotTimeout, ""),
		num("mx-address-limit", float64(c.MXAddressLimit), "no limit", ""),
		num("mx-session-limit", float64(c.MXSessionLimit), "no limit", ""),
		num("api-rate", c.APIRate, "", "no limit"),
		num("api-burst", float64(c.APIBurst), "", ""),
		num("api-max-inflight-bytes", float64(c.APIMaxInflightBytes), "", "no bound"),
		num("webhook-max-attempts", float64(c.WebhookMaxAttempts), "", ""),
		dur("webhook-timeout", c.WebhookTimeout, ""),
		num("webhook-breaker-after", float64(c.WebhookBreakerAfter), "", ""),
		dur("webhook-dead-max-age", c.WebhookDeadMaxAge, ""),
		dur("dsn-delay-warning", c.DSNDelayWarning, "never warn"),
		num("dsn-sender-rate", c.DSNSenderRate, "no limit", ""),
		dur("dsn-pass-timeout", c.DSNPassTimeout, "wait for every destination"),
		num("max-recipients-per-day", float64(c.MaxRecipientsPerDay), "none", ""),
	} {
		if err := n.check(); err != nil {
			return err
		}
	}
	return nil
}

// check refuses n's value when it is 0 or negative and that means
// nothing for n, saying what n takes.
func (n numberCheck) check() error {
	if n.value > 0 || n.value == 0 && n.zero != "" || n.value < 0 && n.negative != "" {
		return nil
	}
	what := "a positive number"
	if n.duration {
		what = "a positive duration"
	}
	if n.zero != "" {
		what = fmt.Sprintf("0 (%s) or %s", n.zero, what)
	}
	if n.negative != "" {
		what += fmt.Sprintf(", or a negative one for %s", n.negative)
	}
	shown := strconv.FormatFloat(n.value, 'g', -1, 64)
	if n.duration {
		shown = time.Duration(n.value).String()
	}
	note := ""
	if n.value == 0 {
		// The mistake this catches: 0 taken for "none" or "never".
		note = "; 0 would be taken as unset and replaced by the default"
	}
	return fmt.Errorf("--%s %s: want %s%s", n.flag, shown, what, note)
}
