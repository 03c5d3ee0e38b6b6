package queue

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFailedStartWritesNoClientInfo: a start refused on --nats-addr (an
// IPv6 address without brackets, or an address in use) leaves no
// ClientInfoFile behind, and one an earlier start wrote as it was. Before,
// the file was written with no URL before --nats-addr was read, and
// `outflow queue list` then said a daemon ran without a client listener.
func TestFailedStartWritesNoClientInfo(t *testing.T) {
	t.Run("unbracketed IPv6", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "data")
		e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, ListenAddr: "::1:50042"})
		if err == nil {
			e.Shutdown()
			t.Fatal("started on --nats-addr ::1:50042")
		}
		if !strings.Contains(err.Error(), "[::1]:4222") {
			t.Errorf("error %q does not show the bracketed form", err)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("data dir after a start refused on a flag: %v, want none", err)
		}
	})
	t.Run("address in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		dir := t.TempDir()
		if e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, ListenAddr: ln.Addr().String()}); err == nil {
			e.Shutdown()
			t.Fatal("started on an address in use")
		}
		if _, err := os.Stat(filepath.Join(dir, ClientInfoFile)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a failed start: %v, want none", ClientInfoFile, err)
		}
	})
	t.Run("earlier start's file kept", func(t *testing.T) {
		dir := t.TempDir()
		e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, ListenAddr: "127.0.0.1:0", Durability: DurabilityNone})
		if err != nil {
			t.Fatal(err)
		}
		url := e.ClientInfo().URL
		e.Shutdown()
		before, err := ReadClientInfo(dir)
		if err != nil || before.URL != url || url == "" {
			t.Fatalf("after a start: %+v, %v; want URL %q", before, err, url)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, ListenAddr: ln.Addr().String()}); err == nil {
			e.Shutdown()
			t.Fatal("started on an address in use")
		}
		if after, err := ReadClientInfo(dir); err != nil || after != before {
			t.Errorf("after a failed start: %+v, %v; want %+v", after, err, before)
		}
	})
}
