package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketIdempotency holds one record per (tenant, Idempotency-Key): the
// hash of the request that first used the key, when it was first seen, and,
// once stored, the ids it was given. Entries expire with the queue's
// deduplication window, after which queue.Enqueue would no longer
// recognise the key either.
const BucketIdempotency = "outflow_idempotency"

// maxIdemKey bounds an Idempotency-Key (draft-ietf-httpapi-idempotency-key
// leaves it to the server); a UUID is 36.
const maxIdemKey = 255

// idemRecord is the value of an idempotency entry.
type idemRecord struct {
	Request string    `json:"request"` // hex SHA-256 of the request body
	First   time.Time `json:"first"`   // when the key was first used: the message's Date on every try
	IDs     []string  `json:"ids,omitempty"`
	// MaybeStored: a try failed once its message had reached the server
	// (queue.ErrMaybeStored: a lost acknowledgement, a failed fsync), so
	// the message may be stored, in part or whole, and is then delivered.
	// The key stays the request's: an identical retry takes the record
	// over at once, with its First, and so stores the same bytes under the
	// same ids; a different request is refused as reusing it. Freed, the
	// key would give a different message the first one's ids (the queue's
	// record of the key names them for the whole window), and a message to
	// several domains the first one's body.
	MaybeStored bool `json:"maybe_stored,omitempty"`
}

// idempotency is the store of idemRecords.
type idempotency struct {
	kv jetstream.KeyValue
	// stale is how long a record without ids may stay unfinished before a
	// repeat takes it over: its first request died between the record and
	// the enqueue (a crash), or its enqueue is still running far beyond
	// any timeout.
	stale time.Duration
}

func openIdempotency(ctx context.Context, b Bucketer, ttl, stale time.Duration) (*idempotency, error) {
	kv, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketIdempotency, Description: "outflow HTTP API idempotency keys", History: 1, TTL: ttl})
	if err != nil {
		return nil, err
	}
	return &idempotency{kv: kv, stale: stale}, nil
}

func idemEntry(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return hex.EncodeToString(sum[:])
}

// claim is the outcome of begin.
type claim struct {
	rec  idemRecord
	rev  uint64
	done bool // rec.IDs is the answer; store nothing
}

// errIdemMismatch: the key was used with another request.
var errIdemMismatch = errors.New("idempotency key used with a different request")

// errIdemBusy: the key's first request is still being stored.
var errIdemBusy = errors.New("idempotency key in use by a request in progress")

// begin claims (tenant, key) for a request whose body hashes to reqHash.
// It returns done with the ids of an earlier identical request; a claim to
// go on with (a new record, or one taken over: stale, or of an identical
// request that may have stored its message); errIdemMismatch; or
// errIdemBusy when an identical request holds the key and is not stale
// after waiting up to wait for it to finish.
func (s *idempotency) begin(ctx context.Context, tenant, key, reqHash string, wait time.Duration) (*claim, error) {
	name := idemEntry(tenant, key)
	for range 4 {
		rec := idemRecord{Request: reqHash, First: time.Now().UTC().Truncate(time.Second)}
		b, _ := json.Marshal(rec)
		rev, err := s.kv.Create(ctx, name, b)
		if err == nil {
			return &claim{rec: rec, rev: rev}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("idempotency record: %w", err)
		}
		c, err := s.existing(ctx, name, reqHash, wait)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // the holder gave up (its enqueue failed): claim again
		}
		return c, err
	}
	return nil, errIdemBusy
}

// existing reads the record that name already has, waiting (on a watch,
// up to wait) for an unfinished identical request to record its ids.
func (s *idempotency) existing(ctx context.Context, name, reqHash string, wait time.Duration) (*claim, error) {
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	w, err := s.kv.Watch(ctx, name)
	if err != nil {
		return nil, fmt.Errorf("idempotency record: %w", err)
	}
	defer func() { _ = w.Stop() }()
	var last *claim
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("idempotency record: watch closed")
			}
			if e == nil {
				continue // the end of the initial values: wait for changes
			}
			if e.Operation() != jetstream.KeyValuePut {
				return nil, jetstream.ErrKeyNotFound
			}
			var rec idemRecord
			if err := json.Unmarshal(e.Value(), &rec); err != nil {
				return nil, fmt.Errorf("idempotency record: %w", err)
			}
			if rec.Request != reqHash {
				return nil, errIdemMismatch
			}
			last = &claim{rec: rec, rev: e.Revision(), done: len(rec.IDs) > 0}
			if last.done || rec.MaybeStored {
				return last, nil
			}
			if time.Since(rec.First) > s.stale {
				// Take it over; Enqueue's dedup absorbs a late first try.
				// That try may have stored the message (its process died
				// after the enqueue), so the key is kept as for one that
				// did: should this try fail too, it is not freed.
				last.rec.MaybeStored = true
				return last, nil
			}
		case <-ctx.Done():
			if last != nil && ctx.Err() == context.DeadlineExceeded {
				return nil, errIdemBusy
			}
			return nil, fmt.Errorf("idempotency record: %w", ctx.Err())
		}
	}
}

// finish records the ids of a claimed request.
func (s *idempotency) finish(ctx context.Context, tenant, key string, c *claim, ids []string) error {
	c.rec.IDs = ids
	b, _ := json.Marshal(c.rec)
	if _, err := s.kv.Put(ctx, idemEntry(tenant, key), b); err != nil {
		return fmt.Errorf("idempotency record: %w", err)
	}
	return nil
}

// abandon removes the record of a claimed request that stored nothing, so
// that the client's retry is not refused as in progress. A record that an
// earlier try may have stored under (MaybeStored, or taken over stale)
// stays as it is: this try storing nothing does not make that one's
// message not stored.
func (s *idempotency) abandon(ctx context.Context, tenant, key string, c *claim) {
	if c.rec.MaybeStored {
		return
	}
	_ = s.kv.Delete(ctx, idemEntry(tenant, key), jetstream.LastRevision(c.rev))
}

// maybeStored marks the record of a claimed request whose enqueue failed
// after its message reached the server (queue.ErrMaybeStored). Only the
// revision claimed is changed: a request that took the record over since
// holds it now. A failed write leaves the record in progress, taken over
// once stale, and kept for good then too (existing).
func (s *idempotency) maybeStored(ctx context.Context, tenant, key string, c *claim) error {
	c.rec.MaybeStored = true
	b, _ := json.Marshal(c.rec)
	if _, err := s.kv.Update(ctx, idemEntry(tenant, key), b, c.rev); err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return fmt.Errorf("idempotency record: %w", err)
	}
	return nil
}
