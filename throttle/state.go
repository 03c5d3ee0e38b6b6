package throttle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/ascii"
)

// Breaker states, as stored in DestState.Breaker and shown by `outflow dest
// status`. An empty Breaker reads as closed.
const (
	BreakerClosed   = "closed"    // attempts flow normally
	BreakerOpen     = "open"      // no network attempts until BreakerUntil
	BreakerHalfOpen = "half-open" // cooling period over: one probe per worker
)

// SuspendForever is the SuspendedUntil that Suspend stores for a zero
// until: suspended until someone calls Resume.
var SuspendForever = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

// maxCASTries bounds the read-modify-write loop of one state transition.
// Conflicts mean another worker changed the same destination at the same
// moment; a handful of tries always settles it.
const maxCASTries = 16

// DestState is the shared throttle state of one destination, one JSON value
// per destination in the outflow_dest bucket (key: StateKey(dest)). Every
// worker watches the bucket and acts on it within a second; it is written
// only on transitions (a suspension, a rate cut or step, a breaker change,
// an admin command), never per message. Zero fields mean "no such
// restriction".
type DestState struct {
	Dest string `json:"dest"` // destination: a domain or a group name

	// SuspendedUntil: no attempts before this time (zero: not suspended).
	SuspendedUntil time.Time `json:"suspended_until,omitzero"`
	// Reason says why the destination is suspended (admin text or
	// "automation: <rule>").
	Reason string `json:"reason,omitempty"`

	// Factor multiplies the destination's configured rate after throttled
	// replies, in [MinFactor, 1]; 0 reads as 1 (full rate).
	Factor float64 `json:"factor,omitempty"`
	// FactorUntil is when the next additive step of the ramp back to the
	// full rate may happen: DecreaseFor after a cut, IncreaseEvery after a
	// step. Zero when the factor is 1.
	FactorUntil time.Time `json:"factor_until,omitzero"`

	// RateOverride replaces the configured fleet rate (messages per second)
	// until RateUntil (zero: until changed). 0 means no override.
	RateOverride float64   `json:"rate_override,omitempty"`
	RateUntil    time.Time `json:"rate_until,omitzero"` // end of RateOverride; zero: until changed

	// ConnsOverride replaces the configured fleet connection limit until
	// ConnsUntil (zero: until changed). 0 means no override.
	ConnsOverride int       `json:"conns_override,omitempty"`
	ConnsUntil    time.Time `json:"conns_until,omitzero"` // end of ConnsOverride; zero: until changed

	// Breaker is closed, open or half-open ("" reads as closed). An open
	// breaker whose BreakerUntil has passed is half-open (see BreakerAt).
	Breaker      string    `json:"breaker,omitempty"`
	BreakerUntil time.Time `json:"breaker_until,omitzero"` // end of the open breaker's cooling period

	// LearnedRate is the fleet rate (messages per second) learned from
	// throttled replies for a destination without a configured rate (see
	// learn.go); 0 means unknown. LearnedStep is its additive step up,
	// LearnedHold the earliest time of its next cut, LearnedNext that of
	// its next step up, and LearnedReason why it last changed.
	LearnedRate   float64   `json:"learned_rate,omitempty"`
	LearnedStep   float64   `json:"learned_step,omitempty"`
	LearnedHold   time.Time `json:"learned_hold,omitzero"`
	LearnedNext   time.Time `json:"learned_next,omitzero"` // earliest next step up
	LearnedReason string    `json:"learned_reason,omitempty"`
	// LearnedSlowStart: no cut since the seed, so steps up double.
	LearnedSlowStart bool `json:"learned_slow_start,omitempty"`
	// LearnedPaced: every cut since the seed was for the throttle of an
	// attempt paced at the rate in force, with no step between; the
	// second such cut is by DecreaseFactor when the window read at least
	// the rate throttled (learn.go, cutRate).
	LearnedPaced bool `json:"learned_paced,omitempty"`
	// LearnedPlateau is where the steps up after a cut stop, 5% under the
	// rate the last throttle answered, until LearnedProbeAt; LearnedProbes
	// counts the probes above it that met a throttle in a row, each of
	// which doubles the next wait (learn.go). 0: no plateau.
	LearnedPlateau float64   `json:"learned_plateau,omitempty"`
	LearnedProbeAt time.Time `json:"learned_probe_at,omitzero"`
	LearnedProbes  int       `json:"learned_probes,omitempty"`
	// LearnedRunFrom is the rate in force at the first cut since the last
	// step up: the rate before the throttles began, which the first
	// delivery after a block resumes from (learn.go, resumeRate).
	LearnedRunFrom float64 `json:"learned_run_from,omitempty"`
	// LearnedConns is the fleet connection limit learned from "too many
	// connections" replies; 0 means unknown. LearnedConnsHold is the
	// earliest time of its next cut, LearnedConnsNext that of its next
	// step up, and LearnedConnsReason why it last changed, as for the
	// rate. LearnedConnsPlateau is where the steps up after a cut stop,
	// one under the limit the cut answered, until LearnedConnsProbeAt;
	// LearnedConnsProbes counts the probes above it that met a connection
	// throttle in a row, each of which doubles the next wait (learn.go).
	LearnedConns        int       `json:"learned_conns,omitempty"`
	LearnedConnsHold    time.Time `json:"learned_conns_hold,omitzero"`
	LearnedConnsNext    time.Time `json:"learned_conns_next,omitzero"`
	LearnedConnsReason  string    `json:"learned_conns_reason,omitempty"`
	LearnedConnsPlateau int       `json:"learned_conns_plateau,omitempty"`
	LearnedConnsProbeAt time.Time `json:"learned_conns_probe_at,omitzero"`
	LearnedConnsProbes  int       `json:"learned_conns_probes,omitempty"`
	// LearnedSince is when the destination first learned a limit;
	// LearnedCutAt the last throttle that cut one. What was learned is
	// forgotten LearnForget after LearnedCutAt.
	LearnedSince time.Time `json:"learned_since,omitzero"`
	LearnedCutAt time.Time `json:"learned_cut_at,omitzero"`
	// Grid is the learned rate's grid of send slots, in segments (one
	// per recent change of the rate; slots.go), so that the fleet's turns
	// go on across a change without two of them falling together.
	Grid []GridSegment `json:"grid,omitempty"`

	// Rules holds, for each automation rule whose action is in force,
	// when it ends. Every worker leaves the rule alone until then, not
	// only the one whose count fired it: others, counting the same
	// replies, fired it again and stretched its action past its for (and
	// one more match after an operator's Resume suspended again). Never
	// modified in place: a write replaces the map (copies of a state
	// share it).
	//
	// A rule is keyed by its name and a short hash of its definition,
	// "NAME#1a2b3c4d" (ruleKey), so that a rule edited under the same
	// name and restarted is not held by its old version's end; for a
	// tenant's part (a tenant-scoped reply, Tenants) the tenant follows,
	// "NAME#1a2b3c4d/TENANT". The plain "NAME" that older daemons wrote
	// and read is written beside the destination's key, so that they
	// still leave a rule in force alone in a fleet that rolls through
	// versions; it is read only where no keyed entry of the name is in
	// force (autoEnd).
	Rules map[string]time.Time `json:"rules,omitempty"`

	// RateBy, ConnsBy and FactorBy say who set RateOverride, ConnsOverride
	// and Factor when it was not an operator or a throttle: "automation:
	// NAME" for a rule's action ("" otherwise), for `dest list` and `dest
	// status`. An operator's SetRate or SetConns clears its own, a
	// throttle's cut of the factor FactorBy.
	RateBy   string `json:"rate_by,omitempty"`
	ConnsBy  string `json:"conns_by,omitempty"`
	FactorBy string `json:"factor_by,omitempty"`

	// Tenants holds the suspensions of one tenant's part of the
	// destination, by tenant: an automation rule's suspend fired by
	// replies about that tenant's own mail (classify scope tenant, e.g.
	// Gmail's 4.7.26 for its unauthenticated mail) holds that tenant's
	// mail only, not every tenant's. Never modified in place, as Rules.
	// A daemon older than this field neither applies nor keeps it.
	Tenants map[string]TenantHold `json:"tenants,omitempty"`

	// Recover is set by Resume: the next worker to clear it (by revision
	// CAS, so exactly one) calls Config.OnRecover for the
	// destination.
	Recover bool `json:"recover,omitempty"`

	UpdatedBy string    `json:"updated_by,omitempty"` // worker id or admin name of the last writer
	UpdatedAt time.Time `json:"updated_at,omitzero"`  // time of the last write
}

