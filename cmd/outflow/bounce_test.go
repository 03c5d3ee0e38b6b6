package main

import (
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
	_, err := startBounces(c, nil, nil, nil, nil, nil, nil, "h", "w", nil, nil, zerolog.Nop())
	var ue usageError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "no return-path domain") {
		t.Fatalf("--bounce-addr without a return path: %v", err)
	}
	for _, tc := range []struct{ c, want string }{
		{"postmaster", "not an address"},
		{"ops@operator.example", "--bounce-addr"},
	} {
		_, err := startBounces(&serveConfig{bounceConfig: bounceConfig{Postmaster: tc.c}}, nil, nil, nil, nil, nil, nil, "h", "w", nil, nil, zerolog.Nop())
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--postmaster %s: %v, want a usage error saying %q", tc.c, err, tc.want)
		}
	}
}
