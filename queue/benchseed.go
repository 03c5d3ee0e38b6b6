package queue

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
)

// SeedDeferred stores n deferred envelopes on the retry lane, each a
// message schedule for dest firing at at, as if n messages had failed
// once. It exists for the deferred-backlog benchmark (bench/,
// docs/benchmarks.md, scenario 3), which needs a million of them faster
// than SMTP could queue and fail them; nothing in the daemon calls it.
// The envelopes name bodies that do not exist: if one ever fires, the
// worker parks it in dead letters ("body missing"). Publishes are
// pipelined, at most 4096 unacknowledged at a time.
func (q *Queue) SeedDeferred(ctx context.Context, n int, dest string, at time.Time) error {
	prefix := "seed" + nuid.Next()
	now := time.Now().UTC()
	pending := make([]jetstream.PubAckFuture, 0, 4096)
	flush := func() error {
		err := waitAcks(ctx, pending...)
		pending = pending[:0]
		return err
	}
	for i := 0; i < n; i++ {
		id := prefix + strconv.Itoa(i)
		e := &Envelope{
			ID: id, MsgID: id, Tenant: "bench", From: "seed@bench.test", Rcpts: []string{"rcpt" + strconv.Itoa(i) + "@" + dest},
			Dest: dest, BodyRef: id, Size: 2048, Parts: 1, SubmittedAt: now, Deadline: now.Add(q.opts.DeadlineAfter),
			Attempt: 1, FirstAttempt: now, LastClass: "transient", LastReply: "421 4.3.0 seeded", Step: 1,
		}
		m, err := scheduleMsg(e, LaneRetry, at)
		if err != nil {
			return err
		}
		f, err := q.js.PublishMsgAsync(m)
		if err != nil {
			return fmt.Errorf("seed %d: %w", i, err)
		}
		pending = append(pending, f)
		if len(pending) == cap(pending) {
			if err := flush(); err != nil {
				return fmt.Errorf("seed %d: %w", i, err)
			}
		}
	}
	return flush()
}
