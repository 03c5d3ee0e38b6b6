package e2e

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// parseReportPy reads one message on stdin with Python's email package and
// prints what a mail client sees of a delivery status notification: the
// content type and report-type, each part's type, the delivery-status
// groups as dictionaries, and the returned original's Subject.
const parseReportPy = `
import email, json, sys
from email import policy
msg = email.message_from_bytes(sys.stdin.buffer.read(), policy=policy.default)
out = {"type": msg.get_content_type(), "report_type": msg.get_param("report-type"),
       "from": msg["From"], "auto_submitted": msg["Auto-Submitted"], "parts": [], "groups": [], "original_subject": None}
for part in msg.iter_parts():
    ct = part.get_content_type()
    out["parts"].append(ct)
    if ct == "message/delivery-status":
        for g in part.get_payload():
            out["groups"].append({k: str(v) for k, v in g.items()})
    elif ct == "text/rfc822-headers":
        inner = email.message_from_string(part.get_content(), policy=policy.default)
        out["original_subject"] = inner["Subject"]
    elif ct == "message/rfc822":
        out["original_subject"] = part.get_payload()[0]["Subject"]
print(json.dumps(out))
`

type pyReport struct {
	Type            string              `json:"type"`
	ReportType      string              `json:"report_type"`
	From            string              `json:"from"`
	AutoSubmitted   string              `json:"auto_submitted"`
	Parts           []string            `json:"parts"`
	Groups          []map[string]string `json:"groups"`
	OriginalSubject string              `json:"original_subject"`
}

func parseWithPython(t *testing.T, msg []byte) pyReport {
	t.Helper()
	cmd := exec.Command("python3", "-c", parseReportPy)
	cmd.Stdin = bytes.NewReader(msg)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("python3: %v\n%s\nmessage:\n%s", err, errb.String(), msg)
	}
	var r pyReport
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("python output %q: %v", out.String(), err)
	}
	return r
}

// reportsTo returns the messages the MX got with a null reverse path for rcpt.
func reportsTo(mx *fakemx.Server, rcpt string) []fakemx.Message {
	var out []fakemx.Message
	for _, m := range mx.Messages() {
		if m.From == "" && len(m.Rcpts) == 1 && m.Rcpts[0] == rcpt {
			out = append(out, m)
		}
	}
	return out
}

// submitDSN submits one message with DSN parameters.
func submitDSN(t *testing.T, c *smtp.Client, from string, mo *smtp.MailOptions, rcpts map[string]*smtp.RcptOptions, order []string, body []byte) string {
	t.Helper()
	if err := c.Mail(from, mo); err != nil {
		t.Fatal(err)
	}
	for _, r := range order {
		if err := c.Rcpt(r, rcpts[r]); err != nil {
			t.Fatal(err)
		}
	}
	w, err := c.Data()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(body); err != nil {
		t.Fatal(err)
	}
	resp, err := w.CloseWithResponse()
	if err != nil {
		t.Fatal(err)
	}
	_, id, _ := strings.Cut(resp.StatusText, "queued as ")
	return strings.Fields(id)[0]
}

func notify(n ...smtp.DSNNotify) *smtp.RcptOptions { return &smtp.RcptOptions{Notify: n} }

