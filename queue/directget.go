package queue

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// lastMsg reads the last message stored on subject in stream with one
// direct get, the request nats.go's KeyValue.Get makes, without what it
// adds on the way: a JSON request body the direct get ignores, its
// encoding, and an entry built around the reply. found is false when no
// message is stored, or when the last one is a key-value delete or purge
// marker (what KeyValue.Get reports as ErrKeyNotFound). seq is the
// message's stream sequence (a key's revision). Every stream it reads
// allows direct gets (setup).
//
// On the embedded server a subject with nothing stored is answered in
// process (localStore), counted as OpLocalGet; a direct get is counted as
// op.
func (q *Queue) lastMsg(ctx context.Context, op Op, stream, subject string) (data []byte, seq uint64, found bool, err error) {
	m, found, err := q.lastStored(ctx, op, stream, subject)
	if err != nil || !found {
		return nil, 0, false, err
	}
	seq, err = strconv.ParseUint(m.Header.Get(nats.JSSequence), 10, 64)
	if err != nil {
		return nil, 0, false, fmt.Errorf("direct get %s: sequence: %w", subject, err)
	}
	return m.Data, seq, true, nil
}

// lastHeader is lastMsg's look-up for the stored message's headers.
func (q *Queue) lastHeader(ctx context.Context, op Op, stream, subject string) (nats.Header, bool, error) {
	m, found, err := q.lastStored(ctx, op, stream, subject)
	if err != nil || !found {
		return nil, false, err
	}
	return m.Header, true, nil
}

// lastStored is lastMsg's direct get: the reply, whose headers are the
// stored message's with the stream's (Nats-Sequence, Nats-Subject).
func (q *Queue) lastStored(ctx context.Context, op Op, stream, subject string) (*nats.Msg, bool, error) {
	if q.local != nil && q.local.absent(stream, subject) {
		q.count(OpLocalGet)
		return nil, false, nil
	}
	q.count(op)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directGetTimeout)
		defer cancel()
	}
	resp, err := q.nc.RequestWithContext(ctx, directGetSubject(stream, subject), nil)
	if err != nil {
		return nil, false, err
	}
	return storedReply(resp, subject)
}

// storedReply reads a direct get's reply for what: the stored message, or
// found false for none (404) and for a key-value delete or purge marker.
func storedReply(resp *nats.Msg, what string) (*nats.Msg, bool, error) {
	if len(resp.Data) == 0 {
		switch st := resp.Header.Get("Status"); st {
		case "":
		case "404":
			return nil, false, nil
		default:
			return nil, false, fmt.Errorf("direct get %s: %s %s", what, st, resp.Header.Get("Description"))
		}
	}
	switch resp.Header.Get("KV-Operation") {
	case "DEL", "PURGE":
		return nil, false, nil
	}
	return resp, true, nil
}

// directGetTimeout bounds a direct get whose context has no deadline, as
// nats.go's default API timeout does.
const directGetTimeout = 5 * time.Second

// lastMatching reads the last message stored on any subject matching
// pattern (a wildcard) in stream with one direct get by its JSON form,
// the only form that takes a wildcard. It returns the reply (its subject
// in the Nats-Subject header); found is as lastMsg's.
func (q *Queue) lastMatching(ctx context.Context, op Op, stream, pattern string) (m *nats.Msg, found bool, err error) {
	q.count(op)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, directGetTimeout)
		defer cancel()
	}
	resp, err := q.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream, []byte(`{"last_by_subj":"`+pattern+`"}`))
	if err != nil {
		return nil, false, err
	}
	return storedReply(resp, pattern)
}
