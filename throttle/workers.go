package throttle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Worker is one live worker as its registry key last said.
type Worker struct {
	ID string `json:"worker_id"`
	// Instance tells apart processes that go by one worker id (random
	// per process; empty for a worker of an older version).
	Instance string    `json:"instance,omitempty"`
	Started  time.Time `json:"started"`
	At       time.Time `json:"at"` // its last heartbeat
	// Dests is how many destinations it has traffic with; Rate its
	// delivered messages per second over the learning window, summed over
	// them; InFlight its deliveries in progress.
	Dests    int     `json:"dests"`
	Rate     float64 `json:"rate"`
	InFlight int     `json:"in_flight"`
}

// ListWorkers reads the live-worker registry (the bucket's TTL removes a
// worker that stopped heartbeating), by worker id, then instance.
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
		w := Worker{ID: rec.Worker, Instance: rec.Instance, Started: rec.Started, At: rec.At, Dests: len(rec.Load)}
		for _, l := range rec.Load {
			w.Rate += l.Rate
			w.InFlight += l.InFlight
		}
		out = append(out, w)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].ID != out[j].ID {
			return out[i].ID < out[j].ID
		}
		return out[i].Instance < out[j].Instance
	})
	return out, nil
}

// WorkerStatus is one worker's view of a destination, as it answers a
// status request (queue.ServeDestStatus) and AskStatus collects it.
type WorkerStatus struct {
	Worker string `json:"worker_id"`
	DestStatus
	// Sources is the destination per egress address (PairName), when the
	// worker has [[egress]] addresses and was asked for the destination
	// without one.
	Sources []DestStatus `json:"sources,omitempty"`
}

// StatusAsker sends a status request to every running worker and returns
// the answers that arrive within wait: *queue.Queue.
type StatusAsker interface {
	GatherDestStatus(dest string, wait time.Duration) ([][]byte, error)
}

// DefaultStatusWait is how long `outflow dest status` and the console wait
// for the workers' answers to AskStatus: long enough for every worker of a
// fleet on one network, short enough for a page or a command to feel
// immediate.
const DefaultStatusWait = 500 * time.Millisecond

// AskStatus asks every running worker for its view of dest and collects
// the answers that arrive within wait (`outflow dest status` and the
// console use it, with DefaultStatusWait).
func AskStatus(q StatusAsker, dest string, wait time.Duration) ([]WorkerStatus, error) {
	answers, err := q.GatherDestStatus(strings.ToLower(dest), wait)
	if err != nil {
		return nil, err
	}
	var out []WorkerStatus
	for _, b := range answers {
		var v WorkerStatus
		if json.Unmarshal(b, &v) == nil {
			out = append(out, v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out, nil
}
