// Package fleetkey keeps secret keys that every process of a fleet must
// share: one random key per name, made by the first process that needs
// it and stored in a JetStream key-value bucket, so that what one process
// signs or seals any other can check or open.
//
// The bounce listener's return-path addresses (package bounce) and the
// one-click unsubscribe links (package unsubscribe) each have one.
package fleetkey

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// Size is the length of a key made here, in bytes.
const Size = 32

// minSize is the shortest stored key accepted: anything shorter was not
// written by Load.
const minSize = 16

// Buckets opens key-value buckets (queue.Queue.KeyValue).
type Buckets interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

// Load returns the key stored under name in bucket (made with
// description when the bucket is new), making a random one on first use.
// Two processes making it at once both end with the one stored first: the
// write is a create, and the loser reads the winner's.
func Load(ctx context.Context, b Buckets, bucket, description, name string) ([]byte, error) {
	kv, err := b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Description: description, History: 1})
	if err != nil {
		return nil, err
	}
	for range 2 {
		e, err := kv.Get(ctx, name)
		if err == nil {
			if len(e.Value()) < minSize {
				return nil, fmt.Errorf("%s %s: a key of %d bytes", bucket, name, len(e.Value()))
			}
			return e.Value(), nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, fmt.Errorf("%s %s: %w", bucket, name, err)
		}
		key := make([]byte, Size)
		_, _ = rand.Read(key)
		if _, err := kv.Create(ctx, name, key); err == nil {
			return key, nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("%s %s: %w", bucket, name, err)
		}
		// Another process made it first: read that one.
	}
	return nil, fmt.Errorf("%s %s: neither read nor made", bucket, name)
}
