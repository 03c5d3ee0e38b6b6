package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/webhook"
)

// webhookConfig is the event webhooks' part of serveConfig; each field is a
// flag and a config-file key of the same name.
type webhookConfig struct {
	WebhookAllowPrivate bool          `toml:"webhook-allow-private"`
	WebhookMaxAttempts  int           `toml:"webhook-max-attempts"`
	WebhookTimeout      time.Duration `toml:"webhook-timeout"`
	WebhookBreakerAfter int           `toml:"webhook-breaker-after"`
	WebhookDeadMaxAge   time.Duration `toml:"webhook-dead-max-age"`
}

// bindWebhookFlags registers the webhook flags on fs.
func bindWebhookFlags(fs *pflag.FlagSet, c *webhookConfig) {
	fs.BoolVar(&c.WebhookAllowPrivate, "webhook-allow-private", false, "let webhook URLs reach loopback, private and link-local addresses")
	fs.IntVar(&c.WebhookMaxAttempts, "webhook-max-attempts", webhook.DefaultMaxAttempts, "POSTs per event before it goes to the webhook's dead letters")
	fs.DurationVar(&c.WebhookTimeout, "webhook-timeout", webhook.DefaultTimeout, "bound on one webhook POST, connection included")
	fs.IntVar(&c.WebhookBreakerAfter, "webhook-breaker-after", webhook.DefaultBreakerAfter, "events in a row that spend their budget before an endpoint's breaker opens")
	fs.DurationVar(&c.WebhookDeadMaxAge, "webhook-dead-max-age", webhook.DefaultDeadMaxAge, "how long a webhook dead letter is kept for webhook replay")
}

// startWebhooks runs the webhook dispatcher until the returned stop is
// called (it waits for the deliveries in progress to end).
func startWebhooks(ctx context.Context, c *serveConfig, q *queue.Queue, workerID string, log zerolog.Logger) (func(), error) {
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, err := webhook.OpenRetention(setup, q, c.WebhookDeadMaxAge)
	if err != nil {
		return nil, err
	}
	d, err := webhook.New(webhook.Config{Store: store, Events: q, WorkerID: workerID, MaxAttempts: c.WebhookMaxAttempts,
		BreakerAfter: c.WebhookBreakerAfter, Timeout: c.WebhookTimeout, AllowPrivate: c.WebhookAllowPrivate, Logger: log})
	if err != nil {
		return nil, err
	}
	return background(ctx, log, "webhook dispatcher", func(ctx context.Context) {
		if err := d.Run(ctx); err != nil {
			log.Error().Err(err).Msg("webhook dispatcher stopped")
		}
	}), nil
}

// endpointRow is one endpoint as `webhook list` shows it: never its secret.
type endpointRow struct {
	webhook.Endpoint
	State   string               `json:"state"`
	Breaker webhook.BreakerState `json:"breaker"`
	Dead    int                  `json:"dead"`
}

