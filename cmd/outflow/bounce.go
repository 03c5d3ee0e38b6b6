package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/bounce"
	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/queue"
	"github.com/outflow/outflow/submission"
	"github.com/outflow/outflow/worker"
)

// bounceConfig is the return path's part of serveConfig; each field is a
// flag and a config-file key of the same name. A tenant's own domain is
// [tenants.NAME] return-path (tenantConfig).
type bounceConfig struct {
	ReturnPath string `toml:"return-path"`
	BounceAddr string `toml:"bounce-addr"`
	Postmaster string `toml:"postmaster"`
}

func bindBounceFlags(fs *pflag.FlagSet, c *bounceConfig) {
	fs.StringVar(&c.ReturnPath, "return-path", "", "domain of the envelope sender every tenant's mail goes out with, so that later bounces and complaints come back to --bounce-addr (\"\" keeps each message's own sender); per tenant: [tenants.NAME] return-path")
	fs.StringVar(&c.BounceAddr, "bounce-addr", "", "listener for bounces and complaints mailed to the return-path domains, e.g. :25 (\"\" for none)")
	fs.StringVar(&c.Postmaster, "postmaster", "", "address that mail to postmaster@ and abuse@ the return-path domains is forwarded to (\"\": refused, 550)")
}

// returnPath is the return path the workers write and the listener checks,
// nil when no tenant has one.
func (c *serveConfig) returnPath(ctx context.Context, q *queue.Queue) (*bounce.ReturnPath, error) {
	domains := map[string]*string{}
	for name, t := range c.Tenants {
		if t.ReturnPath != nil {
			domains[name] = t.ReturnPath
		}
	}
	check := func(what, d string) error {
		d = strings.TrimSpace(d)
		if d != "" && (strings.ContainsAny(d, "@ /:") || !strings.Contains(d, ".")) {
			return usageError{fmt.Errorf("%s %q: not a domain", what, d)}
		}
		return nil
	}
	if err := check("--return-path", c.ReturnPath); err != nil {
		return nil, err
	}
	for name, d := range domains {
		if err := check("[tenants."+name+"] return-path", *d); err != nil {
			return nil, err
		}
	}
	probe := bounce.NewReturnPath(nil, c.ReturnPath, domains)
	if !probe.Enabled() {
		return nil, nil
	}
	setup, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key, err := bounce.LoadKey(setup, q)
	if err != nil {
		return nil, err
	}
	return bounce.NewReturnPath(key, c.ReturnPath, domains), nil
}

// startBounces serves the bounce listener on --bounce-addr until the
// returned stop is called. Without a return path or an address it serves
// nothing: a listener with no return path would refuse every recipient,
// and a return path without a listener here is another process's to
// receive (the same key serves the whole fleet).
func startBounces(c *serveConfig, rp *bounce.ReturnPath, q *queue.Queue, enq bounce.Forwarder, notices bounce.Notifier, sup *queue.Suppressions,
	cl *classify.Classifier, hostname, workerID string, tlsConf *tls.Config, reg prometheus.Registerer, log zerolog.Logger) (func(context.Context), error) {
	none := func(context.Context) {}
	if c.Postmaster != "" {
		if _, err := submission.ParseAddress(c.Postmaster); err != nil || !strings.Contains(c.Postmaster, "@") {
			return nil, usageError{fmt.Errorf("--postmaster %q: not an address", c.Postmaster)}
		}
		if c.BounceAddr == "" {
			return nil, usageError{fmt.Errorf("--postmaster %s: mail to it comes to the bounce listener, which is off (--bounce-addr)", c.Postmaster)}
		}
	}
	if c.BounceAddr == "" {
		if rp.Enabled() {
			log.Warn().Strs("return_path_domains", rp.Domains()).
				Msg("a return path is set and --bounce-addr is not: this process receives no bounces (another must, behind the domains' MX)")
		}
		return none, nil
	}
	if !rp.Enabled() {
		return nil, usageError{fmt.Errorf("--bounce-addr %s: no return-path domain to receive for (--return-path or [tenants.NAME] return-path)", c.BounceAddr)}
	}
	srv, err := bounce.New(bounce.Config{Addr: c.BounceAddr, Hostname: hostname, ID: workerID + "/bounce", ReturnPath: rp,
		Store: q, Suppressions: sup, Postmaster: c.Postmaster, Forwarder: enq, Notifier: notices, Classifier: cl, TLSConfig: tlsConf,
		Registerer: reg, Logger: log})
	if err != nil {
		return nil, usageError{err}
	}
	ln, err := srv.Listen()
	if err != nil {
		return nil, fmt.Errorf("--bounce-addr: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil {
			log.Error().Err(err).Msg("bounce listener stopped")
		}
	}()
	log.Info().Str("bounce_addr", ln.Addr().String()).Strs("return_path_domains", rp.Domains()).Msg("bounce listener started")
	return func(ctx context.Context) {
		if err := srv.Shutdown(ctx); err != nil {
			log.Warn().Err(err).Msg("bounce listener shutdown")
		}
		<-done
	}, nil
}

// returnPathOrNil keeps a nil *bounce.ReturnPath from becoming a non-nil
// worker.ReturnPather.
func returnPathOrNil(rp *bounce.ReturnPath) worker.ReturnPather {
	if rp == nil {
		return nil
	}
	return rp
}
