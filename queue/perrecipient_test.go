package queue

import (
	"context"
	"testing"
	"time"
)

// TestPerRecipientOption: Options.PerRecipient splits the mail of the
// tenants it names per recipient inside Enqueue, whoever submits it; other
// tenants keep one envelope per domain.
func TestPerRecipientOption(t *testing.T) {
	q, _ := startQueueWith(t, Options{PerRecipient: func(tenant string) bool { return tenant == "rp" }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for tenant, want := range map[string]int{"rp": 2, "plain": 1} {
		ids, err := q.Enqueue(ctx, &Submission{Tenant: tenant, From: "a@src.example", Rcpts: []string{"x@one.example", "y@one.example"},
			Body: []byte("Subject: hi\r\n\r\nx\r\n")})
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != want {
			t.Errorf("tenant %s: %d envelopes, want %d", tenant, len(ids), want)
		}
	}
}
