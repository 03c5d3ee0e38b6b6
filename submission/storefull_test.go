package submission

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/queue"
)

// A queue refusing new mail for want of room in the store
// (queue.ErrNoRoom, the store near its limit) is answered 452 4.3.1
// Insufficient system storage, not a 451: nothing was stored, and the
// client retries later. Another queue failure is still a 451.
func TestStoreFullIs452(t *testing.T) {
	q := &fakeQueue{err: fmt.Errorf("%w (used 9 of 10 bytes)", queue.ErrNoRoom)}
	ts := startServer(t, Config{Users: testUsers(t), Hostname: "mx.test"}, q)
	c := ts.dialAuth(t)
	err := c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader("Subject: a\r\n\r\nhi\r\n"))
	se := wantCode(t, err, 452, smtp.EnhancedCode{4, 3, 1})
	if !strings.HasPrefix(se.Message, "Insufficient system storage") {
		t.Errorf("reply %q, want it to say Insufficient system storage", se.Message)
	}
	if got := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonInsufficientStorage); got != 1 {
		t.Errorf("rejections counted as %s: %v, want 1", reasonInsufficientStorage, got)
	}

	q.mu.Lock()
	q.err = errors.New("store down")
	q.mu.Unlock()
	err = c.SendMail("app@example.com", []string{"rcpt@example.org"}, strings.NewReader("Subject: b\r\n\r\nhi\r\n"))
	wantCode(t, err, 451, smtp.EnhancedCode{4, 3, 0})
}
