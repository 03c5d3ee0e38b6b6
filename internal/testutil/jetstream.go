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
	return clientOf(t, nc, err)
}

// StartJetStream starts a bare nats-server with JetStream on loopback (no
// accounts, a store in the test's temporary directory) and returns a
// client of it; both end with the test. For the packages below the queue,
// which take buckets and streams, not a queue.
func StartJetStream(t testing.TB) jetstream.JetStream {
	t.Helper()
	s, err := server.NewServer(&server.Options{JetStream: true, StoreDir: t.TempDir(), Port: -1, Host: "127.0.0.1", NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, err := nats.Connect(s.ClientURL())
	return clientOf(t, nc, err)
}

// clientOf is the JetStream client of a connection just made (or the
// test's end, when the connection failed); the connection closes with the
// test.
func clientOf(t testing.TB, nc *nats.Conn, err error) jetstream.JetStream {
	t.Helper()
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
