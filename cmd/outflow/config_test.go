package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// docExample returns the ```toml block of docs/configuration.md.
func docExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "```toml\n")
	j := strings.Index(s[i+8:], "```")
	if i < 0 || j < 0 {
		t.Fatal("no toml example in docs/configuration.md")
	}
	return s[i+8 : i+8+j]
}

func parseWith(t *testing.T, file string, args ...string) (*serveConfig, error) {
	t.Helper()
	c := &serveConfig{}
	cmd := &cobra.Command{Use: "serve", RunE: func(*cobra.Command, []string) error { return nil }}
	bindServeFlags(cmd.Flags(), c)
	if err := cmd.ParseFlags(append([]string{"--config", file}, args...)); err != nil {
		t.Fatal(err)
	}
	return c, loadConfigFile(cmd, c)
}

// TestDocumentedExampleParses keeps the example in docs/configuration.md
// a working config, and checks flags given on the command line win over it.
func TestDocumentedExampleParses(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte(docExample(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p, "--workers", "8")
	if err != nil {
		t.Fatal(err)
	}
	if c.Workers != 8 {
		t.Errorf("workers = %d: the command line must win over the file", c.Workers)
	}
	if c.SMTPAddr != "0.0.0.0:587" || c.MaxAge.Hours() != 48 || c.EventsMaxAge.Hours() != 72 || len(c.DKIM) != 1 || c.TLSDestinations["bank.example"] != "required" {
		t.Errorf("file not applied: %+v", c)
	}
	if c.RetryBase.Seconds() != 5 {
		t.Errorf("retry-base = %v, want the default 5s where neither file nor flag set it", c.RetryBase)
	}
	tc, err := c.ThrottleFile.Config()
	if err != nil {
		t.Fatal(err)
	}
	if tc.Defaults.Rate != 50 || len(tc.Automation) != 1 || tc.Overrides["google"].Rate != 20 {
		t.Errorf("throttle sections: %+v", tc)
	}
}

func TestUnknownConfigKeyRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(p, []byte("smtp-adr = \"x\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseWith(t, p); err == nil || !strings.Contains(err.Error(), "smtp-adr") {
		t.Fatalf("err = %v, want the unknown key named", err)
	}
}
