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
// A part's note replaces an earlier one of its own while the pass is
// incomplete (an attempt run again after a crash reports its own result);
// once every part has a note, the record no longer changes, so every
// reader of a complete pass gets the same notes. The key expires with the
// bucket's TTL (Options.SentTTL): a part run again after a crash must still
// find it.

// passMaxBytes bounds a pass record. A note that would make it larger is
// not stored (the part counts as reached, and reports on its own).
const passMaxBytes = 256 << 10

// passRecord is the stored value of a pass.
type passRecord struct {
	Parts int                        `json:"parts"`
	Notes map[string]json.RawMessage `json:"notes"` // by envelope id; "null": reached, nothing stored
}

func (r *passRecord) complete() bool { return len(r.Notes) >= r.Parts }

// Pass is what RecordPass answers.
type Pass struct {
	// Complete: every part has reached the end of its first pass. Notes
	// then holds each part's note (envelope id order, parts that stored
	// none left out); it is the same for every caller.
	Complete bool
	Notes    []json.RawMessage
	// Alone: this part's note was not stored (it would have made the
	// record larger than passMaxBytes, or the pass was complete without
	// it); the part reports it on its own.
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
	wrote := false
	err := q.updateKey(ctx, key, func(old []byte) ([]byte, error) {
		rec := passRecord{Parts: e.Parts}
		if old != nil {
			if err := json.Unmarshal(old, &rec); err != nil {
				return nil, err
			}
		}
		if rec.complete() {
			// Complete before this call: a part run again after a crash,
			// whose note is in, or (Parts disagreeing) one that is not.
			_, in := rec.Notes[e.ID]
			p = Pass{Complete: true, Notes: rec.sorted(), Alone: !in}
			return nil, nil
		}
		if rec.Notes == nil {
			rec.Notes = map[string]json.RawMessage{}
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
			p.Notes = rec.sorted()
		}
		wrote = true
		return val, err
	})
	if err != nil {
		return Pass{}, fmt.Errorf("pass record: %w", err)
	}
	if wrote {
		// The record decides whether notices are owed: it must outlive a
		// power loss like the envelope whose step follows it.
		if err := q.durable(ctx, kvStream(BucketSent)); err != nil {
			return Pass{}, err
		}
	}
	return p, nil
}

// updateKey changes key's value in the SENT bucket by compare-and-set on
// its revision: change gets the current value (nil when there is none) and
// returns the new one, or nil to write nothing; when another writer came
// first it is called again with that writer's value.
func (q *Queue) updateKey(ctx context.Context, key string, change func(old []byte) ([]byte, error)) error {
	for range 64 {
		var old []byte
		var rev uint64
		ent, err := q.sent.Get(ctx, key)
		switch {
		case err == nil:
			old, rev = ent.Value(), ent.Revision()
		case errors.Is(err, jetstream.ErrKeyNotFound):
		default:
			return fmt.Errorf("%s: %w", key, err)
		}
		val, err := change(old)
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		if val == nil {
			return nil
		}
		if rev == 0 {
			_, err = q.sent.Create(ctx, key, val)
		} else {
			_, err = q.sent.Update(ctx, key, val, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another writer came first: read again
		}
		if err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("%s: too many concurrent updates", key)
}

// sorted returns the stored notes in envelope id order.
func (r *passRecord) sorted() []json.RawMessage {
	ids := make([]string, 0, len(r.Notes))
	for id, n := range r.Notes {
		if string(n) != "null" {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]json.RawMessage, len(ids))
	for i, id := range ids {
		out[i] = r.Notes[id]
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
	err := q.updateKey(ctx, rateKey(name), func(old []byte) ([]byte, error) {
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
