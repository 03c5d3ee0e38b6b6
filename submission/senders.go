package submission

import (
	"fmt"
	"strings"

	"github.com/outflow/outflow/internal/mailhdr"
)

// SenderDomains is the sender policy of a shared deployment: for each
// tenant it names, the domains that tenant may send as, in the envelope
// sender (MAIL FROM, the API's from) and in the From header's addresses.
// A tenant it does not name has the OtherTenants entry's domains when
// there is one (the config file's top-level sender-domains), else may use
// any domain, as before the policy existed; so may every tenant with a nil
// policy. The OtherTenants entry is what closes the policy: without it a
// tenant left out, or spelled otherwise than in the users file ("shopa"
// for [tenants.shopA]), sent as anyone's domain, and had it signed with
// that domain's DKIM key.
//
// Without it one tenant could send as another's domain, and since DKIM
// picks its key by the From domain (docs/delivery.md), have that mail
// signed with the other tenant's key. Postfix's reject_sender_login_mismatch
// closes the same hole for its submission service.
//
// An entry is a domain ("shop.example": that domain only) or a wildcard
// ("*.shop.example": any name under it, not the domain itself). Names are
// compared without case and without a trailing dot; CheckSenderDomain
// validates an entry.
type SenderDomains map[string][]string

// OtherTenants is the SenderDomains key whose domains are those of every
// tenant the policy does not name: the config file's top-level
// sender-domains. No tenant can have that name (ValidateUserName; an API
// key's tenant takes letters, digits and "-_.@+").
const OtherTenants = "*"

// list is tenant's entry, or the OtherTenants one; ok false when neither
// exists.
func (p SenderDomains) list(tenant string) ([]string, bool) {
	if l, ok := p[tenant]; ok {
		return l, true
	}
	l, ok := p[OtherTenants]
	return l, ok
}

// CheckSenderDomain reports what is wrong with a SenderDomains entry, or
// nil.
func CheckSenderDomain(entry string) error {
	d := strings.TrimPrefix(entry, "*.")
	if d == "" || strings.Contains(d, "*") || checkDomain(strings.TrimSuffix(d, ".")) != nil {
		return fmt.Errorf("sender domain %q: want a domain name, or *. and a domain name", entry)
	}
	return nil
}

// Restricted reports whether tenant's senders are limited.
func (p SenderDomains) Restricted(tenant string) bool {
	_, ok := p.list(tenant)
	return ok
}

// Allows reports whether tenant may send as addr (user@domain, or ""
// for the null sender, which names no domain and is allowed).
func (p SenderDomains) Allows(tenant, addr string) bool {
	list, ok := p.list(tenant)
	if !ok || addr == "" {
		return true
	}
	at := strings.LastIndexByte(addr, '@')
	if at < 0 {
		return false
	}
	domain := strings.ToLower(strings.TrimSuffix(addr[at+1:], "."))
	for _, e := range list {
		e = strings.ToLower(strings.TrimSuffix(e, "."))
		if sub, ok := strings.CutPrefix(e, "*."); ok {
			if strings.HasSuffix(domain, "."+sub) {
				return true
			}
		} else if domain == e {
			return true
		}
	}
	return false
}

// CheckFrom checks the addresses of the From fields in msg's header
// section against tenant's domains. It returns "" when they are allowed (or
// tenant is not restricted, or there is no From field), else what is
// wrong: an address tenant may not use, or a From field that cannot be
// read (whose addresses therefore cannot be checked).
func (p SenderDomains) CheckFrom(tenant string, msg []byte) string {
	if !p.Restricted(tenant) {
		return ""
	}
	for _, v := range mailhdr.Values(msg, "From") {
		// Display names in any charset: only the addresses are checked.
		list, err := mailhdr.Addresses(v)
		if err != nil {
			return "the From field cannot be read: " + err.Error()
		}
		for _, a := range list {
			if !p.Allows(tenant, a.Address) {
				return a.Address + " in From is not one of the sender domains of " + tenant
			}
		}
	}
	return ""
}