// Suspended reports whether the destination is suspended at now.
func (s DestState) Suspended(now time.Time) bool { return now.Before(s.SuspendedUntil) }

// TenantHold is a suspension of one tenant's part of a destination
// (DestState.Tenants).
type TenantHold struct {
	Until  time.Time `json:"until"`
	Reason string    `json:"reason,omitempty"`
}

// TenantSuspended reports whether tenant's part of the destination is
// suspended at now, and its hold.
func (s DestState) TenantSuspended(tenant string, now time.Time) (TenantHold, bool) {
	h, ok := s.Tenants[tenant]
	return h, ok && now.Before(h.Until)
}

// TenantsSuspended are the tenants whose part is suspended at now, sorted.
func (s DestState) TenantsSuspended(now time.Time) []string {
	var out []string
	for tenant, h := range s.Tenants {
		if now.Before(h.Until) {
			out = append(out, tenant)
		}
	}
	slices.Sort(out)
	return out
}

// RateOverrideAt is the fleet rate override in force at now, if any: an
// override whose end has passed is not (`dest list` showed caps ended
// hours ago).
func (s DestState) RateOverrideAt(now time.Time) (float64, bool) { return s.rateOverride(now) }

// ConnsOverrideAt is the fleet connection override in force at now, if any.
func (s DestState) ConnsOverrideAt(now time.Time) (int, bool) { return s.connsOverride(now) }

