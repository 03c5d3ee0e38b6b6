package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The first delivery pass of a multi-part submission (a message whose
// recipients were split into one envelope per destination). Its parts
// report what they owe the sender as notifications into one record, so that
// the recipients of one message that fail in the same pass share one
// delivery status notification, whichever process delivers each part
// (worker/dsn.go decides what a note holds and sends the report).
//
// The record is a SENT-bucket key, "pass.<msg id>" (no envelope id is
// "pass", so it never collides with a SENT marker), holding each part's
// note by envelope id. Updates are compare-and-set on the key's revision.
// A part's note replaces an earlier one of its own while the pass is open
// (an attempt run again after a crash reports its own result). The pass
// closes when every part has a note, or when ClosePass ends it at its
// deadline with the notes it holds (a part that is never pulled, its
// destination paused or behind a backlog, must not hold the others'
// failures back for ever); a closed record no longer changes, so every
// reader gets the same notes, and a part that reaches its pass afterwards
// reports on its own (Pass.Alone). The key expires with the bucket's TTL
// (Options.SentTTL): a part run again after a crash must still find it.

// passMaxBytes bounds a pass record. A note that would make it larger is
// not stored (the part counts as reached, and reports on its own).
const passMaxBytes = 256 << 10

// passRecord is the stored value of a pass.
type passRecord struct {
	Parts  int   `json:"parts"`
	Notes  notes `json:"notes"`            // by envelope id; "null": reached, nothing stored
	Closed bool  `json:"closed,omitempty"` // ended by ClosePass before every part had a note
}

// complete: no note is added any more, every part's or by the deadline.
func (r *passRecord) complete() bool { return r.Closed || len(r.Notes) >= r.Parts }

// notes are the parts' notes in a per-message record, by envelope id.
type notes map[string]json.RawMessage

// Pass is what RecordPass answers.
type Pass struct {
	// Complete: the pass is complete (every part reached it, or it was
	// closed at its deadline) and this part is in it; the caller sends its
	// report. Notes then holds each part's note (envelope id order, parts
	// that stored none left out); it is the same for every caller.
	Complete bool
	Notes    []json.RawMessage
	// Alone: this part's note was not stored (it would have made the
	// record larger than passMaxBytes, or the pass was complete, or
	// closed, without it); the part reports it on its own.
	Alone bool
}

func passKey(msgID string) string { return "pass." + msgID }

// RecordPass stores note as e's part of its submission's first pass and
// answers whether the pass is now complete. It is safe to call again for
// the same part (an attempt run again): the part counts once. An error
// means nothing may be assumed stored; the caller's durable step must fail
// so that the attempt, and this call, run again.
func (q *Queue) RecordPass(ctx context.Context, e *Envelope, note json.RawMessage) (Pass, error) {
	key := passKey(e.MsgID)
	if note == nil {
		note = json.RawMessage("null")
	}
	var p Pass
	err := q.updateRecord(ctx, key, func(old []byte) ([]byte, error) {
		rec := passRecord{Parts: e.Parts}
		if old != nil {
			if err := json.Unmarshal(old, &rec); err != nil {
				return nil, err
			}
		}
		if rec.complete() {
			// Complete before this call: a part run again after a crash,
			// whose note is in (it sends the report again, under the same
			// id), or one that is not (reached after the deadline, or
			// Parts disagreeing), which reports on its own.
			if _, in := rec.Notes[e.ID]; !in {
				p = Pass{Alone: true}
			} else {
				p = Pass{Complete: true, Notes: rec.Notes.sorted("")}
			}
			return nil, nil
		}
		if rec.Notes == nil {
			rec.Notes = notes{}
		}
		p = Pass{}
		rec.Notes[e.ID] = note
		val, err := json.Marshal(&rec)
		if err == nil && len(val) > passMaxBytes {
			p.Alone = true
			rec.Notes[e.ID] = json.RawMessage("null")
			val, err = json.Marshal(&rec)
		}
		if p.Complete = rec.complete(); p.Complete {
			p.Notes = rec.Notes.sorted("")
		}
		return val, err
	})
	if err != nil {
		return Pass{}, fmt.Errorf("pass record: %w", err)
	}
	return p, nil
}

// ClosePass ends msgID's first pass at its deadline, whatever parts have
// not reached it, and returns the notes the record holds (envelope id
// order) when the caller owes the report: the pass was open and this call
// closed it, or an earlier ClosePass did (the report of a closed pass has
// one queue id, so sending it again is absorbed). It returns nil, false
// when there is nothing to report: no record, or every part reached the
// pass, whose completer sent the report.
func (q *Queue) ClosePass(ctx context.Context, msgID string) ([]json.RawMessage, bool, error) {
	var out []json.RawMessage
	owed := false
	err := q.updateRecord(ctx, passKey(msgID), func(old []byte) ([]byte, error) {
		if old == nil {
			return nil, nil
		}
		var rec passRecord
		if err := json.Unmarshal(old, &rec); err != nil {
			return nil, err
		}
		if len(rec.Notes) >= rec.Parts {
			owed = false
			return nil, nil
		}
		out, owed = rec.Notes.sorted(""), true
		if rec.Closed {
			return nil, nil
		}
		rec.Closed = true
		return json.Marshal(&rec)
	})
	if err != nil {
		return nil, false, fmt.Errorf("pass record: %w", err)
	}
	return out, owed, nil
}

// A first pass left open by a part's note is waited on until its deadline
// by the process that wrote the note (worker/passwait.go), in memory. The
// part that would complete the pass may never come: dropped by an
// operator, it never reaches its pass, and then nothing but that timer
// ends the pass; a process that stopped before the deadline took the
// sender's notice with it. So the wait is also kept in the SENT bucket,
// "passwait.<msg id>", holding what the report needs (a part's
// per-message fields, the body it returns) and the deadline; a process
// that starts, and every process from time to time, takes up the waits
// listed there (PassWaits). The key goes once the pass's report is sent,
// or the pass completed (EndPassWait): by a stream purge of its subject,
// which leaves no marker, so listing the waits reads only the open ones,
// not a marker for every multi-part message of the bucket's lifetime. A
// wait left behind (a removal lost) ends at its deadline: ClosePass finds
// the pass complete and owes nothing, and the key goes then.

// PassWait is one first pass waited on, as WaitPass stored it.
type PassWait struct {
	// Env is a part of the message without its body or history: the
	// report's per-message fields (sender, tenant, DSN parameters).
	Env *Envelope `json:"env"`
	// Body is what the report returns of the original, already bounded
	// by the caller; nil to read it from the Object Store (Env.BodyRef).
	Body []byte `json:"body,omitempty"`
	// Due is the pass's deadline, on the clock of the process that
	// wrote it.
	Due time.Time `json:"due"`
}

func passWaitKey(msgID string) string { return "passwait." + msgID }

// WaitPass records that e's first pass is waited on until due, unless a
// wait is recorded already (the pass's deadline runs from its first
// note), and syncs it: it must outlive a power loss as the note does. An
// error means nothing may be assumed stored; the caller's durable step
// must fail, as for RecordPass.
func (q *Queue) WaitPass(ctx context.Context, e *Envelope, body []byte, due time.Time) error {
	val, err := json.Marshal(&PassWait{Env: e, Body: body, Due: due.UTC()})
	if err != nil {
		return fmt.Errorf("pass wait: %w", err)
	}
	q.count(OpSentPut)
	if _, err := q.sent.Create(ctx, passWaitKey(e.MsgID), val); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return nil
		}
		return fmt.Errorf("pass wait: %w", err)
	}
	return q.durable(ctx, kvStream(BucketSent))
}

