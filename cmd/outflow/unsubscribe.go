package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/unsubscribe"
	"github.com/outflow/outflow/worker"
)

// unsubscribeConfig is the one-click unsubscribe links' part of
// serveConfig; each field is a flag and a config-file key of the same
// name. A tenant's own choice is [tenants.NAME] list-unsubscribe
// (tenantConfig).
type unsubscribeConfig struct {
	UnsubscribeURL  string `toml:"unsubscribe-url"`
	ListUnsubscribe bool   `toml:"list-unsubscribe"`
}

func bindUnsubscribeFlags(fs *pflag.FlagSet, c *unsubscribeConfig) {
	fs.StringVar(&c.UnsubscribeURL, "unsubscribe-url", "", "public https URL at which /unsubscribe/ of --api-addr is reached, e.g. https://mail.example.com/unsubscribe; the one-click unsubscribe links (RFC 8058) start with it (\"\": no links)")
	fs.BoolVar(&c.ListUnsubscribe, "list-unsubscribe", false, "give every tenant's mail one-click unsubscribe links (needs --unsubscribe-url); per tenant: [tenants.NAME] list-unsubscribe; per API message: list_unsubscribe")
}

// listUnsubscribe is which tenants' mail gets unsubscribe links when the
// submission does not say (queue.Submission.ListUnsubscribe nil).
type listUnsubscribe struct {
	all     bool
	tenants map[string]bool // [tenants.NAME] list-unsubscribe, where set
}

// apply decides s's links: the tenant's setting when s says nothing, and
// none for a message that has a List-Unsubscribe of its own (the
// application runs its own lists) or is a notification outflow wrote.
func (l listUnsubscribe) apply(s *queue.Submission) {
	on := l.all
	if v, ok := l.tenants[s.Tenant]; ok {
		on = v
	}
	if s.ListUnsubscribe != nil {
		on = *s.ListUnsubscribe
	}
	if on && (s.IsReport || unsubscribe.Has(s.Body)) {
		on = false
	}
	if on || s.ListUnsubscribe != nil {
		s.ListUnsubscribe = &on
	}
}

// unsubscribeLinks returns the policy and the links the workers write and
// the API serves: no links without --unsubscribe-url, and an error when
// a tenant asks for them without it.
func (c *serveConfig) unsubscribeLinks(ctx context.Context, q *queue.Queue, log zerolog.Logger) (listUnsubscribe, *unsubscribe.Links, error) {
	policy := listUnsubscribe{all: c.ListUnsubscribe, tenants: map[string]bool{}}
	var asking []string
	if c.ListUnsubscribe {
		asking = append(asking, "--list-unsubscribe")
	}
	for name, t := range c.Tenants {
		if t.ListUnsubscribe != nil {
			policy.tenants[name] = *t.ListUnsubscribe
			if *t.ListUnsubscribe {
				asking = append(asking, "[tenants."+name+"] list-unsubscribe")
			}
		}
	}
	sort.Strings(asking)
	if c.UnsubscribeURL == "" {
		if len(asking) > 0 {
			return policy, nil, usageError{fmt.Errorf("%s: one-click unsubscribe links need --unsubscribe-url, the public address of /unsubscribe/ on --api-addr", asking[0])}
		}
		return policy, nil, nil
	}
	if c.APIAddr == "" {
		return policy, nil, usageError{fmt.Errorf("--unsubscribe-url %s: the links are served on --api-addr, which is off", c.UnsubscribeURL)}
	}
	if _, err := unsubscribe.New(make([]byte, 32), c.UnsubscribeURL); err != nil {
		return policy, nil, usageError{fmt.Errorf("--unsubscribe-url: %w", err)}
	}
	if !servedPath(c.UnsubscribeURL) {
		log.Warn().Str("unsubscribe_url", c.UnsubscribeURL).
			Msg("--unsubscribe-url does not end in /unsubscribe, the path the API listener serves the links at: a reverse proxy must map it there")
	}
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key, err := unsubscribe.LoadKey(setup, q)
	if err != nil {
		return policy, nil, err
	}
	links, err := unsubscribe.New(key, c.UnsubscribeURL)
	return policy, links, err
}

// servedPath reports whether base's path is the one the API listener
// serves the links at. Served as it is, another path's link is a 404; it
// is fine only behind a proxy that maps it there.
func servedPath(base string) bool {
	u, err := url.Parse(base)
	return err == nil && strings.TrimSuffix(u.Path, "/") == "/unsubscribe"
}

// unsubscribeHandler serves the links on the API listener; nil without
// links.
func unsubscribeHandler(links *unsubscribe.Links, q *queue.Queue, sup *queue.Suppressions, workerID string,
	reg prometheus.Registerer, log zerolog.Logger) http.Handler {
	if links == nil {
		return nil
	}
	return unsubscribe.NewHandler(unsubscribe.HandlerConfig{Links: links, Store: q, Suppressions: sup,
		ID: workerID + "/api", Log: log, Metrics: unsubscribe.NewMetrics(reg)})
}

// unsubscriberOrNil keeps a nil *unsubscribe.Links from becoming a
// non-nil worker.Unsubscriber.
func unsubscriberOrNil(l *unsubscribe.Links) worker.Unsubscriber {
	if l == nil {
		return nil
	}
	return l
}
