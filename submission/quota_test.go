package submission

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/quota"
)

// fakeQuota allows left recipients per tenant, then refuses; fail makes
// every Take fail.
type fakeQuota struct {
	mu       sync.Mutex
	left     map[string]int
	taken    []string
	returned int
	fail     bool
}

func (f *fakeQuota) Return(tenant string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left[tenant] += n
	f.returned += n
}

func (f *fakeQuota) Take(_ context.Context, tenant string, n int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail {
		return errors.New("no responders")
	}
	if f.left[tenant] < n {
		return &quota.Exceeded{Limit: 2, Until: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	}
	f.left[tenant] -= n
	f.taken = append(f.taken, tenant)
	return nil
}

// Past the tenant's sending limit a recipient is deferred at RCPT with
// 452 4.4.5 and when more can be sent; the recipients taken before it go
// on, a repeated mailbox counts once, and the limit that cannot be read
// defers with 451.
func TestSendingLimitAtRcpt(t *testing.T) {
	q := &fakeQueue{}
	qt := &fakeQuota{left: map[string]int{testUser: 2}}
	ts := startServer(t, Config{Users: testUsers(t), Quota: qt}, q)
	c := ts.dialAuth(t)
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"a@example.org", "a@EXAMPLE.org", "b@example.org"} {
		if err := c.Rcpt(r, nil); err != nil {
			t.Fatalf("RCPT %s: %v", r, err)
		}
	}
	se := wantCode(t, c.Rcpt("c@example.org", nil), 452, smtp.EnhancedCode{4, 4, 5})
	if !strings.Contains(se.Message, "limit of 2 recipients per 24 hours") || !strings.Contains(se.Message, "2026-12-07T10:00:00Z") {
		t.Errorf("reply %q", se.Message)
	}
	data(t, c, "Subject: t\r\n\r\nx\r\n")
	if subs := q.got(); len(subs) != 1 || len(subs[0].Rcpts) != 2 {
		t.Fatalf("submissions %+v", subs)
	}
	if len(qt.taken) != 2 {
		t.Fatalf("taken %d times for two mailboxes", len(qt.taken))
	}
	if n := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonQuota); n != 1 {
		t.Errorf("quota rejections = %v", n)
	}

	// A transaction reset before its DATA gives its recipients back.
	qt.mu.Lock()
	qt.left[testUser] = 1
	qt.mu.Unlock()
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("e@example.org", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	qt.mu.Lock()
	returned, left := qt.returned, qt.left[testUser]
	qt.mu.Unlock()
	if returned != 1 || left != 1 {
		t.Fatalf("after RSET: %d returned, %d left; want the recipient back", returned, left)
	}

	qt.mu.Lock()
	qt.fail = true
	qt.mu.Unlock()
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.Rcpt("d@example.org", nil), 451, smtp.EnhancedCode{4, 3, 0})
}

// TestSendingLimitAfterAFailedStore: a DATA whose store failed before
// anything was handed to the server gives its recipients back; one that
// failed after (queue.ErrMaybeStored: part or all of it may be stored, and
// is then delivered) keeps them counted, though the client is told 451.
func TestSendingLimitAfterAFailedStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		returned int
	}{
		{"nothing stored", errors.New("jetstream unavailable"), 1},
		{"maybe stored", fmt.Errorf("queue envelope: fsync failed (%w)", queue.ErrMaybeStored), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fakeQueue{err: tc.err}
			qt := &fakeQuota{left: map[string]int{testUser: 5}}
			ts := startServer(t, Config{Users: testUsers(t), Quota: qt}, q)
			c := ts.dialAuth(t)
			if err := c.Mail("app@example.com", nil); err != nil {
				t.Fatal(err)
			}
			if err := c.Rcpt("a@example.org", nil); err != nil {
				t.Fatal(err)
			}
			w, err := c.Data()
			if err != nil {
				t.Fatal(err)
			}
			_, _ = w.Write([]byte("Subject: t\r\n\r\nx\r\n"))
			wantCode(t, w.Close(), 451, smtp.EnhancedCode{4, 3, 0})
			_ = c.Quit()
			qt.mu.Lock()
			defer qt.mu.Unlock()
			if qt.returned != tc.returned {
				t.Fatalf("returned %d recipients, want %d", qt.returned, tc.returned)
			}
		})
	}
}
