package clientaddr

import (
	"net"
	"net/netip"
	"testing"
)

// One IPv6 /64 is one client, an IPv4 address is one client, an IPv4
// address mapped into IPv6 is that IPv4 client.
func TestPrefix(t *testing.T) {
	for _, tc := range []struct {
		a    net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 1}, "2001:db8::/64"},
		{&net.TCPAddr{IP: net.ParseIP("2001:db8::ffff:2"), Port: 2}, "2001:db8::/64"},
		{&net.TCPAddr{IP: net.ParseIP("192.0.2.7"), Port: 3}, "192.0.2.7/32"},
		{&net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 4}, "192.0.2.7/32"},
		{&net.UnixAddr{Name: "@", Net: "unix"}, "invalid Prefix"},
	} {
		if got := Of(tc.a); got.String() != tc.want {
			t.Errorf("Of(%v) = %v, want %s", tc.a, got, tc.want)
		}
	}
	if Prefix(netip.Addr{}) != (netip.Prefix{}) {
		t.Error("the zero address is not the shared bucket")
	}
}
