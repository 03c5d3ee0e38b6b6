package e2e

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/postfixinst"
	"github.com/outflow/outflow/internal/testutil"
)

// postfixStyleDSN is a failure report as Postfix mails it back, hours
// after its MX said 250, when the mailbox behind it turns out not to
// exist: to the envelope sender the message had, here outflow's return
// path.
func postfixStyleDSN(returnPath, rcpt string) []byte {
	return []byte(strings.ReplaceAll(`From: MAILER-DAEMON@mbox.dest.test (Mail Delivery System)
Subject: Undelivered Mail Returned to Sender
To: `+returnPath+`
Auto-Submitted: auto-replied
MIME-Version: 1.0
Content-Type: multipart/report; report-type=delivery-status;
	boundary="8E1F2C0E5A.1733490000/mbox.dest.test"
Message-Id: <20261206120000.8E1F2C0E5A@mbox.dest.test>

This is a MIME-encapsulated message.

--8E1F2C0E5A.1733490000/mbox.dest.test
Content-Description: Notification
Content-Type: text/plain; charset=us-ascii

I'm sorry to have to inform you that your message could not
be delivered to one or more recipients.

--8E1F2C0E5A.1733490000/mbox.dest.test
Content-Description: Delivery report
Content-Type: message/delivery-status

Reporting-MTA: dns; mbox.dest.test
X-Postfix-Queue-ID: 8E1F2C0E5A
X-Postfix-Sender: rfc822; `+returnPath+`
Arrival-Date: Sun,  6 Dec 2026 12:00:00 +0000 (UTC)

Final-Recipient: rfc822; `+rcpt+`
Original-Recipient: rfc822;`+rcpt+`
Action: failed
Status: 5.1.1
Remote-MTA: dns; store.dest.test
Diagnostic-Code: smtp; 550 5.1.1 <`+rcpt+`>: Recipient address rejected: User
    unknown in virtual mailbox table

--8E1F2C0E5A.1733490000/mbox.dest.test
Content-Description: Undelivered Message Headers
Content-Type: text/rfc822-headers

From: app@sender.test
Subject: test later

--8E1F2C0E5A.1733490000/mbox.dest.test--
`, "\n", "\r\n"))
}

