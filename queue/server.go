package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"golang.org/x/crypto/bcrypt"
)

// ClientInfoFile is the file, inside the data dir, where `serve` writes the
// address and credentials of the embedded server's client listener, so that
// the CLI's admin verbs and external workers can reach it. Mode 0600.
const ClientInfoFile = "nats-client.json"

// ClientInfo is the content of ClientInfoFile.
type ClientInfo struct {
	URL      string `json:"url"`      // nats://127.0.0.1:port, empty when there is no listener
	User     string `json:"user"`     // the generated client user
	Password string `json:"password"` // its generated password
}

// EmbeddedConfig configures the in-process NATS server.
type EmbeddedConfig struct {
	// DataDir is outflow's data directory; JetStream files go in
	// DataDir/jetstream and the client credentials in DataDir/ClientInfoFile.
	DataDir string
	// ListenAddr is the optional client listener (host:port; port 0 picks a
	// free one). Empty means in-process connections only. It always
	// requires the generated credentials.
	ListenAddr string
	// Durability is what a write must reach before outflow reports it
	// done. DurabilityDisk (the default, also for "") starts a StoreSyncer,
	// which Syncer returns for Options.Syncer: group-committed fsyncs of
	// the streams written. DurabilityNone relies on the server's sync
	// every two minutes. DurabilityReplicas needs a cluster and is refused.
	Durability Durability
	// SyncWindow is the StoreSyncer's batch window while the store is
	// busy (serve's default: DefaultSyncWindow); 0: none, a batch is what
	// arrived during the previous sync (see NewStoreSyncer).
	SyncWindow time.Duration
	// SweepEvery is how often the StoreSyncer syncs the deferred lanes on
	// its own; 0 means DefaultSweepEvery, negative never (tests).
	SweepEvery time.Duration
	// SyncAlways makes the server itself fsync every write before
	// acknowledging it (about 6.7 fsyncs per submitted message, one at a
	// time; docs/benchmarks.md). Kept to measure against; Durability disk
	// gives the same promise for one fsync per batch.
	SyncAlways bool
	// MaxStore bounds JetStream's file storage in bytes (serve's
	// --store-max); 0 means nats-server's own formula, computed here: 75%
	// of the file system's free space at start, plus 75% of what the store
	// already holds, rising while running as disk space is freed. The
	// limit in force is StoreRoom().Limit(), and new mail is refused once
	// the store is within StoreReserve of it (ErrNoRoom). nats-server's
	// own limit is kept at least the store's use at start plus the
	// reserve (storeLimits), so that the mail already queued drains.
	MaxStore int64
	// Logger receives the server's warnings and errors; zero value: none.
	Logger zerolog.Logger

	// freeSpace reads the free bytes of dir's file system; nil: statfs.
	// Tests give a full disk without filling one.
	freeSpace func(dir string) (uint64, error)
}

// Embedded is a running in-process NATS server with JetStream.
type Embedded struct {
	srv        *server.Server
	info       ClientInfo
	inProcess  ClientInfo // the in-process user: plain password, in memory only
	storeDir   string
	limitMu    sync.Mutex             // guards jsConfig and natsOpts: the store limit rises while running
	jsConfig   server.JetStreamConfig // as started (its limit as raised since), to start it again the same way
	natsOpts   *server.Options        // as last given to the server, to raise its store limit (raiseStoreLimit)
	writeErr   *atomic.Bool           // a stream reported a sticky write error
	syncer     *StoreSyncer           // nil unless Durability is disk
	stopSync   context.CancelFunc     // ends the syncer's goroutine
	syncPanics atomic.Uint64          // the syncer's recovered panics
	room       *StoreRoom             // the store's use against its limit
	stopRoom   context.CancelFunc     // ends the room's polls
	lock       *os.File               // the data dir's lock (LockFile), held until Shutdown
}

