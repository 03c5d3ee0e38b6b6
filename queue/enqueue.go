package queue

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// perRecipientInlineMax bounds the copies of a body that a submission
// split per recipient carries inline, one in each envelope: beyond it the
// body is stored once and shared, as a multi-destination message's is,
// rather than written to the work stream (and held by the publishes in
// flight) once per recipient.
const perRecipientInlineMax = 16 << 20

// ErrNoRecipients is returned by Enqueue for a submission without recipients.
var ErrNoRecipients = errors.New("no recipients")

// Enqueue stores a submission durably: one envelope per destination
// domain on the work stream, with the body inside it (one destination, a
// body up to InlineBodyMax) or stored once in the Object Store first. It returns
// the envelope ids only when JetStream has acknowledged every write; an
// error means nothing may be reported to the client as accepted (the
// submission listener answers 451 and the client retries). Near the
// embedded store's limit new mail is refused with ErrNoRoom before
// anything is written (storeroom.go; 452 over SMTP).
//
// With an IdempotencyKey the ids are derived from tenant, key and the
// time the key was first used (keyedRecord), and the work stream's
// deduplication window absorbs a resubmission, so a client that resends
// after a timeout creates no duplicate. Once the window has passed, the
// key makes a new message, with ids, body and records of its own.
func (q *Queue) Enqueue(ctx context.Context, s *Submission) ([]string, error) {
	if len(s.Rcpts) == 0 {
		return nil, ErrNoRecipients
	}
	// Near the store's limit new mail is refused before anything is
	// written, so that what is left is the mail already accepted's
	// (storeroom.go). No round trip: the last look at the store.
	if err := q.roomFor(ctx, s); err != nil {
		return nil, err
	}
	msgID := nuid.Next()
	unsub := s.ListUnsubscribe != nil && *s.ListUnsubscribe
	// The tenant's own split (a return path) applies here rather than in
	// each caller, so that no way in can skip it.
	perRcpt := unsub || s.PerRecipient || q.opts.PerRecipient != nil && q.opts.PerRecipient(s.Tenant)
	var keyed *keyedRecord
	if s.IdempotencyKey != "" {
		var err error
		if keyed, err = q.keyedSubmission(ctx, s.Tenant, s.IdempotencyKey, perRcpt); err != nil {
			return nil, err
		}
		// A retry splits as the first try did (keyedRecord.perRcpt),
		// whatever its caller decided this time.
		if keyed.ids != nil {
			// A keyed message held for later (SendAt) went to the retry
			// lane, whose deduplication window is minutes, not the work
			// stream's day: its record answers a resubmission.
			return keyed.ids, nil
		}
		msgID = keyed.msgID(s.Tenant, s.IdempotencyKey)
		perRcpt = keyed.perRcpt
	}
	received := s.ReceivedAt
	if received.IsZero() {
		received = time.Now()
	}
	tenant, err := q.ensureTenant(ctx, s.Tenant)
	if err != nil {
		return nil, fmt.Errorf("tenant consumer: %w", err)
	}
	parts := split(s.Rcpts, perRcpt)
	// One destination and a body of at most InlineBodyMax: the body goes
	// inside the envelope, and the envelope's one acknowledged write stores
	// both. Otherwise the body is stored once in the Object Store first.
	// A message split per recipient carries its body inline in each
	// envelope too, while its copies come to at most
	// perRecipientInlineMax: its parts are many (up to max-recipients),
	// and a body they shared would have each of them count itself out of
	// one key (lastPart) at about the same moment.
	inline := len(s.Body) <= q.opts.InlineBodyMax &&
		(len(parts) == 1 || perRcpt && len(parts)*len(s.Body) <= perRecipientInlineMax)
	bodyRef := msgID
	switch {
	case inline:
		bodyRef = ""
	case s.IdempotencyKey != "":
		// An idempotency-keyed name can exist already, and PutBytes
		// cleans up the chunks it replaces.
		if err := q.putBody(ctx, msgID, s.Body); err != nil {
			return nil, fmt.Errorf("store body: %w", err)
		}
	default:
		// A nuid-named body is new by construction: the fast path may
		// skip the Object Store's look-up of an older version.
		if err := q.putNewBody(ctx, msgID, s.Body); err != nil {
			return nil, fmt.Errorf("store body: %w", err)
		}
	}
	if len(parts) > 1 && !inline {
		// Several envelopes share the body: count them, so that the last
		// one to finish can delete it (releaseBody). Written before any
		// envelope exists, so no part can finish uncounted.
		q.count(OpSentPut)
		if _, err := q.sent.Put(ctx, partsKey(msgID), []byte(strconv.Itoa(len(parts)))); err != nil {
			return nil, fmt.Errorf("count body references: %w", err)
		}
	}
	msgHdrID := headerMessageID(s.Body)
	deadline := received.Add(q.opts.DeadlineAfter)
	// A message sent later waits as a first attempt scheduled on the retry
	// lane; its age counts from when it is to be sent.
	later := s.SendAt.After(time.Now().Add(time.Second))
	if later {
		deadline = s.SendAt.Add(q.opts.DeadlineAfter)
	}
	ids := make([]string, 0, len(parts))
	futures := make([]jetstream.PubAckFuture, 0, len(parts))
	// The queued events carry the time before the envelopes are published:
	// a worker can deliver an envelope before the fsync below returns, and
	// its event must not read as older than the message's queued one.
	stored := time.Now().UTC()
	for i, part := range parts {
		id := msgID
		if len(parts) > 1 {
			id = msgID + "-" + strconv.Itoa(i+1)
		}
		dom := part.dest
		env := &Envelope{
			ID: id, MsgID: msgID, Tenant: s.Tenant, From: s.From,
			Rcpts: part.rcpts, Dest: dom, BodyRef: bodyRef, Size: int64(len(s.Body)),
			Parts: len(parts), SubmittedAt: received.UTC(), MessageID: msgHdrID,
			Deadline: deadline,
			Source:   s.Source, DSN: s.DSN.For(part.rcpts), IsReport: s.IsReport,
			ListUnsubscribe: unsub,
		}
		if later {
			env.SendAt = s.SendAt.UTC()
		}
		if inline {
			env.Body = s.Body
			if len(parts) == 1 {
				env.frame = s.Frame
			}
		}
		ids = append(ids, id)
		var m *nats.Msg
		var err error
		stream, op := StreamWork, OpPublishWork
		if later {
			// Its schedule's deduplication id (<id>.0) absorbs a keyed
			// resubmission for minutes; the record written below, after.
			m, err = scheduleMsg(env, LaneRetry, s.SendAt)
			stream, op = StreamRetry, OpPublishLane
		} else if m, err = env.Encode(workSubject(s.Tenant, dom, id)); err == nil {
			m.Header.Set(jetstream.ExpectedStreamHeader, StreamWork)
			if s.IdempotencyKey != "" {
				// Only a keyed id can come again. The server keeps every
				// deduplication id in memory for the whole window
				// (DedupWindow), so giving each nuid-named envelope one
				// would cost server memory per message for that long, for
				// nothing.
				m.Header.Set(jetstream.MsgIDHeader, id)
			}
		}
		if err != nil {
			return nil, err
		}
		q.count(op)
		if len(parts) == 1 {
			// One envelope: one request, its PubAck read without
			// nats.go's future and JSON decode (pubAckErr).
			if err := q.publishConfirmed(ctx, m, stream); err != nil {
				if refused(err) {
					return nil, fmt.Errorf("queue envelope: %w", err)
				}
				return nil, maybeStored(fmt.Errorf("queue envelope: %w", err))
			}
			continue
		}
		f, err := q.js.PublishMsgAsync(m)
		if err != nil {
			if len(futures) == 0 {
				return nil, fmt.Errorf("queue envelope: %w", err) // not sent
			}
			return nil, maybeStored(fmt.Errorf("queue envelope: %w", err))
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return nil, maybeStored(fmt.Errorf("queue envelope: %w", err))
		case <-ctx.Done():
			return nil, maybeStored(fmt.Errorf("queue envelope: %w", ctx.Err()))
		}
	}
	// The envelopes, and the body when it is stored apart, are on disk
	// before the ids are returned (before the 250): RFC 5321 §6.1.
	streams := []string{StreamWork}
	reason := ""
	if later {
		streams[0] = StreamRetry
		reason = "scheduled for " + s.SendAt.UTC().Format(time.RFC3339)
	}
	if !inline {
		streams = append(streams, bodyStreamName)
	}
	if keyed != nil {
		// The key's record names the ids: lost in a crash, a retry would
		// store the message again under new ones.
		streams = append(streams, sentStreamName)
	}
	if err := q.durable(ctx, streams...); err != nil {
		if !errors.Is(err, ErrSyncUnanswered) || !q.storedAcrossRestart(ctx, streams, ids) {
			return nil, maybeStored(fmt.Errorf("queue envelope: %w", err))
		}
	}
	// Counted until the next look at the store reads it (StoreRoom.charge):
	// the bodies, once or in each envelope, and some for the envelopes.
	charged := len(s.Body)
	if inline {
		charged *= len(parts)
	}
	q.storeRoom().charge(charged + 512*len(parts))
	if !later {
		q.wake(tenant)
	} else if keyed != nil {
		if err := q.recordScheduled(ctx, keyed, ids); err != nil {
			return nil, maybeStored(err)
		}
	}
	for i, id := range ids {
		// The recipients, so that a message not yet tried is found by
		// address too (FindEvents).
		q.Event(EventQueued, &Event{Time: stored, ID: id, MsgID: msgID, Tenant: s.Tenant, Dest: parts[i].dest, Rcpts: len(parts[i].rcpts),
			Size: int64(len(s.Body)), Reason: reason, Recipients: parts[i].rcpts})
	}
	return ids, nil
}

