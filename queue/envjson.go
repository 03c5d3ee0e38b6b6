package queue

import (
	"slices"
	"strconv"
	"time"

	"github.com/outflow/outflow/internal/jsonenc"
)

// appendJSON appends e as JSON, byte for byte what json.Marshal writes
// (field order, omitempty, HTML-safe escaping, sorted map keys, times as
// time.Time.MarshalJSON writes them), without reflection: every envelope
// is encoded at least once on its way to delivery, and json.Marshal was
// a visible share of Enqueue's cost. ok is false when a time cannot be
// written as RFC 3339 (a year outside [0,9999] or a zone offset of 24
// hours or more), which json.Marshal refuses too.
func (e *Envelope) appendJSON(b []byte) (_ []byte, ok bool) {
	b = append(b, `{"id":`...)
	b = jsonenc.AppendString(b, e.ID)
	b = append(b, `,"msg_id":`...)
	b = jsonenc.AppendString(b, e.MsgID)
	b = append(b, `,"tenant":`...)
	b = jsonenc.AppendString(b, e.Tenant)
	b = append(b, `,"from":`...)
	b = jsonenc.AppendString(b, e.From)
	b = append(b, `,"rcpts":`...)
	if e.Rcpts == nil {
		b = append(b, "null"...)
	} else {
		b = appendStrings(b, e.Rcpts)
	}
	b = append(b, `,"dest":`...)
	b = jsonenc.AppendString(b, e.Dest)
	b = appendStringField(b, "group", e.Group)
	b = append(b, `,"body_ref":`...)
	b = jsonenc.AppendString(b, e.BodyRef)
	if e.Signed {
		b = append(b, `,"signed":true`...)
	}
	b = appendIntField(b, "sig_len", int64(e.SigLen))
	b = append(b, `,"size":`...)
	b = strconv.AppendInt(b, e.Size, 10)
	b = append(b, `,"parts":`...)
	b = strconv.AppendInt(b, int64(e.Parts), 10)
	b = append(b, `,"submitted_at":`...)
	if b, ok = appendTime(b, e.SubmittedAt); !ok {
		return b, false
	}
	b = appendStringField(b, "message_id", e.MessageID)
	if len(e.History) > 0 {
		b = append(b, `,"history":[`...)
		for i := range e.History {
			if i > 0 {
				b = append(b, ',')
			}
			if b, ok = e.History[i].appendJSON(b); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	b = appendStringField(b, "source", e.Source)
	if e.DSN != nil {
		b = e.DSN.appendJSON(append(b, `,"dsn":`...))
	}
	if e.IsReport {
		b = append(b, `,"is_dsn":true`...)
	}
	if e.DelayWarned {
		b = append(b, `,"delay_warned":true`...)
	}
	if e.PassNoted {
		b = append(b, `,"dsn_pass":true`...)
	}
	b = appendIntField(b, "delay_noted", int64(e.DelayNoted))
	if !e.SendAt.IsZero() {
		if b, ok = appendTime(append(b, `,"send_at":`...), e.SendAt); !ok {
			return b, false
		}
	}
	if e.ListUnsubscribe {
		b = append(b, `,"list_unsubscribe":true`...)
	}
	b = append(b, e.unknown...) // a later release's fields, kept (Envelope.unknown)
	return append(b, '}'), true
}

// jsonSizeHint is a generous guess at the length of e's JSON, so that
// data allocates its buffer once.
func (e *Envelope) jsonSizeHint() int {
	n := 320 + len(e.unknown) + len(e.ID) + len(e.MsgID) + len(e.Tenant) + len(e.From) + len(e.Dest) + len(e.Group) + len(e.BodyRef) + len(e.MessageID) + len(e.Source)
	for _, r := range e.Rcpts {
		n += len(r) + 3
	}
	for i := range e.History {
		a := &e.History[i]
		n += 240 + len(a.Worker) + len(a.Class) + len(a.Rule) + len(a.Enhanced) + len(a.Reply) + len(a.Lane) + len(a.JitterSeed)
	}
	if e.DSN != nil {
		n += 40 + len(e.DSN.Ret) + len(e.DSN.EnvID)
		for k, r := range e.DSN.Rcpts {
			n += 60 + len(k) + len(r.ORcpt) + len(r.ORcptType)
			for _, v := range r.Notify {
				n += len(v) + 3
			}
		}
	}
	return n
}

func (a *Attempt) appendJSON(b []byte) (_ []byte, ok bool) {
	b = append(b, `{"at":`...)
	if b, ok = appendTime(b, a.At); !ok {
		return b, false
	}
	b = append(b, `,"attempt":`...)
	b = strconv.AppendInt(b, int64(a.Attempt), 10)
	b = append(b, `,"worker":`...)
	b = jsonenc.AppendString(b, a.Worker)
	b = append(b, `,"class":`...)
	b = jsonenc.AppendString(b, a.Class)
	b = appendStringField(b, "rule", a.Rule)
	b = appendIntField(b, "code", int64(a.Code))
	b = appendStringField(b, "enhanced_code", a.Enhanced)
	b = appendStringField(b, "reply", a.Reply)
	b = appendStringField(b, "lane", a.Lane)
	b = appendIntField(b, "delay_ms", a.DelayMs)
	b = appendStringField(b, "jitter_seed", a.JitterSeed)
	b = appendIntField(b, "rcpts", int64(a.Rcpts))
	return append(b, '}'), true
}

// appendJSON writes d with its recipients in the order of their keys'
// bytes, as json.Marshal sorts a map's keys.
func (d *DSNParams) appendJSON(b []byte) []byte {
	b = append(b, '{')
	first := true
	field := func(name string) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(append(append(b, '"'), name...), `":`...)
	}
	if d.Ret != "" {
		field("ret")
		b = jsonenc.AppendString(b, d.Ret)
	}
	if d.EnvID != "" {
		field("envid")
		b = jsonenc.AppendString(b, d.EnvID)
	}
	if len(d.Rcpts) > 0 {
		field("rcpts")
		keys := make([]string, 0, len(d.Rcpts))
		for k := range d.Rcpts {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonenc.AppendString(b, k)
			b = append(b, ':')
			r := d.Rcpts[k]
			b = r.appendJSON(b)
		}
		b = append(b, '}')
	}
	return append(b, '}')
}

func (r *RcptDSN) appendJSON(b []byte) []byte {
	b = append(b, '{')
	n := len(b)
	if len(r.Notify) > 0 {
		b = appendStrings(append(b, `"notify":`...), r.Notify)
	}
	if r.ORcpt != "" {
		if len(b) > n {
			b = append(b, ',')
		}
		b = jsonenc.AppendString(append(b, `"orcpt":`...), r.ORcpt)
	}
	if r.ORcptType != "" {
		if len(b) > n {
			b = append(b, ',')
		}
		b = jsonenc.AppendString(append(b, `"orcpt_type":`...), r.ORcptType)
	}
	return append(b, '}')
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonenc.AppendString(b, s)
	}
	return append(b, ']')
}

// appendTime appends t quoted, as time.Time.MarshalJSON writes it (RFC
// 3339 with nanoseconds, trailing zeros trimmed). ok is false where
// MarshalJSON fails: a year that is not four digits, or a zone offset whose
// hours are not below 24.
func appendTime(b []byte, t time.Time) (_ []byte, ok bool) {
	b = append(b, '"')
	n := len(b)
	b = t.AppendFormat(b, time.RFC3339Nano)
	if len(b)-n < len("2006-01-02T15:04:05Z") || b[n+4] != '-' {
		return b, false
	}
	if b[len(b)-1] != 'Z' {
		// ±hh:mm: more than two hour digits push a digit where the sign goes.
		z := b[len(b)-len("-07:00"):]
		if z[0] >= '0' && z[0] <= '9' || (z[1]-'0')*10+(z[2]-'0') >= 24 {
			return b, false
		}
	}
	return append(b, '"'), true
}
