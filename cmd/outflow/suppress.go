package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
)

// outflow suppress list|add|remove: the per-tenant suppression list
// (queue.Suppressions), which refuses recipients at submission.
func init() {
	a := &adminFlags{}
	sc := &cobra.Command{Use: "suppress", Short: "list, add and remove suppressed recipient addresses (per tenant)"}
	a.bind(sc)

	var tenant, reason, source string
	var forDur, since time.Duration
	withList := func(cmd *cobra.Command, f func(ctx context.Context, l *queue.Suppressions) error) error {
		return runWith(a, cmd, func(ctx context.Context, q *queue.Queue) (*queue.Suppressions, error) { return q.Suppressions(ctx) },
			func(ctx context.Context, _ *queue.Queue, l *queue.Suppressions) error { return f(ctx, l) })
	}
	needTenant := func() error {
		if tenant == "" {
			return usageError{errors.New("--tenant is required")}
		}
		return nil
	}

	list := &cobra.Command{
		Use:   "list [--tenant T] [--source S] [--since DUR]",
		Short: "list the suppressions that apply now: tenant, address, source, reason, created, expires",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if source != "" && !slices.Contains(queue.SuppressionSources, source) {
				return usageError{fmt.Errorf("--source %q: one of %s", source, strings.Join(queue.SuppressionSources, ", "))}
			}
			if since < 0 {
				return usageError{errors.New("--since must not be negative")}
			}
			return withList(cmd, func(ctx context.Context, l *queue.Suppressions) error {
				all, err := l.List(ctx, tenant)
				if err != nil {
					return err
				}
				var after time.Time
				if since > 0 {
					after = time.Now().Add(-since)
				}
				all = queue.FilterSuppressions(all, source, after)
				return printList(cmd.OutOrStdout(), a.json, all, "TENANT\tADDRESS\tSOURCE\tCREATED\tEXPIRES\tREASON", func(s queue.Suppression) string {
					exp := "never"
					if !s.Expires.IsZero() {
						exp = s.Expires.Format(time.RFC3339)
					}
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", s.Tenant, s.Address, s.Source, s.Created.Format(time.RFC3339), exp, s.Reason)
				})
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant's suppressions (default every tenant's)")
	list.Flags().StringVar(&source, "source", "", "only those added by this source: "+strings.Join(queue.SuppressionSources, ", "))
	list.Flags().DurationVar(&since, "since", 0, "only those added in this last stretch of time, e.g. 24h (default any time)")

	add := &cobra.Command{
		Use:   "add ADDR --tenant T [--reason R] [--for DUR]",
		Short: "suppress an address for a tenant: its mail to it is refused at submission",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needTenant(); err != nil {
				return err
			}
			if forDur < 0 {
				return usageError{errors.New("--for must not be negative")}
			}
			if _, err := submission.ParseAddress(args[0]); err != nil {
				return usageError{fmt.Errorf("%q: %w", args[0], err)}
			}
			return withList(cmd, func(ctx context.Context, l *queue.Suppressions) error {
				// Address and Created as Add stores them, so that --json
				// prints the entry itself (as suppress list and POST
				// /v1/suppressions do).
				now := time.Now().UTC()
				s := queue.Suppression{Tenant: tenant, Address: queue.NormalizeAddress(args[0]), Reason: reason,
					Source: queue.SuppressAdmin, Created: now.Truncate(time.Second)}
				if forDur > 0 {
					s.Expires = now.Add(forDur).Truncate(time.Second)
				}
				if err := l.Add(ctx, s); err != nil {
					return err
				}
				return report(cmd, a.json, s, "suppressed %s for tenant %s", s.Address, tenant)
			})
		},
	}
	add.Flags().StringVar(&tenant, "tenant", "", "the tenant whose mail to ADDR is refused (required)")
	add.Flags().StringVar(&reason, "reason", "", "why, shown by suppress list")
	add.Flags().DurationVar(&forDur, "for", 0, "lift the suppression after this long (default never)")

	remove := &cobra.Command{
		Use:   "remove ADDR --tenant T",
		Short: "lift a tenant's suppression of an address",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := needTenant(); err != nil {
				return err
			}
			return withList(cmd, func(ctx context.Context, l *queue.Suppressions) error {
				if err := l.Remove(ctx, tenant, args[0]); err != nil {
					return err
				}
				addr := queue.NormalizeAddress(args[0])
				return report(cmd, a.json, map[string]any{"tenant": tenant, "address": addr, "removed": true},
					"removed %s for tenant %s", addr, tenant)
			})
		},
	}
	remove.Flags().StringVar(&tenant, "tenant", "", "the tenant (required)")

	sc.AddCommand(list, add, remove)
	rootCmd.AddCommand(sc)
}
