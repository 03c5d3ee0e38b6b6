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
//   - and no word of policy, reputation, authentication, the sender or
//     the sending account, or a limit in the text.
//
// The words are looked for in the text less its addresses, host names and
// links (wordsOnly): the recipient's own spelling says nothing of the
// refusal. Read whole, "ann@blockchain.example … User unknown" was kept
// (a "block"), and "jo@disabledsports.example … Access denied" suppressed
// (a "disabled").
func (r Result) AddressGone(stage Stage) bool {
	if r.Class != Permanent || r.Scope != ScopeRecipient {
		return false
	}
	switch stage {
	case StageRcpt, StageDataEnd, StageUnknown:
	default:
		return false
	}
	text := wordsOnly(strings.ToLower(r.Text))
	byCode := false
	switch r.Enhanced {
	case "5.1.1", "5.1.2", "5.1.3", "5.1.6", "5.1.10", "5.2.1":
		byCode = true
	}
	switch {
	case byCode, providerAddressRules[r.Rule]:
	case r.Rule == "user-unknown":
		// Its widest phrases ("recipient address rejected", "mailbox
		// unavailable") are Postfix's and others' words in front of any
		// refusal at RCPT, an access table's or an SPF check's as well:
		// the text must also say the address is not there.
		if !containsAny(text, saysNoSuchAddress) {
			return false
		}
	default:
		return false
	}
	// Domino's "not listed in Domino Directory" is no listing of ours.
	return !containsAny(strings.ReplaceAll(text, "not listed in", " "), notAboutTheAddress)
}

// wordsOnly is text (lower case) without the words that name something
// rather than say something of it: an address (with an @), a host or
// domain name (dotted, ending in a label of letters), a link. What is
// left is joined with single spaces.
func wordsOnly(text string) string {
	fields := strings.FieldsFunc(text, func(c rune) bool {
		switch c {
		case ' ', '\t', '\r', '\n', '<', '>', '(', ')', '[', ']', ';', ',', '"', '\'':
			return true
		}
		return false
	})
	kept := fields[:0]
	for _, f := range fields {
		if !names(f) {
			kept = append(kept, f)
		}
	}
	return strings.Join(kept, " ")
}

// names reports whether word (lower case) is an address, a link or a
// dotted host or domain name. "5.1.1" and "e.g." are not.
func names(word string) bool {
	if strings.ContainsRune(word, '@') || strings.Contains(word, "://") {
		return true
	}
	w := strings.TrimRight(word, ".:")
	i := strings.LastIndexByte(w, '.')
	if i <= 0 || len(w)-i-1 < 2 {
		return false
	}
	for _, c := range w[i+1:] {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

func containsAny(text string, words []string) bool {
	for _, w := range words {
		if strings.Contains(text, w) {
			return true
		}
	}
	return false
}

// saysNoSuchAddress are the words with which a reply that user-unknown
// matched says the address does not exist or is disabled.
var saysNoSuchAddress = []string{
	"user unknown", "unknown user", "no such user", "does not exist", "doesn't exist", "not exist",
	"not found", "no such mailbox", "invalid recipient", "invalid mailbox", "recipientnotfound",
	"not our customer", "disabled", "no mailbox", "unknown recipient", "recipient unknown", "unknown in",
	"not listed in",
}

// providerAddressRules are the providers' rules whose match says, from
// the text, that the address does not exist or is disabled.
var providerAddressRules = map[string]bool{
	"yahoo-no-account":                  true,
	"microsoft-recipient-access-denied": true,
	"mailru-invalid-mailbox":            true,
}

// notAboutTheAddress are words that put a refusal on something other than
// the address: the sending address or domain, also in the words of other
// languages ("sender" is in German's "Absender") and of the envelope
// ("Expéditeur inconnu", "Remitente desconocido", "MAIL FROM address
// unknown": sender-refused reads English only and the 5.1.x in front of them
// scopes them to the recipient, who must not be suppressed for them), the
// sending account ("message sending for this account is disabled", "you
// have exceeded your quota": the account is ours, not the recipient's), the
// message, its authentication, a limit.
var notAboutTheAddress = []string{
	"spam", "block", "listed", "blacklist", "reputation", "policy",
	"spf", "dkim", "dmarc", "authenticat", "sender", "relay access", "relaying",
	"emetteur", "émetteur", "expediteur", "expéditeur", "remitente", "mittente",
	"mail from", "envelope from", "from address", "return-path",
	"sending", "outgoing", "your account", "you have exceeded", "you've reached", "you have reached",
	"quota", "limit", "too many", "mailbox full", "is full", "storage",
	"message size", "too large", "whitelist", "white list", "allowlist", "allow list", "allowed list",
}