// StartEmbedded starts nats-server in this process with JetStream on file
// storage, and writes (or reuses) the client credentials file.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: no data dir")
	}
	if cfg.Durability == "" {
		cfg.Durability = DurabilityDisk
	}
	if cfg.Durability == DurabilityReplicas {
		return nil, errors.New("embedded nats: durability replicas needs a cluster (--nats-url); the embedded server is one node: use disk")
	}
	if cfg.MaxStore < 0 {
		return nil, fmt.Errorf("embedded nats: --store-max %d: want a number of bytes, or 0 for nats-server's default", cfg.MaxStore)
	}
	// --nats-addr is read before anything is written in the data dir: a
	// start refused on it must leave nothing behind (a ClientInfoFile
	// without a URL made the CLI blame a daemon that never ran for having
	// no client listener).
	var listenHost string
	var listenPort int
	if cfg.ListenAddr != "" {
		host, port, err := net.SplitHostPort(cfg.ListenAddr)
		if err != nil {
			hint := ""
			if strings.Count(cfg.ListenAddr, ":") > 1 && !strings.HasPrefix(cfg.ListenAddr, "[") {
				hint = " (an IPv6 address goes in brackets: [::1]:4222)"
			}
			return nil, fmt.Errorf("embedded nats: --nats-addr %q: %w%s", cfg.ListenAddr, err, hint)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 0 || p > 65535 {
			return nil, fmt.Errorf("embedded nats: --nats-addr %q: bad port", cfg.ListenAddr)
		}
		listenHost, listenPort = host, p
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	lock, err := lockDataDir(cfg.DataDir, cfg.Logger)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started {
			_ = lock.Close()
		}
	}()
	info, err := loadOrCreateCreds(filepath.Join(cfg.DataDir, ClientInfoFile))
	if err != nil {
		return nil, err
	}
	// The server keeps only a bcrypt hash of the generated password
	// (nats-server verifies "$2a$" passwords with bcrypt), so the password
	// itself lives in one 0600 file. At bcrypt's least cost: the cost is a
	// brute-force guesser's price per guess, which only matters for a
	// password a person chose, and this one is 192 random bits. The
	// server pays it on every connection from outside the process (each
	// CLI command, each fleet member): at the default cost, 10, a CLI
	// command against a race-detector build of the daemon cost it 1.4 s
	// of CPU (about 50 ms without the race detector, by `outflow passwd`'s
	// figure for that cost).
	hash, err := bcrypt.GenerateFromPassword([]byte(info.Password), bcrypt.MinCost)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	// In-process connections (the daemon's own) sign in as a second user
	// that the server accepts only for in-process connections. Its
	// password is made for this start and never written down, so it can
	// be compared in plain (constant time) rather than with bcrypt, which
	// on a machine whose cores are busy can take longer than the handshake.
	inProcess, err := newCreds("outflow-in-process")
	if err != nil {
		return nil, err
	}
	// nats-server's limit is always given, never left to its default (0):
	// a limit the server computed itself cannot be changed while it runs
	// (reload refuses "dynamic" to set), and its default is under the
	// store's use on a disk with less free space than a third of it, where
	// it would refuse every write (storeLimits). Until the streams are
	// recovered and their use known, the default's part for the free
	// space; raised below once it is.
	storeDir := filepath.Join(cfg.DataDir, "jetstream")
	if err := os.MkdirAll(storeDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	freeSpace := cfg.freeSpace
	if freeSpace == nil {
		freeSpace = freeBytes
	}
	free, err := freeSpace(storeDir)
	if err != nil {
		// As nats-server does when it cannot tell: 1 TB.
		cfg.Logger.Warn().Err(err).Str("store", storeDir).Msg("free disk space unknown; the store limit assumes 1 TB")
		free = server.JetStreamMaxStoreDefault / 3 * 4
	}
	natsLimit, _ := storeLimits(cfg.MaxStore, free, 0)
	opts := &server.Options{
		ServerName:        "outflow-embedded",
		JetStream:         true,
		StoreDir:          storeDir,
		JetStreamMaxStore: natsLimit,
		Users: []*server.User{
			{Username: info.User, Password: string(hash)},
			{Username: inProcess.User, Password: inProcess.Password,
				AllowedConnectionTypes: map[string]struct{}{jwt.ConnectionTypeInProcess: {}}},
		},
		NoSigs:                true,
		NoLog:                 true,
		MaxPayload:            8 << 20,
		DisableShortFirstPing: true,
	}
	if cfg.SyncAlways {
		opts.SyncAlways = true
	}
	if cfg.ListenAddr == "" {
		opts.DontListen = true
	} else {
		host, p := listenHost, listenPort
		if p == 0 {
			p = server.RANDOM_PORT
		} else if ln, err := net.Listen("tcp", cfg.ListenAddr); err != nil {
			// Said now: nats-server only logs it, and the start would wait
			// 30 s for a listener that never comes.
			hint := ""
			if errors.Is(err, syscall.EADDRINUSE) {
				hint = " (another outflow or NATS server? give another --nats-addr)"
			}
			return nil, fmt.Errorf("embedded nats: --nats-addr %s: %w%s", cfg.ListenAddr, err, hint)
		} else {
			ln.Close()
		}
		opts.Host, opts.Port = host, p
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	writeErr := &atomic.Bool{}
	srv.SetLoggerV2(natsLog{cfg.Logger.With().Str("component", "nats-server").Logger(), writeErr}, false, false, false)
	srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		return nil, errors.New("embedded nats: not ready after 30s")
	}
	// A failed JetStream start (disk, permissions, a corrupt store) can
	// leave the server running without it; refuse to go on in that state.
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		return nil, fmt.Errorf("embedded nats: JetStream did not start (store dir %s)", opts.StoreDir)
	}
	jsc := *srv.JetStreamConfig()
	// The running config names <StoreDir>/jetstream; EnableJetStream adds
	// that suffix again, so a restart must be given the configured dir.
	jsc.StoreDir = opts.StoreDir
	e := &Embedded{srv: srv, info: info, inProcess: inProcess, storeDir: opts.StoreDir, jsConfig: jsc, natsOpts: opts, writeErr: writeErr, lock: lock}
	if !opts.DontListen {
		e.info.URL = srv.ClientURL()
	} else {
		e.info.URL = ""
	}
	if err := writeJSON0600(filepath.Join(cfg.DataDir, ClientInfoFile), e.info); err != nil {
		srv.Shutdown()
		return nil, err
	}
	// The limits, now that the streams are recovered and their use known
	// (storeLimits); watched from here on, so that new mail is refused
	// while the rest of the store's writes still find room.
	var used int64
	if jsz, err := srv.Jsz(&server.JSzOptions{}); err == nil && jsz != nil && !jsz.Disabled {
		used = int64(jsz.Store)
	}
	limit, natsLimit := storeLimits(cfg.MaxStore, free, used)
	if err := e.raiseStoreLimit(natsLimit, cfg.Logger); err != nil {
		cfg.Logger.Error().Err(err).Str("store", opts.StoreDir).Int64("store_bytes", used).
			Msg("nats-server's store limit could not be raised for the mail already queued: it may not drain until a restart with more disk space")
	}
	var roomFree func() (uint64, error)
	if cfg.MaxStore == 0 {
		roomFree = func() (uint64, error) { return freeSpace(opts.StoreDir) }
	}
	var raiseFailed atomic.Bool // said once: the room tries again at each look
	e.room = newStoreRoom(srv, limit, roomFree, func(n int64) error {
		err := e.raiseStoreLimit(n, cfg.Logger)
		if err != nil && !raiseFailed.Swap(true) {
			cfg.Logger.Warn().Err(err).Msg("the store limit cannot follow the free disk space up; new mail is held to the limit of the start")
		}
		return err
	})
	storeRooms.Store(srv, e.room)
	roomCtx, stopRoom := context.WithCancel(context.Background())
	e.stopRoom = stopRoom
	go e.room.run(roomCtx, StoreRoomEvery)
	logStoreAtStart(cfg.Logger, e.room, cfg.MaxStore, free, opts.StoreDir)
	if cfg.Durability == DurabilityDisk {
		e.syncer = NewStoreSyncer(srv, cfg.SyncWindow)
		if cfg.SweepEvery != 0 {
			e.syncer.sweepEvery = max(cfg.SweepEvery, 0)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e.stopSync = cancel
		go e.runSyncer(ctx, cfg.Logger)
	}
	started = true
	return e, nil
}

// raiseStoreLimit makes nats-server's store limit n bytes, if more than it
// is: through a reload of its options (server/reload.go allows a set limit
// to rise while running, never to fall), and into the JetStream config
// Supervise restarts JetStream with.
func (e *Embedded) raiseStoreLimit(n int64, log zerolog.Logger) error {
	e.limitMu.Lock()
	defer e.limitMu.Unlock()
	was := e.natsOpts.JetStreamMaxStore
	if n <= was {
		return nil
	}
	o := e.natsOpts.Clone()
	o.JetStreamMaxStore = n
	if err := e.srv.ReloadOptions(o); err != nil {
		return fmt.Errorf("raise nats-server's store limit from %d to %d bytes: %w", was, n, err)
	}
	e.natsOpts = o
	e.jsConfig.MaxStore = n
	log.Debug().Int64("from_bytes", was).Int64("to_bytes", n).Msg("nats-server's store limit raised")
	return nil
}

// logStoreAtStart says, loudly, a store started short of room: over its
// limit (an error: it took in more than it may hold, or the disk filled
// up since), or within the reserve of it (a warning: new mail waits for
// deliveries), with what gives it room.
func logStoreAtStart(log zerolog.Logger, r *StoreRoom, maxStore int64, free uint64, dir string) {
	if r.Err() == nil {
		return
	}
	used, limit := r.Used(), r.Limit()
	ev := log.Warn()
	msg := "the store is short of room at start: new mail is refused (452 4.3.1) until deliveries free it; the mail already queued moves on in the reserve"
	if used >= limit {
		ev = log.Error()
		msg = "the store holds more than its limit at start: new mail is refused (452 4.3.1) until deliveries bring it under the limit less the reserve; " +
			"nats-server's limit is raised above the store's use so that the mail already queued drains"
	}
	if maxStore > 0 {
		msg += "; raise --store-max for room now (a restart), or let the queue drain"
	} else {
		msg += "; free disk space for room now (the limit rises with it, no restart needed), or let the queue drain"
	}
	ev.Str("store", dir).Int64("store_bytes", used).Int64("store_limit_bytes", limit).
		Int64("store_reserve_bytes", r.Reserve()).Int64("nats_store_limit_bytes", r.ServerLimit()).
		Int64("store_max", maxStore).Uint64("free_bytes", free).Msg(msg + "; docs/runbook.md, \"The store is full\"")
}

// LockFile is the file in the data directory that a running embedded
// server holds locked (flock), with its process id in it.
const LockFile = "outflow.lock"

// lockDataDir takes dir's lock, or says which process holds it: two
// servers on one store would write the same block files (the second even
// "recovers" the first's streams while they are written), and the second
// would only fail 30 s later, on the listener address the first holds.
// The kernel drops the lock when the process ends, however it ends.
func lockDataDir(dir string, log zerolog.Logger) (*os.File, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.ENOLCK) || errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
			// A file system without locks (some NFS, CIFS or FUSE
			// mounts): go on unlocked, as the releases before did.
			log.Warn().Err(err).Str("dir", dir).Msg("data dir cannot be locked on this file system; a second serve on it would not be refused")
			return f, nil
		}
		pid, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("data dir %s is in use by another outflow (pid %s): stop it, or give this one another --data",
				dir, cmp.Or(strings.TrimSpace(string(pid)), "unknown"))
		}
		return nil, fmt.Errorf("embedded nats: lock %s: %w", path, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}

