package webhook

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/queue"
)

// TestRotateKeepsTheOldSecretForTheOverlap: a rotation gives the endpoint
// a new secret, and until --keep has passed each delivery carries a
// signature of each secret, so a receiver verifies it whether it has
// switched yet or not; with no overlap, or once it has passed, only the
// new secret signs. Before, a new secret meant a new endpoint, and the
// events between the receiver's switch and the old one's removal went to
// one that could not verify them.
func TestRotateKeepsTheOldSecretForTheOverlap(t *testing.T) {
	f := newFixture(t, status(200))
	ctx := context.Background()
	old := f.ep.Secret
	rotated, err := f.store.Rotate(ctx, f.ep.ID, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if rotated.Secret == old || !strings.HasPrefix(rotated.Secret, SecretPrefix) || rotated.PrevSecret != old ||
		rotated.PrevUntil.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("rotated: secret %q (old %q), prev %q until %v", rotated.Secret, old, rotated.PrevSecret, rotated.PrevUntil)
	}
	stored, _, err := f.store.Get(ctx, f.ep.ID)
	if err != nil || stored.Secret != rotated.Secret || stored.PrevSecret != old {
		t.Fatalf("stored %+v, %v", stored, err)
	}

	// The running dispatcher takes the rotation up: its deliveries carry
	// a signature of the new secret too (the receiver still verifies each
	// with the old one, its own).
	waitUntil(t, "a delivery signed with the new secret", func() bool {
		f.q.Event(queue.EventDelivered, &queue.Event{ID: "r1", Tenant: "acme", Dest: "x.test"})
		d := f.next(t)
		return Verify(rotated.Secret, d.hdr.Get("webhook-id"), d.hdr.Get("webhook-timestamp"), d.hdr.Get("webhook-signature"), d.raw, time.Now(), time.Minute) == nil
	})

	// Post, directly: both signatures while the old secret is kept, each
	// verifying with its own secret; then only the new one's.
	var hdr http.Header
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hdr = r.Header.Clone()
		body = make([]byte, r.ContentLength)
		_, _ = r.Body.Read(body)
	}))
	defer srv.Close()
	ep := *rotated
	ep.URL = srv.URL
	verify := func(secret string) error {
		return Verify(secret, hdr.Get("webhook-id"), hdr.Get("webhook-timestamp"), hdr.Get("webhook-signature"), body, time.Now(), time.Minute)
	}
	if _, _, err := Post(ctx, srv.Client(), &ep, "evt_1", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(hdr.Get("webhook-signature"))); n != 2 || verify(old) != nil || verify(rotated.Secret) != nil {
		t.Fatalf("during the overlap: %d signatures %q; old verifies: %v, new: %v", n, hdr.Get("webhook-signature"), verify(old), verify(rotated.Secret))
	}
	ep.PrevUntil = time.Now().Add(-time.Second)
	if _, _, err := Post(ctx, srv.Client(), &ep, "evt_2", []byte(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Fields(hdr.Get("webhook-signature"))); n != 1 || verify(old) == nil || verify(rotated.Secret) != nil {
		t.Fatalf("after the overlap: %d signatures; old verifies: %v, new: %v", n, verify(old), verify(rotated.Secret))
	}

	// No overlap: the old secret ends at once.
	again, err := f.store.Rotate(ctx, f.ep.ID, 0)
	if err != nil || again.PrevSecret != "" || !again.PrevUntil.IsZero() || again.Secret == rotated.Secret {
		t.Fatalf("rotation without overlap: %+v, %v", again, err)
	}
	if _, err := f.store.Rotate(ctx, "wh_nosuch", time.Hour); err == nil {
		t.Error("rotating an endpoint that does not exist succeeded")
	}
}
