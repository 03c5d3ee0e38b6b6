package submission

import (
	"net/netip"
	"testing"
)

// TestTrustedNetworkIPv4Mapped: a trusted network written in its
// IPv4-mapped form (::ffff:127.0.0.0/104) trusts the IPv4 clients it maps,
// whose addresses are unmapped before the check; before, it was accepted
// and matched no client, which was told 530.
func TestTrustedNetworkIPv4Mapped(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("::ffff:127.0.0.0/104")}}, q)
	if err := send(ts.dial(t), "app@example.com", []string{"rcpt@example.org"}, "Subject: t\r\n\r\nx\r\n"); err != nil {
		t.Fatalf("client 127.0.0.1 in ::ffff:127.0.0.0/104: %v", err)
	}
	if subs := q.got(); len(subs) != 1 || subs[0].Tenant != TrustedTenant {
		t.Fatalf("submissions %+v", subs)
	}
	if got, want := ts.srv.cfg.TrustedNetworks, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}; len(got) != 1 || got[0] != want[0] {
		t.Errorf("TrustedNetworks %v, want %v", got, want)
	}
}

// TestTrustedNetworkMatches: which client addresses a network trusts. A
// zoned link-local client is in its prefix (Contains refuses a zoned
// address, so it matched none); mapped networks of fewer than 96 bits
// are IPv6 networks and kept as written.
func TestTrustedNetworkMatches(t *testing.T) {
	for _, c := range []struct {
		prefix, client string
		want           bool
	}{
		{"::ffff:127.0.0.0/104", "127.0.0.1", true},
		{"::ffff:127.0.0.1/128", "127.0.0.1", true},
		{"::ffff:127.0.0.1/128", "127.0.0.2", false},
		{"::ffff:10.0.0.0/104", "127.0.0.1", false},
		{"::ffff:0.0.0.0/96", "192.0.2.1", true},
		{"fe80::/10", "fe80::2%eth0", true},
		{"fe80::/10", "fe80::2", true},
		{"2001:db8::/32", "fe80::2%eth0", false},
		{"127.0.0.0/8", "127.0.0.1", true},
	} {
		srv, err := New(Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix(c.prefix)}}, &fakeQueue{})
		if err != nil {
			t.Fatal(err)
		}
		if got := srv.isTrusted(netip.MustParseAddr(c.client)); got != c.want {
			t.Errorf("client %s in %s: %v, want %v", c.client, c.prefix, got, c.want)
		}
	}
}
