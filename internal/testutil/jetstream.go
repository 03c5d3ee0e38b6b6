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
	// The in-process handshake checks a bcrypt password, which a loaded
	// machine under -race can take longer than nats.go's timeout for:
	// connect again until a minute has passed.
	var nc *nats.Conn
	var err error
	for deadline := time.Now().Add(time.Minute); ; {
		nc, err = nats.Connect("", nats.InProcessServer(srv), nats.UserInfo(user, password), nats.Timeout(10*time.Second))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
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