// ErrMaybeStored marks an Enqueue error that came once an envelope had
// been handed to the server: the message may be stored, in part (one
// envelope of several) or whole (its fsync failed, or the answer was
// lost), and what is stored is delivered. A caller must not take it as
// not sent: a sending limit keeps its recipients counted.
var ErrMaybeStored = errors.New("the message may be stored, in part or whole")

func maybeStored(err error) error { return fmt.Errorf("%w (%w)", err, ErrMaybeStored) }

// refused reports whether err from publishing one envelope says the
// server did not store it: no stream answered, or the stream answered
// with an error. A timeout or a lost connection says nothing either way.
func refused(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, nats.ErrMaxPayload) || errors.As(err, &apiErr)
}

// part is the recipients of one envelope, all at dest.
type part struct {
	dest  string
	rcpts []string
}

// split groups recipients into envelopes: by their lower-cased domain, in
// the order in which domains first appear, or with perRcpt one envelope
// per recipient (a message whose header names its one recipient, such as
// its unsubscribe link), in the order given, a repeated address (in any
// case) once.
func split(rcpts []string, perRcpt bool) []part {
	if len(rcpts) == 1 {
		return []part{{Domain(rcpts[0]), rcpts}}
	}
	parts := make([]part, 0, 2)
	if perRcpt {
		seen := make(map[string]bool, len(rcpts))
		for _, r := range rcpts {
			if n := NormalizeAddress(r); !seen[n] {
				seen[n] = true
				parts = append(parts, part{Domain(r), []string{r}})
			}
		}
		return parts
	}
	index := make(map[string]int, 2)
	for _, r := range rcpts {
		d := Domain(r)
		i, ok := index[d]
		if !ok {
			i = len(parts)
			index[d] = i
			parts = append(parts, part{dest: d})
		}
		parts[i].rcpts = append(parts[i].rcpts, r)
	}
	return parts
}

