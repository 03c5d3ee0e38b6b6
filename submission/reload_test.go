package submission

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
	"golang.org/x/crypto/bcrypt"
)

// usersWith is a Users of name:password pairs at bcrypt's minimum cost.
func usersWith(t *testing.T, pairs ...string) *Users {
	t.Helper()
	var b strings.Builder
	for i := 0; i+1 < len(pairs); i += 2 {
		h, err := bcrypt.GenerateFromPassword([]byte(pairs[i+1]), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		b.WriteString(pairs[i] + ":" + string(h) + "\n")
	}
	u, err := ParseUsers(strings.NewReader(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestReloadedUsers: the users file read again (SetUsers) takes effect at
// once, without a restart: a new password and a new account authenticate,
// the old password does not, and a session that authenticated with
// credentials since changed or removed is asked to authenticate again at
// its next MAIL. Before, revoking a compromised SMTP account took a
// restart of the daemon, every client's session cut with it, and its open
// session sent on until then.
func TestReloadedUsers(t *testing.T) {
	q := &fakeQueue{}
	ts := startServer(t, Config{Users: usersWith(t, "alice", "old-secret", "bob", "bob-secret")}, q)
	auth := func(user, password string) (*smtp.Client, error) {
		c := ts.dial(t)
		return c, c.Auth(sasl.NewPlainClient("", user, password))
	}
	alice, err := auth("alice", "old-secret")
	if err != nil {
		t.Fatal(err)
	}
	bob, err := auth("bob", "bob-secret")
	if err != nil {
		t.Fatal(err)
	}
	carolBefore := ts.dial(t)
	if err := carolBefore.Auth(sasl.NewPlainClient("", "carol", "carol-secret")); err == nil {
		t.Fatal("carol authenticated before she was added")
	}

	if err := ts.srv.SetUsers(usersWith(t, "alice", "new-secret", "carol", "carol-secret")); err != nil {
		t.Fatal(err)
	}
	if _, err := auth("alice", "old-secret"); err == nil {
		t.Fatal("alice's old password still authenticates")
	}
	if _, err := auth("alice", "new-secret"); err != nil {
		t.Fatalf("alice's new password: %v", err)
	}
	if _, err := auth("carol", "carol-secret"); err != nil {
		t.Fatalf("carol, added: %v", err)
	}
	if _, err := auth("bob", "bob-secret"); err == nil {
		t.Fatal("bob, removed, still authenticates")
	}
	for name, c := range map[string]*smtp.Client{"alice (password changed)": alice, "bob (removed)": bob} {
		se := wantCode(t, c.Mail("app@example.com", nil), 421, smtp.EnhancedCode{4, 7, 0})
		if !strings.Contains(se.Message, "credentials have changed") {
			t.Fatalf("%s: %q", name, se.Message)
		}
		// The connection has ended: nothing more is sent on it.
		if err := c.Mail("app@example.com", nil); err == nil {
			t.Fatalf("%s: MAIL accepted on the session after the 421", name)
		}
	}
	if len(q.got()) != 0 {
		t.Fatalf("%d messages queued", len(q.got()))
	}
	if n := ts.counter(t, "outflow_submission_rejections_total", "reason", "auth_revoked"); n != 2 {
		t.Fatalf("auth_revoked rejections %v, want 2", n)
	}
	if err := ts.srv.SetUsers(nil); err == nil {
		t.Fatal("SetUsers(nil) accepted")
	}
}

// TestReloadWithAuthOff: a server without users (trusted networks only)
// refuses accounts on a reload: AUTH was never offered.
func TestReloadWithAuthOff(t *testing.T) {
	ts := startServer(t, Config{TrustedNetworks: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}}, &fakeQueue{})
	if err := ts.srv.SetUsers(usersWith(t, "alice", "x")); err == nil {
		t.Fatal("accounts set on a server without AUTH")
	}
}

// TestUsersDiff: what a reload changed, for its log line.
func TestUsersDiff(t *testing.T) {
	older := usersWith(t, "alice", "a", "bob", "b", "dave", "d")
	newer := usersWith(t, "alice", "a2", "carol", "c", "dave", "d")
	newer.hashes["dave"] = older.hashes["dave"]
	added, removed, changed := newer.Diff(older)
	if strings.Join(added, ",") != "carol" || strings.Join(removed, ",") != "bob" || strings.Join(changed, ",") != "alice" {
		t.Fatalf("added %v, removed %v, changed %v", added, removed, changed)
	}
}
