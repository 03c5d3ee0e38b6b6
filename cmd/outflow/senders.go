package main

import (
	"fmt"

	"github.com/outflow/outflow/submission"
)

// senderDomains is the sender policy of the [tenants.NAME] sections that
// set sender-domains, for the submission listener and the HTTP API; nil
// when none does. An empty list is kept: that tenant may send as no
// domain.
func (c *dsnConfig) senderDomains() (submission.SenderDomains, error) {
	var p submission.SenderDomains
	for name, t := range c.Tenants {
		if t.SenderDomains == nil {
			continue
		}
		for _, d := range t.SenderDomains {
			if err := submission.CheckSenderDomain(d); err != nil {
				return nil, usageError{fmt.Errorf("[tenants.%s] sender-domains: %w", name, err)}
			}
		}
		if p == nil {
			p = submission.SenderDomains{}
		}
		p[name] = t.SenderDomains
	}
	return p, nil
}
