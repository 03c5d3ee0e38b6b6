// Package clientaddr is the unit in which outflow's listeners count a
// client (connections, AUTH failures): an IPv4 address, or an IPv6 /64,
// since one host usually owns a whole /64 and counting single IPv6
// addresses would give it 2^64 tries.
package clientaddr

import (
	"net"
	"net/netip"
)

// Prefix is the counting unit for addr: its /32, or its /64 for IPv6; the
// zero prefix (one shared bucket) for an address that is neither.
func Prefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p
	}
	if addr.Is4() {
		return netip.PrefixFrom(addr, 32)
	}
	return netip.Prefix{}
}

// Of is the counting unit of a connection's remote address.
func Of(a net.Addr) netip.Prefix {
	if ta, ok := a.(*net.TCPAddr); ok {
		ip, _ := netip.AddrFromSlice(ta.IP)
		return Prefix(ip)
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Prefix{}
	}
	return Prefix(ap.Addr())
}
