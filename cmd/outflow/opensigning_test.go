package main

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOpenSigning: with several tenants, [[dkim]] keys and no top-level
// sender-domains, a tenant without a list of its own sends as any domain,
// another tenant's included, signed with that domain's key; start now
// says so and names them. One tenant, a top-level list, every tenant
// listed, or no key: nothing to say.
func TestOpenSigning(t *testing.T) {
	list := func(d ...string) []string { return d }
	c := &dsnConfig{Tenants: map[string]tenantConfig{"alice": {SenderDomains: list("a.example")}}}
	dkim := []string{"b.example", "a.example", "b.example"}
	line := c.openSigning([]string{"alice", "bob", "trusted", "bob"}, dkim)
	for _, want := range []string{"2 of 3 tenants (bob, trusted) may send as any domain", "signs for a.example, b.example", "set sender-domains"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	many := []string{"alice", "t1", "t2", "t3", "t4", "t5", "t6", "t7"}
	if line := c.openSigning(many, dkim); !strings.Contains(line, "(t1, t2, t3, t4, t5 and 2 more)") {
		t.Errorf("seven open tenants: %q", line)
	}
	top := &dsnConfig{SenderDomains: &[]string{}, Tenants: c.Tenants}
	both := &dsnConfig{Tenants: map[string]tenantConfig{"alice": {SenderDomains: list("a.example")}, "bob": {SenderDomains: list("b.example")}}}
	for name, got := range map[string]string{
		"one tenant":          c.openSigning([]string{"bob", "bob"}, dkim),
		"a top-level list":    top.openSigning([]string{"alice", "bob"}, dkim),
		"every tenant listed": both.openSigning([]string{"alice", "bob"}, dkim),
		"no dkim key":         c.openSigning([]string{"alice", "bob"}, nil),
	} {
		if got != "" {
			t.Errorf("%s: %q, want nothing", name, got)
		}
	}
}

// TestServeWarnsOfOpenSigning: the start of a daemon with its generated
// account, trusted networks and a [[dkim]] key, without sender-domains,
// logs the warning, naming the tenants that may send as any domain.
func TestServeWarnsOfOpenSigning(t *testing.T) {
	dir := t.TempDir()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(dir, "b.key")
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "outflow.toml")
	if err := os.WriteFile(conf, []byte("[[dkim]]\ndomain = \"b.example\"\nselector = \"s1\"\nkey-file = \""+key+"\"\n"+
		"[tenants.alice]\nsender-domains = [\"a.example\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	errFile, err := os.Create(filepath.Join(dir, "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	stderr := os.Stderr
	os.Stderr = errFile // newLogger writes to os.Stderr
	defer func() { os.Stderr = stderr }()
	cfg, err := parseWith(t, conf, serveArgs(filepath.Join(dir, "data"), "--trusted-networks", "127.0.0.0/8")...)
	if err != nil {
		t.Fatal(err)
	}
	serveUntilUp(t, cfg)
	os.Stderr = stderr
	logs, err := os.ReadFile(errFile.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(logs), `"level":"warn"`) || !strings.Contains(string(logs), "2 of 2 tenants (outflow, trusted) may send as any domain, and [[dkim]] signs for b.example") {
		t.Errorf("no warning of open signing at start:\n%s", logs)
	}
}
