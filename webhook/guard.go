package webhook

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// ErrPrivateAddress is the dial error for a refused address.
type ErrPrivateAddress struct{ Addr netip.Addr }

func (e *ErrPrivateAddress) Error() string {
	return fmt.Sprintf("webhook: %s is a loopback, private or link-local address (allow with webhook-allow-private)", e.Addr)
}

// private reports whether a is an address a tenant must not aim the
// daemon at: loopback, RFC 1918 / RFC 4193 private, link-local (cloud
// metadata services live there), unspecified, multicast, or another
// special-purpose range (special); and an IPv6
// address that carries such an IPv4 one to a translator (NAT64, RFC 6052
// and 8215; 6to4, RFC 3056), which on a host behind one reaches it.
func private(a netip.Addr) bool {
	a = a.Unmap()
	if v4, ok := embeddedV4(a); ok && private(v4) {
		return true
	}
	if a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast() {
		return true
	}
	for _, p := range special {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// special are the other ranges that are no public endpoint (RFC 6890's
// registries): what one reaches there is the operator's network or
// nobody's.
var special = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network" (0.x.y.z reaches the host itself on Linux)
	netip.MustParsePrefix("100.64.0.0/10"),   // carrier-grade NAT (RFC 6598)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking (RFC 2544), used for internal networks
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("fec0::/10"),       // site-local (deprecated, still routed inside some sites)
	netip.MustParsePrefix("100::/64"),        // discard-only (RFC 6666)
	netip.MustParsePrefix("2001:2::/48"),     // benchmarking
	netip.MustParsePrefix("::ffff:0:0:0/96"), // IPv4-translated (RFC 2765), SIIT
}

// translators are the IPv6 prefixes whose addresses embed an IPv4 one, and
// where in them it sits.
var translators = []struct {
	prefix netip.Prefix
	at     int // the first octet of the IPv4 address
}{
	{netip.MustParsePrefix("64:ff9b::/96"), 12},   // NAT64 well-known prefix (RFC 6052)
	{netip.MustParsePrefix("64:ff9b:1::/48"), 12}, // local-use NAT64 (RFC 8215), in its last 32 bits here
	{netip.MustParsePrefix("2002::/16"), 2},       // 6to4 (RFC 3056)
	{netip.MustParsePrefix("::/96"), 12},          // IPv4-compatible (RFC 4291 2.5.5.1, deprecated; some stacks still reach the IPv4 address)
}

// embeddedV4 is the IPv4 address an IPv6 translator address carries.
func embeddedV4(a netip.Addr) (netip.Addr, bool) {
	if !a.Is6() {
		return netip.Addr{}, false
	}
	for _, t := range translators {
		if t.prefix.Contains(a) {
			b := a.As16()
			return netip.AddrFrom4([4]byte(b[t.at : t.at+4])), true
		}
	}
	return netip.Addr{}, false
}

// dialer returns a DialContext that refuses private addresses unless
// allowPrivate. The check runs in Control, on the address actually being
// connected to after name resolution, so a name that resolves (or
// re-resolves) to an internal address is caught too.
func dialer(allowPrivate bool, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}
	if !allowPrivate {
		d.Control = func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			if private(ap.Addr()) {
				return &ErrPrivateAddress{Addr: ap.Addr()}
			}
			return nil
		}
	}
	return d.DialContext
}
