package queue

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"time"

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
	// SyncAlways makes JetStream fsync every write before acknowledging it
	// (slower; survives a power loss). The default syncs every two minutes
	// and relies on replication or the OS for the window in between.
	SyncAlways bool
	// MaxStore bounds JetStream's file storage in bytes; 0 means the
	// server's default (most of the disk).
	MaxStore int64
	// Logger receives the server's warnings and errors; zero value: none.
	Logger zerolog.Logger
}

// Embedded is a running in-process NATS server with JetStream.
type Embedded struct {
	srv      *server.Server
	info     ClientInfo
	storeDir string
	jsConfig server.JetStreamConfig // as started, to start it again the same way
	writeErr *atomic.Bool           // a stream reported a sticky write error
}

// StartEmbedded starts nats-server in this process with JetStream on file
// storage, and writes (or reuses) the client credentials file.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("embedded nats: no data dir")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	info, err := loadOrCreateCreds(filepath.Join(cfg.DataDir, ClientInfoFile))
	if err != nil {
		return nil, err
	}
	// The server keeps only a bcrypt hash of the generated password
	// (nats-server verifies "$2a$" passwords with bcrypt), so the password
	// itself lives in one 0600 file.
	hash, err := bcrypt.GenerateFromPassword([]byte(info.Password), bcrypt.DefaultCost)
	if err != nil {
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	opts := &server.Options{
		ServerName:            "outflow-embedded",
		JetStream:             true,
		StoreDir:              filepath.Join(cfg.DataDir, "jetstream"),
		JetStreamMaxStore:     cfg.MaxStore,
		Username:              info.User,
		Password:              string(hash),
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
		host, port, err := net.SplitHostPort(cfg.ListenAddr)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: --nats-addr %q: %w", cfg.ListenAddr, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: --nats-addr %q: bad port", cfg.ListenAddr)
		}
		if p == 0 {
			p = server.RANDOM_PORT
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
	e := &Embedded{srv: srv, info: info, storeDir: opts.StoreDir, jsConfig: jsc, writeErr: writeErr}
	if !opts.DontListen {
		e.info.URL = srv.ClientURL()
	} else {
		e.info.URL = ""
	}
	if err := writeJSON0600(filepath.Join(cfg.DataDir, ClientInfoFile), e.info); err != nil {
		srv.Shutdown()
		return nil, err
	}
	return e, nil
}

// Server returns the underlying nats-server, for in-process connections.
func (e *Embedded) Server() *server.Server { return e.srv }

// ClientInfo returns the listener URL (may be empty) and credentials.
func (e *Embedded) ClientInfo() ClientInfo { return e.info }

// Shutdown stops the server and waits for it to finish writing.
func (e *Embedded) Shutdown() {
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
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

func loadOrCreateCreds(path string) (ClientInfo, error) {
	var ci ClientInfo
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &ci); err == nil && ci.User != "" && ci.Password != "" {
			return ci, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return ci, fmt.Errorf("embedded nats: %w", err)
	}
	buf := make([]byte, 24)
	if _, err := rand.Read(buf); err != nil {
		return ci, fmt.Errorf("embedded nats: generate credentials: %w", err)
	}
	ci = ClientInfo{User: "outflow", Password: hex.EncodeToString(buf)}
	return ci, writeJSON0600(path, ci)
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