// outflow webhook add|list|remove|test|replay.
func init() {
	a := &adminFlags{}
	wc := &cobra.Command{Use: "webhook", Short: "add, list, remove, test, replay and rotate the secrets of event webhooks"}
	a.bind(wc)
	withStore := func(cmd *cobra.Command, f func(ctx context.Context, q *queue.Queue, s *webhook.Store) error) error {
		return runWith(a, cmd, func(ctx context.Context, q *queue.Queue) (*webhook.Store, error) { return webhook.Open(ctx, q) }, f)
	}

	var tenant, rawURL, events string
	add := &cobra.Command{
		Use:   "add --tenant T --url URL [--events a,b]",
		Short: "register an endpoint for a tenant's events and print its signing secret (shown only now)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if tenant == "" || rawURL == "" {
				return usageError{errors.New("--tenant and --url are required")}
			}
			if err := webhook.CheckURL(rawURL); err != nil {
				return usageError{err}
			}
			var evs []string
			if events != "" {
				evs = strings.Split(events, ",")
			}
			if _, err := webhook.CheckEvents(evs); err != nil {
				return usageError{err}
			}
			return withStore(cmd, func(ctx context.Context, _ *queue.Queue, s *webhook.Store) error {
				ep, err := s.Add(ctx, tenant, rawURL, evs)
				if err != nil {
					return err // the store's (the arguments were checked above)
				}
				if a.json {
					err = printJSON(cmd.OutOrStdout(), ep)
				} else {
					fmt.Fprintln(cmd.OutOrStdout(), ep.Secret)
					fmt.Fprintf(os.Stderr, "outflow: webhook %s for tenant %s created (events %s); the secret is shown only now\n",
						ep.ID, ep.Tenant, strings.Join(ep.Events, ","))
				}
				// With --json too: it warns of events that will not arrive.
				if webhook.LiteralPrivate(rawURL) {
					fmt.Fprintln(os.Stderr, "outflow: note: the URL names a loopback or private address; the daemon delivers to it only with webhook-allow-private (otherwise its events go to the endpoint's dead letters)")
				}
				return err
			})
		},
	}
	add.Flags().StringVar(&tenant, "tenant", "", "the tenant whose events are sent (required)")
	add.Flags().StringVar(&rawURL, "url", "", "the http(s) endpoint (required)")
	add.Flags().StringVar(&events, "events", "", "comma-separated event types (default "+strings.Join(webhook.DefaultEvents, ",")+")")

	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "list endpoints: id, tenant, URL, events, state, breaker, dead letters (never the secret)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, func(ctx context.Context, _ *queue.Queue, s *webhook.Store) error {
				eps, err := s.List(ctx, tenant)
				if err != nil {
					return err
				}
				rows := make([]endpointRow, len(eps))
				for i, ep := range eps {
					dead, _ := s.Dead(ctx, ep.ID)
					br, _ := s.Breaker(ctx, ep.ID)
					state := "enabled"
					if ep.Disabled {
						state = "disabled: " + ep.DisabledReason
					}
					ep.Secret, ep.PrevSecret = "", ""
					rows[i] = endpointRow{ep, state, br, len(dead)}
				}
				return printList(cmd.OutOrStdout(), a.json, rows, "ID\tTENANT\tURL\tEVENTS\tSTATE\tBREAKER\tDEAD", func(r endpointRow) string {
					breaker := "closed"
					if r.Breaker.Open {
						breaker = "open since " + r.Breaker.Since.Format(time.RFC3339)
					}
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d", r.ID, r.Tenant, r.URL, strings.Join(r.Events, ","), r.State, breaker, r.Dead)
				})
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant's endpoints")

	remove := &cobra.Command{
		Use:   "remove ID",
		Short: "remove an endpoint, its consumer and its dead letters",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(ctx context.Context, _ *queue.Queue, s *webhook.Store) error {
				if err := s.Remove(ctx, args[0]); err != nil {
					return err
				}
				return report(cmd, a.json, map[string]any{"id": args[0], "removed": true}, "removed %s", args[0])
			})
		},
	}
	test := &cobra.Command{
		Use:   "test ID",
		Short: "publish a webhook-test event that the daemon delivers to this endpoint only, signed and retried like any other",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(ctx context.Context, q *queue.Queue, s *webhook.Store) error {
				ep, _, err := s.Get(ctx, args[0])
				if err != nil {
					return err
				}
				q.Event(webhook.EventTest, &queue.Event{ID: "test" + fmt.Sprint(time.Now().UnixNano()), Tenant: ep.Tenant, Dest: ep.ID,
					Reason: "sent by outflow webhook test"})
				if err := q.Flush(ctx); err != nil { // the event is published asynchronously
					return err
				}
				return report(cmd, a.json, map[string]any{"id": ep.ID, "tenant": ep.Tenant, "type": webhook.EventTest, "published": true},
					"test event published for %s", ep.ID)
			})
		},
	}
	replay := &cobra.Command{
		Use:   "replay ID",
		Short: "move an endpoint's dead letters back to its queue, and enable it if a 410 Gone disabled it (the daemon need not run)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withStore(cmd, func(ctx context.Context, _ *queue.Queue, s *webhook.Store) error {
				n, err := s.Replay(ctx, args[0])
				if err != nil {
					return err
				}
				if ep, _, err := s.Get(ctx, args[0]); err == nil && ep.Disabled {
					// A 410 Gone meanwhile (from a replayed event, or
					// another): said, not overridden.
					fmt.Fprintf(cmd.ErrOrStderr(), "outflow: note: %s is disabled again (%s); replay it again once the receiver takes events\n",
						args[0], ep.DisabledReason)
				}
				return report(cmd, a.json, map[string]any{"id": args[0], "replayed": n},
					"replaying %d dead letter(s) of %s", n, args[0])
			})
		},
	}
	var keep time.Duration
	rotate := &cobra.Command{
		Use:   "rotate ID [--keep 24h]",
		Short: "give an endpoint a new signing secret and print it (shown only now); the old one also signs until --keep has passed",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if keep < 0 {
				return usageError{errors.New("--keep: want a duration of 0 or more")}
			}
			return withStore(cmd, func(ctx context.Context, _ *queue.Queue, s *webhook.Store) error {
				ep, err := s.Rotate(ctx, args[0], keep)
				if err != nil {
					return err
				}
				ep.PrevSecret = "" // the old one the receiver has
				if a.json {
					return printJSON(cmd.OutOrStdout(), ep)
				}
				fmt.Fprintln(cmd.OutOrStdout(), ep.Secret)
				until := "no longer signs"
				if !ep.PrevUntil.IsZero() {
					until = "also signs until " + ep.PrevUntil.Format(time.RFC3339)
				}
				fmt.Fprintf(os.Stderr, "outflow: webhook %s has a new secret, shown only now; the old one %s\n", ep.ID, until)
				return nil
			})
		},
	}
	rotate.Flags().DurationVar(&keep, "keep", 24*time.Hour, "how long deliveries are also signed with the old secret (0: not at all)")
	wc.AddCommand(add, list, remove, test, replay, rotate)
	rootCmd.AddCommand(wc)
}