// TestAsyncBounceThroughReturnPath: with a return path, outflow sends a
// tenant's mail with MAIL FROM b.<id>...@<return-path domain>; the
// destination takes it (250) and mails a failure report to that address
// later. The bounce listener takes the report, records a bounced event
// marked async on the envelope (`queue history`), suppresses the
// recipient for the tenant (`suppress list`, and the next submission to
// it is refused), and counts it; an address that is not a return path is
// refused at RCPT, and the sender gets a failure notice from outflow, as
// it would have without the return path. Mail to postmaster@ the
// return-path domain is forwarded to the operator's --postmaster address,
// from the null sender.
func TestAsyncBounceThroughReturnPath(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{})
	dir := t.TempDir()
	bounceAddr := freeAddr(t)
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none",
		"--return-path", "rp.sender.test", "--bounce-addr", bounceAddr, "--postmaster", "ops@operator.test", "--dsn=true")

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	if err := submit(c, "app@sender.test", []string{"gone@dest.test", "ok@dest.test"}, message("later", "")); err != nil {
		t.Fatal(err)
	}
	// One transaction per recipient, each with a return path of its own:
	// a recipient cannot report another bounced.
	var m, other fakemx.Message
	waitFor(t, 60*time.Second, "the two deliveries", func() bool {
		for _, fm := range mx.Messages() {
			switch {
			case len(fm.Rcpts) != 1:
				t.Fatalf("a transaction for %v; want one per recipient", fm.Rcpts)
			case fm.Rcpts[0] == "gone@dest.test":
				m = fm
			case fm.Rcpts[0] == "ok@dest.test":
				other = fm
			}
		}
		return m.From != "" && other.From != ""
	})
	if m.From == other.From {
		t.Fatalf("both recipients' copies went out with return path %s", m.From)
	}
	returnPath := m.From
	local, domain, _ := strings.Cut(returnPath, "@")
	parts := strings.Split(local, ".")
	if domain != "rp.sender.test" || len(parts) != 4 || parts[0] != "b" {
		t.Fatalf("MAIL FROM %q, want b.<id>.<minute>.<mac>@rp.sender.test", returnPath)
	}
	id := parts[1]
	if !strings.Contains(string(m.Data), "From: app@sender.test") {
		t.Fatal("the message's own From changed")
	}
	waitFor(t, 30*time.Second, "the delivered event", func() bool {
		return strings.Contains(d.cli(t, "queue", "history", id), "delivered")
	})

	send := func(to string, body []byte) error {
		mc, err := smtp.Dial(bounceAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer mc.Close()
		if err := mc.Hello("mbox.dest.test"); err != nil {
			t.Fatal(err)
		}
		return testutil.Send(mc, "", []string{to}, body)
	}
	var se *smtp.SMTPError
	forged := "b." + id + "." + parts[2] + ".aaaaaaaaaaaaaaaa@rp.sender.test"
	if err := send(forged, postfixStyleDSN(forged, "ok@dest.test")); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("a forged return path answered %v, want 550", err)
	}
	if err := send(returnPath, postfixStyleDSN(returnPath, "gone@dest.test")); err != nil {
		t.Fatalf("the report answered %v, want 250", err)
	}

	// Recorded before the 250: no waiting.
	hist := d.cli(t, "queue", "history", id, "--json")
	var bounced string
	for _, line := range strings.Split(hist, "\n") {
		if strings.Contains(line, `"type":"bounced"`) {
			bounced = line
		}
	}
	for _, want := range []string{`"async":true`, `"recipients":["gone@dest.test"]`, "User unknown in virtual mailbox table", `"tenant":"` + testUser + `"`} {
		if !strings.Contains(bounced, want) {
			t.Fatalf("bounced event lacks %s:\n%s", want, hist)
		}
	}
	text := d.cli(t, "queue", "history", id)
	if !strings.Contains(text, "later, gone@dest.test: 550 5.1.1") {
		t.Fatalf("queue history does not show the later bounce:\n%s", text)
	}
	if list := d.cli(t, "suppress", "list", "--tenant", testUser, "--json"); !strings.Contains(list, "gone@dest.test") ||
		!strings.Contains(list, `"source":"bounce"`) || strings.Contains(list, "ok@dest.test") {
		t.Fatalf("suppress list:\n%s", list)
	}
	// The sender hears of it as it would have without the return path: a
	// failure notice from outflow, queued before the 250, with the remote
	// server's diagnostic and the header it returned.
	waitFor(t, 60*time.Second, "the sender's notice", func() bool {
		for _, fm := range mx.Messages() {
			if len(fm.Rcpts) == 1 && fm.Rcpts[0] == "app@sender.test" {
				body := string(fm.Data)
				for _, want := range []string{"Final-Recipient: rfc822; gone@dest.test", "Action: failed", "Status: 5.1.1",
					"Remote-MTA: dns; store.dest.test", "User unknown in virtual mailbox table", "which reported\r\nlater",
					"Subject: test later"} {
					if fm.From != "" || !strings.Contains(body, want) {
						t.Fatalf("notice from %q lacks %q:\n%s", fm.From, want, body)
					}
				}
				if strings.Contains(body, "ok@dest.test") {
					t.Fatalf("the delivered recipient is in the notice:\n%s", body)
				}
				return true
			}
		}
		return false
	})
	waitFor(t, 30*time.Second, "the notice in the original's history", func() bool {
		return strings.Contains(d.cli(t, "queue", "history", id), "failed notice ")
	})
	// What became of mail to gone@: found by address, in any case.
	found := d.cli(t, "queue", "find", "GONE@dest.test")
	for _, want := range []string{"queued", "delivered", "bounced", "dsn"} {
		if !slices.ContainsFunc(strings.Split(found, "\n"), func(l string) bool {
			f := strings.Fields(l)
			return len(f) > 2 && f[1] == want && f[2] == id
		}) {
			t.Fatalf("queue find shows no %s event of %s:\n%s", want, id, found)
		}
	}
	if !strings.Contains(found, "User unknown") || !strings.Contains(found, "4 event(s) of") {
		t.Fatalf("queue find:\n%s", found)
	}
	if found := d.cli(t, "queue", "find", "gone@dest.test", "--type", "bounced", "--json"); strings.Count(found, "\n") != 1 ||
		!strings.Contains(found, `"type":"bounced"`) || !strings.Contains(found, `"async":true`) {
		t.Fatalf("queue find --type bounced --json:\n%s", found)
	}
	if found := d.cli(t, "queue", "find", "gone@dest.test", "--tenant", "someone-else"); strings.Contains(found, id) {
		t.Fatalf("queue find of another tenant:\n%s", found)
	}
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("gone@dest.test", nil); !errors.As(err, &se) || se.Code != 550 {
		t.Fatalf("RCPT of the bounced recipient: %v", err)
	}
	_ = c.Reset()

	if err := send("postmaster@rp.sender.test", []byte("From: admin@isp.test\r\nSubject: about your mail\r\n\r\nPlease call.\r\n")); err != nil {
		t.Fatalf("mail to the postmaster: %v", err)
	}
	waitFor(t, 60*time.Second, "the postmaster's mail forwarded", func() bool {
		for _, fm := range mx.Messages() {
			if len(fm.Rcpts) == 1 && fm.Rcpts[0] == "ops@operator.test" {
				if fm.From != "" || !strings.Contains(string(fm.Data), "Content-Type: message/rfc822\r\n\r\nFrom: admin@isp.test\r\n") ||
					!strings.Contains(string(fm.Data), "Please call.") || !strings.HasPrefix(string(fm.Data), "Received: ") {
					t.Fatalf("forwarded from %q:\n%s", fm.From, fm.Data)
				}
				return true
			}
		}
		return false
	})
	m2 := scrapeNoFatal(d)
	if m2[`outflow_bounces_received_total{result="bounced"}`] != 1 || m2[`outflow_bounces_received_total{result="refused"}`] != 1 ||
		m2[`outflow_bounces_received_total{result="forwarded"}`] != 1 {
		t.Fatalf("metrics: bounced %v, refused %v, forwarded %v", m2[`outflow_bounces_received_total{result="bounced"}`],
			m2[`outflow_bounces_received_total{result="refused"}`], m2[`outflow_bounces_received_total{result="forwarded"}`])
	}
}

