package main

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// TestHTTPAddrOff: --http-addr "" serves no metrics and health listener,
// as "" turns the API's and the embedded NATS server's off, and a daemon
// comes up and stops without it. Before, net.Listen took "" for every
// interface at a port of its choosing: /metrics on every address.
func TestHTTPAddrOff(t *testing.T) {
	srv, ln, err := startHTTP("", prometheus.NewRegistry(), &atomic.Bool{}, nil, nil, queue.DurabilityDisk, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	if ln != nil {
		ln.Close()
		t.Fatalf("--http-addr \"\" listens on %s", ln.Addr())
	}
	// Idle keep-alive connections end, and a slow client's request too.
	if srv.IdleTimeout <= 0 || srv.ReadTimeout <= 0 || srv.ReadHeaderTimeout <= 0 {
		t.Errorf("metrics listener's timeouts: idle %v, read %v, header %v; want each set", srv.IdleTimeout, srv.ReadTimeout, srv.ReadHeaderTimeout)
	}
	if err := srv.Close(); err != nil {
		t.Errorf("close: %v", err)
	}

	data := filepath.Join(t.TempDir(), "data")
	cfg, err := parseWith(t, emptyConfig(t), serveArgs(data, "--http-addr", "")...)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.HTTPAddr != "" {
		t.Fatalf("--http-addr %q, want \"\"", cfg.HTTPAddr)
	}
	serveUntilUp(t, cfg) // without a metrics listener
}

// serveUntilUp runs serve on cfg until it is up (it prints the generated
// account once the daemon is up), then stops it; t fails when serve stops
// by itself, does not come up within 2 minutes, or returns an error.
func serveUntilUp(t *testing.T, cfg *serveConfig) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &signalWriter{wrote: make(chan struct{})}
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, out) }()
	select {
	case <-out.wrote:
	case err := <-done:
		t.Fatalf("serve stopped before it was up: %v", err)
	case <-time.After(2 * time.Minute):
		t.Fatal("serve did not come up")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}
