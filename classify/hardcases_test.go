package classify

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// check classifies in with the default rules and compares class, scope and
// rule (an empty want field is not compared).
func check(t *testing.T, in Input, class Class, scope Scope, rule string) Result {
	t.Helper()
	res := Default().Classify(in)
	if res.Class != class || (scope != 0 && res.Scope != scope) || (rule != "" && res.Rule != rule) {
		t.Errorf("Classify(%+v)\n got %s/%s rule %s\nwant %s/%s rule %s", in, res.Class, res.Scope, res.Rule, class, scope, rule)
	}
	return res
}

// A 5xx can mean "slow down": Gmail's per-recipient receiving rate, Gmail's
// daily sending limit (the tenant's account), QQ's frequency limits.
// Bouncing these would lose mail that a slower send delivers.
func TestFiveHundredThatMeansSlowDown(t *testing.T) {
	check(t, Input{Stage: StageRcpt, Code: 550, Enhanced: "5.2.1", Text: "The user you are trying to contact is receiving mail at a rate that prevents additional messages from being delivered. For more information, go to https://support.google.com/mail/?p=ReceivingRatePerm"},
		Throttled, ScopeRecipient, "gmail-receiving-rate")
	check(t, Input{Stage: StageDataEnd, Code: 550, Enhanced: "5.4.5", Text: "Daily user sending limit exceeded. For more information on Gmail sending limits, go to Gmail sending limits."},
		Throttled, ScopeTenant, "gmail-daily-sending-limit")
	check(t, Input{Raw: "550 Ip frequency limited [V2VkIEFw Blocked IP 192.0.2.22]. http://service.mail.qq.com/cgi-bin/help?subtype=1&&id=20022&&no=1000725"},
		Throttled, ScopeDestination, "qq-frequency-limited")
	// The sending address's frequency is that sender's (one tenant's):
	// QQ's rate is not cut for every tenant.
	check(t, Input{Raw: "550 Sender frequency limited. http://service.exmail.qq.com/cgi-bin/help?subtype=1&&id=20022&&no=1000723"},
		Throttled, ScopeTenant, "qq-sender-frequency-limited")
}

// A 4xx can say it will never succeed: Yahoo's [TS03] permanent deferral,
// Gmail's 421 5.7.32 DMARC alignment. Retrying these for days only hurts the
// sending IP's reputation.
func TestFourHundredThatWillNeverSucceed(t *testing.T) {
	check(t, Input{Stage: StageMail, Raw: "421 4.7.0 [TS03] All messages from 192.0.2.25 will be permanently deferred; Retrying will NOT succeed. See https://postmaster.yahooinc.com/error-codes"},
		Permanent, ScopeSource, "yahoo-permanent-deferral")
	check(t, Input{Stage: StageDataEnd, Code: 421, Enhanced: "5.7.32", Text: "Your email was blocked because the From: header (RFC5322) in this message isn't aligned with either the authenticated SPF or DKIM organizational domain."},
		Permanent, ScopeMessage, "gmail-dmarc-alignment-5.7.32")
	check(t, Input{Raw: "451 Message rejected, retrying will not succeed"}, Permanent, 0, "will-not-succeed")
	check(t, Input{Raw: "421 Domain x.mailgun.org is not allowed to send: Sandbox subdomains are for test purposes only."}, Permanent, ScopeTenant, "mailgun-sandbox")
}

// A class-5 enhanced code inside a 421 (RFC 3463 2 wants the classes to
// agree) does not make the reply permanent: a 4xx is permanent only when its
// text says a retry cannot succeed, and a policy deferral often clears. The
// reverse, 5xx with a class-4 enhanced code, is transient too.
func TestClassFiveEnhancedCodeIn421(t *testing.T) {
	res := check(t, Input{Stage: StageRcpt, Raw: "421 5.7.0 Sender blocked by local policy"}, Transient, ScopeRecipient, "enhanced-class-5-in-4xx")
	if res.Code != 421 || res.Enhanced != "5.7.0" {
		t.Errorf("code %d enhanced %q, want 421 5.7.0", res.Code, res.Enhanced)
	}
	check(t, Input{Stage: StageRcpt, Raw: "550 4.7.1 Please try again later"}, Transient, ScopeRecipient, "enhanced-class-4-in-5xx")
	// A rate signal in the text still comes first.
	check(t, Input{Raw: "421 5.7.0 Too many concurrent connections from your IP"}, Throttled, ScopeDestination, "rate-signal")
}