// TestPostfixBouncesLaterToTheReturnPath: the whole path with a real MTA
// writing the report. outflow relays to a Postfix that takes both
// recipients (250) and passes the message on to the next hop, a fake MX
// that refuses one of them with 550 5.1.1. Postfix then mails its own
// non-delivery report to the envelope sender it was given, outflow's
// return path, which its transport table routes to outflow's bounce
// listener. outflow records the bounce, marked async, suppresses the
// refused recipient, not the delivered one, and sends the application's
// sender a failure notice through Postfix, and the success notice another
// recipient asked for, which Postfix reported to the return path.
func TestPostfixBouncesLaterToTheReturnPath(t *testing.T) {
	next := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "gone@dest.test: no such mailbox here"}
		}
		return nil
	}})
	bounceAddr := freeAddr(t)
	pf := startPostfixWith(t, func(string) map[string]string {
		return map[string]string{
			"transport_maps": "inline:{ dest.test=smtp:" + postfixinst.RelayHost(next.Addr()) +
				", sender.test=smtp:" + postfixinst.RelayHost(next.Addr()) +
				", rp.sender.test=smtp:" + postfixinst.RelayHost(bounceAddr) + " }",
			"smtp_tls_security_level": "none",
		}
	}, nil)
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", pf.Addr, "--relay-tls", "none",
		"--return-path", "rp.sender.test", "--bounce-addr", bounceAddr, "--dsn=true")

	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	// kept@ asks for a success notice, which Postfix owes (it offers DSN,
	// so outflow hands NOTIFY on) and mails to the return path when it
	// relays to a next hop without DSN.
	if err := c.Mail("app@sender.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("gone@dest.test", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Rcpt("kept@dest.test", &smtp.RcptOptions{Notify: []smtp.DSNNotify{smtp.DSNNotifySuccess, smtp.DSNNotifyFailure}}); err != nil {
		t.Fatal(err)
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(message("via-postfix", "")); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	// Each recipient's copy went in a transaction of its own, with a
	// return path of its own: kept@'s reached the next hop (gone@'s was
	// refused there at RCPT). The sender's failure notice may get there
	// first: Postfix delivers its queue in no set order.
	var id, keptFrom string
	waitFor(t, 60*time.Second, "the message at the next hop", func() bool {
		for _, m := range next.Messages() {
			if slices.Contains(m.Rcpts, "gone@dest.test") || slices.Contains(m.Rcpts, "kept@dest.test") && len(m.Rcpts) != 1 {
				t.Fatalf("the next hop got a message for %v; want kept@dest.test's alone", m.Rcpts)
			}
			if len(m.Rcpts) == 1 && m.Rcpts[0] == "kept@dest.test" {
				keptFrom = m.From
				local, _, _ := strings.Cut(m.From, "@")
				if parts := strings.Split(local, "."); len(parts) == 4 {
					id = parts[1]
				}
				return true
			}
		}
		return false
	})
	if id == "" {
		t.Fatalf("the next hop saw MAIL FROM %q, not a return path", keptFrom)
	}
	pf.waitLog(t, "sender non-delivery notification")
	var goneID string
	waitFor(t, 60*time.Second, "the later bounce in gone@'s history", func() bool {
		out := d.cli(t, "queue", "find", "gone@dest.test", "--type", "bounced", "--json")
		var ev struct {
			ID, Reason string
			Async      bool
		}
		for _, l := range strings.Split(out, "\n") {
			if json.Unmarshal([]byte(l), &ev) == nil && ev.Async && strings.Contains(ev.Reason, "550 5.1.1 gone@dest.test") {
				goneID = ev.ID
				return true
			}
		}
		return false
	})
	if goneID == id || strings.Contains(d.cli(t, "queue", "history", id), "gone@dest.test") {
		t.Fatalf("gone@ and kept@ shared envelope %s", id)
	}
	if h := d.cli(t, "queue", "history", goneID); !strings.Contains(h, "later, gone@dest.test: 550 5.1.1") {
		t.Fatalf("gone@'s history:\n%s", h)
	}
	list := d.cli(t, "suppress", "list", "--tenant", testUser, "--json")
	if !strings.Contains(list, "gone@dest.test") || strings.Contains(list, "kept@dest.test") {
		t.Fatalf("suppress list:\n%s", list)
	}
	if m := scrapeNoFatal(d); m[`outflow_bounces_received_total{result="bounced"}`] != 1 {
		t.Fatalf("bounces received: %v", m[`outflow_bounces_received_total{result="bounced"}`])
	}
	// outflow's notices to the sender, relayed through Postfix to the next
	// hop: the failure with Postfix's diagnostic, and the success report
	// kept@ asked for, which Postfix sent as "relayed".
	var failed, relayed string
	nRelayed := 0
	waitFor(t, 60*time.Second, "the sender's two notices at the next hop", func() bool {
		nRelayed = 0
		for _, fm := range next.Messages() {
			if len(fm.Rcpts) != 1 || fm.Rcpts[0] != "app@sender.test" {
				continue
			}
			if fm.From != "" {
				t.Fatalf("a notice from %q:\n%s", fm.From, fm.Data)
			}
			switch body := string(fm.Data); {
			case strings.Contains(body, "Action: failed"):
				failed = body
			case strings.Contains(body, "Action: relayed"):
				relayed = body
				nRelayed++
			}
		}
		return failed != "" && relayed != ""
	})
	// The relayed notice is Postfix's report passed on by the bounce
	// listener, not one outflow wrote at delivery (Postfix took NOTIFY).
	hist := d.cli(t, "queue", "history", id, "--json")
	if nRelayed != 1 || !slices.ContainsFunc(strings.Split(hist, "\n"), func(l string) bool {
		return strings.Contains(l, `"type":"dsn"`) && strings.Contains(l, `"reason":"relayed notice `) && strings.Contains(l, `/bounce"`)
	}) {
		t.Fatalf("%d relayed notices; the history names none from the bounce listener:\n%s", nRelayed, hist)
	}
	if !strings.Contains(failed, "Final-Recipient: rfc822; gone@dest.test") || !strings.Contains(failed, "no such mailbox here") ||
		strings.Contains(failed, "kept@dest.test") {
		t.Fatalf("failure notice:\n%s", failed)
	}
	if !strings.Contains(relayed, "Final-Recipient: rfc822; kept@dest.test") || strings.Contains(relayed, "gone@dest.test") {
		t.Fatalf("success notice:\n%s", relayed)
	}
}