// RateFactor is the effective factor: Factor, with 0 read as 1, clamped to
// (0, 1].
func (s DestState) RateFactor() float64 {
	if s.Factor <= 0 || s.Factor > 1 || math.IsNaN(s.Factor) {
		return 1
	}
	return s.Factor
}

// BreakerAt is the breaker state at now: an open breaker whose cooling
// period is over is half-open.
func (s DestState) BreakerAt(now time.Time) string {
	switch s.Breaker {
	case BreakerOpen:
		if now.Before(s.BreakerUntil) {
			return BreakerOpen
		}
		return BreakerHalfOpen
	case BreakerHalfOpen:
		return BreakerHalfOpen
	}
	return BreakerClosed
}

// rateOverride is the active fleet rate override at now, if any.
func (s DestState) rateOverride(now time.Time) (float64, bool) {
	if s.RateOverride > 0 && (s.RateUntil.IsZero() || now.Before(s.RateUntil)) {
		return s.RateOverride, true
	}
	return 0, false
}

// connsOverride is the active fleet connection override at now, if any.
func (s DestState) connsOverride(now time.Time) (int, bool) {
	if s.ConnsOverride > 0 && (s.ConnsUntil.IsZero() || now.Before(s.ConnsUntil)) {
		return s.ConnsOverride, true
	}
	return 0, false
}

// idle reports whether nothing in s is in force at now: the state says
// no more than its absence would, and may be deleted (which also removes
// its metric series).
func (s DestState) idle(now time.Time) bool {
	_, rate := s.rateOverride(now)
	_, conns := s.connsOverride(now)
	return s.SuspendedUntil.IsZero() && s.RateFactor() >= 1 && s.BreakerAt(now) == BreakerClosed &&
		!rate && !conns && !s.Recover && !s.learned() && !s.ruleInForce(now) && len(s.TenantsSuspended(now)) == 0
}

