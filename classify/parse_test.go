package classify

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		raw      string
		code     int
		enhanced string
		text     string
		stage    Stage
		event    Event
	}{
		{"250 2.0.0 OK 1376056636 i3si9508927obz.16 - gsmtp", 250, "2.0.0", "OK 1376056636 i3si9508927obz.16 - gsmtp", 0, 0},
		{"250 Queued mail for delivery", 250, "", "Queued mail for delivery", 0, 0},
		{"250", 250, "", "", 0, 0},
		{"  550 5.1.1 user unknown\r\n", 550, "5.1.1", "user unknown", 0, 0},
		{"550 #5.1.0 Address rejected", 550, "5.1.0", "Address rejected", 0, 0},
		{"552 1 Requested mail action aborted, mailbox not found", 552, "", "1 Requested mail action aborted, mailbox not found", 0, 0},
		{"451 4.16.1 odd but valid", 451, "4.16.1", "odd but valid", 0, 0},
		{"451 4.1234.1 too long", 451, "", "4.1234.1 too long", 0, 0},
		{"451 3.1.1 bad class", 451, "", "3.1.1 bad class", 0, 0},
		{"421 - [Too many sessions opened]", 421, "", "[Too many sessions opened]", 0, 0},
		{"421 4.4.5 - Too many connections from your host", 421, "4.4.5", "Too many connections from your host", 0, 0},
		// Multi-line, as sent (RFC 5321 4.2.1) and as flattened by a log.
		{"250-mx.example.com\r\n250-PIPELINING\r\n250 SIZE 1000", 250, "", "mx.example.com PIPELINING SIZE 1000", 0, 0},
		{"554-gmx.net (mxgmx017) Nemesis ESMTP Service not available 554-No SMTP service 554-Bad DNS PTR resource record. 554 For explanation visit http://postmaster.gmx.com/en/error-messages?ip=94.23.55.190&c=rdns",
			554, "", "gmx.net (mxgmx017) Nemesis ESMTP Service not available No SMTP service Bad DNS PTR resource record. For explanation visit http://postmaster.gmx.com/en/error-messages?ip=94.23.55.190&c=rdns", 0, 0},
		{"552-5.2.2 The recipient's inbox is out of storage space and inactive. Please 552-5.2.2 direct the recipient to 552 5.2.2 https://support.google.com/mail/?p=OverQuotaPerm c2-202229zmZBNM3agi23.222 - gsmtp",
			552, "5.2.2", "The recipient's inbox is out of storage space and inactive. Please direct the recipient to https://support.google.com/mail/?p=OverQuotaPerm c2-202229zmZBNM3agi23.222 - gsmtp", 0, 0},
		{"451-216.194.173.80 is not yet authorized to deliver mail from 451 <chris@example.net> to <docs@example.com>. Please try later.",
			451, "", "216.194.173.80 is not yet authorized to deliver mail from <chris@example.net> to <docs@example.com>. Please try later.", 0, 0},
		// A second digit past RFC 5321's 5, as servers send it.
		{"571 No PTR Record found. Reverse DNS required: 203.0.113.22", 571, "", "No PTR Record found. Reverse DNS required: 203.0.113.22", 0, 0},
		// Exim's diagnostics, older and 4.9x; a number after a colon
		// elsewhere is text.
		{"SMTP error from remote mail server after RCPT TO:<a@b.example>: host mx.b.example [192.0.2.1]: 550 5.1.1 User unknown",
			550, "5.1.1", "User unknown", StageRcpt, 0},
		{"SMTP error from remote server for RCPT TO command, host: mx.b.example (192.0.2.1) reason: 550 5.1.1 <a@b.example>: Recipient address rejected: User unknown",
			550, "5.1.1", "<a@b.example>: Recipient address rejected: User unknown", StageRcpt, 0},
		{"Rejected: 421 times", 0, "", "Rejected: 421 times", 0, 0},
		// Code after the text.
		{`4.7.1 Ratelimit "user" exceeded (451)`, 451, "4.7.1", `Ratelimit "user" exceeded`, 0, 0},
		{"Mailbox full [552]", 552, "", "Mailbox full", 0, 0},
		{"5.1.1 no such user 550.", 550, "5.1.1", "no such user", 0, 0},
		{"4.7.1 class disagrees (550)", 0, "4.7.1", "class disagrees (550)", 0, 0},
		// Log lines around a reply.
		{"host mx.example.com[192.0.2.1] said: 550 5.1.1 <a@example.com>: Recipient address rejected: User unknown (in reply to RCPT TO command)",
			550, "5.1.1", "<a@example.com>: Recipient address rejected: User unknown (in reply to RCPT TO command)", StageRcpt, 0},
		{"host mx.example.com[192.0.2.1] said: 451 4.3.0 Error: queue file write error (in reply to end of DATA command)",
			451, "4.3.0", "Error: queue file write error (in reply to end of DATA command)", StageDataEnd, 0},
		// Client-side reports with no reply.
		{"delivery temporarily suspended: conversation with 111.111.111.11[111.111.111.11] timed out while sending end of data -- message may be sent more than once",
			0, "", "delivery temporarily suspended: conversation with 111.111.111.11[111.111.111.11] timed out while sending end of data -- message may be sent more than once", StageDataEnd, EventTimeout},
		{"lost connection with mx.example.com[192.0.2.1] while receiving the initial server greeting", 0, "", "lost connection with mx.example.com[192.0.2.1] while receiving the initial server greeting", StageGreeting, EventConnLost},
		// Not codes.
		{"2024-05-09 something", 0, "", "2024-05-09 something", 0, 0},
		{"600 nope", 0, "", "600 nope", 0, 0},
		{"", 0, "", "", 0, 0},
	} {
		got := Parse(tc.raw)
		if got.Code != tc.code || got.Enhanced != tc.enhanced || got.Text != tc.text || got.Stage != tc.stage || got.Event != tc.event || got.Raw != tc.raw {
			t.Errorf("Parse(%q)\n got %d %q %q stage %s event %s\nwant %d %q %q stage %s event %s",
				tc.raw, got.Code, got.Enhanced, got.Text, got.Stage, got.Event, tc.code, tc.enhanced, tc.text, tc.stage, tc.event)
		}
	}
}

