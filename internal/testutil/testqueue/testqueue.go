package testqueue

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// ConnectInProcess connects a silent queue to emb in process, as the
// daemon does, with opts' other settings (InProcess, User, Password and
// Logger are filled in). nats.go gives the handshake a few seconds, which
// a loaded machine under -race can exceed: it connects again until ctx
// ends.
func ConnectInProcess(ctx context.Context, emb *queue.Embedded, opts queue.Options) (*queue.Queue, error) {
	ci := emb.InProcessInfo()
	opts.InProcess, opts.User, opts.Password, opts.Logger = emb.Server(), ci.User, ci.Password, zerolog.Nop()
	for {
		q, err := queue.Connect(ctx, opts)
		if err == nil || ctx.Err() != nil {
			return q, err
		}
	}
}

// Connect is ConnectInProcess for a test: within a minute, fatal when it
// fails, and closed when the test ends.
func Connect(t testing.TB, emb *queue.Embedded, opts queue.Options) *queue.Queue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	q, err := ConnectInProcess(ctx, emb, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	return q
}

// Listening starts an embedded server on dir with a client listener on a
// free loopback port (for the admin commands, which connect by URL), shut
// down when the test ends.
func Listening(t testing.TB, dir string) *queue.Embedded {
	t.Helper()
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: dir, ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emb.Shutdown)
	return emb
}

// Take pulls the next envelope from lane of q, as a worker would, failing
// the test when none comes before ctx ends. stop ends the pull; the
// delivery stays the caller's to settle (ack, defer, dead) or to leave
// unacknowledged.
func Take(t testing.TB, ctx context.Context, q *queue.Queue, lane queue.Lane) (d *queue.Delivery, stop func()) {
	t.Helper()
	pull, stop := context.WithCancel(ctx)
	work, err := q.Messages(pull, lane, 1)
	if err != nil {
		stop()
		t.Fatal(err)
	}
	select {
	case d = <-work:
		return d, stop
	case <-ctx.Done():
		stop()
		t.Fatalf("no envelope from the %s lane", lane)
		return nil, stop
	}
}
