package backoff

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/internal/jsonenc"
)

// Record is the decision record: why a message was deferred and exactly how
// its next attempt time was computed. It is logged as one JSON line per
// decision (Log) and stored with the message's events (MarshalJSON), with
// the same field names in both, so that `outflow queue history` and the
// logs tell the same story and `outflow schedule` can replay it.
type Record struct {
	MsgID  string // message id
	Tenant string // submitting tenant (the submission AUTH user)
	Dest   string // destination: recipient domain or provider group

	// Attempt is the message's attempt number as the worker counts it.
	// When 0, the embedded Decision's Attempt is logged instead. The
	// Decision's own Attempt (the backoff exponent, which may differ, e.g. on
	// the rate-limit lane where it is the throttle count) is logged as
	// backoff_attempt: that is the number to replay.
	Attempt int

	WorkerID     string // the worker that decided; its offset is in the Decision
	Class        string // reply class from classify (transient, throttled, unknown …)
	Rule         string // the classify rule that matched
	Code         int    // basic SMTP reply code; 0 for transport events
	EnhancedCode string // enhanced status code, e.g. "4.7.28"; "" when absent
	Reply        string // the reply text (or event description) as received
	Lane         string // lane the message goes to: "retry" or "ratelimit"

	Decision

	// PacedBy, when set, says that the delay is the envelope's place in
	// the destination's virtual queue at this rate ("10.00/s learned"),
	// not the backoff draw: throttled mail of a destination with a rate
	// comes back at that rate (Throttle.Pace), or "deadline": the wait
	// cut short at the message's end, where it expires. Delay and DelayMs
	// are then the paced delay; the draw's fields are kept for the record.
	PacedBy string

	// AdmitWaitMs is how long the attempt waited for the throttle's
	// admission before it began, in whole milliseconds: up to max-wait
	// for a token, up to one of the worker's turns on a learned rate's
	// grid. The attempt went out that long after its envelope was taken,
	// so up to that long after the next_attempt_at of the decision before
	// it. 0 (left out) when it did not wait.
	AdmitWaitMs int64

	// Deliveries is how many times the queue server had handed the
	// envelope out when this attempt was made (JetStream's delivery
	// count), kept only above 1 (left out otherwise): an earlier holder
	// had it and did not finish (killed, stalled past the ack wait, or it
	// gave the envelope back unsent). If that holder had begun its
	// attempt, the attempt may have reached the server, and this one may
	// be a duplicate (docs/reliability.md).
	Deliveries uint64

	// MX is the MX host (or relay) of the attempt's last connection, MXAddr
	// its ip:port, and Source the egress address it went out from
	// ([[egress]]); each left out when empty (no server reached, no egress
	// addresses). After an abuse report or a blocklisting they say which
	// address sent a message where.
	MX, MXAddr, Source string

	// NextAttemptAt is when the attempt is due: the decision time plus
	// Decision.Delay.
	NextAttemptAt time.Time
}

// recordJSON is the wire form of a Record, shared by the log line and the
// event stream. jitter_seed is a decimal string because JSON numbers lose
// precision above 2^53 in most readers; `outflow schedule --seed` accepts it
// as printed.
type recordJSON struct {
	MsgID          string  `json:"msg_id"`
	Tenant         string  `json:"tenant"`
	Dest           string  `json:"dest"`
	Attempt        int     `json:"attempt"`
	BackoffAttempt int     `json:"backoff_attempt"`
	WorkerID       string  `json:"worker_id"`
	Class          string  `json:"class"`
	Rule           string  `json:"rule"`
	Code           int     `json:"code"`
	EnhancedCode   string  `json:"enhanced_code"`
	Reply          string  `json:"reply"`
	Lane           string  `json:"lane"`
	BaseMs         int64   `json:"base_ms"`
	MinMs          int64   `json:"min_ms"`
	Multiplier     float64 `json:"multiplier"`
	WindowMs       int64   `json:"window_ms"`
	NominalMs      int64   `json:"nominal_ms"`
	CapMs          int64   `json:"cap_ms"`
	JitterSeed     string  `json:"jitter_seed"`
	JitterMs       int64   `json:"jitter_ms"`
	OffsetMs       int64   `json:"offset_ms"`
	HintMs         int64   `json:"hint_ms"`
	DelayMs        int64   `json:"delay_ms"`
	PacedBy        string  `json:"paced_by,omitempty"`
	AdmitWaitMs    int64   `json:"admit_wait_ms,omitempty"`
	Deliveries     uint64  `json:"deliveries,omitempty"`
	MX             string  `json:"mx,omitempty"`
	MXAddr         string  `json:"mx_addr,omitempty"`
	Source         string  `json:"source,omitempty"`
	NextAttemptAt  string  `json:"next_attempt_at"`
}

