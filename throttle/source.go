package throttle

import "strings"

// Per-source state. Providers limit, throttle and block per sending IP
// address, so with egress addresses configured every limit and every piece
// of state of a destination (configured and learned rates and connections,
// the breaker, suspensions, the virtual queue) is kept per (destination,
// source) pair, under the name PairName gives it: "gmail.com@192.0.2.10".
// The pair has the destination's configured limits (each address may
// send at the configured rate), its own DestState in the outflow_dest
// bucket, and its own metrics label. An operator addresses one source as
// `dest suspend gmail.com@192.0.2.10`; a suspension of the destination
// itself (`dest suspend gmail.com`) still holds for every source, and a
// pin or a connection limit set on it (`dest rate gmail.com --max 5`)
// holds on the total from every source, on top of each pair's own limits
// (own.go). Without egress addresses no name carries a source and nothing
// here is used.

// PairName is the throttle's name for dest reached from source; just dest
// when source is empty.
func PairName(dest, source string) string {
	if source == "" {
		return dest
	}
	return dest + "@" + source
}

// SplitPair undoes PairName: the destination and the source ("" when name
// carries none). Domain and group names never hold "@".
func SplitPair(name string) (dest, source string) {
	if i := strings.LastIndexByte(name, '@'); i >= 0 {
		return name[:i], name[i+1:]
	}
	return name, ""
}

// baseDest is the destination part of a name, for its configured limits.
func baseDest(name string) string {
	d, _ := SplitPair(name)
	return d
}

// wholeSuspended is the refusal of an attempt from one source when the
// destination as a whole (not only the pair) is suspended.
func (t *Throttle) wholeSuspended(dest string) (Refusal, bool) {
	now := t.now()
	t.mu.RLock()
	whole := t.dests[dest]
	t.mu.RUnlock()
	if whole == nil {
		return Refusal{}, false
	}
	whole.mu.Lock()
	s := whole.state
	whole.mu.Unlock()
	if !s.Suspended(now) {
		return Refusal{}, false
	}
	return suspendedRefusal(dest, s, now), true
}
