package classify

import (
	"os"
	"testing"
)

// TestAddressGone: what a suppression may rest on. A reply that says the
// address does not exist, or its mailbox is disabled, does; a refusal of
// the sending address, the sender, the message or a limit, scoped to the
// recipient by a catch-all rule, does not, nor does a reply to MAIL.
func TestAddressGone(t *testing.T) {
	c := Default()
	for _, tc := range []struct {
		reply string
		stage Stage
		gone  bool
	}{
		{"550 5.1.1 The email account that you tried to reach does not exist. Please try double-checking the recipient's email address for typos", StageRcpt, true},
		{"550 5.1.1 RESOLVER.ADR.RecipNotFound; not found", StageRcpt, true},
		{"554 delivery error: dd This user doesn't have a yahoo.com account (bob@yahoo.com) [0] - mta1.mail.yahoo.com", StageDataEnd, true},
		{"550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown in virtual mailbox table", StageRcpt, true},
		{"550 5.7.1 No such user!", StageRcpt, true},
		{"550 5.2.1 The email account that you tried to reach is disabled.", StageRcpt, true},
		{"550 5.1.10 RESOLVER.ADR.RecipientNotFound; Recipient not found by SMTP address lookup", StageRcpt, true},
		{"550 No such user here", StageUnknown, true},
		{"550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown in relay recipient table", StageRcpt, true},
		{"554 5.7.1 <bob@dest.example>: Recipient address rejected: Access denied", StageRcpt, false},
		{"550 Requested action not taken: mailbox unavailable (policy)", StageRcpt, false},

		{"554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org", StageRcpt, false},
		{"550 5.7.708 Service unavailable. Access denied, traffic not accepted from this IP.", StageRcpt, false},
		{"554 5.7.1 <bob@dest.example>: Relay access denied", StageRcpt, false},
		{"550 5.7.23 <bob@dest.example>: Recipient address rejected: Message rejected due to: SPF fail - not authorized", StageRcpt, false},
		{"550 5.4.5 Daily user sending quota exceeded.", StageRcpt, false},
		{"552 5.2.2 The email account that you tried to reach is over quota", StageRcpt, false},
		{"550 5.1.0 <bounce@shop.example> sender rejected", StageMail, false},
		{"550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown", StageMail, false},
		{"550 5.2.0 Message rejected due to DMARC", StageDataEnd, false},
		{"550 4.2.1 Mailbox disabled temporarily", StageRcpt, false},
		{"550 5.1.1 <bob@dest.example>: Recipient address rejected: blocked by policy", StageRcpt, false},
		// A refusal of our sender, at RCPT under an address code, in
		// other words than sender-refused reads: the recipient stays.
		{"550 5.1.1 Absender unbekannt", StageRcpt, false},
		{"550 5.1.1 Expéditeur inconnu", StageRcpt, false},
		{"550 5.1.1 Remitente desconocido", StageRcpt, false},
		{"550 5.1.1 Mittente sconosciuto", StageRcpt, false},
		{"550 5.1.1 MAIL FROM address unknown", StageRcpt, false},
		// And in the words sender-refused reads: scoped to the message.
		{"550 5.1.1 Emetteur invalide", StageRcpt, false},
		{"553 5.1.0 <bounce@shop.example>: Sender address rejected: not owned by user", StageRcpt, false},
		{"550 coolexample.com From: Domain is invalid. Provide a valid From: IB506", StageRcpt, false},
		// The recipient's own spelling, or a host's, says nothing of the
		// refusal: a word of a limit or policy in the address does not
		// keep it, one of "no such address" does not strike it.
		{"550 5.1.1 <ann@blockchain.test>: Recipient address rejected: User unknown in virtual mailbox table", StageUnknown, true},
		{"550 5.1.1 <info@unlimited.test>: Recipient address rejected: User unknown in virtual mailbox table", StageUnknown, true},
		{"550 5.1.1 <claims@policy-direct.test>: Recipient address rejected: User unknown", StageRcpt, true},
		{"550 5.1.1 <quotations@shop.test>: Recipient address rejected: User unknown", StageRcpt, true},
		{"host mx.spamfilter.example said: 550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown", StageUnknown, true},
		{"550 5.7.1 <jo@disabledsports.test>: Recipient address rejected: Access denied", StageUnknown, false},
		{"550 5.7.1 <jo@notfound.test>: Recipient address rejected: Access denied", StageRcpt, false},
		// Lotus Domino's words for an unknown user.
		{"550 5.1.1 User dom2 (dom2@dest.test) not listed in Domino Directory", StageUnknown, true},
		{"550 5.1.1 <bob@dest.example>: Recipient address rejected: not listed in our whitelist", StageRcpt, false},
	} {
		in := Parse(tc.reply)
		in.Stage = tc.stage
		r := c.Classify(in)
		if got := r.AddressGone(tc.stage); got != tc.gone {
			t.Errorf("%q at %s (%s %s, %s): AddressGone %v, want %v", tc.reply, tc.stage, r.Class, r.Scope, r.Rule, got, tc.gone)
		}
	}
}

