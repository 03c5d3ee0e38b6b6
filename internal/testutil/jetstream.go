package testutil

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStream connects to srv in process with user and password, as an
// outside client would, for a test that looks at streams and consumers the
// queue does not hand out. The connection closes with the test.
func JetStream(t testing.TB, srv *server.Server, user, password string) jetstream.JetStream {
	t.Helper()
	// 10 s for the handshake, as the queue gives it: a loaded machine
	// under -race is slow to answer in process.
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.UserInfo(user, password), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}