func TestRetryHint(t *testing.T) {
	for _, tc := range []struct {
		text string
		want time.Duration
	}{
		{"Too many messages. Try again in 92 seconds.", 92 * time.Second},
		{"please retry in 5 minutes", 5 * time.Minute},
		{"Try again after 1 hour", time.Hour},
		{"Greylisted for 5 minutes", 5 * time.Minute},
		{"greylisted for 60 seconds by ZEROSPAM", time.Minute},
		{"Please try again in a few hours and reduce the sending rate.", 2 * time.Hour},
		{"try again in 30s", 30 * time.Second},
		{"wait 2 mins", 2 * time.Minute},
		{"TRY AGAIN IN AN HOUR", time.Hour},
		{"deferred for 2 days", 48 * time.Hour},
		{"Greylisting in action, please come back in 00:24:59", 24*time.Minute + 59*time.Second},
		{"please come back in 1:02:03.", time.Hour + 2*time.Minute + 3*time.Second},
		{"come back in 00:61:00", 0},
		{"come back in 00:05:00:00", 0},
		{"retry in 12:30", 0},
		{"try again in 99999999999999999999 hours", maxHint},
		{"Messages from domains sending over 5,000 emails per day", 0},
		{"has sent to too many recipients this hour", 0},
		{"in the last 10 minutes", 0},
		{"Please try again later", 0},
		{"in 5", 0},
		{"", 0},
	} {
		if got := retryHint(tc.text); got != tc.want {
			t.Errorf("retryHint(%q) = %v, want %v", tc.text, got, tc.want)
		}
	}
}

func TestNames(t *testing.T) {
	for c := Delivered; c <= Unknown; c++ {
		b, err := c.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Class
		if err := back.UnmarshalText(b); err != nil || back != c {
			t.Errorf("class %d: %q -> %d, %v", c, b, back, err)
		}
	}
	for s := ScopeRecipient; s <= ScopeConnection; s++ {
		b, _ := s.MarshalText()
		if back, err := ParseScope(string(b)); err != nil || back != s {
			t.Errorf("scope %d: %q -> %d, %v", s, b, back, err)
		}
	}
	for s := StageUnknown; s <= StageDataEnd; s++ {
		if back, err := ParseStage(s.String()); err != nil || back != s {
			t.Errorf("stage %d: %q -> %d, %v", s, s.String(), back, err)
		}
	}
	for e := EventNone; e <= EventLocal; e++ {
		if back, err := ParseEvent(e.String()); err != nil || back != e {
			t.Errorf("event %d: %q -> %d, %v", e, e.String(), back, err)
		}
	}
	if _, err := Class(0).MarshalText(); err == nil {
		t.Error("Class(0).MarshalText succeeded")
	}
	if got := Class(42).String(); got != "invalid(42)" {
		t.Errorf("Class(42).String() = %q", got)
	}
	if _, err := ParseClass("throtled"); err == nil {
		t.Error(`ParseClass("throtled") succeeded`)
	}
}
