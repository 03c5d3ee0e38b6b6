package submission

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/queue"
)

// fakeSuppressor is a suppression list in memory, keyed by tenant and
// lower-cased address; err, when set, is returned by every look-up.
type fakeSuppressor struct {
	mu      sync.Mutex
	list    map[string]string // tenant "\x00" address -> reason
	err     error
	refused []string // tenant "/" address "/" via
}

func (f *fakeSuppressor) Suppressed(_ context.Context, tenant, addr string) (*queue.Suppression, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	reason, ok := f.list[tenant+"\x00"+strings.ToLower(addr)]
	if !ok {
		return nil, nil
	}
	return &queue.Suppression{Tenant: tenant, Address: addr, Reason: reason}, nil
}

func (f *fakeSuppressor) Refused(tenant, addr, via string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused = append(f.refused, tenant+"/"+addr+"/"+via)
}

func TestSuppressedRecipientRefusedAtRcpt(t *testing.T) {
	q := &fakeQueue{}
	sup := &fakeSuppressor{list: map[string]string{
		testUser + "\x00bounced@example.org": "550 5.1.1 no such user",
		"other\x00ok@example.org":            "another tenant's entry",
	}}
	ts := startServer(t, Config{Users: testUsers(t), Suppressions: sup}, q)
	c := ts.dialAuth(t)
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	se := wantCode(t, c.Rcpt("Bounced@example.org", nil), 550, smtp.EnhancedCode{5, 7, 1})
	if !strings.Contains(se.Message, "suppressed") {
		t.Errorf("reply %q does not say suppressed", se.Message)
	}
	// The other recipients go on.
	if err := c.Rcpt("ok@example.org", nil); err != nil {
		t.Fatalf("unsuppressed recipient: %v", err)
	}
	data(t, c, "Subject: t\r\n\r\nx\r\n")
	subs := q.got()
	if len(subs) != 1 || len(subs[0].Rcpts) != 1 || subs[0].Rcpts[0] != "ok@example.org" {
		t.Fatalf("submissions %+v", subs)
	}
	sup.mu.Lock()
	refused := append([]string(nil), sup.refused...)
	sup.mu.Unlock()
	if len(refused) != 1 || refused[0] != testUser+"/Bounced@example.org/smtp" {
		t.Fatalf("refusals recorded %q", refused)
	}
	if n := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonSuppressed); n != 1 {
		t.Errorf("suppressed rejections = %v", n)
	}
}

func TestSuppressionListDownIs451AtRcpt(t *testing.T) {
	q := &fakeQueue{}
	sup := &fakeSuppressor{err: errors.New("kv unavailable")}
	ts := startServer(t, Config{Users: testUsers(t), Suppressions: sup}, q)
	c := ts.dialAuth(t)
	if err := c.Mail("app@example.com", nil); err != nil {
		t.Fatal(err)
	}
	wantCode(t, c.Rcpt("anyone@example.org", nil), 451, smtp.EnhancedCode{4, 3, 0})
}
