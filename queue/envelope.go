package queue

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Attempt metadata headers. They travel with the envelope on every lane, so
// each reschedule is one atomic write of the message with its metadata, and a
// restarted worker continues the same budget instead of granting a new one.
const (
	HdrAttempt       = "Outflow-Attempt"        // attempts already made, throttled ones included (0 for fresh mail)
	HdrFirstAttempt  = "Outflow-First-Attempt"  // RFC 3339 time of the first attempt
	HdrDeadline      = "Outflow-Deadline"       // RFC 3339 time after which the envelope is dead
	HdrLastClass     = "Outflow-Last-Class"     // class of the last attempt
	HdrLastReply     = "Outflow-Last-Reply"     // the last reply, one line, truncated
	HdrThrottleCount = "Outflow-Throttle-Count" // throttled attempts so far; the budget spent is Attempt - ThrottleCount
	HdrReplays       = "Outflow-Replays"        // operator replays so far
	HdrStep          = "Outflow-Step"           // durable steps taken (each reschedule, hold, dead letter, replay); names SENT keys and dedup ids
	HdrNotBefore     = "Outflow-Not-Before"     // RFC 3339 time the envelope was scheduled for
	HdrProbe         = "Outflow-Probe"          // "1": an operator's fast-forward; this attempt bypasses the throttle
	HdrInlineBody    = "Outflow-Inline-Body"    // length of the body carried after the envelope's JSON (absent: the body is in the Object Store)
)

// MaxEnvelopeBytes bounds an envelope's encoded JSON. Anything larger on a
// work subject is refused as malformed: envelopes are small by design.
const MaxEnvelopeBytes = 256 << 10

// InlineBodyMax is the largest body that travels inside its envelope's
// message (after the JSON, its length in HdrInlineBody) instead of in the
// Object Store: a body of one destination up to the Object Store's chunk
// size. Storing, reading and deleting it separately costs six JetStream
// operations per message, a large share of the daemon's time and
// allocation for small messages (docs/benchmarks.md). A body shared by several
// destinations, or a larger one, is stored once in the Object Store.
const InlineBodyMax = 128 << 10

// InlineSignedMax bounds an inline body once outflow's DKIM signature (a
// header field of about a kilobyte) is prepended to it.
const InlineSignedMax = InlineBodyMax + 16<<10

// MaxMsgBytes bounds a stored envelope message, the JSON and an inline
// body: the work and lane streams refuse anything larger at publish.
const MaxMsgBytes = MaxEnvelopeBytes + InlineSignedMax

// ErrMalformed is returned (wrapped) for envelopes that cannot be decoded.
var ErrMalformed = errors.New("malformed envelope")

