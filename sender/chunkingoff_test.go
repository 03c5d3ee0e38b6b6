package sender

import (
	"net"
	"strings"
	"testing"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestChunkingOffIPv6Relay: a relay at an IPv6 literal is named in
// NoChunkingFor as the relay is written ("[::1]", --relay '[::1]:587'),
// bare, or in another spelling of the address, and is sent DATA. The
// relay's host is compared bare ("::1"), so the bracketed name was
// accepted and never matched: BDAT went on to the broken relay.
func TestChunkingOffIPv6Relay(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	for _, name := range []string{"[::1]", "::1", "0:0:0:0:0:0:0:1", "[0000::0001]"} {
		t.Run(name, func(t *testing.T) {
			fake := fakemx.Start(t, fakemx.Options{Addr: "[::1]:0"})
			w := newWorld(t)
			w.routes[fake.Addr()] = fake.Addr()
			w.recordWrites = true
			cfg := w.config()
			cfg.Relay, cfg.RelayTLS = fake.Addr(), RelayNoTLS
			cfg.NoChunkingFor = map[string]bool{name: true}
			checkDelivered(t, w.sender(cfg).Send(ctxT(t), msg("example.test", "a@example.test")))
			data := false
			for _, wr := range w.writesSeen() {
				if strings.Contains(wr, "BDAT ") {
					t.Errorf("BDAT sent to relay %s with %q in NoChunkingFor: %q", fake.Addr(), name, wr)
				}
				data = data || strings.HasSuffix(wr, "DATA\r\n")
			}
			if !data {
				t.Errorf("no DATA sent to relay %s", fake.Addr())
			}
		})
	}
}

// TestNameKeyAddressLiteral: an IP address is keyed as netip writes it,
// with or without brackets; a name keeps to lower case without a trailing
// dot.
func TestNameKeyAddressLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"[::1]": "::1", "::1": "::1", "0:0:0:0:0:0:0:1": "::1", "[2001:DB8::A]": "2001:db8::a",
		"[127.0.0.1]": "127.0.0.1", "::ffff:127.0.0.1": "127.0.0.1",
		"MX1.Example.": "mx1.example", "[not-an-ip]": "[not-an-ip]",
	} {
		if got := nameKey(in); got != want {
			t.Errorf("nameKey(%q) = %q, want %q", in, got, want)
		}
	}
}