// ruleInForce reports whether some automation rule's action is in force
// at now (Rules).
func (s DestState) ruleInForce(now time.Time) bool {
	for _, end := range s.Rules {
		if now.Before(end) {
			return true
		}
	}
	return false
}

// normalized fills the read-side defaults (Factor 1, Breaker closed) so
// that callers printing a state need not know the zero conventions.
func (s DestState) normalized() DestState {
	s.Factor = s.RateFactor()
	if s.Breaker == "" {
		s.Breaker = BreakerClosed
	}
	return s
}

// StateKey is the KV key of a destination: the destination with every byte
// outside [-/_.a-zA-Z0-9], and '=' itself, written as "=XX" (hex), and a
// '.' escaped where NATS would read it as an empty token (first, last, or
// after another '.'). Ordinary domains and group names are their own key.
func StateKey(dest string) string {
	var b strings.Builder
	for i := 0; i < len(dest); i++ {
		c := dest[i]
		plain := c == '-' || c == '/' || c == '_' || c == '.' ||
			'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
		if c == '.' && (i == 0 || i == len(dest)-1 || dest[i-1] == '.') {
			plain = false
		}
		if plain {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "=%02X", c)
	}
	return b.String()
}

// DestFromKey reverses StateKey. A malformed escape is kept as written.
func DestFromKey(key string) string {
	if !strings.Contains(key, "=") {
		return key
	}
	var b strings.Builder
	for i := 0; i < len(key); i++ {
		if key[i] == '=' && i+2 < len(key) {
			if v, err := strconv.ParseUint(key[i+1:i+3], 16, 8); err == nil {
				b.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		b.WriteByte(key[i])
	}
	return b.String()
}

// NormalizeDest lower-cases a domain, drops a trailing dot and writes an
// internationalised name in A-labels, so that "Gmail.COM." and
// "gmail.com" share one budget, and "bücher.example" is the
// "xn--bcher-kva.example" that mail to it is queued under (submission
// takes addresses in ASCII only). A DEST@SOURCE pair keeps its source,
// in the form normalizeSource gives it.
func NormalizeDest(d string) string {
	name, source := SplitPair(strings.TrimSpace(d))
	if source == "" {
		return ascii.Domain(name)
	}
	return PairName(ascii.Domain(name), normalizeSource(source))
}

// normalizeSource writes the SOURCE of DEST@SOURCE as the workers name the
// pair: an IP address (also in brackets, "[::1]") as netip writes it,
// IPv4-mapped addresses unmapped, as [[egress]] takes its addresses
// (sender.NewEgress, sender.Source.String). Otherwise
// "0:0:0:0:0:0:0:1", "[::1]" and "0000::0001" were three more pairs than
// "::1", and a suspension of any of them held no mail. A zone is kept as
// written, as [[egress]] keeps it (interface names are case-sensitive).
// Anything else is lower-cased without a trailing dot, as before.
func normalizeSource(source string) string {
	ip := source
	if len(ip) > 2 && ip[0] == '[' && ip[len(ip)-1] == ']' {
		ip = ip[1 : len(ip)-1]
	}
	if a, err := netip.ParseAddr(ip); err == nil {
		return a.Unmap().String()
	}
	return strings.ToLower(strings.TrimSuffix(source, "."))
}

// decodeState parses a stored value; dest fills in a missing Dest.
func decodeState(key string, b []byte) (DestState, error) {
	var s DestState
	if err := json.Unmarshal(b, &s); err != nil {
		return DestState{Dest: DestFromKey(key)}, fmt.Errorf("dest state %q: %w", key, err)
	}
	if s.Dest == "" {
		s.Dest = DestFromKey(key)
	}
	return s, nil
}

// updateState is one read-modify-write transition of dest's state with
// revision CAS: fn sees the current state (zero if absent) and returns
// false to write nothing. It retries when another writer got in between.
// It returns the state before and after, the new revision, and whether it
// wrote.
func updateState(ctx context.Context, kv jetstream.KeyValue, dest, by string, fn func(s *DestState, now time.Time) bool) (before, after DestState, rev uint64, wrote bool, err error) {
	return updateStateIn(ctx, kv, dest, by, frame{now: time.Now}, fn)
}

// updateStateIn is updateState on the clock fr: the stored state is moved
// into fr's frame before fn sees it (so every time in it and fn's now are
// on one clock), and written in that frame, UpdatedAt included.
func updateStateIn(ctx context.Context, kv jetstream.KeyValue, dest, by string, fr frame, fn func(s *DestState, now time.Time) bool) (before, after DestState, rev uint64, wrote bool, err error) {
	if kv == nil {
		return before, after, 0, false, errors.New("dest state: no KV bucket")
	}
	dest = NormalizeDest(dest)
	if dest == "" {
		return before, after, 0, false, errors.New("dest state: empty destination")
	}
	key := StateKey(dest)
	for try := 0; try < maxCASTries; try++ {
		var cur DestState
		var last uint64
		e, err := kv.Get(ctx, key)
		switch {
		case err == nil:
			last = e.Revision()
			cur, _ = decodeState(key, e.Value()) // a corrupt value is overwritten
			cur = fr.toLocal(cur, e.Created())
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			cur = DestState{Dest: dest}
		default:
			return before, after, 0, false, fmt.Errorf("dest state %q: get: %w", dest, err)
		}
		cur.Dest = dest
		next := cur
		now := fr.now()
		if !fn(&next, now) {
			return cur, cur, last, false, nil
		}
		next.UpdatedBy, next.UpdatedAt = by, now.UTC()
		b, err := json.Marshal(next)
		if err != nil {
			return cur, cur, last, false, fmt.Errorf("dest state %q: %w", dest, err)
		}
		if last == 0 {
			rev, err = kv.Create(ctx, key, b)
		} else {
			rev, err = kv.Update(ctx, key, b, last)
		}
		if err == nil {
			return cur, next, rev, true, nil
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // someone else wrote in between: read again
		}
		return cur, cur, last, false, fmt.Errorf("dest state %q: write: %w", dest, err)
	}
	return before, after, 0, false, fmt.Errorf("dest state %q: %d conflicting writers in a row", dest, maxCASTries)
}

// Suspend stops every worker from contacting dest until until (zero: until
// Resume). It takes effect fleet-wide within a second. by names who asked
// (an operator, a script); it is stored as UpdatedBy.
func Suspend(ctx context.Context, kv jetstream.KeyValue, dest string, until time.Time, reason, by string) error {
	if until.IsZero() {
		until = SuspendForever
	}
	if !until.After(time.Now()) {
		return fmt.Errorf("suspend %q: until %s is in the past", dest, until.Format(time.RFC3339))
	}
	_, _, _, _, err := updateState(ctx, kv, dest, by, func(s *DestState, _ time.Time) bool {
		s.SuspendedUntil, s.Reason = until.UTC(), reason
		return true
	})
	return err
}

// Resume lifts a suspension of dest (and those of its tenants' parts,
// Tenants) and closes its breaker, and asks the workers to release its
// deferred envelopes (one worker calls OnRecover). It reports whether dest
// was suspended or its breaker open; resuming a destination that is
// neither changes nothing and reports false.
func Resume(ctx context.Context, kv jetstream.KeyValue, dest, by string) (bool, error) {
	_, _, _, wrote, err := updateState(ctx, kv, dest, by, func(s *DestState, now time.Time) bool {
		if s.SuspendedUntil.IsZero() && s.BreakerAt(now) == BreakerClosed && len(s.TenantsSuspended(now)) == 0 {
			return false
		}
		s.SuspendedUntil, s.Reason = time.Time{}, ""
		s.Tenants = nil // a rule's suspension of one tenant's part ends too
		s.Breaker, s.BreakerUntil = BreakerClosed, time.Time{}
		s.Recover = true
		return true
	})
	return wrote, err
}

// SetRate overrides dest's fleet rate (messages per second) until until
// (zero: until changed again). rate 0 removes the override: the configured
// rate applies again. The adaptive factor still multiplies an override.
func SetRate(ctx context.Context, kv jetstream.KeyValue, dest string, rate float64, until time.Time, by string) error {
	if rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return fmt.Errorf("set rate %q: rate %v: want a number >= 0", dest, rate)
	}
	return setOverride(ctx, kv, dest, by, rate, until, func(s *DestState) (*float64, *time.Time, *string) { return &s.RateOverride, &s.RateUntil, &s.RateBy })
}

// SetConns overrides dest's fleet connection limit until until (zero: until
// changed again). conns 0 removes the override.
func SetConns(ctx context.Context, kv jetstream.KeyValue, dest string, conns int, until time.Time, by string) error {
	if conns < 0 {
		return fmt.Errorf("set conns %q: %d: want >= 0", dest, conns)
	}
	return setOverride(ctx, kv, dest, by, conns, until, func(s *DestState) (*int, *time.Time, *string) { return &s.ConnsOverride, &s.ConnsUntil, &s.ConnsBy })
}

// setOverride writes one of dest's overrides, v until until, or removes it
// when v is 0; field picks the override, its end and who set it (an
// automation rule's name, cleared: an operator's is not a rule's) in the
// state.
func setOverride[T int | float64](ctx context.Context, kv jetstream.KeyValue, dest, by string, v T, until time.Time,
	field func(*DestState) (*T, *time.Time, *string)) error {
	_, _, _, _, err := updateState(ctx, kv, dest, by, func(s *DestState, _ time.Time) bool {
		val, end, setBy := field(s)
		*setBy = ""
		if v == 0 {
			*val, *end = 0, time.Time{}
		} else {
			*val, *end = v, until.UTC()
		}
		return true
	})
	return err
}

// Forget clears what dest has learned (its learned rate and connection
// limit), so that its next throttle seeds them afresh from the traffic of
// that moment. It reports whether anything was learned. Configured limits,
// pins, the factor and suspensions are left alone.
func Forget(ctx context.Context, kv jetstream.KeyValue, dest, by string) (bool, error) {
	_, _, _, wrote, err := updateState(ctx, kv, dest, by, func(s *DestState, _ time.Time) bool {
		if !forgetLearned(s) {
			return false
		}
		s.LearnedReason = "forgotten by " + by
		return true
	})
	return wrote, err
}

// GetState returns dest's shared state, normalized (Factor 1 and Breaker
// "closed" when unset). A destination with no stored state has the zero
// state and no error.
func GetState(ctx context.Context, kv jetstream.KeyValue, dest string) (DestState, error) {
	dest = NormalizeDest(dest)
	key := StateKey(dest)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return DestState{Dest: dest}.normalized(), nil
	}
	if err != nil {
		return DestState{}, fmt.Errorf("dest state %q: %w", dest, err)
	}
	s, err := decodeState(key, e.Value())
	if err != nil {
		return DestState{}, err
	}
	return s.normalized(), nil
}

// ListStates returns every destination that has shared state, sorted by
// destination, normalized like GetState.
func ListStates(ctx context.Context, kv jetstream.KeyValue) ([]DestState, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("dest states: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []DestState
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("dest states: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("dest states: watcher closed")
			}
			if e == nil { // end of the current values
				sort.Slice(out, func(i, j int) bool { return out[i].Dest < out[j].Dest })
				return out, nil
			}
			s, err := decodeState(e.Key(), e.Value())
			if err != nil {
				return nil, err
			}
			out = append(out, s.normalized())
		}
	}
}
