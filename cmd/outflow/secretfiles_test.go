package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecretFileWarnings: a private key, credentials or a config file
// with relay-password that every local user may read is named at start,
// with its mode and the chmod that mends it; 0600 and 0640 files, and a
// config file without a password, are not.
func TestSecretFileWarnings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	c := &serveConfig{
		Users:     write("users", "", 0o644),
		TLSKey:    write("tls.key", "", 0o600),
		NATSCreds: write("nats.creds", "", 0o604),
		Config:    write("outflow.toml", "relay-password = \"x\"\n", 0o644),
	}
	c.APITLSKey = write("api.key", "", 0o640)
	c.DKIM = []dkimConfig{{Domain: "a.example", KeyFile: write("a.key", "", 0o444)}, {Domain: "b.example", KeyFile: write("b.key", "", 0o600)}}
	got := strings.Join(c.secretFileWarnings(), "\n")
	for _, want := range []string{
		"users file " + c.Users + " is readable by every user of this host (mode 0644): chmod o-rwx " + c.Users,
		"nats-creds " + c.NATSCreds + " is readable by every user of this host (mode 0604)",
		"[[dkim]] key-file of a.example " + c.DKIM[0].KeyFile + " is readable",
		"config file (relay-password) " + c.Config + " is readable",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("warnings lack %q:\n%s", want, got)
		}
	}
	for _, quiet := range []string{c.TLSKey, c.APITLSKey, c.DKIM[1].KeyFile} {
		if strings.Contains(got, quiet+" ") {
			t.Errorf("%s named, but no other user may read it:\n%s", quiet, got)
		}
	}
	if n := len(c.secretFileWarnings()); n != 4 {
		t.Errorf("%d warnings, want 4", n)
	}
	c = &serveConfig{Config: write("plain.toml", "workers = 4\n", 0o644)}
	if w := c.secretFileWarnings(); len(w) != 0 {
		t.Errorf("a config file without a password: %q", w)
	}
}