// TestDSNFailureReport: a recipient refused with 550 produces one RFC 3464
// report to the envelope sender at the MX, with a null reverse path, that
// Python's email package reads as multipart/report; report-type=
// delivery-status with the fields RFC 3464 asks for; the original's
// history names the report's queue id, and outflow_dsn_total counts it. A
// message to two domains that both refuse gets one report for both.
func TestDSNFailureReport(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone@") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user here"}
		}
		return nil
	}})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--dsn=true", "--hostname", "mta.outflow.test")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	id := submitDSN(t, c, "app@sender.test", &smtp.MailOptions{EnvelopeID: "order-77", Return: smtp.DSNReturnHeaders},
		map[string]*smtp.RcptOptions{"gone@dest.test": {OriginalRecipientType: smtp.DSNAddressTypeRFC822, OriginalRecipient: "Gone@Dest.test"}},
		[]string{"gone@dest.test", "ok@dest.test"}, message("fail1", ""))

	waitFor(t, 60*time.Second, "the failure report at the MX", func() bool { return len(reportsTo(mx, "app@sender.test")) == 1 })
	r := parseWithPython(t, reportsTo(mx, "app@sender.test")[0].Data)
	if r.Type != "multipart/report" || r.ReportType != "delivery-status" {
		t.Fatalf("content type %q report-type %q", r.Type, r.ReportType)
	}
	if strings.Join(r.Parts, ",") != "text/plain,message/delivery-status,text/rfc822-headers" {
		t.Fatalf("parts %v", r.Parts)
	}
	// From this host: no DKIM key signs sender.test here, and a notice
	// from MAILER-DAEMON@sender.test would fail its DMARC.
	if !strings.Contains(r.From, "MAILER-DAEMON@mta.outflow.test") || r.AutoSubmitted != "auto-replied" {
		t.Errorf("From %q Auto-Submitted %q", r.From, r.AutoSubmitted)
	}
	if r.OriginalSubject != "test fail1" {
		t.Errorf("returned header's Subject %q", r.OriginalSubject)
	}
	if len(r.Groups) != 2 {
		t.Fatalf("delivery-status groups %v, want the message's and one recipient's", r.Groups)
	}
	msgFields, rc := r.Groups[0], r.Groups[1]
	if msgFields["Reporting-MTA"] != "dns; mta.outflow.test" || msgFields["Original-Envelope-Id"] != "order-77" || msgFields["Arrival-Date"] == "" {
		t.Errorf("per-message fields %v", msgFields)
	}
	for k, v := range map[string]string{
		"Final-Recipient": "rfc822; gone@dest.test", "Original-Recipient": "rfc822;Gone@Dest.test", "Action": "failed",
		"Status": "5.1.1", "Diagnostic-Code": "smtp; 550 5.1.1 no such user here",
	} {
		if rc[k] != v {
			t.Errorf("%s = %q, want %q (all: %v)", k, rc[k], v, rc)
		}
	}
	if rc["Remote-MTA"] == "" || rc["Last-Attempt-Date"] == "" {
		t.Errorf("Remote-MTA %q Last-Attempt-Date %q", rc["Remote-MTA"], rc["Last-Attempt-Date"])
	}

	hist, err := runCLI(t, "queue", "history", id, "--data", d.Data)
	if err != nil {
		t.Fatalf("queue history: %v\n%s", err, hist)
	}
	if !strings.Contains(hist, "dsn") || !strings.Contains(hist, "failed notice k") {
		t.Errorf("queue history %s does not show the report:\n%s", id, hist)
	}
	if got := d.scrape(t)[`outflow_dsn_total{action="failed"}`]; got != 1 {
		t.Errorf("outflow_dsn_total{action=failed} = %v", got)
	}
	// The report itself was delivered: nothing answered it, and the
	// recipient was suppressed by the same bounce.
	if n := len(mx.Messages()); n != 2 {
		t.Errorf("the MX got %d messages, want the original (ok@) and one report", n)
	}
	out, err := runCLI(t, "suppress", "list", "--tenant", testUser, "--data", d.Data)
	if err != nil || !strings.Contains(out, "gone@dest.test") {
		t.Errorf("suppress list: %v\n%s", err, out)
	}

	// One message to two domains, both refusing: two envelopes, delivered
	// apart, and one report listing both recipients.
	submitDSN(t, c, "multi@sender.test", nil, nil, []string{"gone@one.test", "gone@two.test"}, message("fail2", ""))
	waitFor(t, 60*time.Second, "both parts bounced", func() bool {
		return d.scrape(t)[`outflow_bounced_recipients_total`] == 3
	})
	waitFor(t, 60*time.Second, "the report for both at the MX", func() bool { return len(reportsTo(mx, "multi@sender.test")) == 1 })
	if got := d.scrape(t)[`outflow_dsn_total{action="failed"}`]; got != 2 {
		t.Errorf("outflow_dsn_total{action=failed} = %v, want one more for the two-domain message", got)
	}
	r = parseWithPython(t, reportsTo(mx, "multi@sender.test")[0].Data)
	var finals []string
	for _, g := range r.Groups[1:] {
		if g["Action"] != "failed" || g["Status"] != "5.1.1" {
			t.Errorf("recipient group %v", g)
		}
		finals = append(finals, g["Final-Recipient"])
	}
	if r.Type != "multipart/report" || strings.Join(finals, ",") != "rfc822; gone@one.test,rfc822; gone@two.test" {
		t.Fatalf("the two-domain report is %q listing %v", r.Type, finals)
	}
}

