package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the packages above queue need of the NATS connection, as methods:
// the connection and the JetStream context stay inside queue, so every
// subject and stream they reach is laid out in subjects.go and queue.go.

// Connected reports whether the NATS connection is up (for /readyz).
func (q *Queue) Connected() bool { return q.nc.IsConnected() }

// Closed reports whether the connection has finished closing: after Close,
// once its drain is done.
func (q *Queue) Closed() bool { return q.nc.IsClosed() }

// Flush waits until JetStream has stored this process's asynchronous
// publishes (its events), or ctx ends.
func (q *Queue) Flush(ctx context.Context) error {
	return q.asyncStored(ctx)
}

// Depth is the number of messages stored in a lane's stream: envelopes
// waiting, in flight, and (on the deferred lanes) schedules not yet due;
// the work stream's keeper is not counted.
func (q *Queue) Depth(ctx context.Context, l Lane) (uint64, error) {
	s, ok := q.lanes[l]
	if !ok {
		return 0, fmt.Errorf("queue: no lane %q", l)
	}
	if l == LaneWork {
		n, _, err := q.workState(ctx, false)
		if err != nil {
			return 0, fmt.Errorf("lane %s: %w", l, err)
		}
		return n, nil
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("lane %s: %w", l, err)
	}
	return info.State.Msgs, nil
}

// EventConsumer creates or updates the durable consumer cfg describes on
// the events stream (cfg.FilterSubjects from EventTenantFilters).
func (q *Queue) EventConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := q.js.CreateOrUpdateConsumer(ctx, StreamEvents, cfg)
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", cfg.Durable, StreamEvents, err)
	}
	if cfg.Durable != "" {
		q.durableMeta(StreamEvents, cfg.Durable)
	}
	return c, nil
}

// EventReader reads the events stream from where cfg says, with an
// ordered consumer that the server forgets when the reader stops.
func (q *Queue) EventReader(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error) {
	c, err := q.js.OrderedConsumer(ctx, StreamEvents, cfg)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", StreamEvents, err)
	}
	return c, nil
}

// DeleteEventConsumer removes a durable consumer of the events stream; one
// that does not exist is not an error.
func (q *Queue) DeleteEventConsumer(ctx context.Context, name string) error {
	if err := q.js.DeleteConsumer(ctx, StreamEvents, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("consumer %s on %s: %w", name, StreamEvents, err)
	}
	return nil
}

// PublishKeyedEvent stores data on the events stream under
// EventKeySubject(typ, key) and waits for its acknowledgement; msgID
// deduplicates a repeat within the stream's window.
func (q *Queue) PublishKeyedEvent(ctx context.Context, typ, key string, data []byte, msgID string) error {
	if _, err := q.js.Publish(ctx, EventKeySubject(typ, key), data, jetstream.WithMsgID(msgID)); err != nil {
		return fmt.Errorf("event %s: %w", typ, err)
	}
	return nil
}

// ServeDestStatus answers `outflow dest status` requests: answer gets the
// requested destination (a domain or group name, as sent) and returns this
// worker's view as JSON. stop ends the subscription.
func (q *Queue) ServeDestStatus(answer func(dest string) []byte) (stop func(), err error) {
	sub, err := q.nc.Subscribe(subjDestStatus, func(m *nats.Msg) {
		_ = m.Respond(answer(string(m.Data)))
	})
	if err != nil {
		return nil, fmt.Errorf("dest status responder: %w", err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// GatherDestStatus asks every running worker for its view of dest and
// returns the answers that arrive within wait, in the order they came.
func (q *Queue) GatherDestStatus(dest string, wait time.Duration) ([][]byte, error) {
	inbox := q.nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := q.nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := q.nc.PublishRequest(subjDestStatus, inbox, []byte(dest)); err != nil {
		return nil, err
	}
	var out [][]byte
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			out = append(out, m.Data)
		case <-timer.C:
			return out, nil
		}
	}
}
