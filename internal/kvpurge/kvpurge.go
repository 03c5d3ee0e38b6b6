package kvpurge

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

// Purge purges key if its latest revision is still rev (0: whatever it
// is): its earlier revisions go, and one marker stays for the bucket's
// watchers.
func Purge(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	return kv.Purge(ctx, key, opts...)
}

// DropThrough removes from the stream of bucket every message of key up to
// and including sequence seq (a revision of the key, or its marker), and
// nothing written after it: a value put meanwhile stays. It publishes
// nothing, so no watcher hears of it.
func DropThrough(ctx context.Context, st jetstream.Stream, bucket, key string, seq uint64) error {
	return st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+key), jetstream.WithPurgeSequence(seq+1))
}
