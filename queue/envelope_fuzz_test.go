package queue

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// FuzzDecodeEnvelope feeds arbitrary payloads and header values to the
// envelope decoder: garbage published on a work subject must come back as
// an error, never a panic or a half-valid envelope.
func FuzzDecodeEnvelope(f *testing.F) {
	f.Add([]byte(`{"id":"abc","rcpts":["a@b"],"dest":"b","body_ref":"abc"}`), "1", "2026-01-01T00:00:00Z", "")
	f.Add([]byte(`{"id":"../x","rcpts":[]}`), "-1", "yesterday", "")
	f.Add([]byte(`not json`), "", "", "")
	f.Add([]byte(`{"id":"abc","rcpts":["a@b"],"dest":"b","body_ref":"abc","source":"smtp","is_dsn":true,"dsn":{"ret":"FULL","envid":"e1","rcpts":{"a@b":{"notify":["SUCCESS","DELAY"],"orcpt":"A@b"}}}}`), "0", "", "")
	f.Add([]byte(`{"id":"abc","rcpts":["a@b"],"dest":"b","body_ref":"abc","dsn":{"rcpts":null}}`), "0", "", "")
	f.Add([]byte("{\"id\":\"abc\",\"rcpts\":[\"a@b\"],\"dest\":\"b\",\"body_ref\":\"\",\"signed\":true,\"sig_len\":3}\nSig: 1\r\n\r\nhi\r\n"), "0", "", "14")
	f.Fuzz(func(t *testing.T, data []byte, attempt, deadline, inline string) {
		h := nats.Header{}
		h.Set(HdrAttempt, attempt)
		h.Set(HdrDeadline, deadline)
		if inline != "" {
			h.Set(HdrInlineBody, inline)
		}
		// The JSON decode is json.Unmarshal's, error or envelope.
		checkUnmarshalEnvelope(t, data)
		e, err := DecodeEnvelope(data, h)
		if err != nil {
			return
		}
		if e.ID == "" || len(e.Rcpts) == 0 || e.Dest == "" || e.Attempt < 0 || !validID(e.ID) {
			t.Fatalf("decoder accepted an incomplete envelope: %+v", e)
		}
		if (e.BodyRef == "") != (e.Body != nil) || e.SigLen < 0 || e.SigLen > len(e.Body) {
			t.Fatalf("decoder accepted an envelope with no body, two bodies or a bad signature length: %+v", e)
		}
		_ = e.Unsigned()
		for _, r := range e.Rcpts {
			_ = e.DSN.Wants(r, NotifyFailure)
		}
	})
}
