package classify

import "testing"

// TestSourceBlocked: a refusal of the address the mail came from (a DNS
// blocklist, the receiver's own list of IPs, a reverse DNS it will not
// take) is scoped to the source, at any stage, so that with several
// egress addresses the mail goes out from another instead of bouncing. A
// list of the sender's domain or of a link in the body, and a recipient
// refused in words that share a phrase, are not: another address would
// get the same answer.
func TestSourceBlocked(t *testing.T) {
	c := Default()
	source := []string{
		"554 5.7.1 Service unavailable; Client host [192.0.2.1] blocked using zen.spamhaus.org",
		"550 5.7.1 Mail from 192.0.2.1 refused, see http://www.spamhaus.org/query/ip/192.0.2.1",
		"554 5.7.1 Your IP 192.0.2.1 is listed on our blacklist",
		"550 5.7.1 Connection refused - 192.0.2.1 listed at b.barracudacentral.org",
		"550 Rejected because 192.0.2.1 is in a black list at zen.spamhaus.org",
		"550 5.7.1 Client host rejected: cannot find your reverse hostname, [192.0.2.1]",
		"554 Blocked - see https://ipcheck.proofpoint.com/?ip=192.0.2.1",
		"550 5.7.1 Your IP address is blocked",
		"550 5.7.606 Access denied, banned sending IP [192.0.2.1]",
		"550 5.7.25 The IP address sending this message does not have a PTR record setup",
		"554 rejected: [2001:db8::1] listed in dnsbl.sorbs.net",
		"550 5.7.1 Service unavailable, Client host [192.0.2.1] blocked using Customer Block list (AS16012607)",
	}
	for _, reply := range source {
		for _, st := range []Stage{StageGreeting, StageMail, StageRcpt, StageDataEnd} {
			if r := c.Classify(Input{Raw: reply, Stage: st}); r.Class != Permanent || r.Scope != ScopeSource {
				t.Errorf("%q at %s: %s/%s (%s), want permanent/source", reply, st, r.Class, r.Scope, r.Rule)
			}
		}
	}
	notSource := []string{
		"554 5.7.1 Service unavailable; Sender address [a@spam.example] blocked using dbl.spamhaus.org",
		"554 5.7.1 Message rejected: URL in message body listed in multi.uribl.com",
		"550 5.7.1 Sender address is blacklisted",
		"550 5.7.1 Recipient address rejected: blacklisted",
		"550 5.1.1 User not listed in public Name & Address Book",
		// A 4xx that Postfix also sends when the lookup failed for a while:
		// retried anyway, and not source-deferred's (a missing PTR named).
		"450 4.7.25 Client host rejected: cannot find your hostname, [192.0.2.1]",
		// The same lists and words for a domain, which follows the mail
		// to every address: no IP address in the text.
		"550 The sending domain example.com is listed on Spamhaus",
		"550 Rejected because example.com is in a black list at fresh.spameatingmonkey.net",
		// An SPF or DKIM failure names the IP too: it is the sender
		// domain's record, which every address would meet.
		"550 SPF check failed: the ip 192.0.2.1 is not listed as a permitted sender",
		"550 5.7.1 Rejected: the IP address 192.0.2.1 is not listed in example.com's SPF record",
		"550 5.7.1 Sender IP address 192.0.2.1 is not listed in SPF record for example.com",
		"550 5.7.1 DKIM signature invalid: (no TXT record; ptr record found)",
	}
	for _, reply := range notSource {
		if r := c.Classify(Input{Raw: reply, Stage: StageRcpt}); r.Scope == ScopeSource {
			t.Errorf("%q: scoped to the source (%s/%s)", reply, r.Class, r.Rule)
		}
	}
	if got := ScopeSource.String(); got != "source" {
		t.Errorf("ScopeSource is spelled %q", got)
	}
	if s, err := ParseScope("source"); err != nil || s != ScopeSource {
		t.Errorf(`ParseScope("source") = %v, %v`, s, err)
	}
}
