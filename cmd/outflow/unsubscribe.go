package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
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

// linkCheck is what `outflow unsubscribe check` prints of a link.
type linkCheck struct {
	Tenant     string             `json:"tenant"`
	Recipient  string             `json:"recipient"`
	ID         string             `json:"id"` // the envelope that carried it
	Suppressed *queue.Suppression `json:"suppressed"`
}

// outflow unsubscribe check LINK: what an unsubscribe link names, and
// whether its recipient is on the tenant's list now; for the recipient
// who says the link did not work.
func init() {
	a := &adminFlags{}
	uc := &cobra.Command{Use: "unsubscribe", Short: "read one-click unsubscribe links"}
	a.bind(uc)
	check := &cobra.Command{
		Use:   "check LINK",
		Short: "what an unsubscribe link (its URL or token) names, and whether its recipient is suppressed now",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				key, err := unsubscribe.LoadKey(ctx, q)
				if err != nil {
					return err
				}
				links, err := unsubscribe.Opener(key)
				if err != nil {
					return err
				}
				t, err := links.Open(unsubscribe.TokenOf(args[0]))
				if err != nil {
					return usageError{errors.New("not a link of this fleet: cut short, changed, or sealed under another key (the page answers it 404)")}
				}
				sup, err := q.Suppressions(ctx)
				if err != nil {
					return err
				}
				s, err := sup.Suppressed(ctx, t.Tenant, t.Rcpt)
				if err != nil {
					return err
				}
				c := linkCheck{Tenant: t.Tenant, Recipient: t.Rcpt, ID: t.ID, Suppressed: s}
				if a.json {
					return printJSON(cmd.OutOrStdout(), c)
				}
				state := "not suppressed"
				if s != nil {
					state = "suppressed since " + s.Created.Format(time.RFC3339) + " (" + s.Source + ": " + s.Reason + ")"
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "tenant %s, recipient %s, message %s: %s\n", t.Tenant, t.Rcpt, t.ID, state)
				return err
			})
		},
	}
	uc.AddCommand(check)
	rootCmd.AddCommand(uc)
}
