package classify

import "strings"

// AddressGone reports whether r, a reply at stage about one recipient,
// says that the recipient's address cannot receive mail: it does not
// exist, its domain has no mail system, or its mailbox is disabled. That is
// the evidence on which a sender stops writing to an address for good (a
// suppression); a bounce needs less.
//
// Many permanent replies are scoped to the recipient without saying that:
// a blocklisted sending address refused at RCPT ("554 5.7.1 … blocked
// using zen.spamhaus.org"), an SPF failure in Postfix's "Recipient address
// rejected:" wording, a sending quota ("550 5.4.5 Daily user sending quota
// exceeded"), a full mailbox, a refused sender at MAIL. Suppressing on
// those struck whole destinations off a tenant's list for good. So only:
//   - a reply to RCPT, to the end of the data, or in a report that came
//     back later (StageUnknown), never one to MAIL or to the connection;
//   - with an enhanced code that names the address (5.1.1 bad mailbox,
//     5.1.2 bad system, 5.1.3 bad syntax, 5.1.6 moved, 5.1.10 null MX,
//     5.2.1 disabled), or a rule that read it in the text (user unknown,
//     a provider's "no such account");
//   - and no word of policy, reputation, authentication, the sender or a
//     limit in the text.
func (r Result) AddressGone(stage Stage) bool {
	if r.Class != Permanent || r.Scope != ScopeRecipient {
		return false
	}
	switch stage {
	case StageRcpt, StageDataEnd, StageUnknown:
	default:
		return false
	}
	byCode := false
	switch r.Enhanced {
	case "5.1.1", "5.1.2", "5.1.3", "5.1.6", "5.1.10", "5.2.1":
		byCode = true
	}
	if !byCode && !addressRules[r.Rule] {
		return false
	}
	text := strings.ToLower(r.Text)
	for _, w := range notAboutTheAddress {
		if strings.Contains(text, w) {
			return false
		}
	}
	return true
}

// addressRules are the rules whose match says, from the text, that the
// address does not exist or is disabled.
var addressRules = map[string]bool{
	"user-unknown":                      true,
	"yahoo-no-account":                  true,
	"microsoft-recipient-access-denied": true,
	"mailru-invalid-mailbox":            true,
}

// notAboutTheAddress are words that put a refusal on something other than
// the address: the sending address or domain, the message, its
// authentication, a limit.
var notAboutTheAddress = []string{
	"spam", "block", "listed", "blacklist", "reputation", "policy",
	"spf", "dkim", "dmarc", "authenticat", "sender", "relay",
	"quota", "limit", "too many", "mailbox full", "is full", "storage",
	"message size", "too large",
}
