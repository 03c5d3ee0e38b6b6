package fleetkey_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/internal/fleetkey"
	"github.com/outflow/outflow/internal/testutil/testqueue"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/unsubscribe"
)

// Every process of a fleet gets the same key, whichever made it; each use
// has its own key; a stored value too short to be a key is refused.
func TestLoadOnePerFleet(t *testing.T) {
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	q := testqueue.Connect(t, emb, queue.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	keys := make([][]byte, 4)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := fleetkey.Load(ctx, q, "outflow_test_keys", "test", "one")
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for i, k := range keys {
		if len(k) != fleetkey.Size || !bytes.Equal(k, keys[0]) {
			t.Fatalf("process %d got key %x, process 0 %x", i, k, keys[0])
		}
	}

	rp, err := bounce.LoadKey(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	links, err := unsubscribe.LoadKey(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	again, err := unsubscribe.LoadKey(ctx, q)
	if err != nil || !bytes.Equal(again, links) || bytes.Equal(rp, links) {
		t.Fatalf("return path %x, links %x then %x (%v): want two keys, each read back alike", rp, links, again, err)
	}

	kv, err := q.KeyValue(ctx, jetstream.KeyValueConfig{Bucket: "outflow_test_keys"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "short", []byte("0123456789")); err != nil {
		t.Fatal(err)
	}
	if _, err := fleetkey.Load(ctx, q, "outflow_test_keys", "test", "short"); err == nil || !strings.Contains(err.Error(), "a key of 10 bytes") {
		t.Fatalf("a 10-byte value: %v, want refused", err)
	}
}
