package main

// The operator log: what a person did to a message, in the daemon's log.
//
// `outflow queue replay`, `drop` and `fast-forward` run in the operator's
// shell and write to NATS; their events (queue.OperatorEventTypes) name
// the operator ("admin:USER@HOST", adminBy) and what changed. `outflow
// submit` stores a message over NATS, where no daemon's SMTP listener or
// API saw it, and writes a record of the submission beside its queued
// events. The daemons follow both with one durable consumer on the events
// stream that they share: the server hands each event to one of them, so
// a fleet logs it once (at least once: a daemon killed between its line
// and its acknowledgement leaves the event to another, which logs it
// again), and a consumer that outlives the daemons logs what was done
// while none ran when one starts again.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/outflow/outflow/queue"
)

// operatorLogConsumer is the daemons' shared consumer of the operator
// events and the NATS submission records.
const operatorLogConsumer = "outflow-operator-log"

// natsSubmittedSubject is where `outflow submit` records a submission on
// the events stream (one subject: it is no envelope's event, and neither
// `queue history`, `queue find` nor a webhook reads it).
var natsSubmittedSubject = queue.EventKeySubject("submitted", "nats")

// natsSubmission is `outflow submit`'s record of a message it stored.
type natsSubmission struct {
	Time   time.Time `json:"time"`
	IDs    []string  `json:"ids"`
	Tenant string    `json:"tenant"`
	From   string    `json:"from"`
	To     []string  `json:"to"`
	Size   int       `json:"size"`
	SendAt time.Time `json:"send_at,omitzero"`
	By     string    `json:"by"`
}

// recordNATSSubmission stores s on the events stream for the daemons'
// log. The message is queued already: a failure is only said.
func recordNATSSubmission(ctx context.Context, cmd *cobra.Command, q *queue.Queue, s natsSubmission) {
	data, err := json.Marshal(s)
	if err == nil {
		// Deduplicated with the resubmission the work stream absorbs
		// (the same --idempotency-key within the events stream's window).
		err = q.PublishKeyedEvent(ctx, "submitted", "nats", data, "submitted."+strings.Join(s.IDs, "."))
	}
	if err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "outflow: queued as %s, but the daemons' log will not say so: %v\n", strings.Join(s.IDs, " "), err)
	}
}

// noteAction tells the operator, on standard error, who did what and
// where it is recorded, once this process's event is stored (a lost event
// is said: without it, `queue history` and the daemons' log lack the
// action).
func noteAction(ctx context.Context, cmd *cobra.Command, q *queue.Queue, typ, id, by string) {
	if err := q.Flush(ctx); err != nil {
		fmt.Fprintf(cmd.ErrOrStderr(), "outflow: %s %s by %s, but its event may not be recorded (%v): `queue history` and the daemon's log may lack it\n",
			id, typ, by, err)
		return
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "outflow: %s %s by %s (recorded: `queue history %s`; a daemon logs it)\n", id, typ, by, id)
}

// operatorLogConfig is the shared consumer: every daemon of a fleet makes
// the same one, and the server hands each event to one of them.
func operatorLogConfig() jetstream.ConsumerConfig {
	filters := []string{natsSubmittedSubject}
	for _, t := range queue.OperatorEventTypes {
		filters = append(filters, queue.EventTypeFilter(t))
	}
	return jetstream.ConsumerConfig{
		Durable:        operatorLogConsumer,
		Description:    "outflow daemons: operator actions on messages and NATS submissions, each logged by one daemon",
		FilterSubjects: filters,
		// Made by the first daemon of this release: what came before is
		// in the events stream (`queue history`), not logged again.
		DeliverPolicy: jetstream.DeliverNewPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 256,
	}
}

