package classify

import "testing"

// TestScopesOfUnseenReplies: real replies from sisimai's set-of-emails, the
// go-sisimai rhost tables and the SMTP Field Manual, which the corpus tests
// (they check the class only) let through with the wrong scope or class: a
// refusal of the sending address read as the message's (bounced where
// another egress address would do), a relay refusing the account read as a
// recipient's, a line limit read as a throttle of the destination. And the
// guards: a listed domain, an SPF failure, a rate stay what they are.
func TestScopesOfUnseenReplies(t *testing.T) {
	c := Default()
	rows := []struct {
		reply string
		stage Stage
		class Class
		scope Scope
		gone  bool
	}{
		{"550 5.7.1 Connections not accepted from servers without a valid sender domain. Fix reverse DNS for 203.0.113.2", StageRcpt, Permanent, ScopeSource, false},
		{"550 5.7.1 Connections not accepted from servers without a valid sender domain.neko Fix reverse DNS for 203.0.113.22", StageMail, Permanent, ScopeSource, false},
		{"550 5.7.1 Connections not accepted from servers without a valid sender domain. ## Fix reverse DNS for x.xx.xx.xx", StageUnknown, Permanent, ScopeSource, false},
		{"550 domain [example.com] mismatches client ip 192.0.2.225.", StageUnknown, Permanent, ScopeSource, false},
		{"550 5.7.1 host gmail-smtp-in.l.google.com[64.233.188.26] said: [192.0.2.22 18] Our system has detected that this message is likely suspicious due to the very low reputation of the sending IP address. To best protect our users from spam, the message has been blocked. Please visit https://support.google.com/mail/answer/188131 for more information. p22nn000202cat.22 - gsmtp (in reply to end of DATA command)", StageUnknown, Permanent, ScopeSource, false},
		{"550 5.7.1 This message is likely suspicious due to the very low reputation of the sending IP address. To best protect our users from spam, the message has been blocked. For more information, go to Why has Gmail blocked my messages?", StageDataEnd, Permanent, ScopeSource, false},
		{"501 <shironeko@example.co.jp>... no access from mail server [192.0.2.55] which is an open relay.", StageMail, Permanent, ScopeSource, false},
		{"550 5.1.0 <bounce@mailer.cnt1.example.com> sender rejected. Refer to Error Codes section at https://www.cox.com/residential/support/email-error-codes.html for more information. AUP#CDRBL", StageMail, Permanent, ScopeSource, false},
		{"554 rbl deny.", StageGreeting, Permanent, ScopeSource, false},
		{"500 Line limit exceeded", StageDataEnd, Permanent, ScopeMessage, false},
		{"550 5.7.0, Mail Sending denied. This error occurs if the sender account is disabled or not registered within your Google Workspace domain.", StageMail, Permanent, ScopeTenant, false},
		{"550 5.7.1 Invalid credentials for relay <ip-address>. The IP address you've registered in your Workspace SMTP Relay service doesn't match the domain of the account this email is being sent from.", StageMail, Permanent, ScopeTenant, false},
		{"550 User not found", StageRcpt, Permanent, ScopeRecipient, true},
		// guards: these must keep their meaning
		{"550 5.7.1 [192.0.2.1 14] Our system has detected that this message is likely suspicious due to the very low reputation of the sending domain. To best protect our users from spam, the message has been blocked.", StageDataEnd, Permanent, ScopeMessage, false},
		{"550 5.7.1 Service unavailable, MailFrom domain is listed in Spamhaus. To request removal from this list see https://www.spamhaus.org/query/lookup/ (S8002)", StageDataEnd, Permanent, ScopeMessage, false},
		{"550 5.7.1 Your email was rejected due to having a domain present in the Spamhaus DBL -- see https://www.spamhaus.org/dbl/", StageDataEnd, Permanent, ScopeMessage, false},
		{"550-SPF-check failed: 550 example.com doesn't allow sending mails from 192.0.2.1 (in reply to MAIL FROM command)", StageMail, Permanent, ScopeMessage, false},
		{"550 5.7.1 Your account has been blocked for abuse", StageMail, Permanent, ScopeMessage, false},
		{"552 5.3.4 Line length exceeded", StageDataEnd, Permanent, ScopeMessage, false},
		{"421 4.4.2 Message submission rate for this client has exceeded the configured limit", StageMail, Throttled, ScopeDestination, false},
	}
	for _, row := range rows {
		in := Parse(row.reply)
		if row.stage != StageUnknown || in.Stage == StageUnknown {
			in.Stage = row.stage
		}
		r := c.Classify(in)
		if r.Class != row.class || r.Scope != row.scope || r.AddressGone(in.Stage) != row.gone {
			t.Errorf("%q at %s: %s/%s gone=%v (%s), want %s/%s gone=%v", row.reply, in.Stage, r.Class, r.Scope, r.AddressGone(in.Stage), r.Rule, row.class, row.scope, row.gone)
		}
	}
}