// PassWaits lists every pass wait recorded, in no particular order. One
// that cannot be read is left out (and logged).
func (q *Queue) PassWaits(ctx context.Context) ([]PassWait, error) {
	w, err := q.sent.WatchFiltered(ctx, []string{passWaitKey(">")}, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("pass waits: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var out []PassWait
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("pass waits: %w", ctx.Err())
		case ent, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("pass waits: the listing ended early")
			}
			if ent == nil {
				return out, nil // every wait stored when the listing began
			}
			var pw PassWait
			if err := json.Unmarshal(ent.Value(), &pw); err != nil || pw.Env == nil || pw.Env.MsgID == "" {
				q.log.Warn().Err(err).Str("key", ent.Key()).Msg("a pass wait is unreadable; left to expire")
				continue
			}
			out = append(out, pw)
		}
	}
}

// PassWaited reports whether msgID's pass wait is still recorded: false
// once its report went out or its pass completed (EndPassWait).
func (q *Queue) PassWaited(ctx context.Context, msgID string) (bool, error) {
	_, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject(passWaitKey(msgID)))
	if err != nil {
		return false, fmt.Errorf("pass wait: %w", err)
	}
	return found, nil
}

// EndPassWait removes msgID's pass wait, leaving no marker. Not synced: a
// removal lost to a power loss leaves a wait that ends at its deadline
// finding nothing owed, or sends the report again under its one queue id,
// which the work stream's deduplication absorbs.
func (q *Queue) EndPassWait(ctx context.Context, msgID string) error {
	st, err := q.sentStream(ctx)
	if err == nil {
		err = st.Purge(ctx, jetstream.WithPurgeSubject(sentSubject(passWaitKey(msgID))))
	}
	if err != nil {
		return fmt.Errorf("pass wait: %w", err)
	}
	return nil
}