// A full mailbox does not empty in minutes: 5xx bounces now rather than
// being retried for days (RFC 3463's X.2.2 is "persistent transient"), and
// 4xx waits at least an hour between attempts.
func TestMailboxFullDoesNotRetryForDays(t *testing.T) {
	res := check(t, Input{Stage: StageRcpt, Code: 552, Enhanced: "5.2.2", Text: "The email account that you tried to reach is over quota."}, Permanent, ScopeRecipient, "mailbox-full")
	if res.RetryAfter != 0 {
		t.Errorf("permanent result has RetryAfter %v", res.RetryAfter)
	}
	// 552 5.2.2 to RCPT is not RFC 5321's "too many recipients": the
	// enhanced code says what it is.
	check(t, Input{Stage: StageRcpt, Code: 552, Enhanced: "5.2.2", Text: "Requested mail action aborted"}, Permanent, ScopeRecipient, "rfc3463-mailbox-full")
	res = check(t, Input{Stage: StageRcpt, Raw: "452 4.2.2 The email account that you tried to reach is over quota. Please direct the recipient to https://support.google.com/mail/?p=OverQuotaTemp - gsmtp"},
		Transient, ScopeRecipient, "mailbox-full-temporary")
	if res.RetryAfter < time.Hour {
		t.Errorf("4xx mailbox full: RetryAfter %v, want at least 1h", res.RetryAfter)
	}
	res = check(t, Input{Stage: StageRcpt, Code: 452, Enhanced: "4.2.2", Text: "Mailbox temporarily unavailable"}, Transient, ScopeRecipient, "rfc3463-mailbox-full-temporary")
	if res.RetryAfter < time.Hour {
		t.Errorf("4.2.2: RetryAfter %v, want at least 1h", res.RetryAfter)
	}
}

// Replies with no enhanced code classify on the basic code and the text.
func TestNoEnhancedCode(t *testing.T) {
	res := check(t, Input{Stage: StageRcpt, Raw: "550 No such user here"}, Permanent, ScopeRecipient, "user-unknown")
	if res.Enhanced != "" || res.Code != 550 {
		t.Errorf("code %d enhanced %q, want 550 and none", res.Code, res.Enhanced)
	}
	check(t, Input{Stage: StageMail, Raw: "451 Local error in processing"}, Transient, ScopeMessage, "transient")
	check(t, Input{Stage: StageDataEnd, Raw: "554 Transaction failed"}, Permanent, ScopeMessage, "permanent")
}

// An invalid enhanced code ("552 1 ...") is text, not a code.
func TestInvalidEnhancedCode(t *testing.T) {
	res := check(t, Input{Stage: StageRcpt, Raw: "552 1 Requested mail action aborted, mailbox not found"}, Permanent, ScopeRecipient, "user-unknown")
	if res.Enhanced != "" || res.Text != "1 Requested mail action aborted, mailbox not found" {
		t.Errorf("enhanced %q text %q", res.Enhanced, res.Text)
	}
	for _, in := range []Input{
		{Code: 451, Enhanced: "4.7", Text: "try later"},
		{Code: 451, Enhanced: "9.9.9", Text: "try later"},
		{Code: 451, Enhanced: "4.1234.1", Text: "try later"},
		{Raw: "451 4.x.1 try later"},
	} {
		res := check(t, in, Transient, 0, "transient")
		if res.Enhanced != "" {
			t.Errorf("%+v: enhanced %q, want none", in, res.Enhanced)
		}
	}
}

