package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/outflow/outflow/queue"
)

// Links asked for without an address to serve them at, at an address that
// is no https URL, or with the API listener off are refused at start with
// what to fix.
func TestUnsubscribeSettingsChecked(t *testing.T) {
	yes := true
	for _, tc := range []struct {
		c    *serveConfig
		want string
	}{
		{&serveConfig{unsubscribeConfig: unsubscribeConfig{ListUnsubscribe: true}}, "--list-unsubscribe: one-click unsubscribe links need --unsubscribe-url"},
		{&serveConfig{dsnConfig: dsnConfig{Tenants: map[string]tenantConfig{"news": {ListUnsubscribe: &yes}}}}, "[tenants.news] list-unsubscribe: one-click"},
		{&serveConfig{unsubscribeConfig: unsubscribeConfig{UnsubscribeURL: "https://mail.example.com/unsubscribe"}}, "--api-addr, which is off"},
		{&serveConfig{apiConfig: apiConfig{APIAddr: ":8025"}, unsubscribeConfig: unsubscribeConfig{UnsubscribeURL: "http://mail.example.com/unsubscribe"}}, "--unsubscribe-url"},
	} {
		_, _, err := tc.c.unsubscribeLinks(context.Background(), nil, zerolog.Nop())
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want a usage error saying %q", tc.c.unsubscribeConfig, err, tc.want)
		}
	}
	no := false
	c := &serveConfig{dsnConfig: dsnConfig{Tenants: map[string]tenantConfig{"receipts": {ListUnsubscribe: &no}}}}
	if _, links, err := c.unsubscribeLinks(context.Background(), nil, zerolog.Nop()); links != nil || err != nil {
		t.Fatalf("nobody asking for links gave %v, %v", links, err)
	}
}

// The tenant's setting decides for a submission that does not, the
// submission's own choice wins, and a message with its own
// List-Unsubscribe or a notification outflow wrote gets no links.
func TestListUnsubscribePolicy(t *testing.T) {
	yes, no := true, false
	p := listUnsubscribe{all: false, tenants: map[string]bool{"news": true, "receipts": false}}
	plain := []byte("Subject: s\r\n\r\nx\r\n")
	own := []byte("List-Unsubscribe: <mailto:leave@shop.example>\r\nSubject: s\r\n\r\nx\r\n")
	for _, tc := range []struct {
		name   string
		tenant string
		asked  *bool
		body   []byte
		report bool
		want   bool
	}{
		{"tenant on", "news", nil, plain, false, true},
		{"tenant off", "receipts", nil, plain, false, false},
		{"tenant unset, default off", "other", nil, plain, false, false},
		{"asked on, tenant off", "receipts", &yes, plain, false, true},
		{"asked off, tenant on", "news", &no, plain, false, false},
		{"own field", "news", &yes, own, false, false},
		{"a notification", "news", nil, plain, true, false},
	} {
		s := &queue.Submission{Tenant: tc.tenant, Body: tc.body, ListUnsubscribe: tc.asked, IsReport: tc.report}
		p.apply(s)
		if got := s.ListUnsubscribe != nil && *s.ListUnsubscribe; got != tc.want {
			t.Errorf("%s: links %v, want %v", tc.name, got, tc.want)
		}
	}
	all := listUnsubscribe{all: true, tenants: map[string]bool{"receipts": false}}
	s := &queue.Submission{Tenant: "other", Body: plain}
	if all.apply(s); s.ListUnsubscribe == nil || !*s.ListUnsubscribe {
		t.Fatal("--list-unsubscribe does not reach a tenant without a setting")
	}
}

// A base URL whose path is not the listener's is worth a warning: the
// links it makes answer 404 unless a proxy maps them.
func TestServedPath(t *testing.T) {
	for base, want := range map[string]bool{
		"https://mail.example.com/unsubscribe":   true,
		"http://127.0.0.1:8025/unsubscribe/":     true,
		"https://mail.example.com":               false,
		"https://mail.example.com/u":             false,
		"https://mail.example.com/x/unsubscribe": false,
	} {
		if got := servedPath(base); got != want {
			t.Errorf("servedPath(%q) = %v, want %v", base, got, want)
		}
	}
}