// Domain returns the lower-cased domain of an address ("" when it has none).
func Domain(addr string) string {
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return ""
	}
	return strings.ToLower(strings.TrimSuffix(addr[at+1:], "."))
}

// headerMessageID returns the Message-ID header of body, for logs: the
// first such field in the header (up to the first empty line, at most
// 64 KiB), its folded lines joined with a space. It scans the bytes in
// place: net/mail's parser allocates the whole header per message for this
// one field.
func headerMessageID(body []byte) string {
	if len(body) > 64<<10 {
		body = body[:64<<10]
	}
	const name = "message-id:"
	for len(body) > 0 {
		var line []byte
		line, body = nextLine(body)
		if len(line) == 0 {
			return "" // the end of the header
		}
		if len(line) < len(name) || !strings.EqualFold(string(line[:len(name)]), name) {
			continue
		}
		v := strings.TrimSpace(string(line[len(name):]))
		for len(body) > 0 && (body[0] == ' ' || body[0] == '\t') {
			line, body = nextLine(body)
			if cont := strings.TrimSpace(string(line)); cont != "" {
				v += " " + cont
			}
		}
		return shorten(strings.TrimSpace(v), 200)
	}
	return ""
}

// nextLine splits off b's first line, without its CRLF or LF.
func nextLine(b []byte) (line, rest []byte) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return bytes.TrimSuffix(b, []byte("\r")), nil
	}
	return bytes.TrimSuffix(b[:i], []byte("\r")), b[i+1:]
}

