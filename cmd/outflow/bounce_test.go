package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/bounce"
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

// TestReturnPathGivesEachRecipientItsEnvelope: a submission of a tenant
// whose mail goes out with a return path is split per recipient (by the
// queue, on serve's queue.Options.PerRecipient), so each recipient sees a
// return path of its own: with one shared, any of them could mail a forged
// bounce or complaint naming another, and have that address suppressed for
// the tenant. A tenant without one keeps one envelope per domain.
func TestReturnPathGivesEachRecipientItsEnvelope(t *testing.T) {
	off := ""
	var rp *bounce.ReturnPath
	split := perRecipient(&rp)
	if split("shop") {
		t.Error("split without any return path")
	}
	rp = bounce.NewReturnPath(make([]byte, 32), "rp.example", map[string]*string{"own": &off})
	for tenant, want := range map[string]bool{"shop": true, "own": false} {
		if got := split(tenant); got != want {
			t.Errorf("tenant %s: PerRecipient %v, want %v", tenant, got, want)
		}
	}
}