// TestDSNNotifyAndNullSender: NOTIFY=NEVER and a null reverse path get no
// report; NOTIFY=SUCCESS gets a "relayed" notice, since the MX does not
// offer DSN (RFC 3461 §6.2.2).
func TestDSNNotifyAndNullSender(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "gone") {
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 1, 1}, Message: "no such user here"}
		}
		return nil
	}})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--dsn=true")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()

	submitDSN(t, c, "never@sender.test", nil, map[string]*smtp.RcptOptions{"gone1@dest.test": notify(smtp.DSNNotifyNever)},
		[]string{"gone1@dest.test"}, message("never", ""))
	submitDSN(t, c, "", nil, nil, []string{"gone2@dest.test"}, message("null", ""))
	waitFor(t, 60*time.Second, "both bounces decided", func() bool {
		m := d.scrape(t)
		return m[`outflow_dsn_skipped_total{reason="notify"}`] == 1 && m[`outflow_dsn_skipped_total{reason="null-sender"}`] == 1
	})

	submitDSN(t, c, "app@sender.test", nil, map[string]*smtp.RcptOptions{"ok@dest.test": notify(smtp.DSNNotifySuccess, smtp.DSNNotifyFailure)},
		[]string{"ok@dest.test"}, message("success", ""))
	waitFor(t, 60*time.Second, "the success notice", func() bool { return len(reportsTo(mx, "app@sender.test")) == 1 })
	r := parseWithPython(t, reportsTo(mx, "app@sender.test")[0].Data)
	if r.Type != "multipart/report" || len(r.Groups) != 2 || r.Groups[1]["Action"] != "relayed" ||
		r.Groups[1]["Final-Recipient"] != "rfc822; ok@dest.test" || !strings.HasPrefix(r.Groups[1]["Status"], "2.") {
		t.Fatalf("success notice %+v", r)
	}
	for _, m := range mx.Messages() {
		if m.From == "" && (m.Rcpts[0] == "never@sender.test" || m.Rcpts[0] == "") {
			t.Fatalf("a report went to %v", m.Rcpts)
		}
	}
	if n := len(mx.Messages()); n != 2 {
		t.Errorf("the MX got %d messages, want the success message and its notice", n)
	}
	if got := d.scrape(t)[`outflow_dsn_total{action="relayed"}`]; got != 1 {
		t.Errorf("outflow_dsn_total{action=relayed} = %v", got)
	}
}