// Envelope is the unit of delivery: the recipients of one message at one
// destination. The JSON payload holds what never changes; the attempt
// metadata lives in headers (see Hdr*) and in History.
type Envelope struct {
	ID     string   `json:"id"`     // envelope id, unique per destination part
	MsgID  string   `json:"msg_id"` // submission id, shared by all parts; names the body
	Tenant string   `json:"tenant"` // the submitting user
	From   string   `json:"from"`   // envelope sender
	Rcpts  []string `json:"rcpts"`  // recipients still to deliver, all at Dest
	Dest   string   `json:"dest"`   // destination: the recipients' domain
	// Group is the provider group Dest belongs to when the workers group
	// destinations by MX (google, microsoft, ...), as the last worker to
	// try it found; "" before a first attempt, or for a domain of its
	// own. `queue list --dest GROUP` finds the group's mail by it.
	Group string `json:"group,omitempty"`
	// BodyRef is the Object Store name of the body: MsgID for the submitted
	// original, shared by all parts; any other name is a copy this envelope
	// alone uses (DKIM-signed, or edited by a replay), deleted with it.
	// Empty when the body is inline (Body).
	BodyRef string `json:"body_ref"`
	// Body is an inline body (see InlineBodyMax): it travels in the
	// envelope's message, after the JSON, on every lane and into dead
	// letters. Nil when the body is in the Object Store.
	Body []byte `json:"-"`
	// frame is the buffer an inline Body was read into, with free octets
	// in front of it (Submission.Frame); nil otherwise. data encodes the
	// envelope there instead of copying Body.
	frame []byte
	// unknown holds the top-level members of the JSON this envelope was
	// decoded from that this release does not know (a later release's
	// fields, met in a rolling upgrade or after a rollback), each as
	// `,"key":value`, so that writing the envelope again (a deferral, a
	// hold, a dead letter) keeps them for the release that knows them.
	// Nil for envelopes of this release. Members inside history entries
	// or the DSN parameters are not kept.
	unknown []byte
	// Signed is set once the body carries outflow's DKIM signature.
	// Retries send the signed bytes unchanged. In the Object Store the
	// signed copy has its own name and the unsigned original stays under
	// MsgID; inline, the signature is the first SigLen bytes of Body.
	Signed      bool      `json:"signed,omitempty"`
	SigLen      int       `json:"sig_len,omitempty"`
	Size        int64     `json:"size"`                 // body size in bytes
	Parts       int       `json:"parts"`                // how many envelopes the submission became
	SubmittedAt time.Time `json:"submitted_at"`         // when outflow accepted the message
	MessageID   string    `json:"message_id,omitempty"` // the Message-ID header, for logs
	History     []Attempt `json:"history,omitempty"`    // every attempt so far, oldest first

	// Delivery status notifications (see DSNParams). All omitted when
	// unset, so envelopes written before they existed decode unchanged.
	Source      string     `json:"source,omitempty"`       // how the message came in: SourceSMTP, SourceAPI, SourceNATS; "" if not recorded
	DSN         *DSNParams `json:"dsn,omitempty"`          // the submitter's RFC 3461 parameters; nil when it gave none
	IsReport    bool       `json:"is_dsn,omitempty"`       // this envelope is a notification outflow wrote: never answered with another
	DelayWarned bool       `json:"delay_warned,omitempty"` // the delay warning for these recipients went out; never a second one
	PassNoted   bool       `json:"dsn_pass,omitempty"`     // this part's first pass is in its submission's pass record (RecordPass); later notices are its own
	DelayNoted  int        `json:"delay_noted,omitempty"`  // how many of these recipients this part's note in its message's delay record lists (NoteDelay); 0: none

	// SendAt is when the submitter asked the message to be sent
	// (Submission.SendAt); zero for at once. Its age, its delay warning
	// and its delivery latency count from then (ReadyAt).
	SendAt time.Time `json:"send_at,omitzero"`

	// ListUnsubscribe: the worker puts a one-click unsubscribe link for
	// the envelope's one recipient in front of the message before its
	// first attempt (Submission.ListUnsubscribe).
	ListUnsubscribe bool `json:"list_unsubscribe,omitempty"`

	// Attempt metadata, carried in headers.
	Attempt       int       `json:"-"`
	FirstAttempt  time.Time `json:"-"`
	Deadline      time.Time `json:"-"`
	LastClass     string    `json:"-"`
	LastReply     string    `json:"-"`
	ThrottleCount int       `json:"-"`
	Replays       int       `json:"-"`
	Step          int       `json:"-"`
	Probe         bool      `json:"-"` // set by fast-forward for one attempt
	NotBefore     time.Time `json:"-"`
}

// ReadyAt is when the message was first to be sent: when it was submitted,
// or the later time it was submitted for.
func (e *Envelope) ReadyAt() time.Time {
	if e.SendAt.After(e.SubmittedAt) {
		return e.SendAt
	}
	return e.SubmittedAt
}

// Message sources, Envelope.Source: whether a tenant's default is to get
// delivery status notifications depends on it (SMTP submitters expect
// them; API and NATS clients read events and webhooks).
const (
	SourceSMTP = "smtp"
	SourceAPI  = "api"
	SourceNATS = "nats"
	SourceDSN  = "dsn" // a notification outflow wrote
)

// DSNParams are the RFC 3461 parameters of a submission: RET and ENVID
// from MAIL FROM, NOTIFY and ORCPT from each RCPT TO. They are kept as
// given (decoded from xtext), passed on to a next hop that offers DSN, and
// otherwise honoured by outflow itself.
type DSNParams struct {
	Ret   string             `json:"ret,omitempty"`   // "FULL" or "HDRS"; "" means HDRS
	EnvID string             `json:"envid,omitempty"` // the submitter's envelope id
	Rcpts map[string]RcptDSN `json:"rcpts,omitempty"` // by recipient, exactly as in Rcpts
}

// RcptDSN is one recipient's NOTIFY and ORCPT.
type RcptDSN struct {
	// Notify is "NEVER" alone, or some of "SUCCESS", "FAILURE", "DELAY";
	// empty means the parameter was not given (RFC 3461 §4.1: then
	// failures and delays are reported, successes not).
	Notify    []string `json:"notify,omitempty"`
	ORcpt     string   `json:"orcpt,omitempty"`      // the original recipient, decoded
	ORcptType string   `json:"orcpt_type,omitempty"` // its address type, "rfc822" when empty
}