// attempt is the attempt number to record: the record's own, or the
// decision's when the caller left it at 0.
func (r Record) attempt() int {
	if r.Attempt != 0 {
		return r.Attempt
	}
	return r.Decision.Attempt
}

// deliveries is the delivery count to record: Deliveries above 1, else 0
// (not written).
func (r Record) deliveries() uint64 {
	if r.Deliveries > 1 {
		return r.Deliveries
	}
	return 0
}

// nextAt formats NextAttemptAt in UTC with nanoseconds, independent of
// zerolog's global TimeFieldFormat; "" when unset.
func (r Record) nextAt() string {
	if r.NextAttemptAt.IsZero() {
		return ""
	}
	return r.NextAttemptAt.UTC().Format(time.RFC3339Nano)
}

func (r Record) wire() recordJSON {
	return recordJSON{
		MsgID:          r.MsgID,
		Tenant:         r.Tenant,
		Dest:           r.Dest,
		Attempt:        r.attempt(),
		BackoffAttempt: r.Decision.Attempt,
		WorkerID:       r.WorkerID,
		Class:          r.Class,
		Rule:           r.Rule,
		Code:           r.Code,
		EnhancedCode:   r.EnhancedCode,
		Reply:          r.Reply,
		Lane:           r.Lane,
		BaseMs:         r.BaseMs,
		MinMs:          r.MinMs,
		Multiplier:     r.Multiplier,
		WindowMs:       r.WindowMs,
		NominalMs:      r.NominalMs,
		CapMs:          r.CapMs,
		JitterSeed:     strconv.FormatUint(r.JitterSeed, 10),
		JitterMs:       r.JitterMs,
		OffsetMs:       r.OffsetMs,
		HintMs:         r.HintMs,
		DelayMs:        r.DelayMs,
		PacedBy:        r.PacedBy,
		AdmitWaitMs:    r.AdmitWaitMs,
		Deliveries:     r.deliveries(),
		MX:             r.MX,
		MXAddr:         r.MXAddr,
		Source:         r.Source,
		NextAttemptAt:  r.nextAt(),
	}
}

// MarshalJSON encodes the record as one flat JSON object with the field
// names of the log line (msg_id, tenant, dest, attempt, backoff_attempt,
// worker_id, class, rule, code, enhanced_code, reply, lane, base_ms, min_ms,
// multiplier, window_ms, nominal_ms, cap_ms, jitter_seed, jitter_ms,
// offset_ms, hint_ms, delay_ms, paced_by, admit_wait_ms, deliveries, mx,
// mx_addr and source when set, next_attempt_at).
func (r Record) MarshalJSON() ([]byte, error) {
	if b, ok := r.AppendJSON(make([]byte, 0, 1024)); ok {
		return b, nil
	}
	return json.Marshal(r.wire()) // for its error
}

