package webhook

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// BucketBreakers is the key-value bucket of the endpoints' breakers, one
// entry per endpoint id holding a BreakerState. An endpoint with no entry
// has a closed breaker and no spent events. Being in JetStream, a breaker
// outlives a restart and is the same for every daemon of a fleet (they all
// pull the endpoint's one consumer).
const BucketBreakers = "outflow_webhook_breakers"

// BreakerState is one endpoint's breaker.
type BreakerState struct {
	// Spent counts the events in a row that spent their budget (the last
	// 2xx resets it).
	Spent int `json:"spent"`
	// Open is set when Spent reaches Config.BreakerAfter: the endpoint's
	// events are then held in its consumer, the current one retried past
	// its budget, until a 2xx closes the breaker.
	Open bool `json:"open"`
	// Since is when the breaker opened; Worker the daemon that opened it.
	Since  time.Time `json:"since,omitzero"`
	Worker string    `json:"worker_id,omitempty"`
}

// breakers is a dispatcher's view of the breaker bucket: a map kept
// current by a watch, read on every event without a round trip, and
// written through (with a compare-and-set) only on a transition, which is
// at most once per spent budget or per recovery.
type breakers struct {
	kv jetstream.KeyValue
	mu sync.Mutex
	m  map[string]BreakerState
}

// watchBreakers loads the bucket and follows it until ctx ends.
func watchBreakers(ctx context.Context, kv jetstream.KeyValue, onErr func(error)) (*breakers, error) {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return nil, err
	}
	b := &breakers{kv: kv, m: map[string]BreakerState{}}
	apply := func(e jetstream.KeyValueEntry) {
		b.mu.Lock()
		defer b.mu.Unlock()
		if e.Operation() != jetstream.KeyValuePut {
			delete(b.m, e.Key())
			return
		}
		var s BreakerState
		if err := json.Unmarshal(e.Value(), &s); err != nil {
			onErr(err)
			return
		}
		b.m[e.Key()] = s
	}
	for initial := true; initial; { // the bucket as it is now, before any runner asks
		select {
		case <-ctx.Done():
			_ = w.Stop()
			return nil, ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				initial = false
				continue
			}
			apply(e)
		}
	}
	go func() {
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil {
					apply(e)
				}
			}
		}
	}()
	return b, nil
}

// get returns endpoint id's breaker as last seen.
func (b *breakers) get(id string) BreakerState {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m[id]
}

func (b *breakers) set(id string, s BreakerState) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s == (BreakerState{}) {
		delete(b.m, id)
	} else {
		b.m[id] = s
	}
}

// spend records that one more of id's events spent its budget, opening the
// breaker at after of them in a row; it returns the new state and whether
// this call opened it.
func (b *breakers) spend(ctx context.Context, id, worker string, after int) (BreakerState, bool, error) {
	for {
		var s BreakerState
		var rev uint64
		e, err := b.kv.Get(ctx, id)
		switch {
		case err == nil:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &s); err != nil {
				s = BreakerState{}
			}
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return b.get(id), false, err
		}
		s.Spent++
		opened := s.Spent >= after && !s.Open
		if opened {
			s.Open, s.Since, s.Worker = true, time.Now().UTC(), worker
		}
		v, _ := json.Marshal(s)
		if rev == 0 {
			_, err = b.kv.Create(ctx, id, v)
		} else {
			_, err = b.kv.Update(ctx, id, v, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another daemon changed it meanwhile: count on top of theirs
		}
		if err != nil {
			return b.get(id), false, err
		}
		b.set(id, s)
		return s, opened, nil
	}
}

// reset closes id's breaker and clears its count after a 2xx, and reports
// what it was. It writes only when there is something to clear.
func (b *breakers) reset(ctx context.Context, id string) (BreakerState, error) {
	s := b.get(id)
	if s == (BreakerState{}) {
		return s, nil
	}
	if err := b.kv.Delete(ctx, id); err != nil {
		return s, err
	}
	b.set(id, BreakerState{})
	return s, nil
}