// Notice kinds, as NOTIFY names them.
const (
	NotifyNever   = "NEVER"
	NotifySuccess = "SUCCESS"
	NotifyFailure = "FAILURE"
	NotifyDelay   = "DELAY"
)

// Rcpt returns rcpt's parameters (the zero value when none were given).
func (d *DSNParams) Rcpt(rcpt string) RcptDSN {
	if d == nil {
		return RcptDSN{}
	}
	return d.Rcpts[rcpt]
}

// Wants reports whether rcpt's NOTIFY asks for a notice of kind
// (NotifySuccess, NotifyFailure or NotifyDelay). Without NOTIFY, failures
// and delays are reported and successes are not (RFC 3461 §4.1).
func (d *DSNParams) Wants(rcpt, kind string) bool {
	n := d.Rcpt(rcpt).Notify
	if len(n) == 0 {
		return kind != NotifySuccess
	}
	for _, v := range n {
		if strings.EqualFold(v, kind) {
			return true
		}
	}
	return false
}

// For returns the parameters of rcpts only (a per-destination envelope's
// share), nil when none of them has any and there is no RET or ENVID.
func (d *DSNParams) For(rcpts []string) *DSNParams {
	if d == nil {
		return nil
	}
	out := &DSNParams{Ret: d.Ret, EnvID: d.EnvID}
	for _, r := range rcpts {
		if p, ok := d.Rcpts[r]; ok {
			if out.Rcpts == nil {
				out.Rcpts = make(map[string]RcptDSN, len(rcpts))
			}
			out.Rcpts[r] = p
		}
	}
	if out.Ret == "" && out.EnvID == "" && out.Rcpts == nil {
		return nil
	}
	return out
}

// Attempt is the compact evidence of one delivery attempt, kept inside the
// envelope so that a dead letter carries its whole story with it.
type Attempt struct {
	At         time.Time `json:"at"`
	Attempt    int       `json:"attempt"`
	Worker     string    `json:"worker"`
	Class      string    `json:"class"`
	Rule       string    `json:"rule,omitempty"`
	Code       int       `json:"code,omitempty"`
	Enhanced   string    `json:"enhanced_code,omitempty"`
	Reply      string    `json:"reply,omitempty"`
	Lane       string    `json:"lane,omitempty"`
	DelayMs    int64     `json:"delay_ms,omitempty"`
	JitterSeed string    `json:"jitter_seed,omitempty"`
	Rcpts      int       `json:"rcpts,omitempty"` // recipients this outcome applied to
}

// maxHistory bounds History; older entries are dropped (the events stream
// keeps them all).
const maxHistory = 32

// AddAttempt appends a to the history, keeping at most the newest entries.
func (e *Envelope) AddAttempt(a Attempt) {
	a.Reply = shorten(a.Reply, 300)
	e.History = append(e.History, a)
	if len(e.History) > maxHistory {
		e.History = append(e.History[:0:0], e.History[len(e.History)-maxHistory:]...)
	}
}

// Clone returns a deep copy, so a worker can derive a smaller envelope for
// deferred recipients without touching the original.
func (e *Envelope) Clone() *Envelope {
	c := *e
	c.Rcpts = append([]string(nil), e.Rcpts...)
	c.History = append([]Attempt(nil), e.History...)
	c.Probe = false // a probe is good for one attempt only
	return &c
}

// Spent is the part of the attempt budget this envelope has used: throttled
// attempts are the receiver asking us to slow down and do not count.
func (e *Envelope) Spent() int { return e.Attempt - e.ThrottleCount }

// SentKey is the SENT-bucket key for this envelope's current step. It
// includes the step because a redelivery of the same stored message must be
// recognised, while a later retry or a replay of the same envelope must not.
func (e *Envelope) SentKey() string {
	return e.ID + "." + strconv.Itoa(e.Step)
}

// Alone reports whether the envelope reports on its own: the only
// envelope of its submission, or one of a split per recipient
// (ListUnsubscribe), whose parts are many and independent. The parts of a
// submission split by destination join their notices into one report per
// pass (worker's recordPass).
func (e *Envelope) Alone() bool { return e.Parts <= 1 || e.ListUnsubscribe }

// Inline reports whether the envelope carries its body (Body) instead of
// naming it in the Object Store.
func (e *Envelope) Inline() bool { return e.BodyRef == "" }

// Unsigned returns an inline body without outflow's DKIM signature.
func (e *Envelope) Unsigned() []byte {
	if e.Signed && e.SigLen > 0 && e.SigLen <= len(e.Body) {
		return e.Body[e.SigLen:]
	}
	return e.Body
}

