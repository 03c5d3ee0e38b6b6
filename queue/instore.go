package queue

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/nats-io/nats-server/v2/server"
)

// Reaching a stream's store in process. nats-server exports the store's
// interface (StreamStore, with FlushAllPending and LoadLastMsg) and the
// stream's Store method, but not a way to find a stream by name, and its
// stream type is unexported; these two links are the whole dependency on
// its internals. The build fails if a nats-server upgrade renames either,
// and TestStoreSyncerFindsStreams and TestLocalAbsent check what they
// return. Upstream, an exported Account.LookupStream would replace them.
// Two things use them: the group-commit syncer (storesync.go) and the
// look-ups below.

//go:linkname natsLookupStream github.com/nats-io/nats-server/v2/server.(*Account).lookupStream
func natsLookupStream(a *server.Account, name string) (unsafe.Pointer, error)

//go:linkname natsStreamStore github.com/nats-io/nats-server/v2/server.(*stream).Store
func natsStreamStore(mset unsafe.Pointer) server.StreamStore

// streamStore returns the store of srv's stream name in the global
// account, where the daemon's streams are.
func streamStore(srv *server.Server, name string) (server.StreamStore, error) {
	acc := srv.GlobalAccount()
	if acc == nil {
		return nil, fmt.Errorf("stream %s: %w: no account", name, ErrUnavailable)
	}
	mset, err := natsLookupStream(acc, name)
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", name, err)
	}
	if mset == nil {
		return nil, fmt.Errorf("stream %s: not found", name)
	}
	store := natsStreamStore(mset)
	if store == nil {
		return nil, fmt.Errorf("stream %s: no store", name)
	}
	return store, nil
}

// localStore answers the delivery path's most frequent question, "is
// nothing stored on this subject?", from the embedded server's own store,
// without a round trip. Two look-ups per message ask it: the suppression
// check of each recipient at RCPT and the SENT check before a send; both
// nearly always find nothing. A direct get (lastMsg) asks the same store
// the same question through the server: a request, the server's parsing
// and routing, a reply, about 20 µs of CPU each (docs/benchmarks.md).
//
// It is exact, not a cache: the store is the one the direct get reads,
// and a write is in it before its publish acknowledgement goes out, so
// whatever a caller saw acknowledged (a SENT marker, a suppression added
// by the API or another process) is seen here too. It is used only on
// the embedded server, which is one node: a clustered server's local
// replica can lag its leader. Any answer other than a definite "nothing
// stored" (a message found, a stream missing or closed, a memory store)
// goes to the direct get, which also reads what is found.
type localStore struct{ srv *server.Server }

// newLocalStore returns the in-process reader for srv, or nil when srv is
// nil or clustered.
func newLocalStore(srv *server.Server) *localStore {
	if srv == nil || srv.JetStreamIsClustered() {
		return nil
	}
	return &localStore{srv: srv}
}

// absent reports whether stream's store holds no message on subject. false
// means "ask the server": something is stored, or the store could not say.
func (l *localStore) absent(stream, subject string) bool {
	store, err := streamStore(l.srv, stream)
	if err != nil {
		return false
	}
	return storeAbsent(store, subject)
}

// storeAbsent is absent on one store: only an open file store's "not
// found" counts.
func storeAbsent(store server.StreamStore, subject string) bool {
	if store.Type() != server.FileStorage {
		return false
	}
	var sm server.StoreMsg
	if _, err := store.LoadLastMsg(subject, &sm); !errors.Is(err, server.ErrStoreMsgNotFound) {
		return false
	}
	// A file store that is closed (its stream deleted, the server
	// stopping) answers every subject "not found"; it answers a load past
	// its last sequence "closed" instead of "end of stream".
	_, err := store.LoadMsg(math.MaxUint64, &sm)
	return errors.Is(err, server.ErrStoreEOF)
}
