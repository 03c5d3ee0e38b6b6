package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestHardBounceSuppresses: a recipient the MX refuses with 550 5.1.1 is
// put on the tenant's suppression list by itself; the tenant's next
// message to it is refused at RCPT with 550 5.7.1 while the other
// recipient goes on; `suppress list` shows it with the reply, and `suppress
// remove` lifts it.
func TestHardBounceSuppresses(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user here"}
		}
		return nil
	}})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none")
	cli := func(args ...string) string {
		t.Helper()
		return adminCLI(t, d.Data, args...)
	}

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	if err := submit(c, "app@sender.test", []string{"gone@dest.test"}, message("first", "")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the bounce to suppress gone@dest.test", func() bool {
		return strings.Contains(cli("suppress", "list", "--tenant", testUser), "gone@dest.test")
	})
	if list := cli("suppress", "list", "--json"); !strings.Contains(list, `"source":"bounce"`) || !strings.Contains(list, "no such user here") {
		t.Fatalf("suppress list --json:\n%s", list)
	}

	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	var se *smtp.SMTPError
	if err := c.Rcpt("gone@dest.test", nil); !errors.As(err, &se) || se.Code != 550 || se.EnhancedCode != (smtp.EnhancedCode{5, 7, 1}) ||
		!strings.Contains(se.Message, "suppressed") {
		t.Fatalf("RCPT of a suppressed recipient: %v", err)
	}
	if err := c.Rcpt("ok@dest.test", nil); err != nil {
		t.Fatalf("the other recipient: %v", err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}

	cli("suppress", "remove", "gone@dest.test", "--tenant", testUser)
	if list := cli("suppress", "list"); strings.Contains(list, "gone@dest.test") {
		t.Fatalf("still listed after remove:\n%s", list)
	}
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("gone@dest.test", nil); err != nil {
		t.Fatalf("RCPT after suppress remove: %v", err)
	}
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}

	// An operator's entry with an expiry applies the same way.
	cli("suppress", "add", "later@dest.test", "--tenant", testUser, "--reason", "unsubscribed", "--for", "1h")
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("later@dest.test", nil); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("RCPT of an added suppression: %v", err)
	}
}