// keyedRecord is the SENT-bucket record of an idempotency-keyed
// submission: "<first>/<split> [<id>,<id>...]", the time the key was
// first used (Unix nanoseconds), how that first try split the message
// ("r": an envelope per recipient, "d": per destination; absent in a
// record of an earlier release), then, for a message held for later, its
// envelope ids once they are stored.
//
// The split is kept because the envelope ids are the message id and a
// part number: a retry that split otherwise (its caller's view of the
// tenant's return path changed between the tries, or `outflow submit`
// could not read it) numbered other recipients under the same ids, so
// the deduplication dropped some of its envelopes as repeats and stored
// others anew: a recipient sent the message twice, another's envelope
// answered under a wrong id.
//
// The time is part of the message id. A key may be used again once the
// work stream's deduplication window has passed (the API's record of it
// expires then too), while what the first message left under its id
// lives on: its schedule and record until it is sent (send_at is up to
// three days ahead), its body and parts count until its last envelope
// ends (a dead letter's for weeks), its SENT markers and events for days.
// With an id derived from tenant and key alone, the new message was
// answered with the first one's ids and dropped when that one had been
// held for later, or overwrote the body the first one's envelopes still
// read and merged the two histories. A retry within the window finds the
// record and makes the same ids; past it, the record is replaced and
// every name is new.
type keyedRecord struct {
	name    string   // its SENT-bucket key
	first   string   // when the key was first used, Unix nanoseconds
	perRcpt bool     // the first try split the message per recipient
	ids     []string // the ids of a stored message held for later; nil otherwise
}

// token is the record's first field: first and the split.
func (k *keyedRecord) token() string {
	if k.perRcpt {
		return k.first + "/r"
	}
	return k.first + "/d"
}

// msgID is the message id of the keyed submission.
func (k *keyedRecord) msgID(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key + "\x00" + k.first))
	return "k" + hex.EncodeToString(sum[:12])
}

// keyedSubmission returns the record of (tenant, key) for a submission
// now: the one within its deduplication window, or a new one, made with
// a compare-and-set so that concurrent first tries (or tries just after
// the window) agree on one. The record lives as long as the SENT bucket
// keeps keys (sent-ttl, three days by default), which must be at least
// the window: a retry later than that is taken for a new message.
//
// perRcpt is this try's split, which a new record keeps; a record within
// its window gives the first try's instead.
func (q *Queue) keyedSubmission(ctx context.Context, tenant, key string, perRcpt bool) (*keyedRecord, error) {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	k := &keyedRecord{name: "idem." + hex.EncodeToString(sum[:16])}
	for range 8 {
		k.first, k.perRcpt, k.ids = strconv.FormatInt(time.Now().UnixNano(), 10), perRcpt, nil
		now := k.token()
		q.count(OpSentPut)
		_, err := q.sent.Create(ctx, k.name, []byte(now))
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
		q.count(OpSentGet)
		e, err := q.sent.Get(ctx, k.name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or removed since: make it
		}
		if err != nil {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
		tok, ids, _ := strings.Cut(string(e.Value()), " ")
		first, split, _ := strings.Cut(tok, "/")
		if ns, err := strconv.ParseInt(first, 10, 64); err == nil && time.Since(time.Unix(0, ns)) < q.opts.DedupWindow {
			k.first = first
			if split != "" {
				k.perRcpt = split == "r"
			}
			if ids != "" {
				k.ids = strings.Split(ids, ",")
			}
			return k, nil
		}
		// The window has passed: a new message.
		q.count(OpSentPut)
		_, err = q.sent.Update(ctx, k.name, []byte(now), e.Revision())
		if err == nil {
			return k, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
		// Another try replaced it first: read what it wrote.
	}
	return nil, errors.New("idempotency record: changing under too many tries at once")
}

// recordScheduled records the ids of a keyed message held for later in
// its key's record, after its schedules are on disk. A crash between the
// two leaves a resubmission to the schedules' own deduplication (minutes)
// and, past it, to the schedule's subject, which a second schedule
// replaces: a duplicate only if the first had already fired.
func (q *Queue) recordScheduled(ctx context.Context, k *keyedRecord, ids []string) error {
	q.count(OpSentPut)
	if err := q.putSent(ctx, k.name, []byte(k.token()+" "+strings.Join(ids, ","))); err != nil {
		return fmt.Errorf("record the scheduled message: %w", err)
	}
	return nil
}
