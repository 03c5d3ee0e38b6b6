package main

import (
	"fmt"
	"net/mail"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/outflow/outflow/worker"
)

// dsnConfig is the delivery status notifications' part of serveConfig;
// each flag is also a config-file key. [tenants.NAME] sections are
// config-file only.
type dsnConfig struct {
	DSN             bool                    `toml:"dsn"`
	DSNDelayWarning time.Duration           `toml:"dsn-delay-warning"`
	DSNSenderRate   float64                 `toml:"dsn-sender-rate"`
	DSNPassTimeout  time.Duration           `toml:"dsn-pass-timeout"`
	Tenants         map[string]tenantConfig `toml:"tenants"`
	// SenderDomains is every tenant's sender-domains, that of a
	// [tenants.NAME] section replacing it; unset: any domain for the
	// tenants whose section sets none (cmd/outflow/senders.go).
	SenderDomains *[]string `toml:"sender-domains"`
}

// tenantConfig is one [tenants.NAME] section: NAME is the tenant (the
// submission AUTH user, or the API key's tenant).
type tenantConfig struct {
	// DSN turns notifications on or off for the tenant; unset: on for
	// mail submitted over SMTP, off for the HTTP API and NATS.
	DSN *bool `toml:"dsn"`
	// DSNAddress receives the tenant's notifications instead of the
	// envelope sender.
	DSNAddress string `toml:"dsn-address"`
	// DSNDelayWarning overrides dsn-delay-warning for the tenant; "0s"
	// turns its delay warnings off.
	DSNDelayWarning *duration `toml:"dsn-delay-warning"`
	// EgressPool is the [[egress]] pool the tenant's mail leaves from;
	// default every egress address (cmd/outflow/delivery.go).
	EgressPool string `toml:"egress-pool"`
	// ReturnPath is the domain of the tenant's return path, overriding
	// return-path; "" sends the tenant's mail with its own envelope
	// sender (cmd/outflow/bounce.go).
	ReturnPath *string `toml:"return-path"`
	// MaxRecipientsPerDay overrides max-recipients-per-day for the
	// tenant; 0 lifts the limit (cmd/outflow/quota.go).
	MaxRecipientsPerDay *int `toml:"max-recipients-per-day"`
	// ListUnsubscribe overrides list-unsubscribe for the tenant: its mail
	// gets one-click unsubscribe links, or none (cmd/outflow/unsubscribe.go).
	ListUnsubscribe *bool `toml:"list-unsubscribe"`
	// SenderDomains limits the domains the tenant may send as
	// (submission.SenderDomains); unset: any (cmd/outflow/senders.go).
	SenderDomains []string `toml:"sender-domains"`
}

// duration decodes a TOML string such as "4h" (BurntSushi/toml decodes a
// time.Duration field, not a pointer to one).
type duration struct{ time.Duration }

func (d *duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

func bindDSNFlags(fs *pflag.FlagSet, c *dsnConfig) {
	fs.BoolVar(&c.DSN, "dsn", true, "send delivery status notifications (RFC 3464) to envelope senders; per tenant: [tenants.NAME] dsn")
	fs.DurationVar(&c.DSNDelayWarning, "dsn-delay-warning", worker.DefaultDelayWarning, "time in the queue after which still deferred recipients get one delay warning (0 = never)")
	fs.Float64Var(&c.DSNSenderRate, "dsn-sender-rate", worker.DefaultDSNSenderRate, "most notifications per hour to one address, across the fleet (0 = no limit)")
	fs.DurationVar(&c.DSNPassTimeout, "dsn-pass-timeout", worker.DefaultPassTimeout, "how long a message's failure report waits for its other destinations' first attempts (0 = until every one)")
}

// workerDSN turns the settings into the worker's, nil when notifications
// are off.
func (c *dsnConfig) workerDSN(hostname string, sup worker.SuppressionChecker, m *worker.DSNMetrics) (*worker.DSNConfig, error) {
	if !c.DSN {
		return nil, nil
	}
	if c.DSNDelayWarning < 0 || c.DSNSenderRate < 0 || c.DSNPassTimeout < 0 {
		return nil, fmt.Errorf("dsn-delay-warning, dsn-sender-rate and dsn-pass-timeout must not be negative")
	}
	w := &worker.DSNConfig{ReportingMTA: hostname, DelayWarning: c.DSNDelayWarning, SenderRate: c.DSNSenderRate,
		PassTimeout: c.DSNPassTimeout, Suppressions: sup, Metrics: m, Tenants: map[string]worker.TenantDSN{}}
	if w.DelayWarning == 0 {
		w.DelayWarning = -1 // the worker's "off"; its zero is the default
	}
	if w.SenderRate == 0 {
		w.SenderRate = -1
	}
	if w.PassTimeout == 0 {
		w.PassTimeout = -1
	}
	for name, t := range c.Tenants {
		td := worker.TenantDSN{Enabled: t.DSN, Address: strings.TrimSpace(t.DSNAddress)}
		if td.Address != "" {
			if _, err := mail.ParseAddress(td.Address); err != nil || !strings.Contains(td.Address, "@") {
				return nil, fmt.Errorf("[tenants.%s] dsn-address %q: not an address", name, t.DSNAddress)
			}
		}
		if t.DSNDelayWarning != nil {
			d := t.DSNDelayWarning.Duration
			if d < 0 {
				return nil, fmt.Errorf("[tenants.%s] dsn-delay-warning %v: must not be negative (\"0s\": never)", name, d)
			}
			td.DelayWarning = &d
		}
		w.Tenants[name] = td
	}
	return w, nil
}