// runSyncer runs the syncer until ctx ends. A panic is logged and ends
// the syncer: every Sync then fails, so nothing more is accepted with a
// 250 until the process restarts, which is what /readyz reports.
func (e *Embedded) runSyncer(ctx context.Context, log zerolog.Logger) {
	defer func() {
		if r := recover(); r != nil {
			e.syncPanics.Add(1)
			log.Error().Interface("panic", r).Msg("store syncer panicked; submissions get 451 until restart")
		}
	}()
	e.syncer.Run(ctx)
}

// Syncer returns the group-commit syncer for Options.Syncer, or nil when
// Durability is none.
func (e *Embedded) Syncer() Syncer {
	if e.syncer == nil {
		return nil
	}
	return e.syncer
}

// StoreSyncer returns the syncer itself (for its Stats), or nil.
func (e *Embedded) StoreSyncer() *StoreSyncer { return e.syncer }

// StoreRoom returns the watch on the store's use against its limit: its
// Err refuses new mail near the limit, and it is the collector of
// outflow_store_bytes, outflow_store_limit_bytes and the rest.
func (e *Embedded) StoreRoom() *StoreRoom { return e.room }

// Server returns the underlying nats-server, for in-process connections.
func (e *Embedded) Server() *server.Server { return e.srv }