// TestDSNPassedToNextHop: a next hop that offers DSN receives NOTIFY,
// ORCPT, RET and ENVID, and outflow sends no notice of its own for
// NOTIFY=SUCCESS: the next hop owes it.
func TestDSNPassedToNextHop(t *testing.T) {
	mx := fakemx.Start(t, fakemx.Options{DSN: true})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--dsn=true")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	submitDSN(t, c, "app@sender.test", &smtp.MailOptions{Return: smtp.DSNReturnFull, EnvelopeID: "env+1"},
		map[string]*smtp.RcptOptions{"ok@dest.test": {Notify: []smtp.DSNNotify{smtp.DSNNotifySuccess, smtp.DSNNotifyDelayed},
			OriginalRecipientType: smtp.DSNAddressTypeRFC822, OriginalRecipient: "Orig@dest.test"}},
		[]string{"ok@dest.test"}, message("passed", ""))
	if err := mx.WaitForMessages(1, 60*time.Second); err != nil {
		t.Fatal(err)
	}
	m := mx.Messages()[0]
	if m.Ret != smtp.DSNReturnFull || m.EnvID != "env+1" {
		t.Errorf("RET %q ENVID %q at the next hop", m.Ret, m.EnvID)
	}
	o := m.RcptOpts[0]
	if len(o.Notify) != 2 || o.Notify[0] != smtp.DSNNotifySuccess || o.Notify[1] != smtp.DSNNotifyDelayed || o.OriginalRecipient != "Orig@dest.test" {
		t.Errorf("RCPT options at the next hop %+v", o)
	}
	waitFor(t, 30*time.Second, "the delivery recorded", func() bool {
		return d.scrape(t)[`outflow_delivered_recipients_total`] == 1
	})
	if got := d.scrape(t)[`outflow_dsn_total{action="relayed"}`]; got != 0 || len(mx.Messages()) != 1 {
		t.Errorf("outflow sent its own notice (%v) to a next hop that offers DSN; MX has %d messages", got, len(mx.Messages()))
	}
}

// TestDSNDelayWarningOnce: a message to two domains, both deferred past
// dsn-delay-warning, gets one "delayed" notice listing both recipients,
// whatever the number of deferrals after it, and is then delivered.
func TestDSNDelayWarningOnce(t *testing.T) {
	var open atomic.Bool
	var deferrals atomic.Int32
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && strings.HasPrefix(arg, "slow@") && !open.Load() {
			deferrals.Add(1)
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try again later"}
		}
		return nil
	}})
	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--relay", mx.Addr(), "--relay-tls", "none", "--dsn=true",
		"--dsn-delay-warning", "2s", "--retry-base", "300ms", "--retry-min", "300ms", "--retry-cap", "600ms")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	submitDSN(t, c, "app@sender.test", nil, nil, []string{"slow@dest.test", "slow@other.test"}, message("slow", ""))

	waitFor(t, 60*time.Second, "the delay warning", func() bool { return len(reportsTo(mx, "app@sender.test")) == 1 })
	r := parseWithPython(t, reportsTo(mx, "app@sender.test")[0].Data)
	if r.Type != "multipart/report" || len(r.Groups) != 3 {
		t.Fatalf("delay warning %+v", r)
	}
	var listed []string
	for _, g := range r.Groups[1:] {
		if g["Action"] != "delayed" || g["Will-Retry-Until"] == "" || g["Status"] != "4.3.0" ||
			g["Diagnostic-Code"] != "smtp; 451 4.3.0 try again later" {
			t.Fatalf("delay warning %+v", r)
		}
		listed = append(listed, g["Final-Recipient"])
	}
	if !slices.Contains(listed, "rfc822; slow@dest.test") || !slices.Contains(listed, "rfc822; slow@other.test") {
		t.Fatalf("delay warning lists %v", listed)
	}
	after := deferrals.Load()
	waitFor(t, 60*time.Second, "three more deferrals after the warning", func() bool { return deferrals.Load() >= after+3 })
	open.Store(true)
	waitFor(t, 60*time.Second, "the deliveries", func() bool {
		n := 0
		for _, m := range mx.Messages() {
			if m.From == "app@sender.test" {
				n++
			}
		}
		return n == 2
	})
	if n := len(reportsTo(mx, "app@sender.test")); n != 1 {
		t.Fatalf("%d delay warnings, want 1", n)
	}
	if got := d.scrape(t)[`outflow_dsn_total{action="delayed"}`]; got != 1 {
		t.Errorf("outflow_dsn_total{action=delayed} = %v", got)
	}
}