// data is the envelope's message payload: its JSON, then an inline body
// after a newline (as json.Encoder ended the JSON when it wrote it).
func (e *Envelope) data() ([]byte, error) {
	if b, ok := e.dataInFrame(); ok {
		return b, nil
	}
	n := e.jsonSizeHint()
	if e.Inline() {
		n += 1 + len(e.Body)
	}
	b, ok := e.appendJSON(make([]byte, 0, n))
	if !ok {
		// json.Marshal refuses it too; its error names the reason.
		_, err := json.Marshal(e)
		if err == nil {
			err = errors.New("a time outside RFC 3339")
		}
		return nil, err
	}
	if e.Inline() {
		b = append(append(b, '\n'), e.Body...)
	}
	return b, nil
}

// dataInFrame is data written in place: the JSON and its newline go into
// the free octets in front of an inline body read into a frame
// (Submission.Frame), so the body is not copied. ok is false, and nothing
// is written, when there is no frame, the body is not its tail, the
// octets are too few, or the JSON cannot be written (data's copying path
// then reports why).
func (e *Envelope) dataInFrame() (_ []byte, ok bool) {
	head := len(e.frame) - len(e.Body)
	if !e.Inline() || len(e.Body) == 0 || head <= 0 || &e.frame[head] != &e.Body[0] {
		return nil, false
	}
	sp := jsonScratch.Get().(*[]byte)
	defer func() {
		if cap(*sp) <= maxScratch {
			jsonScratch.Put(sp)
		}
	}()
	j, ok := e.appendJSON((*sp)[:0])
	*sp = j[:0]
	if !ok || len(j)+1 > head {
		return nil, false
	}
	at := head - len(j) - 1
	copy(e.frame[at:], j)
	e.frame[head-1] = '\n'
	return e.frame[at:], true
}

// jsonScratch holds the buffers dataInFrame encodes an envelope's JSON
// into before placing it in front of the body; one larger than maxScratch
// (a long History) is left to the collector.
var jsonScratch = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

const maxScratch = 16 << 10

// Encode turns the envelope into a NATS message for subject.
func (e *Envelope) Encode(subject string) (*nats.Msg, error) {
	data, err := e.data()
	if err != nil {
		return nil, fmt.Errorf("encode envelope %s: %w", e.ID, err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	h := m.Header
	if e.Inline() {
		h.Set(HdrInlineBody, strconv.Itoa(len(e.Body)))
	}
	h.Set(HdrAttempt, strconv.Itoa(e.Attempt))
	if !e.FirstAttempt.IsZero() {
		h.Set(HdrFirstAttempt, e.FirstAttempt.UTC().Format(time.RFC3339Nano))
	}
	if !e.Deadline.IsZero() {
		h.Set(HdrDeadline, e.Deadline.UTC().Format(time.RFC3339Nano))
	}
	if e.LastClass != "" {
		h.Set(HdrLastClass, e.LastClass)
	}
	if e.LastReply != "" {
		h.Set(HdrLastReply, headerSafe(shorten(e.LastReply, 200)))
	}
	if e.ThrottleCount > 0 {
		h.Set(HdrThrottleCount, strconv.Itoa(e.ThrottleCount))
	}
	if e.Replays > 0 {
		h.Set(HdrReplays, strconv.Itoa(e.Replays))
	}
	if e.Step > 0 {
		h.Set(HdrStep, strconv.Itoa(e.Step))
	}
	if e.Probe {
		h.Set(HdrProbe, "1")
	}
	if !e.NotBefore.IsZero() {
		h.Set(HdrNotBefore, e.NotBefore.UTC().Format(time.RFC3339Nano))
	}
	return m, nil
}

// DecodeEnvelope parses a stored envelope and its attempt headers. Anything
// that is not a complete envelope returns an error wrapping ErrMalformed with
// the reason, so the worker can park it instead of crashing or looping.
func DecodeEnvelope(data []byte, h nats.Header) (*Envelope, error) {
	var body []byte
	if v := h.Get(HdrInlineBody); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > InlineSignedMax || n > len(data) {
			return nil, fmt.Errorf("%w: header %s=%q does not fit the %d-byte message", ErrMalformed, HdrInlineBody, shorten(v, 40), len(data))
		}
		data, body = data[:len(data)-n], data[len(data)-n:len(data):len(data)]
	}
	if len(data) > MaxEnvelopeBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrMalformed, len(data), MaxEnvelopeBytes)
	}
	var e Envelope
	if err := unmarshalEnvelope(data, &e); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	e.Body = body
	switch {
	case e.ID == "" || !validID(e.ID):
		return nil, fmt.Errorf("%w: missing or invalid id %q", ErrMalformed, shorten(e.ID, 40))
	case len(e.Rcpts) == 0:
		return nil, fmt.Errorf("%w: no recipients", ErrMalformed)
	case e.Dest == "":
		return nil, fmt.Errorf("%w: no destination", ErrMalformed)
	case e.BodyRef == "" && body == nil:
		return nil, fmt.Errorf("%w: no body reference and no inline body", ErrMalformed)
	case e.BodyRef != "" && body != nil:
		return nil, fmt.Errorf("%w: both a body reference and an inline body", ErrMalformed)
	case e.SigLen < 0 || e.SigLen > len(body):
		return nil, fmt.Errorf("%w: signature length %d outside the %d-byte inline body", ErrMalformed, e.SigLen, len(body))
	}
	if e.MsgID == "" {
		e.MsgID = e.ID
	}
	r := headerReader{h: h}
	e.Attempt = r.int(HdrAttempt)
	e.ThrottleCount = r.int(HdrThrottleCount)
	e.Replays = r.int(HdrReplays)
	e.Step = r.int(HdrStep)
	e.FirstAttempt = r.time(HdrFirstAttempt)
	e.Deadline = r.time(HdrDeadline)
	e.NotBefore = r.time(HdrNotBefore)
	if r.err != nil {
		return nil, r.err
	}
	e.Probe = h.Get(HdrProbe) == "1"
	e.LastClass = h.Get(HdrLastClass)
	e.LastReply = h.Get(HdrLastReply)
	return &e, nil
}