// The code after the text, as rspamd writes it.
func TestCodeAfterText(t *testing.T) {
	res := check(t, Input{Raw: `4.7.1 Ratelimit "user" exceeded (451)`}, Throttled, ScopeDestination, "rate-signal")
	if res.Code != 451 || res.Enhanced != "4.7.1" || res.Text != `Ratelimit "user" exceeded` {
		t.Errorf("code %d enhanced %q text %q", res.Code, res.Enhanced, res.Text)
	}
	res = check(t, Input{Stage: StageRcpt, Raw: "5.1.1 Mailbox does not exist 550"}, Permanent, ScopeRecipient, "user-unknown")
	if res.Code != 550 {
		t.Errorf("code %d, want 550", res.Code)
	}
}

// RFC 5321 4.5.3.1.10: a 552 to RCPT is RFC 821's "too many recipients";
// treat it as 452. The same 552 after the final dot is permanent.
func Test552ToRcptTreatedAs452(t *testing.T) {
	check(t, Input{Stage: StageRcpt, Code: 552, Text: "Too many recipients"}, Transient, ScopeRecipient, "rcpt-552-as-452")
	check(t, Input{Stage: StageRcpt, Code: 552, Enhanced: "5.5.3", Text: "Too many recipients"}, Transient, ScopeRecipient, "rfc3463-too-many-recipients")
	check(t, Input{Stage: StageDataEnd, Code: 552, Text: "Message size exceeds fixed maximum message size"}, Permanent, ScopeMessage, "permanent")
	check(t, Input{Stage: StageDataEnd, Code: 552, Enhanced: "5.3.4", Text: "Message size exceeds fixed maximum message size"}, Permanent, ScopeMessage, "rfc3463-message-too-big")
}

// No reply to the final dot means the message may have been delivered:
// unknown. Before the dot, the same events are transient.
func TestLostConnectionAfterFinalDotIsUnknown(t *testing.T) {
	check(t, Input{Stage: StageDataEnd, Event: EventConnLost}, Unknown, ScopeMessage, "no-reply-after-dot")
	check(t, Input{Stage: StageDataEnd, Event: EventTimeout}, Unknown, ScopeMessage, "no-reply-after-dot")
	check(t, Input{Stage: StageData, Event: EventConnLost}, Transient, ScopeConnection, "connection-lost")
	check(t, Input{Stage: StageRcpt, Event: EventTimeout}, Transient, ScopeConnection, "timeout")
	check(t, Input{Raw: "conversation with mx.example.com[192.0.2.1] timed out while sending end of data -- message may be sent more than once"},
		Unknown, ScopeMessage, "no-reply-after-dot")
	check(t, Input{Raw: "lost connection with mx.example.com[192.0.2.1] while sending message body"},
		Transient, ScopeConnection, "connection-lost")
}

// A 421 to the final dot is a reply: the server did not take the message.
func Test421ToFinalDotIsTransient(t *testing.T) {
	check(t, Input{Stage: StageDataEnd, Code: 421, Enhanced: "4.4.2", Text: "Connection dropped due to timeout"}, Transient, ScopeConnection, "rfc3463-network-temporary")
	check(t, Input{Stage: StageDataEnd, Code: 421, Text: "Service not available, closing transmission channel"}, Transient, ScopeConnection, "service-closing")
}

