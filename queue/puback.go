package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// pubAckErr reads a JetStream publish acknowledgement (the reply to a
// publish into a stream) without a JSON decode when it is the server's
// success reply: nil when stream stored the message. The server writes a
// success from a template, {"stream":"<name>",["domain":"<d>",]"seq":<n>},
// and every other reply (an error, a duplicate) with json.Marshal; those,
// and anything that does not start exactly so, are decoded in full as
// nats.go's publish does, and an error is an error whatever else the reply
// carries. nats.go's decode was most of the client's cost of a publish.
func pubAckErr(m *nats.Msg, stream string) error {
	if len(m.Data) == 0 {
		if st := m.Header.Get("Status"); st == "503" {
			return jetstream.ErrNoStreamResponse
		} else if st != "" {
			return fmt.Errorf("publish to %s: status %s %s", stream, st, m.Header.Get("Description"))
		}
		return jetstream.ErrInvalidJSAck
	}
	if successPrefix(m.Data, stream) && !bytes.Contains(m.Data, []byte(`"error"`)) {
		return nil
	}
	var r struct {
		Error  *jetstream.APIError `json:"error"`
		Stream string              `json:"stream"`
	}
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return jetstream.ErrInvalidJSAck
	}
	switch {
	case r.Error != nil:
		return r.Error
	case r.Stream == "":
		return jetstream.ErrInvalidJSAck
	case r.Stream != stream:
		return fmt.Errorf("publish to %s: stored in stream %q", stream, r.Stream)
	}
	return nil
}

// successPrefix reports whether b starts with {"stream":"<stream>", and
// goes on with the "seq" or "domain" of the server's success template.
func successPrefix(b []byte, stream string) bool {
	const open = `{"stream":"`
	if len(b) < len(open)+len(stream)+2 || string(b[:len(open)]) != open {
		return false
	}
	b = b[len(open):]
	if string(b[:len(stream)]) != stream || b[len(stream)] != '"' || b[len(stream)+1] != ',' {
		return false
	}
	b = b[len(stream)+2:]
	return bytes.HasPrefix(b, []byte(`"seq":`)) || bytes.HasPrefix(b, []byte(`"domain":`))
}

// publishConfirmed publishes m into stream and waits for the server's
// acknowledgement: what jetstream.PublishMsg does (its request, two more
// tries 250 ms apart when no stream answers, a context without a deadline
// given nats.go's default API timeout), with the answer read by pubAckErr.
func (q *Queue) publishConfirmed(ctx context.Context, m *nats.Msg, stream string) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directGetTimeout)
		defer cancel()
	}
	resp, err := q.nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		t := time.NewTimer(jetstream.DefaultPubRetryWait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		resp, err = q.nc.RequestMsgWithContext(ctx, m)
	}
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return jetstream.ErrNoStreamResponse
		}
		return err
	}
	return pubAckErr(resp, stream)
}

// putSent writes key in the SENT bucket, what KeyValue.Put writes (the
// value on $KV.<bucket>.<key>, no headers, no revision check), with the
// acknowledgement read by pubAckErr.
func (q *Queue) putSent(ctx context.Context, key string, value []byte) error {
	if !validKVKey(key) {
		return jetstream.ErrInvalidKey
	}
	return q.publishConfirmed(ctx, &nats.Msg{Subject: sentSubject(key), Data: value}, sentStreamName)
}

// validKVKey is KeyValue.Put's key check: tokens of [-/_=.a-zA-Z0-9],
// neither starting nor ending with a dot.
func validKVKey(k string) bool {
	if k == "" || k[0] == '.' || k[len(k)-1] == '.' {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '/', c == '_', c == '=', c == '.':
		default:
			return false
		}
	}
	return true
}
