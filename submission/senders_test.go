package submission

import (
	"io"
	"strings"
	"testing"

	"github.com/emersion/go-smtp"
)

func TestSenderDomainsAllows(t *testing.T) {
	p := SenderDomains{"shop": {"shop.example", "*.mail.shop.example"}, "none": nil}
	for _, c := range []struct {
		tenant, addr string
		want         bool
	}{
		{"shop", "a@shop.example", true},
		{"shop", "a@SHOP.Example.", true},
		{"shop", "a@news.mail.shop.example", true},
		{"shop", "a@mail.shop.example", false}, // the wildcard is for names under it
		{"shop", "a@sub.shop.example", false},
		{"shop", "a@evilshop.example", false},
		{"shop", "a@bank.example", false},
		{"shop", "", true}, // the null sender names no domain
		{"none", "a@shop.example", false},
		{"other", "a@bank.example", true}, // a tenant not named: any domain
	} {
		if got := p.Allows(c.tenant, c.addr); got != c.want {
			t.Errorf("%s as %q: %v, want %v", c.tenant, c.addr, got, c.want)
		}
	}
	// With an entry for the other tenants, a tenant not named has its
	// domains, and is restricted.
	closed := SenderDomains{"shop": p["shop"], OtherTenants: {"tenants.example"}}
	if closed.Allows("other", "a@bank.example") || !closed.Allows("other", "a@tenants.example") || !closed.Restricted("other") {
		t.Error("a tenant not named is not held to the other tenants' domains")
	}
	if !closed.Allows("shop", "a@shop.example") || closed.Allows("shop", "a@tenants.example") {
		t.Error("a named tenant is held to the other tenants' domains, not its own")
	}
	if err := ValidateUserName(OtherTenants); err == nil {
		t.Errorf("user name %q accepted: it would be taken for every other tenant", OtherTenants)
	}
	for _, bad := range []string{"", "*", "*.", "a*.example", "shop..example", "-a.example", "*.*.example"} {
		if CheckSenderDomain(bad) == nil {
			t.Errorf("entry %q accepted", bad)
		}
	}
	for _, good := range []string{"shop.example", "*.shop.example", "Shop.Example."} {
		if err := CheckSenderDomain(good); err != nil {
			t.Errorf("entry %q: %v", good, err)
		}
	}
	msg := []byte("Subject: x\r\nFrom: Shop <news@shop.example>,\r\n \"Bank\" <info@bank.example>\r\n\r\nFrom: body@bank.example\r\n")
	if why := p.CheckFrom("shop", msg); !strings.Contains(why, "info@bank.example") {
		t.Errorf("From with a second, foreign address: %q", why)
	}
	if why := p.CheckFrom("shop", []byte("From: news@shop.example\r\n\r\nFrom: x@bank.example\r\n")); why != "" {
		t.Errorf("a From in the body counted: %q", why)
	}
	if why := p.CheckFrom("shop", []byte("From: <<<\r\n\r\n")); why == "" {
		t.Error("an unreadable From passed")
	}
	if why := p.CheckFrom("other", msg); why != "" {
		t.Errorf("an unrestricted tenant: %q", why)
	}
}

// TestSenderDomainsAtSubmission: a tenant limited to its domains gets 553
// 5.7.1 at MAIL FROM for another domain and 550 5.7.1 after DATA for a
// From field of another domain; nothing of either is queued, the session
// goes on, and mail within its domains is accepted.
func TestSenderDomainsAtSubmission(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: testUsers(t), SenderDomains: SenderDomains{testUser: {"example.com"}}}, q)
	c := ts.dialAuth(t)
	wantCode(t, c.Mail("ceo@bank.example", nil), 553, smtp.EnhancedCode{5, 7, 1})
	send := func(from, header string) error {
		t.Helper()
		if err := c.Mail(from, nil); err != nil {
			return err
		}
		if err := c.Rcpt("rcpt@example.org", nil); err != nil {
			t.Fatal(err)
		}
		w, err := c.Data()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, "From: "+header+"\r\nSubject: t\r\n\r\nx\r\n"); err != nil {
			t.Fatal(err)
		}
		return w.Close()
	}
	wantCode(t, send("app@example.com", "CEO <ceo@bank.example>"), 550, smtp.EnhancedCode{5, 7, 1})
	if err := send("app@example.com", "App <app@example.com>"); err != nil {
		t.Fatalf("mail within the tenant's domain: %v", err)
	}
	if subs := q.got(); len(subs) != 1 || subs[0].From != "app@example.com" {
		t.Fatalf("queued %+v, want only the allowed message", subs)
	}
	if n := ts.counter(t, "outflow_submission_rejections_total", "reason", reasonNotOwned); n != 2 {
		t.Errorf("sender_not_owned rejections = %v, want 2", n)
	}
	if _, err := New(Config{Users: testUsers(t), SenderDomains: SenderDomains{"x": {"bad..example"}}}, q); err == nil {
		t.Error("a bad sender domain entry accepted")
	}
}

// TestCheckFromAnyCharset: a From whose display name is in a charset
// net/mail cannot decode (ISO-2022-JP, windows-1252) is read for its
// address, not refused as unreadable.
func TestCheckFromAnyCharset(t *testing.T) {
	p := SenderDomains{"shop": {"shop.example"}}
	for _, from := range []string{
		"=?ISO-2022-JP?B?GyRCJTclZyVDJVcbKEI=?= <info@shop.example>",
		"=?windows-1252?Q?Caf=E9?= <info@shop.example>",
	} {
		if why := p.CheckFrom("shop", []byte("From: "+from+"\r\nSubject: x\r\n\r\nbody\r\n")); why != "" {
			t.Errorf("%s: %s", from, why)
		}
	}
	if why := p.CheckFrom("shop", []byte("From: =?windows-1252?Q?Caf=E9?= <info@bank.example>\r\n\r\nx\r\n")); why == "" {
		t.Error("another domain behind an encoded name was allowed")
	}
	// A field net/mail refuses, with an allowed address in brackets and
	// another outside them, which a reader's mail program shows as the
	// sender: refused, not read as the bracketed address alone.
	for _, from := range []string{"ceo@bank.example; <a@shop.example>", "ceo@bank.example (<a@shop.example>"} {
		if why := p.CheckFrom("shop", []byte("From: "+from+"\r\n\r\nx\r\n")); !strings.Contains(why, "cannot be read") {
			t.Errorf("From: %s: %q, want it refused as unreadable", from, why)
		}
	}
}
