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
// metadata services live there), unspecified, or multicast.
func private(a netip.Addr) bool {
	a = a.Unmap()
	return a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast() ||
		netip.MustParsePrefix("100.64.0.0/10").Contains(a) // carrier-grade NAT
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