func TestTransportEvents(t *testing.T) {
	for _, tc := range []struct {
		in    Input
		class Class
		scope Scope
		rule  string
	}{
		{Input{Stage: StageConnect, Event: EventConnRefused}, Transient, ScopeConnection, "connection-refused"},
		{Input{Stage: StageTLS, Event: EventTLSFailure}, Transient, ScopeConnection, "tls-failure"},
		{Input{Stage: StageDNS, Event: EventDNSNXDomain}, Permanent, ScopeDestination, "dns-nxdomain"},
		{Input{Stage: StageDNS, Event: EventDNSServFail}, Transient, ScopeDestination, "dns-temporary"},
		{Input{Stage: StageDNS, Event: EventNullMX}, Permanent, ScopeDestination, "null-mx"},
		{Input{Stage: StageConnect, Event: EventLocal, Text: "destination suspended"}, Transient, ScopeDestination, "local"},
		{Input{Stage: StageDataEnd, Event: EventLocal}, Transient, ScopeDestination, "local"},
		{Input{Raw: "connect to mx.example.com[192.0.2.1]:25: Connection refused"}, Transient, ScopeConnection, "connection-refused"},
		{Input{Raw: "Host or domain name not found. Name service error for name=example.invalid type=MX: Host not found, try again"}, Transient, ScopeDestination, "dns-temporary"},
		{Input{Raw: "Host or domain name not found. Name service error for name=example.invalid type=A: Host not found"}, Permanent, ScopeDestination, "dns-nxdomain"},
	} {
		res := check(t, tc.in, tc.class, tc.scope, tc.rule)
		if res.Code != 0 || res.Enhanced != "" || res.Text == "" {
			t.Errorf("%+v: code %d enhanced %q text %q", tc.in, res.Code, res.Enhanced, res.Text)
		}
	}
}

func TestScopes(t *testing.T) {
	check(t, Input{Stage: StageRcpt, Code: 250, Text: "OK"}, Delivered, ScopeRecipient, "positive")
	check(t, Input{Stage: StageDataEnd, Code: 250, Enhanced: "2.0.0", Text: "OK queued"}, Delivered, ScopeMessage, "positive")
	check(t, Input{Stage: StageAuth, Code: 535, Enhanced: "5.7.8", Text: "Authentication credentials invalid"}, Permanent, ScopeTenant, "auth-refused")
	check(t, Input{Raw: "535 5.7.8 Authentication credentials invalid"}, Permanent, ScopeTenant, "rfc4954-auth-credentials")
	check(t, Input{Stage: StageAuth, Code: 454, Enhanced: "4.7.0", Text: "Temporary authentication failure"}, Transient, ScopeConnection, "auth-temporary")
	check(t, Input{Stage: StageGreeting, Code: 554, Text: "mx.example.com No SMTP service here"}, Permanent, ScopeDestination, "no-service")
	check(t, Input{Stage: StageGreeting, Code: 421, Text: "mx.example.com busy"}, Transient, ScopeConnection, "service-closing")
	check(t, Input{Stage: StageRcpt, Code: 550, Enhanced: "5.1.1", Text: "<x@example.com>: Recipient unknown"}, Permanent, ScopeRecipient, "rfc3463-bad-recipient")
	check(t, Input{Stage: StageMail, Code: 553, Enhanced: "5.1.8", Text: "Sender address rejected: Domain not found"}, Permanent, ScopeMessage, "rfc3463-bad-sender")
	check(t, Input{Stage: StageRcpt, Code: 451, Enhanced: "4.7.28", Text: "Gmail has detected an unusual rate of email"}, Throttled, ScopeDestination, "gmail-rate-4.7.28")
}

// go-smtp hands over a multi-line reply as lines joined with "\n", each
// still starting with the enhanced code when the server repeated it.
func TestMultiLineText(t *testing.T) {
	res := check(t, Input{Stage: StageDataEnd, Code: 421, Enhanced: "4.7.0", Text: "[192.0.2.1 15] Our system has detected an unusual rate of\n4.7.0 unsolicited mail originating from your IP address. To protect our\n4.7.0 users from spam, mail sent from your IP address has been temporarily\n4.7.0 rate limited."},
		Throttled, ScopeDestination, "gmail-low-reputation")
	want := "[192.0.2.1 15] Our system has detected an unusual rate of unsolicited mail originating from your IP address. To protect our users from spam, mail sent from your IP address has been temporarily rate limited."
	if res.Text != want {
		t.Errorf("text\n got %q\nwant %q", res.Text, want)
	}
	// The same reply as the server sent it.
	raw := "421-4.7.0 [192.0.2.1 15] Our system has detected an unusual rate of\r\n421-4.7.0 unsolicited mail originating from your IP address. To protect our\r\n421-4.7.0 users from spam, mail sent from your IP address has been temporarily\r\n421 4.7.0 rate limited.\r\n"
	res = check(t, Input{Raw: raw}, Throttled, ScopeDestination, "gmail-low-reputation")
	if res.Text != want || res.Code != 421 || res.Enhanced != "4.7.0" {
		t.Errorf("raw: %d %q %q", res.Code, res.Enhanced, res.Text)
	}
}

