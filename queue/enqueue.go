package queue

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/mail"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// ErrNoRecipients is returned by Enqueue for a submission without recipients.
var ErrNoRecipients = errors.New("no recipients")

// Enqueue stores a submission durably: the body once in the Object Store,
// then one envelope per destination domain on the work stream. It returns
// the envelope ids only when JetStream has acknowledged every write; an
// error means nothing may be reported to the client as accepted (the
// submission listener answers 451 and the client retries).
//
// With an IdempotencyKey the ids are derived from tenant and key, and the
// work stream's deduplication window absorbs a resubmission, so a client
// that resends after a timeout creates no duplicate.
func (q *Queue) Enqueue(ctx context.Context, s *Submission) ([]string, error) {
	if len(s.Rcpts) == 0 {
		return nil, ErrNoRecipients
	}
	msgID := nuid.Next()
	if s.IdempotencyKey != "" {
		sum := sha256.Sum256([]byte(s.Tenant + "\x00" + s.IdempotencyKey))
		msgID = "k" + hex.EncodeToString(sum[:12])
	}
	received := s.ReceivedAt
	if received.IsZero() {
		received = time.Now()
	}
	if err := q.ensureTenant(ctx, s.Tenant); err != nil {
		return nil, fmt.Errorf("tenant consumer: %w", err)
	}
	groups, order := splitByDomain(s.Rcpts)
	if _, err := q.bodies.PutBytes(ctx, msgID, s.Body); err != nil {
		return nil, fmt.Errorf("store body: %w", err)
	}
	msgHdrID := headerMessageID(s.Body)
	deadline := received.Add(q.opts.MaxAge)
	ids := make([]string, 0, len(order))
	futures := make([]jetstream.PubAckFuture, 0, len(order))
	for i, dom := range order {
		id := msgID
		if len(order) > 1 {
			id = msgID + "-" + strconv.Itoa(i+1)
		}
		env := &Envelope{
			ID: id, MsgID: msgID, Tenant: s.Tenant, From: s.From,
			Rcpts: groups[dom], Dest: dom, BodyRef: msgID, Size: int64(len(s.Body)),
			Parts: len(order), SubmittedAt: received.UTC(), MessageID: msgHdrID,
			Deadline: deadline,
		}
		m, err := env.Encode(workSubject(s.Tenant, dom, id))
		if err != nil {
			return nil, err
		}
		f, err := q.js.PublishMsgAsync(m, jetstream.WithMsgID(id), jetstream.WithExpectStream(StreamWork))
		if err != nil {
			return nil, fmt.Errorf("queue envelope: %w", err)
		}
		futures = append(futures, f)
		ids = append(ids, id)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, fmt.Errorf("queue envelope: %w", err)
		case <-ctx.Done():
			return nil, fmt.Errorf("queue envelope: %w", ctx.Err())
		}
	}
	for i, id := range ids {
		q.Event(EventQueued, &Event{ID: id, MsgID: msgID, Tenant: s.Tenant, Dest: order[i], Rcpts: len(groups[order[i]]), Size: int64(len(s.Body))})
	}
	return ids, nil
}

// splitByDomain groups recipients by their lower-cased domain, keeping the
// order in which domains first appear.
func splitByDomain(rcpts []string) (map[string][]string, []string) {
	groups := make(map[string][]string, 1)
	var order []string
	for _, r := range rcpts {
		d := Domain(r)
		if _, ok := groups[d]; !ok {
			order = append(order, d)
		}
		groups[d] = append(groups[d], r)
	}
	return groups, order
}

// Domain returns the lower-cased domain of an address ("" when it has none).
func Domain(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return ""
	}
	return strings.ToLower(strings.TrimSuffix(addr[at+1:], "."))
}

// headerMessageID returns the Message-ID header of body, for logs.
func headerMessageID(body []byte) string {
	end := bytes.Index(body, []byte("\r\n\r\n"))
	if end < 0 {
		end = len(body)
	}
	if end > 64<<10 {
		end = 64 << 10
	}
	m, err := mail.ReadMessage(bytes.NewReader(append(body[:end:end], "\r\n\r\n"...)))
	if err != nil {
		return ""
	}
	return shorten(strings.TrimSpace(m.Header.Get("Message-Id")), 200)
}

// Body fetches an envelope's message body.
func (q *Queue) Body(ctx context.Context, ref string) ([]byte, error) {
	b, err := q.bodies.GetBytes(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("body %s: %w", ref, err)
	}
	return b, nil
}

// PutBody stores a derived body (a DKIM-signed copy) under ref.
func (q *Queue) PutBody(ctx context.Context, ref string, body []byte) error {
	if _, err := q.bodies.PutBytes(ctx, ref, body); err != nil {
		return fmt.Errorf("store body %s: %w", ref, err)
	}
	return nil
}

// releaseBody deletes a body once no envelope can need it again: its own
// signed copy always, the shared original only for single-part
// submissions; bodies shared by several envelopes expire with the bucket's
// TTL.
func (q *Queue) releaseBody(ctx context.Context, e *Envelope) {
	var refs []string
	if e.Signed && e.BodyRef != e.MsgID {
		refs = append(refs, e.BodyRef)
	}
	if e.Parts <= 1 {
		refs = append(refs, e.MsgID)
	}
	for _, ref := range refs {
		if err := q.bodies.Delete(ctx, ref); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			q.log.Debug().Err(err).Str("msg_id", e.MsgID).Msg("delete body")
		}
	}
}
