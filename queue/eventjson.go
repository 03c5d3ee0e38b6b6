package queue

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/outflow/outflow/internal/jsonenc"
)

// appendJSON appends ev as JSON, byte for byte what json.Marshal writes
// (field order, omitempty, HTML-safe escaping), without reflection: every
// delivered message publishes two events, and json.Marshal (with its
// copy of Decision) was most of the cost of publishing them. ok is
// false when Decision or State is not valid JSON, which json.Marshal would
// refuse too; a Decision marked DecisionMarshaled is taken as valid.
func (ev *Event) appendJSON(b []byte) (_ []byte, ok bool) {
	if len(ev.Decision) > 0 && !ev.DecisionMarshaled && !json.Valid(ev.Decision) || len(ev.State) > 0 && !json.Valid(ev.State) {
		return b, false
	}
	b = append(b, `{"type":`...)
	b = jsonenc.AppendString(b, ev.Type)
	b = append(b, `,"time":"`...)
	b = ev.Time.AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","id":`...)
	b = jsonenc.AppendString(b, ev.ID)
	b = appendStringField(b, "msg_id", ev.MsgID)
	b = appendStringField(b, "tenant", ev.Tenant)
	b = appendStringField(b, "dest", ev.Dest)
	b = appendIntField(b, "rcpts", int64(ev.Rcpts))
	b = appendIntField(b, "size", ev.Size)
	b = appendIntField(b, "attempt", int64(ev.Attempt))
	b = appendStringField(b, "worker_id", ev.Worker)
	b = appendStringField(b, "reason", ev.Reason)
	if len(ev.Recipients) > 0 {
		b = append(b, `,"recipients":[`...)
		for i, r := range ev.Recipients {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonenc.AppendString(b, r)
		}
		b = append(b, ']')
	}
	if ev.Async {
		b = append(b, `,"async":true`...)
	}
	if ev.Notify != nil {
		// Only delivered events of mail sent with a return path to a
		// sender owed notices carry one: a small struct, about a
		// microsecond through json.Marshal.
		n, err := json.Marshal(ev.Notify)
		if err != nil {
			return b, false
		}
		b = append(append(b, `,"notify":`...), n...)
	}
	switch {
	case len(ev.Decision) > 0 && ev.DecisionMarshaled:
		b = append(append(b, `,"decision":`...), ev.Decision...)
	case len(ev.Decision) > 0:
		b = jsonenc.AppendCompact(append(b, `,"decision":`...), ev.Decision)
	}
	if len(ev.State) > 0 {
		b = jsonenc.AppendCompact(append(b, `,"state":`...), ev.State)
	}
	return append(b, '}'), true
}

func appendStringField(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return jsonenc.AppendString(b, v)
}

func appendIntField(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	b = append(append(append(b, `,"`...), name...), `":`...)
	return strconv.AppendInt(b, v, 10)
}
