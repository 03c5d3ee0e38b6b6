package kvpurge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/testutil"
)

// TestDropThroughKeepsLaterWrites: dropping a key through a sequence
// removes that revision and the ones before it, and nothing written
// after; a purge leaves one marker, which DropThrough then removes.
func TestDropThroughKeepsLaterWrites(t *testing.T) {
	js := testutil.StartJetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "KV_b")
	if err != nil {
		t.Fatal(err)
	}
	msgs := func(key string) uint64 {
		t.Helper()
		info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV.b."+key))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects["$KV.b."+key]
	}

	old, _ := kv.Put(ctx, "k", []byte("1"))
	if _, err := kv.Put(ctx, "k", []byte("2")); err != nil {
		t.Fatal(err)
	}
	if err := DropThrough(ctx, st, "b", "k", old); err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "k"); err != nil || string(e.Value()) != "2" || msgs("k") != 1 {
		t.Fatalf("after dropping through revision %d: %v %v, %d messages; want the later value alone", old, e, err, msgs("k"))
	}

	rev, _ := kv.Put(ctx, "k", []byte("3"))
	if err := Purge(ctx, kv, "k", rev-1); err == nil {
		t.Fatal("a purge at a stale revision went through")
	}
	if err := Purge(ctx, kv, "k", rev); err != nil {
		t.Fatal(err)
	}
	if n := msgs("k"); n != 1 {
		t.Fatalf("after the purge %d messages, want its marker alone", n)
	}
	w, _ := kv.Watch(ctx, "k")
	var marker uint64
	for e := range w.Updates() {
		if e == nil {
			break
		}
		marker = e.Revision()
	}
	_ = w.Stop()
	if err := DropThrough(ctx, st, "b", "k", marker); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, "k"); !errors.Is(err, jetstream.ErrKeyNotFound) || msgs("k") != 0 {
		t.Fatalf("after dropping the marker: %v, %d messages", err, msgs("k"))
	}
}