// AppendJSON appends what MarshalJSON writes, byte for byte what
// json.Marshal writes for the wire form, without reflection: every
// delivery's event carries its record, and json.Marshal was the larger part
// of encoding the event. The output is compact and valid JSON with
// encoding/json's escaping. ok is false when json.Marshal would fail (a
// Multiplier that is NaN or infinite).
func (r Record) AppendJSON(b []byte) (_ []byte, ok bool) {
	start := len(b)
	str := func(name, v string) {
		b = append(append(append(b, ',', '"'), name...), '"', ':')
		b = jsonenc.AppendString(b, v)
	}
	num := func(name string, v int64) {
		b = append(append(append(b, ',', '"'), name...), '"', ':')
		b = strconv.AppendInt(b, v, 10)
	}
	b = append(b, `{"msg_id":`...)
	b = jsonenc.AppendString(b, r.MsgID)
	str("tenant", r.Tenant)
	str("dest", r.Dest)
	num("attempt", int64(r.attempt()))
	num("backoff_attempt", int64(r.Decision.Attempt))
	str("worker_id", r.WorkerID)
	str("class", r.Class)
	str("rule", r.Rule)
	num("code", int64(r.Code))
	str("enhanced_code", r.EnhancedCode)
	str("reply", r.Reply)
	str("lane", r.Lane)
	num("base_ms", r.BaseMs)
	num("min_ms", r.MinMs)
	b = append(b, `,"multiplier":`...)
	if b, ok = jsonenc.AppendFloat(b, r.Multiplier); !ok {
		return b[:start], false
	}
	num("window_ms", r.WindowMs)
	num("nominal_ms", r.NominalMs)
	num("cap_ms", r.CapMs)
	b = append(b, `,"jitter_seed":"`...)
	b = append(strconv.AppendUint(b, r.JitterSeed, 10), '"')
	num("jitter_ms", r.JitterMs)
	num("offset_ms", r.OffsetMs)
	num("hint_ms", r.HintMs)
	num("delay_ms", r.DelayMs)
	if r.PacedBy != "" {
		str("paced_by", r.PacedBy)
	}
	if r.AdmitWaitMs != 0 {
		num("admit_wait_ms", r.AdmitWaitMs)
	}
	if n := r.deliveries(); n != 0 {
		b = append(b, `,"deliveries":`...)
		b = strconv.AppendUint(b, n, 10)
	}
	if r.MX != "" {
		str("mx", r.MX)
	}
	if r.MXAddr != "" {
		str("mx_addr", r.MXAddr)
	}
	if r.Source != "" {
		str("source", r.Source)
	}
	b = append(b, `,"next_attempt_at":"`...)
	if !r.NextAttemptAt.IsZero() {
		b = r.NextAttemptAt.UTC().AppendFormat(b, time.RFC3339Nano)
	}
	return append(b, '"', '}'), true
}

// UnmarshalJSON decodes what MarshalJSON (or Log) wrote. Unknown fields,
// such as the log line's level, time and message, are ignored.
func (r *Record) UnmarshalJSON(b []byte) error {
	var w recordJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	var seed uint64
	if w.JitterSeed != "" {
		s, err := ParseSeed(w.JitterSeed)
		if err != nil {
			return fmt.Errorf("decision record: %w", err)
		}
		seed = s
	}
	var next time.Time
	if w.NextAttemptAt != "" {
		t, err := time.Parse(time.RFC3339Nano, w.NextAttemptAt)
		if err != nil {
			return fmt.Errorf("decision record: next_attempt_at: %w", err)
		}
		next = t
	}
	*r = Record{
		MsgID:        w.MsgID,
		Tenant:       w.Tenant,
		Dest:         w.Dest,
		Attempt:      w.Attempt,
		WorkerID:     w.WorkerID,
		Class:        w.Class,
		Rule:         w.Rule,
		Code:         w.Code,
		EnhancedCode: w.EnhancedCode,
		Reply:        w.Reply,
		Lane:         w.Lane,
		Decision: Decision{
			Attempt:    w.BackoffAttempt,
			BaseMs:     w.BaseMs,
			MinMs:      w.MinMs,
			Multiplier: w.Multiplier,
			WindowMs:   w.WindowMs,
			NominalMs:  w.NominalMs,
			CapMs:      w.CapMs,
			JitterSeed: seed,
			JitterMs:   w.JitterMs,
			OffsetMs:   w.OffsetMs,
			HintMs:     w.HintMs,
			DelayMs:    w.DelayMs,
			Delay:      time.Duration(w.DelayMs) * time.Millisecond,
		},
		PacedBy:       w.PacedBy,
		AdmitWaitMs:   w.AdmitWaitMs,
		Deliveries:    w.Deliveries,
		MX:            w.MX,
		MXAddr:        w.MXAddr,
		Source:        w.Source,
		NextAttemptAt: next,
	}
	return nil
}