// unmarshalEnvelope is json.Unmarshal(data, e) for a zero e, by
// decodeJSONFast for the envelopes outflow writes and by json.Unmarshal
// for anything else.
func unmarshalEnvelope(data []byte, e *Envelope) error {
	if e.decodeJSONFast(data) {
		return nil
	}
	*e = Envelope{}
	if err := json.Unmarshal(data, e); err != nil {
		return err
	}
	e.unknown = unknownMembers(data)
	return nil
}

// envelopeKeys are the JSON names of Envelope's fields.
var envelopeKeys = func() []string {
	var keys []string
	t := reflect.TypeFor[Envelope]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}()

// unknownMembers returns the top-level members of the JSON object data
// that json.Unmarshal matched to no field of Envelope (it matches names
// without regard to case), compacted, in key order, each as
// `,"key":value`; nil when there are none.
func unknownMembers(data []byte) []byte {
	var all map[string]json.RawMessage
	if json.Unmarshal(data, &all) != nil {
		return nil
	}
	var keys []string
	for k := range all {
		if !slices.ContainsFunc(envelopeKeys, func(n string) bool { return strings.EqualFold(n, k) }) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var b bytes.Buffer
	for _, k := range keys {
		kb, _ := json.Marshal(k)
		b.WriteByte(',')
		b.Write(kb)
		b.WriteByte(':')
		if json.Compact(&b, all[k]) != nil {
			return nil
		}
	}
	if b.Len() == 0 {
		return nil
	}
	return b.Bytes()
}

// headerReader reads typed headers in a row and keeps the first error,
// for the decoder to check once.
type headerReader struct {
	h   nats.Header
	err error
}

func (r *headerReader) int(k string) int {
	n, err := intHeader(r.h, k)
	if r.err == nil {
		r.err = err
	}
	return n
}

func (r *headerReader) time(k string) time.Time {
	t, err := timeHeader(r.h, k)
	if r.err == nil {
		r.err = err
	}
	return t
}

func intHeader(h nats.Header, k string) (int, error) {
	v := h.Get(k)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%w: header %s=%q is not a count", ErrMalformed, k, shorten(v, 40))
	}
	return n, nil
}

func timeHeader(h nats.Header, k string) (time.Time, error) {
	v := h.Get(k)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: header %s=%q is not an RFC 3339 time", ErrMalformed, k, shorten(v, 40))
	}
	return t, nil
}

// validID accepts the ids outflow generates (NUIDs and suffixes) and refuses
// anything that could not be a subject token or KV key.
func validID(id string) bool {
	if len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if !tokenSafe(id[i]) {
			return false
		}
	}
	return true
}

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// headerSafe folds a reply onto one line: NATS headers are line-based.
func headerSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' {
			return ' '
		}
		return r
	}, s)
}