func TestRetryAfterFromText(t *testing.T) {
	res := check(t, Input{Raw: "550 Too many messages. Try again in 92 seconds."}, Throttled, ScopeDestination, "rate-signal")
	if res.RetryAfter != 92*time.Second {
		t.Errorf("RetryAfter %v, want 92s", res.RetryAfter)
	}
	res = check(t, Input{Stage: StageRcpt, Raw: "450 4.2.0 <a@example.com>: Recipient address rejected: example.com greylisted for 60 seconds by ZEROSPAM"}, Transient, ScopeRecipient, "greylisting")
	if res.RetryAfter != time.Minute {
		t.Errorf("greylist RetryAfter %v, want 1m", res.RetryAfter)
	}
	res = check(t, Input{Stage: StageRcpt, Raw: "450 4.2.0 <a@example.com>: Recipient address rejected: Greylisted, see http://postgrey.schweikert.ch/help/x.html"}, Transient, ScopeRecipient, "greylisting")
	if res.RetryAfter != 5*time.Minute {
		t.Errorf("greylist default RetryAfter %v, want 5m", res.RetryAfter)
	}
	// milter-greylist says when, as a clock: the rule's 5 minutes would
	// come back four times too early.
	res = check(t, Input{Stage: StageRcpt, Raw: "451 4.7.1 Greylisting in action, please come back in 00:24:59"}, Transient, ScopeRecipient, "greylisting")
	if res.RetryAfter != 24*time.Minute+59*time.Second {
		t.Errorf("milter-greylist RetryAfter %v, want 24m59s", res.RetryAfter)
	}
	res = check(t, Input{Raw: "550 5.7.1 Blocked for 24 hours"}, Permanent, 0, "")
	if res.RetryAfter != 0 {
		t.Errorf("permanent RetryAfter %v, want 0", res.RetryAfter)
	}
}

// Code 0 or out-of-range codes still classify, as temporary.
func TestMalformedReplies(t *testing.T) {
	for _, in := range []Input{
		{Raw: "garbage"},
		{Raw: "   "},
		{Code: 999, Text: "what"},
		{Code: 199, Text: "what"},
		{Raw: "\x00\xff"},
	} {
		res := Default().Classify(in)
		if res.Class != Transient || res.Code != 0 {
			t.Errorf("%+v: %s code %d rule %s, want transient code 0", in, res.Class, res.Code, res.Rule)
		}
	}
	check(t, Input{Raw: "354 Start mail input"}, Transient, ScopeConnection, "unexpected-intermediate")
}

// Classifying a typical single-line reply does not allocate.
func TestClassifyDoesNotAllocate(t *testing.T) {
	c := Default()
	in := Input{Stage: StageDataEnd, Code: 421, Enhanced: "4.7.28", Text: "Gmail has detected an unusual rate of email. To protect our users from spam, email has been temporarily rate limited."}
	in2 := Input{Stage: StageRcpt, Code: 550, Enhanced: "5.1.1", Text: "The email account that you tried to reach does not exist."}
	in3 := Input{Raw: "550 Too many messages. Try again in 92 seconds."}
	if n := testing.AllocsPerRun(100, func() { c.Classify(in); c.Classify(in2); c.Classify(in3) }); n != 0 {
		t.Errorf("%v allocations per run, want 0", n)
	}
}

