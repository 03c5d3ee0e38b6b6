package sender

import (
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

// TestRelayAuthRefusedLogsConfiguredRelay: the "relay AUTH refused" line
// names the relay as configured (host:port, an IPv6 one in brackets), as
// the worker's line about a relay refusing outflow does, so that the two
// can be matched; it named the bare host ("::1").
func TestRelayAuthRefusedLogsConfiguredRelay(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	fake := fakemx.Start(t, fakemx.Options{Addr: "[::1]:0", Users: map[string]string{"tenant": "another password"}})
	w := newWorld(t)
	w.routes[fake.Addr()] = fake.Addr()
	cfg := w.config()
	cfg.Relay, cfg.RelayTLS = fake.Addr(), RelayNoTLS
	cfg.RelayUsername, cfg.RelayPassword = "tenant", relayPassword
	checkAll(t, w.sender(cfg).Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test")), classify.StageAuth, 535, classify.EventNone)
	var found bool
	for _, line := range strings.Split(w.logBuf.String(), "\n") {
		var l struct{ Message, Relay string }
		if json.Unmarshal([]byte(line), &l) != nil || !strings.HasPrefix(l.Message, "relay AUTH refused") {
			continue
		}
		found = true
		if l.Relay != cfg.Relay {
			t.Errorf("relay %q in %s, want the configured %q", l.Relay, line, cfg.Relay)
		}
	}
	if !found {
		t.Errorf("no relay AUTH refused line in:\n%s", w.logBuf.String())
	}
}
