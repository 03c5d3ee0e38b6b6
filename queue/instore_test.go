package queue

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// A look-up that finds nothing is answered in process; one that finds a
// value, or a key-value delete marker, still asks the server, which reads
// what was found. Without localStore every look-up is a direct get.
func TestLocalAbsent(t *testing.T) {
	q, _ := startQueue(t)
	if q.local == nil {
		t.Fatal("an in-process queue on the embedded server has no local reader")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	look := func(key string) (found bool, local, direct uint64) {
		t.Helper()
		before := q.Ops()
		_, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject(key))
		if err != nil {
			t.Fatal(err)
		}
		after := q.Ops()
		return found, after["local_get"] - before["local_get"], after["sent_get"] - before["sent_get"]
	}
	if found, local, direct := look("absent.0"); found || local != 1 || direct != 0 {
		t.Fatalf("absent key: found %v, %d local, %d direct; want answered in process", found, local, direct)
	}
	if _, err := q.sent.Put(ctx, "k1.0", []byte("a@b.example")); err != nil {
		t.Fatal(err)
	}
	// Acknowledged, so in the store: the next look-up sees it.
	if found, local, direct := look("k1.0"); !found || local != 0 || direct != 1 {
		t.Fatalf("stored key: found %v, %d local, %d direct; want found by a direct get", found, local, direct)
	}
	if err := q.sent.Delete(ctx, "k1.0"); err != nil {
		t.Fatal(err)
	}
	if found, _, direct := look("k1.0"); found || direct != 1 {
		t.Fatalf("deleted key: found %v, %d direct; want the delete marker read by a direct get", found, direct)
	}
	// The suppression check takes the same path.
	list, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := q.Ops()
	if s, err := list.Suppressed(ctx, "t1", "nobody@example.com"); err != nil || s != nil {
		t.Fatalf("Suppressed = %v, %v", s, err)
	}
	if after := q.Ops(); after["local_get"]-before["local_get"] != 1 || after["suppress_get"] != before["suppress_get"] {
		t.Fatalf("suppression look-up of an unlisted address: %v -> %v", before, after)
	}
}

// A closed store answers "not found" for every subject; that answer must
// not count as "nothing stored".
func TestLocalAbsentClosedStore(t *testing.T) {
	q, emb := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := q.js.CreateStream(ctx, jetstream.StreamConfig{Name: "LOCAL_PROBE", Subjects: []string{"probe.>"}}); err != nil {
		t.Fatal(err)
	}
	store, err := streamStore(emb.Server(), "LOCAL_PROBE")
	if err != nil {
		t.Fatal(err)
	}
	if !storeAbsent(store, "probe.x") {
		t.Fatal("open, empty store: not absent")
	}
	if _, err := q.js.Publish(ctx, "probe.x", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if storeAbsent(store, "probe.x") {
		t.Fatal("stored subject reported absent")
	}
	if !storeAbsent(store, "probe.y") {
		t.Fatal("other subject not absent")
	}
	if err := q.js.DeleteStream(ctx, "LOCAL_PROBE"); err != nil {
		t.Fatal(err)
	}
	var sm server.StoreMsg
	if _, err := store.LoadLastMsg("probe.x", &sm); err != server.ErrStoreMsgNotFound {
		t.Fatalf("closed store's LoadLastMsg: %v (the probe's premise changed)", err)
	}
	if storeAbsent(store, "probe.x") {
		t.Fatal("closed store reported absent")
	}
	if q.local.absent("LOCAL_PROBE", "probe.x") {
		t.Fatal("deleted stream reported absent")
	}
}

// Over a socket there is no local reader: every look-up is a direct get,
// even on the same machine as the embedded server.
func TestNoLocalReaderOverSocket(t *testing.T) {
	emb, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), ListenAddr: "127.0.0.1:0", Durability: DurabilityNone})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	ci := emb.ClientInfo()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := Connect(ctx, Options{URL: ci.URL, User: ci.User, Password: ci.Password, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if q.local != nil {
		t.Fatal("a queue over a socket reads the store in process")
	}
	if _, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("absent.0")); err != nil || found {
		t.Fatalf("absent key: %v, %v", found, err)
	}
	if got := q.Ops(); got["sent_get"] != 1 || got["local_get"] != 0 {
		t.Fatalf("ops %v, want one direct get", got)
	}
}

// go test -run '^$' -bench LocalAbsent -benchmem ./queue
func BenchmarkLocalAbsent(b *testing.B) {
	q, _ := startQueueWith(b, Options{})
	ctx := context.Background()
	local := q.local
	defer func() { q.local = local }()
	for _, bc := range []struct {
		name  string
		local *localStore
	}{{"local", local}, {"direct-get", nil}} {
		q.local = bc.local
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			defer reportCPU(b)()
			for b.Loop() {
				if _, _, found, err := q.lastMsg(ctx, OpSentGet, sentStreamName, sentSubject("absent.0")); err != nil || found {
					b.Fatal(found, err)
				}
			}
		})
	}
}
