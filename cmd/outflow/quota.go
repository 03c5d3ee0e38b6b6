package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/quota"
	"github.com/outflow/outflow/submission"
)

// quotaConfig is the sending limits' part of serveConfig; a tenant's own
// limit is [tenants.NAME] max-recipients-per-day (tenantConfig).
type quotaConfig struct {
	MaxRecipientsPerDay int `toml:"max-recipients-per-day"`
}

func bindQuotaFlags(fs *pflag.FlagSet, c *quotaConfig) {
	fs.IntVar(&c.MaxRecipientsPerDay, "max-recipients-per-day", 0, "sending limit of every tenant: recipients per rolling 24 hours, across the fleet (SMTP 452 4.4.5 at RCPT, API 429 past it; 0 = none); per tenant: [tenants.NAME] max-recipients-per-day")
}

// sendingLimits opens the tenants' sending limits; nil when none is set.
func (c *serveConfig) sendingLimits(ctx context.Context, q *queue.Queue) (submission.Quota, error) {
	qc := quota.Config{Default: c.MaxRecipientsPerDay, Tenants: map[string]int{}}
	if qc.Default < 0 {
		return nil, usageError{fmt.Errorf("--max-recipients-per-day %d: must not be negative", qc.Default)}
	}
	for name, t := range c.Tenants {
		if t.MaxRecipientsPerDay == nil {
			continue
		}
		if *t.MaxRecipientsPerDay < 0 {
			return nil, usageError{fmt.Errorf("[tenants.%s] max-recipients-per-day %d: must not be negative", name, *t.MaxRecipientsPerDay)}
		}
		qc.Tenants[name] = *t.MaxRecipientsPerDay
	}
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	l, err := quota.Open(setup, q, qc)
	if err != nil || l == nil {
		return nil, err
	}
	return l, nil
}

// outflow quota list: each tenant's recipients counted against its sending
// limit over this hour and the 24 before it (quota.Read). The limits themselves are in
// serve's configuration, which this command does not read.
func init() {
	a := &adminFlags{}
	qc := &cobra.Command{Use: "quota", Short: "tenants' counts against their sending limits (max-recipients-per-day)"}
	a.bind(qc)
	var tenant string
	list := &cobra.Command{
		Use:   "list [--tenant T]",
		Short: "recipients each tenant sent in this hour and the 24 before it (what its limit counts), and in this hour, as the fleet counted them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.run(cmd, func(ctx context.Context, q *queue.Queue) error {
				usage, err := quota.Read(ctx, q, tenant, time.Now())
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), a.json, usage, "TENANT\tLAST 24 H\tTHIS HOUR", func(u quota.Usage) string {
					return fmt.Sprintf("%s\t%d\t%d", u.Tenant, u.Last24h, u.ThisHour)
				})
			})
		},
	}
	list.Flags().StringVar(&tenant, "tenant", "", "only this tenant (default every tenant with a count)")
	qc.AddCommand(list)
	rootCmd.AddCommand(qc)
}