// TestSendingQuotaAndRecipientRate: a sending account's daily allowance is
// the tenant's throttle, not a full mailbox (which bounced the mail and
// suppressed the recipient); one recipient receiving too fast slows that
// recipient, not the whole destination.
func TestSendingQuotaAndRecipientRate(t *testing.T) {
	c := Default()
	for _, tc := range []struct {
		reply string
		class Class
		scope Scope
	}{
		{"550 5.4.5 Daily user sending quota exceeded.", Throttled, ScopeTenant},
		{"550 5.4.5 <bob@dest.example>: Recipient address rejected: Domain Sending Quota Exceeded", Throttled, ScopeTenant},
		{"554 5.2.0 STOREDRV.Submission.Exception:SubmissionQuotaExceededException; Failed to process message", Throttled, ScopeTenant},
		{"550 5.4.5 Daily SMTP relay limit exceeded for customer", Throttled, ScopeTenant},
		{"450 4.2.1 The user you are trying to contact is receiving mail too quickly. Please resend your message at a later time.", Throttled, ScopeRecipient},
		{"450 User is receiving mail too quickly", Throttled, ScopeRecipient},
		{"451 4.5.1 The recipient <x@yandex.ru> has exceeded their message rate limit. Try again later.", Throttled, ScopeRecipient},
		{"552 5.2.2 The email account that you tried to reach is over quota", Permanent, ScopeRecipient},
	} {
		in := Parse(tc.reply)
		in.Stage = StageRcpt
		if r := c.Classify(in); r.Class != tc.class || r.Scope != tc.scope {
			t.Errorf("%q: %s %s (%s), want %s %s", tc.reply, r.Class, r.Scope, r.Rule, tc.class, tc.scope)
		}
	}
}

// TestClassFourEnhancedIn5xxStaysRetryable: a 5xx whose enhanced code is
// class 4 is retried (enhanced-class-4-in-5xx); the token layer may make
// it a throttle, never permanent.
func TestClassFourEnhancedIn5xxStaysRetryable(t *testing.T) {
	c := Default()
	for _, reply := range []string{
		"550 4.2.1 Mailbox disabled temporarily",
		"550 4.7.0 Blocked temporarily",
		"554 4.3.2 Service shutting down",
	} {
		in := Parse(reply)
		in.Stage = StageRcpt
		if r := c.Classify(in); r.Class == Permanent {
			t.Errorf("%q: %s (%s), want it retried", reply, r.Class, r.Rule)
		}
	}
}

// TestRateWordsInOtherLanguages: a server that asks us to slow down in
// German, Spanish, French, Italian or Russian is a throttle too, and so is
// Yahoo's TSS11 deferral.
func TestRateWordsInOtherLanguages(t *testing.T) {
	c := Default()
	for _, reply := range []string{
		"421 Zu viele Verbindungen von Ihrer IP-Adresse",
		"421 Demasiadas conexiones desde su dirección",
		"421 Trop de connexions, réessayez plus tard",
		"421 Troppe connessioni dal tuo indirizzo",
		"451 Превышен лимит отправки сообщений",
		"421 4.7.0 [TSS11] Excessive unknown recipients - possible Invalid Recipients Attack",
		"451 4.7.1 You have exceeded your messaging limits, try again later",
	} {
		in := Parse(reply)
		in.Stage = StageRcpt
		if r := c.Classify(in); r.Class != Throttled {
			t.Errorf("%q: %s (%s), want throttled", reply, r.Class, r.Rule)
		}
	}
}

// TestRuleScopes: every rule's name, the operator's among them, with the
// scope it declares: what an automation rule's rule is checked against.
func TestRuleScopes(t *testing.T) {
	p := t.TempDir() + "/rules.toml"
	if err := os.WriteFile(p, []byte("[[rule]]\nname = \"acme-zorgon\"\nclass = \"throttled\"\nscope = \"destination\"\ntext = [\"zorgon gate\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{ExtraRulesFile: p})
	if err != nil {
		t.Fatal(err)
	}
	got := c.RuleScopes()
	for name, want := range map[string]Scope{"acme-zorgon": ScopeDestination, "gmail-auth-rate-limited": ScopeTenant, "user-unknown": ScopeRecipient} {
		if s, ok := got[name]; !ok || s != want {
			t.Errorf("%s: scope %v (known %v), want %v", name, s, ok, want)
		}
	}
	if len(got) < 100 {
		t.Errorf("%d rules, want every embedded one", len(got))
	}
}
