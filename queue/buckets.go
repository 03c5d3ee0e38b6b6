package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// KeyValue opens the key-value bucket cfg names, creating or updating it
// first unless the queue was connected with NoSetup, so that packages above
// queue (the throttle's destination state and worker registry, the HTTP
// API's keys and idempotency records, the webhook endpoints) keep their
// state in buckets laid out like queue's own: the replicas every other
// stream and bucket has, never fewer than the bucket has already (see
// checkReplicas), and file storage unless cfg asks for memory. An admin client (NoSetup) creates a missing
// bucket all the same: `outflow apikey create` may run before the first
// `serve` with --api-addr.
func (q *Queue) KeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	if q.opts.NoSetup {
		// lookUp: an admin command against a cluster electing the
		// bucket's leader asks again rather than wait out its timeout.
		kv, err := lookUp(ctx, func(ctx context.Context) (jetstream.KeyValue, error) { return q.js.KeyValue(ctx, cfg.Bucket) })
		if err == nil {
			return kv, nil
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("kv %s: %w", cfg.Bucket, err)
		}
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = q.opts.Replicas
	}
	if !q.opts.NoSetup {
		if err := q.checkReplicas(ctx, []string{kvStream(cfg.Bucket)}); err != nil {
			return nil, err
		}
	}
	kv, err := q.js.CreateOrUpdateKeyValue(ctx, cfg)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == errCodeStreamInvalidConfig && strings.Contains(apiErr.Description, "TTL status can not be disabled") {
		// A bucket given message TTLs (by a build that turned on marker
		// TTLs) cannot have them taken away again: use it as it is.
		kv, err = q.js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("kv %s: %w", cfg.Bucket, err)
	}
	q.durableMeta(kvStream(cfg.Bucket), "")
	return kv, nil
}

// errCodeStreamInvalidConfig is JetStream's refusal of a stream
// configuration, among them an update that would turn per-message TTLs
// off again ("message TTL status can not be disabled").
const errCodeStreamInvalidConfig = 10052

// KVStream is the stream that holds bucket's entries, for the few
// operations the key-value API has not (kvpurge.DropThrough).
func (q *Queue) KVStream(ctx context.Context, bucket string) (jetstream.Stream, error) {
	return q.js.Stream(ctx, kvStream(bucket))
}

// DedupWindow is how long a resubmission with the same idempotency key is
// recognised (Options.DedupWindow, default DefaultDedupWindow).
func (q *Queue) DedupWindow() time.Duration { return q.opts.DedupWindow }
