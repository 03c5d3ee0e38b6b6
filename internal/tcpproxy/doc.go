// Package tcpproxy is in charge of a TCP forwarder for tests that cuts the
// network between two peers on command, without touching either process: a
// test points one side at the proxy instead of the other side's listener and
// switches the proxy between forwarding, a blackhole (nothing is forwarded
// any more but every socket stays open, as when a switch or a firewall drops
// packets: the peers notice only through their own timeouts), and a reset
// (every connection is closed with RST and new ones are closed as soon as
// they are accepted, as when a host's kernel answers for a dead peer).
// Healing returns to forwarding; connections held through a blackhole carry
// on with what was buffered, as TCP does after a partition shorter than its
// retransmission timeout.
package tcpproxy