// ClientInfo returns the listener URL (may be empty) and credentials.
func (e *Embedded) ClientInfo() ClientInfo { return e.info }

// InProcessInfo returns the credentials for in-process connections
// (Options.InProcess with Server()); the listener refuses them.
func (e *Embedded) InProcessInfo() ClientInfo { return e.inProcess }

// Shutdown stops the server and waits for it to finish writing.
func (e *Embedded) Shutdown() {
	if e.stopSync != nil {
		e.stopSync()
	}
	if e.stopRoom != nil {
		e.stopRoom()
		storeRooms.Delete(e.srv)
	}
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
	if e.lock != nil {
		_ = e.lock.Close()
	}
}

// ReadClientInfo reads the credentials a running `serve` wrote into dataDir.
func ReadClientInfo(dataDir string) (ClientInfo, error) {
	var ci ClientInfo
	b, err := os.ReadFile(filepath.Join(dataDir, ClientInfoFile))
	if err != nil {
		return ci, fmt.Errorf("read daemon address: %w (is `outflow serve --data %s` running? or pass --nats-url)", err, dataDir)
	}
	if err := json.Unmarshal(b, &ci); err != nil {
		return ci, fmt.Errorf("read daemon address %s: %w", ClientInfoFile, err)
	}
	return ci, nil
}

// loadOrCreateCreds reads the client credentials of an earlier start from
// path, or makes new ones. It writes nothing: StartEmbedded writes the
// file once the server is up, with its URL, so that a start that fails
// leaves no file naming a daemon that never ran (and one that an earlier
// start wrote as it was).
func loadOrCreateCreds(path string) (ClientInfo, error) {
	var ci ClientInfo
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &ci); err == nil && ci.User != "" && ci.Password != "" {
			return ci, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return ci, fmt.Errorf("embedded nats: %w", err)
	}
	return newCreds("outflow")
}

// newCreds makes user a random password (24 bytes, hex).
func newCreds(user string) (ClientInfo, error) {
	buf := make([]byte, 24)
	if _, err := rand.Read(buf); err != nil {
		return ClientInfo{}, fmt.Errorf("embedded nats: generate credentials: %w", err)
	}
	return ClientInfo{User: user, Password: hex.EncodeToString(buf)}, nil
}

func writeJSON0600(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
