package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestSuppressionsAddCheckListRemove(t *testing.T) {
	_, l, ctx := startSuppressions(t)
	if err := l.Add(ctx, Suppression{Tenant: "acme", Address: "<Bob@Example.COM>", Reason: "550 5.1.1 no such user", Source: SuppressBounce}); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(ctx, Suppression{Tenant: "other", Address: "carol@example.com", Source: SuppressAdmin}); err != nil {
		t.Fatal(err)
	}
	// Matching ignores case; the list is per tenant.
	s, err := l.Suppressed(ctx, "acme", "bob@example.com")
	if err != nil || s == nil || s.Reason != "550 5.1.1 no such user" || s.Source != SuppressBounce {
		t.Fatalf("Suppressed(acme, bob) = %+v, %v", s, err)
	}
	if s, err := l.Suppressed(ctx, "other", "bob@example.com"); err != nil || s != nil {
		t.Fatalf("another tenant's entry applied: %+v, %v", s, err)
	}
	all, err := l.List(ctx, "")
	if err != nil || len(all) != 2 || all[0].Tenant != "acme" || all[0].Address != "bob@example.com" || all[1].Tenant != "other" {
		t.Fatalf("List(all) = %+v, %v", all, err)
	}
	one, err := l.List(ctx, "other")
	if err != nil || len(one) != 1 || one[0].Address != "carol@example.com" {
		t.Fatalf("List(other) = %+v, %v", one, err)
	}
	if err := l.Remove(ctx, "acme", "BOB@example.com"); err != nil {
		t.Fatal(err)
	}
	if s, _ := l.Suppressed(ctx, "acme", "bob@example.com"); s != nil {
		t.Fatalf("still suppressed after Remove: %+v", s)
	}
	if err := l.Remove(ctx, "acme", "bob@example.com"); !errors.Is(err, ErrNotSuppressed) {
		t.Fatalf("second Remove = %v, want ErrNotSuppressed", err)
	}
	if err := l.Add(ctx, Suppression{Tenant: "acme", Address: "not-an-address"}); err == nil {
		t.Fatal("Add accepted an address without @")
	}
}

