package throttle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Worker is one live worker as its registry key last said.
type Worker struct {
	ID      string    `json:"worker_id"`
	Started time.Time `json:"started"`
	At      time.Time `json:"at"` // its last heartbeat
	// Dests is how many destinations it has traffic with; Rate its
	// delivered messages per second over the learning window, summed over
	// them; InFlight its deliveries in progress.
	Dests    int     `json:"dests"`
	Rate     float64 `json:"rate"`
	InFlight int     `json:"in_flight"`
}

// ListWorkers reads the live-worker registry (the bucket's TTL removes a
// worker that stopped heartbeating), by worker id.
func ListWorkers(ctx context.Context, registry jetstream.KeyValue) ([]Worker, error) {
	lister, err := registry.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	var out []Worker
	for k := range lister.Keys() {
		e, err := registry.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("list workers: %w", err)
		}
		var rec workerRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			continue
		}
		w := Worker{ID: rec.Worker, Started: rec.Started, At: rec.At, Dests: len(rec.Load)}
		for _, l := range rec.Load {
			w.Rate += l.Rate
			w.InFlight += l.InFlight
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// StatusSubject is the core NATS request subject on which every running
// worker answers with its view of a destination (the payload is a domain
// or group name): a WorkerStatus as JSON.
const StatusSubject = "outflow.admin.dest.status"

// WorkerStatus is one worker's answer on StatusSubject.
type WorkerStatus struct {
	Worker string `json:"worker_id"`
	DestStatus
	// Sources is the destination per egress address (PairName), when the
	// worker has [[egress]] addresses and was asked for the destination
	// without one.
	Sources []DestStatus `json:"sources,omitempty"`
}

// AskStatus asks every running worker for its view of dest and collects
// the answers that arrive within wait (`outflow dest status` and the
// console use it).
func AskStatus(nc *nats.Conn, dest string, wait time.Duration) ([]WorkerStatus, error) {
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(StatusSubject, inbox, []byte(strings.ToLower(dest))); err != nil {
		return nil, err
	}
	var out []WorkerStatus
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			var v WorkerStatus
			if json.Unmarshal(m.Data, &v) == nil {
				out = append(out, v)
			}
		case <-timer.C:
			sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
			return out, nil
		}
	}
}
