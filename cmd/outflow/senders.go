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
