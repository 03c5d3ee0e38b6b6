package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
)

// durable makes the acknowledged writes to streams durable, when this queue
// has a syncer (see Options.Syncer); the caller reports them done only
// after it returns nil.
func (q *Queue) durable(ctx context.Context, streams ...string) error {
	if q.syncer == nil {
		return nil
	}
	if err := q.syncer.Sync(ctx, streams...); err != nil {
		return fmt.Errorf("durable: %w", err)
	}
	return nil
}

// serveSync answers RemoteSync requests with this queue's syncer.
func (q *Queue) serveSync() error {
	_, err := q.nc.Subscribe(subjSync, func(m *nats.Msg) {
		streams := strings.Split(string(m.Data), ",")
		// Each request syncs on its own goroutine: the handler must not
		// hold up the subscription while the batch window runs.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), durableStepWindow)
			defer cancel()
			var reply []byte
			if err := q.syncer.Sync(ctx, streams...); err != nil {
				reply = []byte(err.Error())
			}
			_ = m.Respond(reply)
		}()
	})
	if err != nil {
		return fmt.Errorf("serve %s: %w", subjSync, err)
	}
	return nil
}

// remoteSyncer asks the daemon's syncer over NATS.
type remoteSyncer struct{ nc *nats.Conn }

// Sync implements Syncer. No responder means no daemon syncs for this
// server (it runs with --durability replicas or none): the server's
// acknowledgement is all there is to wait for.
func (r remoteSyncer) Sync(ctx context.Context, streams ...string) error {
	m, err := r.nc.RequestWithContext(ctx, subjSync, []byte(strings.Join(streams, ",")))
	if errors.Is(err, nats.ErrNoResponders) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("sync at the daemon: %w", err)
	}
	if len(m.Data) > 0 {
		return fmt.Errorf("sync at the daemon: %s", m.Data)
	}
	return nil
}