// sentStream is the SENT bucket's stream, looked up once, for the
// operations the key-value API has not (a purge that leaves no marker).
func (q *Queue) sentStream(ctx context.Context) (jetstream.Stream, error) {
	q.sentStMu.Lock()
	defer q.sentStMu.Unlock()
	if q.sentSt == nil {
		st, err := q.js.Stream(ctx, sentStreamName)
		if err != nil {
			return nil, err
		}
		q.sentSt = st
	}
	return q.sentSt, nil
}

// updateRecord is updateKey for a per-message record, synced when written:
// the record decides whether a notice is owed, so it must outlive a power
// loss like the envelope whose step follows it.
func (q *Queue) updateRecord(ctx context.Context, key string, change func(old []byte) ([]byte, error)) error {
	wrote, err := q.updateKey(ctx, key, change)
	if err != nil || !wrote {
		return err
	}
	return q.durable(ctx, kvStream(BucketSent))
}

// A multi-part submission's delay warning. RFC 3464 notices are per
// message, so the parts of one message, delivered independently, share one
// "delayed" notice through a second record, "delay.<msg id>" in the SENT
// bucket, updated like the pass record. A part that is deferred notes its
// recipients still waiting (worker/dsn.go writes the note); one that ends
// (delivered, bounced, dead) takes its note out. The first part deferred
// past the delay-warning time claims the warning, which lists its own
// recipients and every note the record holds then; the claim freezes the
// record, so a part run again after a crash between its claim and its
// durable step reads the same notes and queues the same notice, and every
// later reader learns whether its recipients were listed.
//
// Only parts that are deferred read or write it, and only while their
// tenant has delay warnings on: a message that is delivered, or bounced,
// at its first attempt never touches it, nor does a message of one
// destination, whose one envelope warns on its own.

// delayRecord is the stored value of a message's delay warning.
type delayRecord struct {
	Notes    notes  `json:"notes,omitempty"`     // by envelope id: the part's deferred recipients
	WarnedBy string `json:"warned_by,omitempty"` // the part that claimed the warning; frozen from then on
}

func delayKey(msgID string) string { return "delay." + msgID }

// Delay is what NoteDelay answers.
type Delay struct {
	// Warned: the message's warning is claimed, by this part or another.
	Warned bool
	// Mine: this part claimed it and sends it; Notes then holds the other
	// parts' notes at the claim (envelope id order), the same on every
	// call.
	Mine  bool
	Notes []json.RawMessage
	// Listed: the warning lists this part's recipients (it claimed it,
	// or its note was in the record at the claim). A part deferred only
	// after the claim is not listed, and warns on its own.
	Listed bool
}