// startOperatorLog logs the operator events and NATS submissions a
// daemon is handed until ctx ends or the returned stop is called.
func startOperatorLog(ctx context.Context, q *queue.Queue, log zerolog.Logger) func() {
	return background(ctx, log, "operator log", func(ctx context.Context) {
		delay := time.Second
		for {
			started, err := followOperatorLog(ctx, q, log)
			if ctx.Err() != nil {
				return
			}
			if started {
				delay = time.Second
			}
			log.Warn().Err(err).Dur("retry_in", delay).Msg("operator log: the events stream's consumer failed; making it again")
			t := time.NewTimer(delay)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			delay = min(2*delay, 30*time.Second)
		}
	})
}

// followOperatorLog makes the consumer and logs what it hands over until
// ctx ends or the consumer fails; it reports whether it got that far.
func followOperatorLog(ctx context.Context, q *queue.Queue, log zerolog.Logger) (bool, error) {
	cons, err := q.EventConsumer(ctx, operatorLogConfig())
	if err != nil {
		return false, err
	}
	// Missed heartbeats end the iterator (a consumer deleted by hand, a
	// stream made again), and the loop above makes it again.
	it, err := cons.Messages(jetstream.PullHeartbeat(5*time.Second), jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return false, err
	}
	ended := make(chan struct{})
	defer close(ended)
	go func() {
		select {
		case <-ctx.Done():
			it.Drain()
		case <-ended:
		}
	}()
	defer it.Stop()
	for {
		m, err := it.Next()
		if err != nil {
			return true, err
		}
		if ctx.Err() != nil {
			_ = m.Nak() // to another daemon, now
			continue
		}
		if logOperatorRecord(log, m.Subject(), m.Data()) {
			_ = m.Ack()
		} else {
			_ = m.Term() // undecodable: another daemon could not read it either
		}
	}
}

// logOperatorRecord writes the line for one record the consumer handed
// over, and reports whether it could be read.
func logOperatorRecord(log zerolog.Logger, subject string, data []byte) bool {
	if subject == natsSubmittedSubject {
		var s natsSubmission
		if err := json.Unmarshal(data, &s); err != nil || len(s.IDs) == 0 {
			log.Warn().Err(err).Str("subject", subject).Msg("operator log: unreadable submission record")
			return false
		}
		// As the SMTP listener's line for a message it takes, and with
		// who ran `outflow submit`: every message accepted has one.
		e := log.Info().Str("event", queue.EventQueued).Str("source", queue.SourceNATS).Strs("ids", s.IDs).
			Str("tenant", s.Tenant).Str("from", s.From).Int("size", s.Size).Int("rcpt_count", len(s.To)).Str("by", s.By)
		if !s.SendAt.IsZero() {
			e = e.Time("send_at", s.SendAt)
		}
		e.Time("at", s.Time).Msg("submission accepted")
		return true
	}
	var ev queue.Event
	if err := json.Unmarshal(data, &ev); err != nil || ev.ID == "" {
		log.Warn().Err(err).Str("subject", subject).Msg("operator log: unreadable event")
		return false
	}
	operatorEventLine(log.Info(), &ev).Msg("message " + ev.Type)
	return true
}

// operatorEventLine adds an operator event's fields to e: the message, who
// (by: the event's worker_id) and what changed (reason; a replay also says
// attempt_budget_reset). at is the event's time: the line is written when
// a daemon is handed the event, which may be after the delivery that
// followed a replay or a fast-forward.
func operatorEventLine(e *zerolog.Event, ev *queue.Event) *zerolog.Event {
	e = e.Str("event", ev.Type).Str("msg_id", ev.ID)
	if ev.MsgID != "" && ev.MsgID != ev.ID {
		e = e.Str("submission_id", ev.MsgID)
	}
	e = e.Str("tenant", ev.Tenant).Str("dest", ev.Dest).Strs("rcpts", ev.Recipients).Int("attempts_made", ev.Attempt).Str("by", ev.Worker)
	if ev.Type == queue.EventReplayed {
		e = e.Bool("attempt_budget_reset", true)
	}
	return e.Str("reason", ev.Reason).Time("at", ev.Time)
}
