package kvpurge

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// MarkerTTL is how long a purge's marker stays: long enough for every
// watcher to have seen it, and for a worker that restarts within it to
// read it.
const MarkerTTL = time.Hour

// errCodeMsgTTLDisabled is JetStream's error for a message TTL on a stream
// that does not allow them (a bucket made without LimitMarkerTTL).
const errCodeMsgTTLDisabled = 10166

// Purge purges key if its latest revision is still rev (0: whatever it
// is), with a marker that expires after ttl. On a bucket that allows no
// marker TTL the marker stays, as a Delete's would; the history goes
// either way.
func Purge(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64, ttl time.Duration) error {
	opts := []jetstream.KVDeleteOpt{jetstream.PurgeTTL(ttl)}
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := kv.Purge(ctx, key, opts...)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeMsgTTLDisabled {
		err = kv.Purge(ctx, key, opts[1:]...)
	}
	return err
}

// Open opens (with open) the bucket cfg describes, with marker TTLs
// allowed (LimitMarkerTTL = MarkerTTL; an existing bucket is given them),
// or as cfg is where the server predates marker TTLs.
func Open(ctx context.Context, cfg jetstream.KeyValueConfig, open func(context.Context, jetstream.KeyValueConfig) (jetstream.KeyValue, error)) (jetstream.KeyValue, error) {
	withTTL := cfg
	withTTL.LimitMarkerTTL = MarkerTTL
	kv, err := open(ctx, withTTL)
	if errors.Is(err, jetstream.ErrLimitMarkerTTLNotSupported) {
		kv, err = open(ctx, cfg)
	}
	return kv, err
}
