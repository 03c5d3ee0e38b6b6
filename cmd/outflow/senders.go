package main

import (
	"fmt"
	"slices"
	"strings"

	"golang.org/x/text/unicode/norm"

	"github.com/outflow/outflow/submission"
)

// senderDomains is the sender policy of the [tenants.NAME] sections that
// set sender-domains, and of the top-level sender-domains for every other
// tenant (submission.OtherTenants), for the submission listener and the
// HTTP API; nil when none is set. An empty list is kept: those tenants
// may send as no domain.
func (c *dsnConfig) senderDomains() (submission.SenderDomains, error) {
	var p submission.SenderDomains
	add := func(key, where string, list []string) error {
		for _, d := range list {
			if err := submission.CheckSenderDomain(d); err != nil {
				return usageError{fmt.Errorf("%s: %w", where, err)}
			}
		}
		if p == nil {
			p = submission.SenderDomains{}
		}
		p[key] = list
		return nil
	}
	if c.SenderDomains != nil {
		if err := add(submission.OtherTenants, "sender-domains", *c.SenderDomains); err != nil {
			return nil, err
		}
	}
	for name, t := range c.Tenants {
		if t.SenderDomains == nil {
			continue
		}
		if err := add(name, "[tenants."+name+"] sender-domains", t.SenderDomains); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// tenantNearMisses returns, for each [tenants.NAME] section that names no
// account of users but one the same but for case or Unicode normalisation
// ("shopA" and "shopa"), a line saying so. Tenant names are compared as
// they are everywhere else (byte for byte), so that section applies to
// no one: its sender-domains restrict nobody, and the account sends
// under the defaults.
func (c *dsnConfig) tenantNearMisses(users []string) []string {
	fold := func(s string) string { return strings.ToLower(norm.NFC.String(s)) }
	byFold := map[string][]string{}
	exact := map[string]bool{}
	for _, u := range users {
		exact[u] = true
		byFold[fold(u)] = append(byFold[fold(u)], u)
	}
	var out []string
	for name := range c.Tenants {
		if exact[name] {
			continue
		}
		if near := byFold[fold(name)]; len(near) > 0 {
			out = append(out, fmt.Sprintf("[tenants.%s] names no account, but the users file has %q: tenant names are compared exactly, so that section applies to no one", name, near[0]))
		}
	}
	slices.Sort(out)
	return out
}

// openSigning returns a line for the start's log when tenants share a
// daemon whose [[dkim]] keys sign for dkimDomains and some of them may send
// as any domain: no top-level sender-domains and no [tenants.NAME]
// sender-domains of their own. Each such tenant can send as another's
// domain, signed with that domain's key, and receivers take the signature
// as the domain owner's. One tenant alone is its own operator: nothing to
// say. "" when there is nothing to say.
func (c *dsnConfig) openSigning(tenants, dkimDomains []string) string {
	if len(dkimDomains) == 0 || c.SenderDomains != nil {
		return ""
	}
	all := slices.Compact(slices.Sorted(slices.Values(tenants)))
	if len(all) < 2 {
		return ""
	}
	var open []string
	for _, t := range all {
		if sec, ok := c.Tenants[t]; !ok || sec.SenderDomains == nil {
			open = append(open, t)
		}
	}
	if len(open) == 0 {
		return ""
	}
	const most = 5
	names := strings.Join(open[:min(most, len(open))], ", ")
	if len(open) > most {
		names += fmt.Sprintf(" and %d more", len(open)-most)
	}
	domains := slices.Compact(slices.Sorted(slices.Values(dkimDomains)))
	return fmt.Sprintf("%d of %d tenants (%s) may send as any domain, and [[dkim]] signs for %s: each may send as another tenant's domain, signed with its key; set sender-domains (the top-level list, for every tenant without a [tenants.NAME] list of its own)",
		len(open), len(all), names, strings.Join(domains, ", "))
}