// NoteDelay updates e's part of its message's delay record: note is the
// part's recipients still deferred (nil takes its note out: it has
// ended), and claim asks for the message's warning. A note that would make
// the record larger than passMaxBytes is not stored (the part is then not
// listed, and warns on its own). An error means nothing may be assumed
// stored.
func (q *Queue) NoteDelay(ctx context.Context, e *Envelope, note json.RawMessage, claim bool) (Delay, error) {
	var d Delay
	err := q.updateRecord(ctx, delayKey(e.MsgID), func(old []byte) ([]byte, error) {
		var rec delayRecord
		if old != nil {
			if err := json.Unmarshal(old, &rec); err != nil {
				return nil, err
			}
		}
		d = Delay{}
		if rec.WarnedBy != "" {
			_, in := rec.Notes[e.ID]
			d = Delay{Warned: true, Mine: rec.WarnedBy == e.ID, Listed: rec.WarnedBy == e.ID || in}
			if d.Mine {
				d.Notes = rec.Notes.sorted(e.ID)
			}
			return nil, nil
		}
		_, had := rec.Notes[e.ID]
		if claim {
			rec.WarnedBy = e.ID
			d = Delay{Warned: true, Mine: true, Listed: true, Notes: rec.Notes.sorted(e.ID)}
			delete(rec.Notes, e.ID) // the claimer lists its recipients of the attempt
		} else if note == nil {
			if !had {
				return nil, nil
			}
			delete(rec.Notes, e.ID)
		} else {
			if rec.Notes == nil {
				rec.Notes = notes{}
			}
			rec.Notes[e.ID] = note
		}
		val, err := json.Marshal(&rec)
		if err == nil && len(val) > passMaxBytes && note != nil && !claim {
			delete(rec.Notes, e.ID)
			if !had {
				return nil, nil
			}
			val, err = json.Marshal(&rec)
		}
		return val, err
	})
	if err != nil {
		return Delay{}, fmt.Errorf("delay record: %w", err)
	}
	return d, nil
}

// updateKey changes key's value in the SENT bucket by compare-and-set on
// its revision: change gets the current value (nil when there is none) and
// returns the new one, or nil to write nothing; when another writer came
// first it is called again with that writer's value. It reports whether it
// wrote.
func (q *Queue) updateKey(ctx context.Context, key string, change func(old []byte) ([]byte, error)) (bool, error) {
	for range 64 {
		var old []byte
		var rev uint64
		q.count(OpSentGet)
		ent, err := q.sent.Get(ctx, key)
		switch {
		case err == nil:
			old, rev = ent.Value(), ent.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return false, fmt.Errorf("%s: %w", key, err)
		}
		val, err := change(old)
		if err != nil {
			return false, fmt.Errorf("%s: %w", key, err)
		}
		if val == nil {
			return false, nil
		}
		q.count(OpSentPut)
		if rev == 0 {
			_, err = q.sent.Create(ctx, key, val)
		} else {
			_, err = q.sent.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another writer came first: read again
		}
		if err != nil {
			return false, fmt.Errorf("%s: %w", key, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("%s: too many concurrent updates", key)
}

// sorted returns the stored notes in envelope id order, but that of
// except.
func (n notes) sorted(except string) []json.RawMessage {
	ids := make([]string, 0, len(n))
	for id, v := range n {
		if string(v) != "null" && id != except {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]json.RawMessage, len(ids))
	for i, id := range ids {
		out[i] = n[id]
	}
	return out
}

// rateKey names the shared allowance of name: a hash, since a KV key
// cannot hold every character an address may.
func rateKey(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "rate." + hex.EncodeToString(sum[:12])
}

// rateBucket is the stored value of a shared allowance.
type rateBucket struct {
	Tokens float64 `json:"t"`
	At     int64   `json:"at"` // Unix nanoseconds of the last refill
}

// TakeAllowance takes one from name's allowance of perHour per hour, shared
// by every process on this JetStream: a token bucket holding an hour's
// worth, refilled continuously, stored in the SENT bucket and updated by
// compare-and-set. It reports false when the allowance is spent. An unused
// allowance expires with the bucket's TTL, which refills it anyway.
func (q *Queue) TakeAllowance(ctx context.Context, name string, perHour float64, now time.Time) (bool, error) {
	ok := false
	_, err := q.updateKey(ctx, rateKey(name), func(old []byte) ([]byte, error) {
		b := rateBucket{Tokens: perHour, At: now.UnixNano()}
		if old != nil && json.Unmarshal(old, &b) != nil {
			b = rateBucket{Tokens: perHour, At: now.UnixNano()} // unreadable: start again
		}
		// A clock behind the last writer's refills nothing.
		if d := now.UnixNano() - b.At; d > 0 {
			b.Tokens = min(perHour, b.Tokens+time.Duration(d).Hours()*perHour)
			b.At = now.UnixNano()
		}
		if ok = b.Tokens >= 1; !ok {
			return nil, nil
		}
		b.Tokens--
		return json.Marshal(&b)
	})
	if err != nil {
		return false, fmt.Errorf("allowance: %w", err)
	}
	return ok, nil
}
