package throttle

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The key-value buckets the throttle keeps its shared state in. Their names
// are part of outflow's on-disk contract: renaming one forgets every
// suspension and learned rate.
const (
	// BucketState holds one DestState per destination (Config.State).
	BucketState = "outflow_dest"
	// BucketRegistry holds one heartbeat key per live worker
	// (Config.Registry).
	BucketRegistry = "outflow_workers"
)

// Bucketer opens key-value buckets laid out like the queue's own streams
// (the replicas every other stream has): *queue.Queue.
type Bucketer interface {
	KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

// OpenState opens (creating it if need be) the shared destination state
// bucket. It keeps 5 revisions of each key, for an operator to see what a
// destination's state was just before.
func OpenState(ctx context.Context, b Bucketer) (jetstream.KeyValue, error) {
	return openBucket(ctx, b, jetstream.KeyValueConfig{Bucket: BucketState, Description: "shared destination throttle state", History: 5})
}

// OpenRegistry opens (creating it if need be) the live-worker registry. It
// is kept in memory, its keys expiring DefaultWorkerTTL after a worker's
// last heartbeat: a heartbeat is worth nothing by then, so a restart that
// loses it loses nothing. A JetStream restarted in process (the embedded
// server's, by queue's Supervise) comes back without it: a Throttle given
// this bucket makes it again (heartbeatLoop, rewatch.go).
func OpenRegistry(ctx context.Context, b Bucketer) (jetstream.KeyValue, error) {
	return openBucket(ctx, b, jetstream.KeyValueConfig{Bucket: BucketRegistry, Description: "live workers", TTL: DefaultWorkerTTL, Storage: jetstream.MemoryStorage})
}

// reopenKV is a bucket opened by OpenState or OpenRegistry, which can be
// made again as it was opened when its stream is gone (bucketGone). The
// handle itself names the bucket only, and works again once it is back.
type reopenKV struct {
	jetstream.KeyValue
	b   Bucketer
	cfg jetstream.KeyValueConfig
}

// reopener is a bucket that can be made again (reopenKV).
type reopener interface {
	reopen(ctx context.Context) error
}

func openBucket(ctx context.Context, b Bucketer, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := b.KeyValue(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &reopenKV{KeyValue: kv, b: b, cfg: cfg}, nil
}

func (k *reopenKV) reopen(ctx context.Context) error {
	_, err := k.b.KeyValue(ctx, k.cfg)
	return err
}

// bucketGone reports whether err says a bucket's stream is not there: the
// bucket or the stream not found, or no stream answering a write to it.
func bucketGone(err error) bool {
	for _, gone := range []error{jetstream.ErrBucketNotFound, jetstream.ErrStreamNotFound, jetstream.ErrNoStreamResponse,
		nats.ErrBucketNotFound, nats.ErrStreamNotFound, nats.ErrNoStreamResponse} {
		if errors.Is(err, gone) {
			return true
		}
	}
	return false
}
