package classify

import "testing"

// The replies of a review that ran real provider replies through the
// classifier, and new wordings of the same meanings. The rules that fixed
// them name meanings (near phrases, enhanced-code ranges, provider code
// tables, a sender's quota told from a full mailbox), not the reviewed
// texts, so the paraphrases below, which no rule was written from, must
// classify the same way.

// replyCase is one reply with what it must give; a zero scope or an empty
// rule is not compared.
type replyCase struct {
	raw   string
	stage Stage
	class Class
	scope Scope
	rule  string
}

func checkCases(t *testing.T, cases []replyCase) {
	t.Helper()
	for _, tc := range cases {
		check(t, Input{Raw: tc.raw, Stage: tc.stage}, tc.class, tc.scope, tc.rule)
	}
}

// TestReviewedRepliesThatMeanSlowDown: every reply the review found read as
// transient or permanent where the server asks us to slow down.
func TestReviewedRepliesThatMeanSlowDown(t *testing.T) { checkCases(t, reviewedSlowDown) }

var reviewedSlowDown = []replyCase{
	// Exchange: a limit exceeded, sent with 4.4.2 ("bad connection").
	{"421 4.4.2 Message submission rate for this client has exceeded the configured limit", StageDataEnd, Throttled, ScopeDestination, "limit-exceeded"},
	// Microsoft documents 4.7.500-699 and 4.7.850-899 as IP throttling.
	{"451 4.7.550 Access denied, please try again later", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	{"451 4.7.599 Access denied, please try again later (AS3320)", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	{"451 4.7.850 Access denied, please try again later", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	{"451 4.7.500 Access denied, please try again later. (AS770)", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	// The sender's own daily limit, with a 5.1.x code: the tenant's.
	{"550 5.1.90 Your message can't be sent because you've reached your daily limit for message recipients", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"550 5.7.508 Access denied, [2001:db8::25] has exceeded permitted limits within /64 range", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	// A sending quota, not the recipient's mailbox.
	{"550 Send quota exceeded", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"550 Send quota exceeded", StageRcpt, Throttled, ScopeTenant, "sending-quota"},
	// Provider code tables.
	{"421 cmsmtp blocked. Refer to Error Codes section at https://www.cox.com/internet/support/email-error-codes.html for more information. AUP#CXCNCT", StageConnect, Throttled, ScopeDestination, "cox-rate"},
	{"550 5.1.0 sender rejected AUP#I-1310", StageRcpt, Throttled, ScopeDestination, "spectrum-connection-limit"},
	{"550 5.1.0 sender rejected AUP#I-1330", StageRcpt, Throttled, ScopeDestination, "spectrum-connection-limit"},
	{"550 This message has exceeded the max number of messages per session. Open a new session and try again. IB510", StageDataEnd, Throttled, ScopeConnection, "godaddy-session-limit"},
	// Connection and session limits in words rate-signal did not list.
	{"421 Too many SMTP sessions for this host", StageGreeting, Throttled, ScopeDestination, "rate-signal"},
	{"421 4.7.0 mail.example.com Error: too many new TLS sessions from 192.0.2.1", StageTLS, Throttled, ScopeDestination, "rate-signal"},
	{"454 4.7.0 Error: too many new TLS sessions from 192.0.2.1", StageTLS, Throttled, ScopeDestination, "rate-signal"},
	{"451-The server has reached its limit for processing requests from your host.\r\n451 Please try again later.", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	{"451 4.7.1 <mx.example.org[192.0.2.2]>: Client host rejected: Please try again slower", StageRcpt, Throttled, ScopeDestination, "rate-signal"},
	{"450 4.7.1 <x@example.com>: Recipient address rejected: only 5 recipients per 5 minutes allowed", StageRcpt, Throttled, ScopeDestination, "rate-signal"},
	// NetEase (163.com): the IP's limits, one connection's, the sender's.
	{"421 4.4.5 HL:ICC", StageConnect, Throttled, ScopeDestination, "netease-ip-rate"},
	{"421 4.5.0 HL:IFC", StageMail, Throttled, ScopeDestination, "netease-ip-rate"},
	{"450 4.5.3 RP:DRC", StageRcpt, Throttled, ScopeConnection, "netease-connection-limit"},
	{"451 MI:SFQ", StageMail, Throttled, ScopeTenant, "netease-sender-rate"},
	{"554 MI:STC", StageDataEnd, Throttled, ScopeTenant, "netease-sender-daily-quota"},
	{"550 RP:TRC", StageRcpt, Throttled, ScopeTenant, "netease-sender-daily-quota"},
	{"421 HL:ICC 163 mx12,EMCowACnzwc_BjhcKMZmAQ--.20404S2 1547175487,please see http://mail.163.com/help/help_spam_16.htm?ip=192.0.2.1&hostid=mx12&time=1547175487", StageConnect, Throttled, ScopeDestination, "netease-ip-rate"},
}

// TestParaphrasesOfReviewedReplies: the same meanings in words no rule was
// written from.
func TestParaphrasesOfReviewedReplies(t *testing.T) { checkCases(t, reviewedParaphrases) }

var reviewedParaphrases = []replyCase{
	// A limit exceeded or reached, in other words and orders.
	{"421 4.4.2 Submission rate from this client exceeds the limit set by the administrator", StageDataEnd, Throttled, ScopeDestination, "limit-exceeded"},
	{"421 4.4.2 This client's connection count has exceeded the allowed limit", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	{"550 5.7.508 Access denied, [2001:db8::1] has exceeded the permitted limits for your /64 range", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	{"451 Server reached the limit of requests from your IP, try later", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	{"451 Request limit reached for your host", StageMail, Throttled, ScopeDestination, "limit-exceeded"},
	{"452 cmsmtp message threshold exceeded", StageRcpt, Throttled, ScopeDestination, "limit-exceeded"},
	{"550 Sender has gone over the hourly limit; its limits were exceeded", StageDataEnd, Throttled, ScopeDestination, ""},
	// Other details of Microsoft's documented ranges.
	{"451 4.7.612 Access denied, please try again later", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	{"450 4.7.501 Access denied, please try again later (AS1234)", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	{"451 4.7.899 Access denied, please try again later", StageRcpt, Throttled, ScopeDestination, "microsoft-rate-4.7.65x"},
	// The sender's allowance, said otherwise.
	{"550 5.1.90 You have reached your daily recipient limit. Try again tomorrow.", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"554 5.1.90 Sending limit for today reached: you have sent to too many recipients today", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"550 5.7.1 Sending quota for this account has been exceeded", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"554 Outgoing message quota exceeded, try again tomorrow", StageDataEnd, Throttled, ScopeTenant, "sending-quota"},
	{"550 Daily send limit reached", StageMail, Throttled, ScopeTenant, "sending-quota"},
	{"550 Your account has exceeded its sending allowance", StageMail, Throttled, ScopeTenant, "sending-quota"},
	{"554 Recipient address rejected: Your daily quota has been exceeded", StageRcpt, Throttled, ScopeTenant, "sending-quota"},
	{"550 5.7.1 <x@example.com>: Recipient address rejected: you have used up your sending quota", StageRcpt, Throttled, ScopeTenant, "sending-quota"},
	// Codes of the same tables the review did not see.
	{"421 cmsmtp 192.0.2.1 blocked. AUP#CXMXRT", StageConnect, Throttled, ScopeDestination, "cox-rate"},
	{"550 5.1.0 sender rejected AUP#I-1300", StageRcpt, Throttled, ScopeDestination, "spectrum-connection-limit"},
	{"550 5.1.0 sender rejected AUP#I-1340", StageRcpt, Throttled, ScopeDestination, "spectrum-connection-limit"},
	{"421 cmsmtp 192.0.2.1 blocked aup#in-1320", StageConnect, Throttled, ScopeDestination, "spectrum-connection-limit"},
	{"421 HL:IFC 126 mx3,Lw8vCgD3yx8=.1 please see http://mail.163.com/help/help_spam_16.htm", StageConnect, Throttled, ScopeDestination, "netease-ip-rate"},
	{"450 MI:DMC 163 smtp9", StageDataEnd, Throttled, ScopeConnection, "netease-connection-limit"},
	{"450 RP:QRC 163 smtp9", StageRcpt, Throttled, ScopeTenant, "netease-sender-rate"},
	{"550 This IP has sent too many messages this hour. IB504", StageDataEnd, Throttled, ScopeDestination, "godaddy-rate"},
	// A limit of one connection or session.
	{"550 Maximum messages per session exceeded; open a new session", StageDataEnd, Throttled, ScopeConnection, "too-many-messages-per-session"},
	{"421 Too many messages in this session, reconnect", StageDataEnd, Throttled, ScopeConnection, "too-many-messages-per-connection"},
	{"452 Only 50 recipients per connection allowed", StageRcpt, Throttled, ScopeConnection, "too-many-messages-per-connection"},
	// Connections, sessions and requests, with words between.
	{"421 4.7.0 Too many parallel SMTP connections from your address", StageConnect, Throttled, ScopeDestination, "rate-signal"},
	{"421 You have too many open sessions with this server", StageGreeting, Throttled, ScopeDestination, "rate-signal"},
	{"550 Too many connect", StageConnect, Throttled, ScopeDestination, "rate-signal"},
	{"421 Too many pending requests from 192.0.2.1", StageMail, Throttled, ScopeDestination, "rate-signal"},
	// Slower, and a count per span of time.
	{"450 Please send slower", StageRcpt, Throttled, ScopeDestination, "rate-signal"},
	{"451 4.7.1 Deliver more slowly please", StageDataEnd, Throttled, ScopeDestination, "rate-signal"},
	{"450 4.7.1 Max 100 messages per 10 minutes", StageRcpt, Throttled, ScopeDestination, "rate-signal"},
	{"451 4.7.1 Limit: 20 messages per 1 hour", StageRcpt, Throttled, ScopeDestination, "rate-signal"},
	{"450 at most 3 connections per 30 seconds", StageConnect, Throttled, ScopeDestination, "rate-signal"},
	// Volume words under a code that says something else: the token layer.
	{"452 4.4.5 Hourly message volume exceeded for your IP", StageRcpt, Throttled, 0, TokenRule},
	{"550 5.1.0 Sender has exceeded its hourly volume", StageMail, Throttled, 0, TokenRule},
	{"421 4.4.2 Hourly connection volume exceeded", StageDataEnd, Throttled, 0, TokenRule},
}

// TestSlowDownWordsDoNotWidenToOtherMeanings: the new words must not make a
// throttle of what the design calls something else.
func TestSlowDownWordsDoNotWidenToOtherMeanings(t *testing.T) { checkCases(t, reviewedGuards) }

var reviewedGuards = []replyCase{
	// Too many recipients in one message: RFC 3463 X.5.3, and RFC 5321's
	// 552 to RCPT; not a rate (and "sending limits" in Gmail's pointer
	// to its help page is not a quota).
	{"452 4.5.3 Too many recipients", StageRcpt, Transient, ScopeRecipient, "rfc3463-too-many-recipients"},
	{"552 5.5.3 Too many recipients per message", StageRcpt, Transient, ScopeRecipient, "rfc3463-too-many-recipients"},
	{"550 5.5.3 Recipient limit exceeded", StageRcpt, Transient, ScopeRecipient, "rfc3463-too-many-recipients"},
	{"452 4.5.3 Your message has too many recipients. For more information regarding Google's sending limits, go to Limits for sending & getting email.", StageRcpt, Transient, ScopeRecipient, ""},
	{"452 Number of recipients exceeds the limit of 100", StageRcpt, Transient, ScopeRecipient, ""},
	{"452 This message contains too many recipients. Reduce the number of recipients and retry. IB605", StageRcpt, Transient, ScopeRecipient, ""},
	{"552 Too many recipients", StageRcpt, Transient, ScopeRecipient, "rcpt-552-as-452"},
	{"552 Too many recipients", StageDataEnd, Permanent, ScopeMessage, "permanent"},
	// A user unknown stays a user unknown.
	{"550 5.1.1 User unknown", StageRcpt, Permanent, ScopeRecipient, "user-unknown"},
	// ... when the text also names the session, the connection or a limit.
	{"550 5.1.1 User unknown; rejecting further recipients in this session", StageRcpt, Permanent, ScopeRecipient, "user-unknown"},
	{"553 5.1.2 Invalid address; max 10 invalid recipients per connection", StageRcpt, Permanent, ScopeRecipient, ""},
	{"550 5.1.1 Recipient unknown. Limit of unknown recipients exceeded", StageRcpt, Permanent, ScopeRecipient, ""},
	{"554 5.7.1 Message refused: spam detected in this connection", StageDataEnd, Permanent, 0, ""},
	{"550 5.1.1 <bob@dest.example>: Recipient address rejected: User unknown in virtual mailbox table", StageRcpt, Permanent, ScopeRecipient, "user-unknown"},
	{"550 This account is disabled", StageRcpt, Permanent, ScopeRecipient, "user-unknown"},
	// A spam or content block is a block, whatever volume it names.
	{"554 This IP has been blocked for the day, for attempting to send too many messages containing content judged to be spam by the Internet community. IB111", StageDataEnd, Permanent, ScopeSource, "godaddy-ip-block"},
	{"554 5.7.1 Message rejected: too many spam complaints from your IP", StageDataEnd, Permanent, 0, "spam-block"},
	{"550 High volume of spam detected from your network, blocked", StageDataEnd, Permanent, 0, "spam-block"},
	{"554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org", StageRcpt, Permanent, 0, ""},
	{"550 spam detected", StageDataEnd, Permanent, 0, ""},
	// Limits that are not rates.
	{"552 5.3.4 Message size exceeds fixed limit", StageDataEnd, Permanent, ScopeMessage, ""},
	{"552 Message header limit exceeded", StageDataEnd, Permanent, 0, ""},
	{"554 5.4.14 Hop count exceeded - possible mail loop", StageDataEnd, Permanent, 0, ""},
	{"421 4.7.0 Error: too many errors", StageRcpt, Transient, 0, ""},
	{"421 Too many invalid commands", StageRcpt, Transient, 0, ""},
	{"451 Requested mail action not taken: too much fail authentication", StageMail, Transient, 0, ""},
	// A full mailbox stays the recipient's.
	{"552 5.2.2 Mailbox quota exceeded", StageRcpt, Permanent, ScopeRecipient, "mailbox-full"},
	{"550 5.2.2 user quota exceeded", StageRcpt, Permanent, ScopeRecipient, "mailbox-full"},
	{"550 Quota exceeded for recipient mailbox", StageRcpt, Permanent, ScopeRecipient, "mailbox-full"},
	{"552 5.2.2 Over quota", StageRcpt, Permanent, ScopeRecipient, "rfc3463-mailbox-full"},
	{"452 4.2.2 Quota exceeded, mailbox full", StageRcpt, Transient, ScopeRecipient, "mailbox-full-temporary"},
	// Outside Microsoft's ranges, and codes near the tables' codes.
	{"451 4.7.700 Access denied, please try again later", StageRcpt, Transient, 0, "rfc3463-transient"},
	{"451 4.7.849 Access denied, please try again later", StageRcpt, Transient, 0, "rfc3463-transient"},
	{"550 5.7.550 Access denied", StageRcpt, Permanent, 0, ""},
	// Outside Spectrum's table, "sender rejected" is a refusal of our
	// sender, for the whole message, not of the recipient at whose RCPT it
	// came (sender-refused).
	{"550 5.1.0 sender rejected AUP#I-1350", StageRcpt, Permanent, ScopeMessage, "sender-refused"},
	{"550 5.1.0 sender rejected AUP#I-1010", StageRcpt, Permanent, ScopeMessage, "sender-refused"},
	{"554 cmsmtp 192.0.2.1 IP blocked. AUP#CXBL", StageConnect, Permanent, 0, ""},
	{"554 DT:SPM 163 mx2,please see http://mail.163.com/help/help_spam_16.htm", StageDataEnd, Permanent, 0, ""},
	{"550 Your reference is XHL:ICC2", StageDataEnd, Permanent, 0, "permanent"},
}

// TestSenderAccountIsNotTheAddressGone: replies about the sender's own
// account, quota or IP, sent in reply to RCPT, do not put the recipient on
// the suppression list.
func TestSenderAccountIsNotTheAddressGone(t *testing.T) {
	c := Default()
	for _, tc := range []struct {
		reply string
		class Class
		scope Scope
	}{
		{"550 message sending for this account is disabled", Permanent, ScopeTenant},
		{"550 Sending of messages from this account has been disabled", Permanent, ScopeTenant},
		{"550 Outgoing mail is disabled for your account", Permanent, ScopeTenant},
		{"554 5.7.1 <email@example.com>: Recipient address rejected: You have exceeded your Outmail quota.", Throttled, ScopeTenant},
		{"554 This IP has been temporarily blocked for attempting to mail too many invalid recipients. IB112", Permanent, ScopeSource},
		{"554 Your IP is temporarily blocked: too many invalid recipients", Permanent, 0},
		{"550 5.1.90 Your message can't be sent because you've reached your daily limit for message recipients", Throttled, ScopeTenant},
		{"550 Send quota exceeded", Throttled, ScopeTenant},
		{"550 5.1.0 sender rejected AUP#I-1310", Throttled, ScopeDestination},
	} {
		for _, st := range []Stage{StageRcpt, StageDataEnd, StageUnknown} {
			r := c.Classify(Input{Raw: tc.reply, Stage: st})
			if r.Class != tc.class || tc.scope != 0 && r.Scope != tc.scope {
				t.Errorf("%q at %s: %s/%s (%s), want %s/%s", tc.reply, st, r.Class, r.Scope, r.Rule, tc.class, tc.scope)
			}
			if r.AddressGone(st) {
				t.Errorf("%q at %s (%s): AddressGone, want not: the sender's account, not the address", tc.reply, st, r.Rule)
			}
		}
	}
	// The words of the sending account keep a user-unknown reply that
	// carries them off the list too.
	r := c.Classify(Input{Raw: "550 Your account is disabled for sending", Stage: StageRcpt})
	if r.AddressGone(StageRcpt) {
		t.Errorf("sending account disabled (%s %s): AddressGone", r.Class, r.Rule)
	}
	// And the address that is gone still is.
	for _, reply := range []string{"550 5.1.1 User unknown", "550 This account is disabled", "550 No such user here"} {
		if r := c.Classify(Input{Raw: reply, Stage: StageRcpt}); !r.AddressGone(StageRcpt) {
			t.Errorf("%q (%s %s): not AddressGone", reply, r.Class, r.Rule)
		}
	}
}