// TestOperatorRulesDoNotAllocate: an operator's rules file of a hundred
// phrases keeps Classify off the heap too. With room for 512 phrases on
// the stack and about 510 embedded, a few dozen made every call allocate.
func TestOperatorRulesDoNotAllocate(t *testing.T) {
	var b strings.Builder
	b.WriteString("[[rule]]\nname = \"acme-many\"\nclass = \"throttled\"\ntext = [")
	for i := range 100 {
		fmt.Fprintf(&b, "%q, ", fmt.Sprintf("acme phrase %03d", i))
	}
	b.WriteString("]\n")
	path := filepath.Join(t.TempDir(), "rules.toml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{ExtraRulesFile: path})
	if err != nil {
		t.Fatal(err)
	}
	if r := c.Classify(Input{Raw: "451 4.7.1 acme phrase 042 reached"}); r.Rule != "acme-many" {
		t.Fatalf("the operator's rule did not match: %+v", r)
	}
	in := Input{Stage: StageRcpt, Code: 550, Enhanced: "5.1.1", Text: "The email account that you tried to reach does not exist."}
	in2 := Input{Raw: "550 Too many messages. Try again in 92 seconds."}
	if n := testing.AllocsPerRun(100, func() { c.Classify(in); c.Classify(in2) }); n != 0 {
		t.Errorf("%v allocations per run with the operator's rules, want 0", n)
	}
}

// The safety rules of the classifier, each by name.

// A relay's account state (not activated, not verified, suspended, not
// allowed to send as this sender) is permanent for the tenant's account
// whatever code carries it: 4xx, 5xx, or an HTTP-style 403 from an ESP.
func TestRelayAccountStateIsPermanentForTheTenant(t *testing.T) {
	for _, raw := range []string{
		"421 Domain sandbox1.mailgun.org is not allowed to send: Please activate your Mailgun account.",
		"403 You are not authorized to send from that email address",
		"554 Message rejected: Sending suspended for this account. For more information, please check the inbox of the email address associated with your AWS account.",
		"451 4.7.1 Your account has been suspended; contact support",
		"550 5.7.60 SMTP; Client does not have permissions to send as this sender",
	} {
		check(t, Input{Raw: raw, Stage: StageDataEnd}, Permanent, ScopeTenant, "relay-account-state")
	}
	// A recipient's disabled account is the recipient's, not ours.
	check(t, Input{Raw: "550 5.2.1 The email account that you tried to reach is disabled."}, Permanent, ScopeRecipient, "")
}

// A 5xx whose text names a rate, a speed or a recent volume is throttled:
// bouncing it would lose mail that a slower send delivers.
func TestFiveHundredWithRateSignalIsThrottled(t *testing.T) {
	for _, raw := range []string{
		"550 5.7.1 This email has been rate limited.",
		"554 Sending too fast, slow down",
		"552 5.7.1 Sender exceeded the number of messages per hour",
	} {
		check(t, Input{Raw: raw}, Throttled, 0, "rate-signal")
	}
	// A rate of one sending address is that sender's, one tenant's: a
	// throttle, but not of the whole destination.
	check(t, Input{Raw: "550 Too many messages from this sender in last 60 minutes"}, Throttled, ScopeTenant, "sender-rate")
	// A size limit says "limit exceeded" too, and is not a rate.
	check(t, Input{Raw: "552 5.2.2 Mailbox size limit exceeded"}, Permanent, ScopeRecipient, "")
	// Nor is a span of time alone: a mailbox unused in the last year is
	// gone, not busy, and throttling the destination for it holds every
	// other message to that destination back.
	check(t, Input{Raw: "550 5.2.1 <a@example.org>: Recipient address rejected: this account has been inactive in last 12 months"}, Permanent, ScopeRecipient, "")
	check(t, Input{Raw: "550 5.2.1 Mailbox disabled: no login in last 365 days"}, Permanent, 0, "")
}

// A 4xx is permanent only when its text says a retry cannot succeed; a 4xx
// that speaks of policy, reputation or content is retried.
func TestFourHundredIsPermanentOnlyWhenRetryCannotSucceed(t *testing.T) {
	for _, raw := range []string{
		"451 4.7.1 Rejected by local policy, try again later",
		"421 Reject due to policy violations",
		"450 4.7.1 Client host rejected: cannot find your hostname",
		"421 5.7.1 Service unavailable due to policy",
	} {
		if res := Default().Classify(Input{Raw: raw}); res.Class == Permanent {
			t.Errorf("%q: permanent (rule %s), want it retried", raw, res.Rule)
		}
	}
	check(t, Input{Raw: "451 4.7.0 Delivery will never succeed for this sender"}, Permanent, 0, "will-not-succeed")
}

// Congestion (a busy receiver) is retried; a rate limit is throttled.
func TestCongestionIsNotARateLimit(t *testing.T) {
	check(t, Input{Raw: "421 4.4.5 Server busy, try again later."}, Transient, ScopeConnection, "rfc3463-congestion")
	check(t, Input{Raw: "452 4.4.5 Insufficient disk space; try again later"}, Transient, 0, "")
	check(t, Input{Raw: "452 4.4.5 Messages per second limit exceeded"}, Throttled, 0, "rate-signal")
	// A relay's limit on concurrent sessions is a throttle of the
	// destination (it teaches a connection limit), not congestion.
	check(t, Input{Raw: "421 4.4.5 Service unavailable, concurrency limit reached"}, Throttled, ScopeDestination, "rate-signal")
}

// A name that does not resolve (the envelope sender's domain, the client's
// reverse DNS) is fixed in DNS, not by sending slower: transient, even when
// the text also says "temporarily deferred", which alone is a throttle.
func TestUnresolvableNameIsNotARateLimit(t *testing.T) {
	check(t, Input{Stage: StageMail, Raw: "451 Message temporarily deferred due to unresolvable RFC.5321 from domain"}, Transient, ScopeMessage, "name-does-not-resolve")
	check(t, Input{Stage: StageRcpt, Raw: "451 4.1.8 Domain of sender address bounce@sender.example does not resolve"}, Transient, ScopeRecipient, "name-does-not-resolve")
	check(t, Input{Raw: "450 4.7.1 Message temporarily deferred: client host name could not be resolved"}, Transient, 0, "name-does-not-resolve")
	// Without a named cause the deferral is still a throttle (Yahoo, SendGrid).
	check(t, Input{Raw: "421 Message from (192.0.2.1) temporarily deferred"}, Throttled, ScopeDestination, "rate-signal")
	// A 5xx keeps its code's meaning.
	check(t, Input{Raw: "550 5.1.8 Domain of sender address bounce@sender.example does not resolve"}, Permanent, 0, "")
}

// TestGmailAuthRateLimitIsTheTenants: Gmail's "rate limited because it is
// unauthenticated" (4.7.26, and SPF, DKIM and DMARC's 4.7.24/27/30/32/40)
// is about the sending tenant's domain: scope tenant, so that the
// throttle does not cut Gmail's rate for every tenant over one tenant's
// broken DKIM. The PTR record and TLS deferrals (4.7.23, 4.7.29) are about
// how outflow connects, every tenant's: the destination's.
func TestGmailAuthRateLimitIsTheTenants(t *testing.T) {
	check(t, Input{Stage: StageDataEnd, Raw: "421 4.7.26 This mail has been rate limited because it is unauthenticated. Gmail requires all senders to authenticate with either SPF or DKIM."},
		Throttled, ScopeTenant, "gmail-auth-rate-limited")
	check(t, Input{Stage: StageDataEnd, Raw: "421 4.7.32 Your email has been rate limited because the From: header (RFC5322) in this message isn't aligned with either the authenticated SPF or DKIM organizational domain."},
		Throttled, ScopeTenant, "gmail-auth-rate-limited")
	check(t, Input{Stage: StageMail, Raw: "421 4.7.29 Your email has been rate limited because you're not using a TLS connection."},
		Throttled, ScopeDestination, "gmail-transport-rate-limited")
}
