package main

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/resolver"
)

// deliveryConfig is the DNS and trust-root part of serveConfig; each field
// is a flag and a config-file key of the same name.
type deliveryConfig struct {
	DNS       []string `toml:"dns"`
	TLSCAFile string   `toml:"tls-ca-file"`
}

// bindDeliveryFlags registers the resolver and trust-root flags on fs.
func bindDeliveryFlags(fs *pflag.FlagSet, c *deliveryConfig) {
	fs.StringSliceVar(&c.DNS, "dns", nil, "DNS servers for MX, A/AAAA, TXT and TLSA lookups (ADDR[:PORT][,ADDR…]; default: the nameservers of /etc/resolv.conf)")
	fs.StringVar(&c.TLSCAFile, "tls-ca-file", "", "PEM file of extra root certificates for verifying the relay, MX hosts and MTA-STS policy hosts (added to the system roots)")
}

// newResolver builds the delivery resolver from --dns, or from
// /etc/resolv.conf without it, with its cache metrics on reg.
func newResolver(c *deliveryConfig, reg prometheus.Registerer) (*resolver.Resolver, error) {
	var servers []string
	for _, s := range c.DNS {
		if s != "" {
			servers = append(servers, s)
		}
	}
	r, err := resolver.New(resolver.Config{Servers: servers, Registerer: reg})
	if err != nil {
		return nil, usageError{fmt.Errorf("--dns: %w", err)}
	}
	return r, nil
}

// rootCAs is the system's roots plus --tls-ca-file's, or nil (the system
// pool) without the flag. A file that holds no certificate is an error:
// silently trusting only the system would fail every delivery later.
func rootCAs(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, usageError{fmt.Errorf("--tls-ca-file: %w", err)}
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, usageError{fmt.Errorf("--tls-ca-file %s: no PEM certificate in it", file)}
	}
	return pool, nil
}