func TestSuppressionExpires(t *testing.T) {
	_, l, ctx := startSuppressions(t)
	past := time.Now().Add(-time.Minute)
	if err := l.Add(ctx, Suppression{Tenant: "acme", Address: "old@example.com", Expires: past}); err != nil {
		t.Fatal(err)
	}
	if err := l.Add(ctx, Suppression{Tenant: "acme", Address: "new@example.com", Expires: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if s, err := l.Suppressed(ctx, "acme", "old@example.com"); err != nil || s != nil {
		t.Fatalf("expired entry applied: %+v, %v", s, err)
	}
	if s, err := l.Suppressed(ctx, "acme", "new@example.com"); err != nil || s == nil {
		t.Fatalf("unexpired entry not applied: %+v, %v", s, err)
	}
	got, err := l.List(ctx, "acme")
	if err != nil || len(got) != 1 || got[0].Address != "new@example.com" {
		t.Fatalf("List = %+v, %v", got, err)
	}
}

func TestSuppressionRefusedEvent(t *testing.T) {
	q, l, ctx := startSuppressions(t)
	c, err := q.js.OrderedConsumer(ctx, "OUTFLOW_EVENTS", jetstream.OrderedConsumerConfig{FilterSubjects: []string{subjEvents + EventSuppressed + ".>"}})
	if err != nil {
		t.Fatal(err)
	}
	l.Refused("acme", "Bob@example.com", "smtp")
	m, err := c.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ev Event
	if err := json.Unmarshal(m.Data(), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Type != EventSuppressed || ev.Tenant != "acme" || len(ev.Recipients) != 1 || ev.Recipients[0] != "bob@example.com" || ev.ID == "" {
		t.Fatalf("event = %+v", ev)
	}
}

// TestSuppressionAddFirst: what a recipient's mail system reports (a hard
// bounce, a complaint) does not replace an entry that never expires, so
// an unsubscribe stays listed as one; it replaces one that expires, or has
// expired. An expired entry is not there to remove.
func TestSuppressionAddFirst(t *testing.T) {
	_, l, ctx := startSuppressions(t)
	complaint := func(addr string) bool {
		t.Helper()
		added, err := l.AddFirst(ctx, Suppression{Tenant: "acme", Address: addr, Source: SuppressComplaint, Reason: "complaint: abuse"})
		if err != nil {
			t.Fatal(err)
		}
		return added
	}
	for _, e := range []Suppression{
		{Tenant: "acme", Address: "left@example.com", Source: SuppressUnsubscribe},
		{Tenant: "acme", Address: "paused@example.com", Source: SuppressAPI, Expires: time.Now().Add(time.Hour)},
		{Tenant: "acme", Address: "lapsed@example.com", Source: SuppressAPI, Expires: time.Now().Add(-time.Minute)},
	} {
		if err := l.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if complaint("left@example.com") {
		t.Error("a complaint replaced an unsubscribe")
	}
	if s, _ := l.Suppressed(ctx, "acme", "left@example.com"); s == nil || s.Source != SuppressUnsubscribe {
		t.Errorf("entry after the complaint: %+v, want the unsubscribe", s)
	}
	for _, addr := range []string{"paused@example.com", "lapsed@example.com", "new@example.com"} {
		if !complaint(addr) {
			t.Errorf("%s: the complaint was not added", addr)
		}
		if s, _ := l.Suppressed(ctx, "acme", addr); s == nil || s.Source != SuppressComplaint || !s.Expires.IsZero() {
			t.Errorf("%s: entry %+v, want the complaint's, for good", addr, s)
		}
	}
	// A complaint and an unsubscribe at once: one is written, and stays.
	for i := range 10 {
		addr := fmt.Sprintf("both%d@example.com", i)
		var wg sync.WaitGroup
		added := make([]bool, 2)
		for j, src := range []string{SuppressComplaint, SuppressUnsubscribe} {
			wg.Go(func() {
				ok, err := l.AddFirst(ctx, Suppression{Tenant: "acme", Address: addr, Source: src})
				if err != nil {
					t.Error(err)
				}
				added[j] = ok
			})
		}
		wg.Wait()
		want := SuppressUnsubscribe
		if added[0] {
			want = SuppressComplaint
		}
		s, _ := l.Suppressed(ctx, "acme", addr)
		if added[0] == added[1] || s == nil || s.Source != want {
			t.Fatalf("%s: added %v, entry %+v: want exactly one written, and it kept", addr, added, s)
		}
	}
	if err := l.Add(ctx, Suppression{Tenant: "acme", Address: "gone@example.com", Expires: time.Now().Add(-time.Second)}); err != nil {
		t.Fatal(err)
	}
	if err := l.Remove(ctx, "acme", "gone@example.com"); !errors.Is(err, ErrNotSuppressed) {
		t.Errorf("removing an expired entry: %v, want ErrNotSuppressed", err)
	}
}

// TestSuppressionsLeaveNothing: an entry removed, or expired and met by a
// look-up or a listing, leaves nothing in the bucket's stream (a KV
// delete's marker stayed for good, one per address ever lifted), and an
// address suppressed again is suppressed.
func TestSuppressionsLeaveNothing(t *testing.T) {
	q, l, ctx := startSuppressions(t)
	past := time.Now().Add(-time.Minute)
	for _, s := range []Suppression{
		{Tenant: "acme", Address: "removed@example.com"},
		{Tenant: "acme", Address: "looked-up@example.com", Expires: past},
		{Tenant: "acme", Address: "listed@example.com", Expires: past},
	} {
		if err := l.Add(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Remove(ctx, "acme", "removed@example.com"); err != nil {
		t.Fatal(err)
	}
	if s, err := l.Suppressed(ctx, "acme", "looked-up@example.com"); err != nil || s != nil {
		t.Fatalf("expired entry applied: %+v, %v", s, err)
	}
	if _, err := l.List(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	st, err := q.js.Stream(ctx, kvStream(BucketSuppressions))
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{"removed@example.com", "looked-up@example.com", "listed@example.com"} {
		if m, err := st.GetLastMsgForSubject(ctx, kvSubject(BucketSuppressions, suppressKey("acme", addr))); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("%s: %v left (%v), want nothing", addr, m, err)
		}
	}
	if err := l.Remove(ctx, "acme", "removed@example.com"); !errors.Is(err, ErrNotSuppressed) {
		t.Errorf("removed twice: %v, want ErrNotSuppressed", err)
	}
	if added, err := l.AddFirst(ctx, Suppression{Tenant: "acme", Address: "removed@example.com"}); err != nil || !added {
		t.Fatalf("suppressed again: %v %v", added, err)
	}
	if s, err := l.Suppressed(ctx, "acme", "removed@example.com"); err != nil || s == nil {
		t.Errorf("suppressed again, not applied: %v %v", s, err)
	}
}

// startSuppressions is a queue on a fresh embedded server, its
// suppression list, and a context for the test's calls.
func startSuppressions(t *testing.T) (*Queue, *Suppressions, context.Context) {
	t.Helper()
	q, _ := startQueue(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	l, err := q.Suppressions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return q, l, ctx
}
