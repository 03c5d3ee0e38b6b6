package throttle

import (
	"context"

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
	return b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketState, Description: "shared destination throttle state", History: 5})
}

// OpenRegistry opens (creating it if need be) the live-worker registry. It
// is kept in memory, its keys expiring DefaultWorkerTTL after a worker's
// last heartbeat: a heartbeat is worth nothing by then, so a restart that
// loses it loses nothing.
func OpenRegistry(ctx context.Context, b Bucketer) (jetstream.KeyValue, error) {
	return b.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: BucketRegistry, Description: "live workers", TTL: DefaultWorkerTTL, Storage: jetstream.MemoryStorage})
}
