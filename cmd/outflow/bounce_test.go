package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// A return-path domain that is no domain, and a bounce listener with
// nothing to receive for, are refused at start with what to fix.
func TestReturnPathSettingsChecked(t *testing.T) {
	bad := "shop.example/rp"
	for _, c := range []*serveConfig{
		{bounceConfig: bounceConfig{ReturnPath: "bounces@example.com"}},
		{bounceConfig: bounceConfig{ReturnPath: "localhost"}},
		{dsnConfig: dsnConfig{Tenants: map[string]tenantConfig{"shop": {ReturnPath: &bad}}}},
	} {
		_, err := c.returnPath(context.Background(), nil)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), "not a domain") {
			t.Errorf("%+v: %v, want a usage error", c.bounceConfig, err)
		}
	}
	off := ""
	c := &serveConfig{dsnConfig: dsnConfig{Tenants: map[string]tenantConfig{"shop": {ReturnPath: &off}}}}
	if rp, err := c.returnPath(context.Background(), nil); rp != nil || err != nil {
		t.Fatalf("no return-path domain gave %v, %v", rp, err)
	}
	c.BounceAddr = "127.0.0.1:0"
	_, err := startBounces(c, nil, nil, nil, nil, nil, "h", "w", nil, nil, zerolog.Nop())
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no return-path domain") {
		t.Fatalf("--bounce-addr without a return path: %v", err)
	}
	for _, tc := range []struct{ c, want string }{
		{"postmaster", "not an address"},
		{"ops@operator.example", "--bounce-addr"},
	} {
		_, err := startBounces(&serveConfig{bounceConfig: bounceConfig{Postmaster: tc.c}}, nil, nil, nil, nil, nil, "h", "w", nil, nil, zerolog.Nop())
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--postmaster %s: %v, want a usage error saying %q", tc.c, err, tc.want)
		}
	}
}

// A return path for every tenant, with notifications on, says at start
// that SMTP senders no longer get the remote bounces; per tenant, or with
// notifications off, it says nothing.
func TestGlobalReturnPathWarns(t *testing.T) {
	for _, tc := range []struct {
		c    *serveConfig
		warn bool
	}{
		{&serveConfig{bounceConfig: bounceConfig{ReturnPath: "rp.example.com"}, dsnConfig: dsnConfig{DSN: true}}, true},
		{&serveConfig{bounceConfig: bounceConfig{ReturnPath: "rp.example.com"}}, false},
		{&serveConfig{dsnConfig: dsnConfig{DSN: true}}, false},
	} {
		var buf bytes.Buffer
		if _, err := startBounces(tc.c, nil, nil, nil, nil, nil, "h", "w", nil, nil, zerolog.New(&buf)); err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(buf.String(), "no longer receive the bounces"); got != tc.warn {
			t.Errorf("%+v %+v: warned %v, want %v:\n%s", tc.c.bounceConfig, tc.c.DSN, got, tc.warn, buf.String())
		}
	}
}
