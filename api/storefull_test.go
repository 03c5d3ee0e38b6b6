package api

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/outflow/outflow/queue"
)

// noRoomQueue refuses new mail while full is set, as the queue does near
// its store's limit.
type noRoomQueue struct {
	*queue.Queue
	full atomic.Bool
}

func (q *noRoomQueue) Enqueue(ctx context.Context, s *queue.Submission) ([]string, error) {
	if q.full.Load() {
		return nil, fmt.Errorf("%w (used 9 of 10 bytes)", queue.ErrNoRoom)
	}
	return q.Queue.Enqueue(ctx, s)
}

// A queue short of room for new mail (queue.ErrNoRoom) is a 503
// store-unavailable that says nothing was stored, with a Retry-After of
// a minute; the Idempotency-Key is free again for the retry.
func TestStoreFullIs503WithRetryAfter(t *testing.T) {
	var full *noRoomQueue
	f := newFixture(t, func(c *Config) {
		full = &noRoomQueue{Queue: c.Queue.(*failingQueue).Queue}
		full.full.Store(true)
		c.Queue = full
	})
	msg := map[string]any{"from": "a@src.example", "to": []string{"b@one.example"}, "text": "hi"}
	hdr := map[string]string{"Idempotency-Key": "full-1"}
	res := f.do(t, "POST", "/v1/messages", f.key, msg, hdr)
	if res.status != http.StatusServiceUnavailable || res.json["type"] != ProblemUnavailable || res.header.Get("Retry-After") != "60" {
		t.Fatalf("store full: %d Retry-After %q %s", res.status, res.header.Get("Retry-After"), res.raw)
	}
	if d, _ := res.json["detail"].(string); !strings.Contains(d, "nothing was stored") {
		t.Errorf("detail %q, want it to say nothing was stored", d)
	}
	if n := len(queued(t, f.q)); n != 0 {
		t.Fatalf("%d envelopes after a refusal", n)
	}
	full.full.Store(false)
	if ids := f.do(t, "POST", "/v1/messages", f.key, msg, hdr).ids(t); len(ids) != 1 {
		t.Fatalf("the retry under the same key: ids %v", ids)
	}
}