// MarshalZerologObject writes the record's fields into a zerolog event,
// with the same names and forms as MarshalJSON.
func (r Record) MarshalZerologObject(e *zerolog.Event) {
	w := r.wire()
	e.Str("msg_id", w.MsgID).
		Str("tenant", w.Tenant).
		Str("dest", w.Dest).
		Int("attempt", w.Attempt).
		Int("backoff_attempt", w.BackoffAttempt).
		Str("worker_id", w.WorkerID).
		Str("class", w.Class).
		Str("rule", w.Rule).
		Int("code", w.Code).
		Str("enhanced_code", w.EnhancedCode).
		Str("reply", w.Reply).
		Str("lane", w.Lane).
		Int64("base_ms", w.BaseMs).
		Int64("min_ms", w.MinMs).
		Float64("multiplier", w.Multiplier).
		Int64("window_ms", w.WindowMs).
		Int64("nominal_ms", w.NominalMs).
		Int64("cap_ms", w.CapMs).
		Str("jitter_seed", w.JitterSeed).
		Int64("jitter_ms", w.JitterMs).
		Int64("offset_ms", w.OffsetMs).
		Int64("hint_ms", w.HintMs).
		Int64("delay_ms", w.DelayMs)
	if w.PacedBy != "" {
		e.Str("paced_by", w.PacedBy)
	}
	if w.AdmitWaitMs != 0 {
		e.Int64("admit_wait_ms", w.AdmitWaitMs)
	}
	if w.Deliveries != 0 {
		e.Uint64("deliveries", w.Deliveries)
	}
	if w.MX != "" {
		e.Str("mx", w.MX)
	}
	if w.MXAddr != "" {
		e.Str("mx_addr", w.MXAddr)
	}
	if w.Source != "" {
		e.Str("source", w.Source)
	}
	e.Str("next_attempt_at", w.NextAttemptAt)
}

// DecisionMessage is the message ("msg") of every decision log line, for
// filtering the log.
const DecisionMessage = "backoff decision"

// LogOutcome writes the record to l as exactly one JSON line, with an
// "outcome" field (delivered, deferred, …) when outcome is not empty and
// the recipients it is about ("rcpts", as Postfix logs to=<…>) when there
// are any, before the record's own fields. The line is never sampled and never filtered by the
// logger's level: it is an audit record a postmortem depends on, so it is
// written with sampling removed and without a zerolog level, and labelled
// "level":"info" by hand. Only a logger disabled outright (zerolog.Disabled)
// drops it.
func (r Record) LogOutcome(l zerolog.Logger, outcome string, rcpts []string) {
	l = l.Sample(nil)
	ev := l.Log().Str(zerolog.LevelFieldName, zerolog.LevelInfoValue)
	if outcome != "" {
		ev = ev.Str("outcome", outcome)
	}
	if len(rcpts) > 0 {
		ev = ev.Strs("rcpts", rcpts)
	}
	ev.EmbedObject(r).Msg(DecisionMessage)
}

// ParseSeed parses a jitter seed as logged (decimal) or written in hex
// with a 0x prefix. A leading 0 does not mean octal.
func ParseSeed(s string) (uint64, error) {
	if len(s) > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		v, err := strconv.ParseUint(s[2:], 16, 64)
		if err != nil {
			return 0, fmt.Errorf("jitter seed %q: %w", s, err)
		}
		return v, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("jitter seed %q: want a decimal or 0x-hex uint64: %w", s, err)
	}
	return v, nil
}
