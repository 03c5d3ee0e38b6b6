package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/outflow/outflow/internal/testutil"
	"github.com/outflow/outflow/throttle"
	"github.com/outflow/outflow/worker"
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
	if c.SMTPAddr != "0.0.0.0:587" || c.MaxAge.Hours() != 48 || c.EventsMaxAge.Hours() != 72 || c.SentTTL.Hours() != 24 || len(c.DKIM) != 1 || c.TLSDestinations["bank.example"] != "required" ||
		len(c.NoChunkingFor) != 2 || c.NoChunkingFor[0] != "legacy.example" || c.NoChunkingFor[1] != "mx1.old.example" {
		t.Errorf("file not applied: %+v", c)
	}
	if rp := c.Tenants["shop"].ReturnPath; c.BounceAddr != ":25" || rp == nil || *rp != "rp.shop.example" {
		t.Errorf("bounce-addr %q, [tenants.shop] return-path %v", c.BounceAddr, rp)
	}
	if c.RetryBase.Seconds() != 5 {
		t.Errorf("retry-base = %v, want the default 5s where neither file nor flag set it", c.RetryBase)
	}
	tc, err := c.File.Config()
	if err != nil {
		t.Fatal(err)
	}
	if tc.Defaults.Rate != 50 || len(tc.Automation) != 1 || tc.Overrides["google"].Rate != 20 {
		t.Errorf("throttle sections: %+v", tc)
	}
}

// TestUnknownConfigKeyRefused: a misspelt key is refused with the known
// key of its table nearest it, and a string left unquoted is told to be
// quoted instead of getting the parser's "Invalid float value".
func TestUnknownConfigKeyRefused(t *testing.T) {
	for _, c := range []struct{ file, want string }{
		{"smtp-adr = \"x\"\n", `unknown key "smtp-adr" (did you mean "smtp-addr"?)`},
		{"[throttle]\nbreaker-failure = 3\n", `unknown key "throttle.breaker-failure" (did you mean "breaker-failures"?)`},
		{"[[dkim]]\ndomian = \"a.test\"\n", `unknown key "dkim.domian" (did you mean "domain"?)`},
		{"zzzzzz = 1\n", `unknown key "zzzzzz"` + "\x00"},
		// A misspelt table's name: its keys are unknown too, and the
		// table nearest it is named.
		{"[tenant.shop]\nreturn-path = \"rp.shop.example\"\n", `(did you mean "tenants"?)`},
		{"[destination.\"gmail.com\"]\nrate = 5\n", `(did you mean "destinations"?)`},
		{"[tenants.shop]\nretrun-path = \"rp.shop.example\"\n", `unknown key "tenants.shop.retrun-path" (did you mean "return-path"?)`},
		{"smtp-addr = 127.0.0.1:2525\n", `(smtp-addr takes a string: quote it, smtp-addr = "...")`},
		{"shutdown-grace = 30s\n", `(shutdown-grace takes a string: quote it, shutdown-grace = "...")`},
		{"[[dkim]]\ndomain = a.test\n", `(domain takes a string: quote it, domain = "...")`},
		// Quoted already: the unit is what is wrong, not the quotes.
		{"max-age = \"2d\"\n", `invalid duration: "2d" (max-age is a duration with a unit of h, m, s or ms, like "48h")` + "\x00"},
	} {
		p := filepath.Join(t.TempDir(), "bad.toml")
		if err := os.WriteFile(p, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := parseWith(t, p)
		if err == nil || !strings.Contains(err.Error()+"\x00", c.want) {
			t.Errorf("%q: err = %v, want %q", c.file, err, c.want)
		}
	}
}

// TestSecretNotInParseError: a password left unquoted is what the TOML
// parser quotes in its error ("found \"OnlyLettersPassword\""), which
// serve logs at fatal level; the error names the key and the line, and
// says to quote it, without the value.
func TestSecretNotInParseError(t *testing.T) {
	for _, file := range []string{
		"relay-password = OnlyLettersPassword\n",
		"relay-password = Sup3rSecret\n",
		"smtp-addr = \"127.0.0.1:2525\"\nrelay-password = Sup3rSecret!x\n",
	} {
		p := filepath.Join(t.TempDir(), "outflow.toml")
		if err := os.WriteFile(p, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := parseWith(t, p)
		if err == nil || !strings.Contains(err.Error(), "relay-password") || !strings.Contains(err.Error(), "quote it") {
			t.Fatalf("%q: err = %v, want relay-password named and the hint to quote it", file, err)
		}
		for _, part := range []string{"OnlyLetters", `"Sup`, "Sup3r"} {
			if strings.Contains(err.Error(), part) {
				t.Errorf("%q: err = %v repeats the password", file, err)
			}
		}
	}
}

// TestIntegerDurationRefused: the TOML decoder reads an integer into a
// time.Duration as nanoseconds, so `shutdown-grace = 30` was 30 ns and
// `max-age = 86400` expired every message at once. A duration key with an
// integer is refused, wherever it is (embedded settings, a section, an
// array of tables); other integer keys still take integers.
func TestIntegerDurationRefused(t *testing.T) {
	for _, c := range []struct{ file, key string }{
		{"shutdown-grace = 30\n", "shutdown-grace"},
		{"max-age = 86400\n", "max-age"},
		{"webhook-timeout = 10\n", "webhook-timeout"},
		{"[throttle]\nbreaker-cooldown = 3\n", "throttle.breaker-cooldown"},
		{"[[automation]]\nname = \"a\"\npattern = \"TSS04\"\naction = \"suspend\"\nwindow = 60\nfor = \"15m\"\n", "automation.window"},
	} {
		p := filepath.Join(t.TempDir(), "outflow.toml")
		if err := os.WriteFile(p, []byte(c.file), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := parseWith(t, p)
		if err == nil || !strings.Contains(err.Error(), c.key+":") || !strings.Contains(err.Error(), "nanoseconds") {
			t.Errorf("%q: err = %v, want %s refused as an integer duration", c.file, err, c.key)
		}
	}
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte("workers = 8\nmax-attempts = 9\nshutdown-grace = \"45s\"\n[throttle]\nbreaker-failures = 4\n[tenants.a]\ndsn-delay-warning = \"0s\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if c.Workers != 8 || c.MaxAttempts != 9 || c.ShutdownGrace != 45*time.Second || c.Throttle.BreakerFailures != 4 {
		t.Errorf("integers and durations not applied: workers %d, max-attempts %d, shutdown-grace %v, breaker-failures %d",
			c.Workers, c.MaxAttempts, c.ShutdownGrace, c.Throttle.BreakerFailures)
	}
}

// TestSentTTLFloor: serve refuses a SENT-marker lifetime shorter than an
// hour or four ack waits, before it starts anything: an envelope whose ack
// was lost comes back after the ack wait and must still find its marker.
func TestSentTTLFloor(t *testing.T) {
	p := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--sent-ttl", "30m"}, {"--sent-ttl", "12h"}, {"--sent-ttl", "25h", "--ack-wait", "7h"}} {
		c, err := parseWith(t, p, append(args, "--data", t.TempDir())...)
		if err != nil {
			t.Fatal(err)
		}
		err = serve(context.Background(), c, io.Discard)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "--sent-ttl") {
			t.Errorf("%v: error %v, want a --sent-ttl usage error", args, err)
		}
	}
}

// TestEveryServeFlagDocumented: each serve flag (and so each config key)
// has its row in docs/configuration.md.
func TestEveryServeFlagDocumented(t *testing.T) {
	b, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	cmd := &cobra.Command{Use: "serve"}
	bindServeFlags(cmd.Flags(), &serveConfig{})
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		// A row may name a pair: | `tls-cert`, `tls-key` |.
		if !strings.Contains(string(b), "| `"+f.Name+"`") && !strings.Contains(string(b), "`, `"+f.Name+"` |") {
			t.Errorf("--%s has no row in docs/configuration.md", f.Name)
		}
	})
}

// TestFlagHelpValueNames: pflag takes a `quoted` word of a flag's usage
// as the name of its value in --help, so a usage that quotes a command
// printed "--data outflow serve" and "--webhook-dead-max-age webhook
// replay". No flag of any command may name its value with more than a word.
func TestFlagHelpValueNames(t *testing.T) {
	check := func(c string, f *pflag.Flag) {
		if name, _ := pflag.UnquoteUsage(f); strings.ContainsAny(name, " \t") {
			t.Errorf("%s --%s: --help names its value %q (a `quoted` phrase in its usage)", c, f.Name, name)
		}
	}
	serve := &cobra.Command{Use: "serve"}
	bindServeFlags(serve.Flags(), &serveConfig{})
	serve.Flags().VisitAll(func(f *pflag.Flag) { check("serve", f) })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.LocalNonPersistentFlags().VisitAll(func(f *pflag.Flag) { check(c.CommandPath(), f) })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { check(c.CommandPath(), f) })
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(rootCmd)
}

// TestEveryCommandFlagDocumented: each flag of the other commands has its
// row in docs/configuration.md's "Flags of the other commands".
func TestEveryCommandFlagDocumented(t *testing.T) {
	sec := testutil.DocSection(t, "../../docs/configuration.md", "## Flags of the other commands", "\n## ")
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Name() == "serve" || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		check := func(f *pflag.Flag) {
			if f.Name != "help" && !strings.Contains(sec, "`--"+f.Name+"`") {
				t.Errorf("%s --%s has no row in docs/configuration.md", c.CommandPath(), f.Name)
			}
		}
		c.LocalNonPersistentFlags().VisitAll(check)
		c.PersistentFlags().VisitAll(check)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	for _, c := range rootCmd.Commands() {
		walk(c)
	}
}

// TestHistorySinceMustBePositive: a negative --since is a usage error,
// refused before any connection to NATS is tried.
func TestHistorySinceMustBePositive(t *testing.T) {
	err := execRoot(context.Background(), nil, "queue", "history", "someid", "--since", "-1h", "--data", t.TempDir())
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "--since") {
		t.Fatalf("error %v, want a --since usage error", err)
	}
}

// TestMisspeltArgumentsRefused: a misspelt event type for `queue find`
// (which would find nothing and exit 0), a negative --for for `dest rate`
// (which set a cap that never ended) or `dest suspend`, a negative --limit
// (which listed everything), a suppression of no address, a state or
// webhook event that does not exist, and the command line's own errors are
// usage errors (exit 2), refused before any connection is tried.
func TestMisspeltArgumentsRefused(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"queue", "find", "ann@example.com", "--type", "delivered,bounce"}, `"bounce" is not an event type`},
		{[]string{"dest", "rate", "slow.test", "--max", "5", "--for", "-1m"}, "--for must be > 0"},
		{[]string{"queue", "list", "--state", "bogus"}, `--state "bogus"`},
		{[]string{"queue", "list", "--limit", "-5"}, "--limit -5: want 0 (all) or more"},
		{[]string{"dest", "suspend", "slow.test", "--for", "-5m"}, "--for -5m0s: must be positive"},
		{[]string{"suppress", "add", "not an address", "--tenant", "shop"}, `"not an address"`},
		{[]string{"webhook", "add", "--tenant", "shop", "--url", "https://hooks.example/x", "--events", "delivered,bogus"}, `unknown event "bogus"`},
		{[]string{"webhook", "rotate", "wh_x", "--keep", "-1h"}, "--keep: want a duration of 0 or more"},
		// The command line's own errors, which cobra reports.
		{[]string{"queue", "drop"}, "accepts 1 arg(s), received 0"},
		{[]string{"queue", "list", "--bogus"}, "unknown flag: --bogus"},
		{[]string{"queue", "list", "--limit", "many"}, "invalid argument"},
		{[]string{"queue", "bogus"}, `unknown command "bogus"`},
		{[]string{"queue", "lsit"}, `did you mean list?`},
		{[]string{"queu"}, `unknown command "queu" for "outflow"`},
		{[]string{"help", "bogus"}, `unknown help topic "bogus"`},
		{[]string{"help", "queue", "bogus"}, `unknown help topic "queue bogus"`},
	} {
		args := c.args
		if len(args) > 1 && args[0] != "help" {
			args = append(args, "--data", t.TempDir())
		}
		err := execRoot(context.Background(), nil, args...)
		if err == nil || exitCode(err) != 2 || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want a usage error (exit 2) saying %s", c.args, err, c.want)
		}
	}
}

// TestDestArgRefusesNonDestinations: dest commands refuse a DEST that no
// mail can have (a list, a space, a NATS wildcard, nothing) with a usage
// error before any connection is tried, and take domains, groups and
// DEST@SOURCE pairs.
func TestDestArgRefusesNonDestinations(t *testing.T) {
	for _, bad := range []string{"", " ", "gmail.com,yahoo.com", "a b", "gmail.*", "a.>", "x\ty", "gmail.com/x", "\u0301bad.example"} {
		for _, verb := range [][]string{{"status"}, {"suspend", "--for", "1m"}, {"resume"}, {"rate", "--max", "1"}, {"forget"}} {
			args := append([]string{"dest", verb[0], bad}, verb[1:]...)
			err := execRoot(context.Background(), nil, append(args, "--data", t.TempDir())...)
			var u usageError
			if !errors.As(err, &u) || !strings.Contains(err.Error(), "DEST") {
				t.Errorf("%q: error %v, want a DEST usage error", args, err)
			}
		}
	}
	for _, good := range []string{"gmail.com", "Gmail.COM.", "google", "gmail.com@192.0.2.10", "gmail.com@2001:db8::1", "xn--bcher-kva.example"} {
		if err := destArg(nil, []string{good}); err != nil {
			t.Errorf("%q refused: %v", good, err)
		}
	}
	// An internationalised name is the A-label name mail to it is queued
	// under (submission takes ASCII addresses only): suspending
	// bücher.example suspended a destination no mail had.
	for in, want := range map[string]string{"Bücher.Example": "xn--bcher-kva.example", "bücher.example@192.0.2.10": "xn--bcher-kva.example@192.0.2.10"} {
		args := []string{in}
		if err := destArg(nil, args); err != nil || args[0] != want {
			t.Errorf("%q: %q, %v; want %q", in, args[0], err, want)
		}
	}
}

// TestTenantDSNConfig: the documented [tenants.NAME] section reaches the
// worker, and a bad dsn-address is refused.
func TestTenantDSNConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte(docExample(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.workerDSN("mta1.example.com", nil, nil)
	if err != nil || w == nil {
		t.Fatalf("workerDSN: %v %v", w, err)
	}
	b := w.Tenants["billing"]
	if b.Enabled == nil || !*b.Enabled || b.Address != "bounces@example.com" || b.DelayWarning == nil || *b.DelayWarning != 0 {
		t.Fatalf("tenant billing = %+v", b)
	}
	if w.DelayWarning.Hours() != 4 || w.SenderRate != 60 || w.PassTimeout != 5*time.Minute {
		t.Errorf("defaults: delay warning %v, sender rate %v, pass timeout %v", w.DelayWarning, w.SenderRate, w.PassTimeout)
	}
	c.Tenants["billing"] = tenantConfig{DSNAddress: "not an address"}
	if _, err := c.workerDSN("h", nil, nil); err == nil {
		t.Error("a bad dsn-address was accepted")
	}
	c.DSN = false
	if w, err := c.workerDSN("h", nil, nil); w != nil || err != nil {
		t.Errorf("dsn = false: %v %v", w, err)
	}
}

// TestServeFlagDefaultsDocumented: the default docs/configuration.md gives
// each serve flag is the flag's own, which the flags take from the library
// packages' Default constants. A row whose default is prose (the host
// name, `disk` on the embedded server …) or computed at start is left to
// the reader.
func TestServeFlagDefaultsDocumented(t *testing.T) {
	sec := testutil.DocSection(t, "../../docs/configuration.md", "## Flags and keys of `outflow serve`", "\n## ")
	documented := map[string]string{} // flag name → documented default
	for _, line := range strings.Split(sec, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue
		}
		def := strings.TrimSpace(cells[2])
		if !strings.HasPrefix(def, "`") {
			continue
		}
		val, rest, ok := strings.Cut(def[1:], "`")
		if !ok || rest != "" && !strings.HasPrefix(rest, " (") {
			continue
		}
		for _, name := range strings.Split(cells[1], ",") {
			documented[strings.Trim(strings.TrimSpace(name), "`")] = val
		}
	}
	cmd := &cobra.Command{Use: "serve"}
	bindServeFlags(cmd.Flags(), &serveConfig{})
	checked := 0
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		doc, ok := documented[f.Name]
		if !ok || f.DefValue == "" { // "": computed at start (DATA/users, hostname-pid)
			return
		}
		checked++
		if f.Value.Type() == "duration" {
			dd, err1 := time.ParseDuration(doc)
			fd, err2 := time.ParseDuration(f.DefValue)
			if err1 != nil || err2 != nil || dd != fd {
				t.Errorf("--%s: docs/configuration.md says %s, the flag's default is %s", f.Name, doc, f.DefValue)
			}
			return
		}
		if doc != f.DefValue {
			t.Errorf("--%s: docs/configuration.md says %s, the flag's default is %s", f.Name, doc, f.DefValue)
		}
	})
	if checked < 40 {
		t.Errorf("only %d documented defaults compared; has the table's layout changed?", checked)
	}
}

// TestAdminTimeoutMustBePositive: --timeout 0s would give up before the
// first request; it is refused as a usage error, before any connection.
func TestAdminTimeoutMustBePositive(t *testing.T) {
	for _, d := range []string{"0s", "-1s"} {
		err := execRoot(context.Background(), nil, "queue", "list", "--timeout", d, "--data", t.TempDir())
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), "--timeout") {
			t.Errorf("--timeout %s: error %v, want a usage error", d, err)
		}
	}
}

// TestAwaitStopReportsAFailure: the submission listener or the workers
// stopping on their own is a failure serve exits with (a supervisor then
// restarts it); a signal is a clean stop. The workers' result, once read,
// is not waited for again.
func TestAwaitStopReportsAFailure(t *testing.T) {
	log := zerolog.Nop()
	sub, pool := make(chan error, 1), make(chan error, 1)
	sub <- errors.New("accept: too many open files")
	if err, read := awaitStop(context.Background(), sub, pool, log); err == nil || !strings.Contains(err.Error(), "submission listener stopped: accept") || read {
		t.Errorf("listener failure: %v, %v", err, read)
	}
	pool <- nil
	if err, read := awaitStop(context.Background(), sub, pool, log); err == nil || !strings.Contains(err.Error(), "workers stopped") || !read {
		t.Errorf("workers ending: %v, %v", err, read)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err, read := awaitStop(ctx, sub, pool, log); err != nil || read {
		t.Errorf("signal: %v, %v; want a clean stop", err, read)
	}
	// A signal with the workers ending because of it, both ready at
	// once: a clean stop every time (select picked either, and
	// TestFirstStartShowsAccountOnceUp failed now and then).
	for range 50 {
		pool <- context.Canceled
		err, read := awaitStop(ctx, sub, pool, log)
		if err != nil {
			t.Fatalf("signal while the workers end: %v; want a clean stop", err)
		}
		if !read {
			<-pool
		}
	}
}

// TestSenderDomainsConfig: [tenants.NAME] sender-domains reaches the
// sender policy (the documented example's billing tenant is limited, a
// tenant without the key is not), and an entry that is no domain stops
// serve before it starts.
func TestSenderDomainsConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte(docExample(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := c.senderDomains()
	if err != nil {
		t.Fatal(err)
	}
	if !pol.Allows("billing", "a@mail.example.com") || pol.Allows("billing", "a@bank.example") || !pol.Allows("shop", "a@bank.example") {
		t.Errorf("policy %v", pol)
	}
	bad := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(bad, []byte("[tenants.shop]\nsender-domains = [\"shop example\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = parseWith(t, bad); err != nil {
		t.Fatal(err)
	}
	var u usageError
	if _, err := c.senderDomains(); !errors.As(err, &u) || !strings.Contains(err.Error(), "[tenants.shop] sender-domains") {
		t.Errorf("bad entry: %v, want a usage error naming it", err)
	}
}

// TestSenderDomainsForOtherTenants: the top-level sender-domains is the
// policy of every tenant without a section of its own, which closes the
// policy: a tenant left out, or spelled otherwise than in the users file,
// no longer sends as anyone's domain. A section spelled otherwise than an
// account is said at start.
func TestSenderDomainsForOtherTenants(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outflow.toml")
	conf := "sender-domains = []\n[tenants.shopA]\nsender-domains = [\"a.example\"]\n[tenants.billing]\nsender-domains = [\"b.example\"]\n"
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p)
	if err != nil {
		t.Fatal(err)
	}
	pol, err := c.senderDomains()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		tenant, from string
		want         bool
	}{
		{"shopA", "x@a.example", true},
		{"shopA", "x@b.example", false},
		{"shopa", "x@b.example", false}, // not named: the top-level list, empty
		{"shopa", "x@a.example", false},
		{"newcomer", "x@anything.example", false},
	} {
		if got := pol.Allows(tc.tenant, tc.from); got != tc.want {
			t.Errorf("%s as %s: %v, want %v", tc.tenant, tc.from, got, tc.want)
		}
	}
	near := c.tenantNearMisses([]string{"shopa", "billing", "other"})
	if len(near) != 1 || !strings.Contains(near[0], "[tenants.shopA]") || !strings.Contains(near[0], `"shopa"`) {
		t.Errorf("near misses %q, want one naming [tenants.shopA] and the account shopa", near)
	}
	// Without the top-level key, a tenant without a section may use any
	// domain, as before.
	open := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(open, []byte("[tenants.shopA]\nsender-domains = [\"a.example\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = parseWith(t, open); err != nil {
		t.Fatal(err)
	}
	if pol, err = c.senderDomains(); err != nil || !pol.Allows("shopa", "x@b.example") {
		t.Errorf("no top-level list: shopa refused (%v)", err)
	}
	// A section named "*", the key of every tenant without one, silently
	// replaced the top-level list (x@evil.example allowed to all): refused.
	star := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(star, []byte("sender-domains = [\"common.example\"]\n[tenants.\"*\"]\nsender-domains = [\"evil.example\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = parseWith(t, star); err == nil {
		err = c.checkFlags()
	}
	if err == nil || !strings.Contains(err.Error(), `[tenants."*"]`) || !strings.Contains(err.Error(), "reserved") {
		t.Errorf(`a [tenants."*"] section: %v, want it refused as reserved`, err)
	}
}

// TestServeLogsItsStopAsJSON: the error serve stops on is also a JSON log
// line (level fatal, the error, the exit status), as the daemon's other
// lines are, for a collector that reads only those.
func TestServeLogsItsStopAsJSON(t *testing.T) {
	var errOut bytes.Buffer
	rootCmd.SetArgs([]string{"serve", "--sent-ttl", "30m", "--data", t.TempDir()})
	rootCmd.SetOut(io.Discard)
	rootCmd.SetErr(&errOut)
	defer func() {
		rootCmd.SetArgs(nil)
		rootCmd.SetOut(nil)
		rootCmd.SetErr(nil)
		resetCommands(rootCmd)
	}()
	if err := rootCmd.ExecuteContext(context.Background()); err == nil {
		t.Fatal("serve --sent-ttl 30m started")
	}
	var line struct {
		Level    string `json:"level"`
		Error    string `json:"error"`
		ExitCode int    `json:"exit_code"`
		Message  string `json:"message"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(errOut.Bytes()), &line); err != nil {
		t.Fatalf("stderr is not one JSON line: %v: %q", err, errOut.String())
	}
	if line.Level != "fatal" || !strings.Contains(line.Error, "--sent-ttl") || line.ExitCode != 2 || line.Message == "" {
		t.Fatalf("stop line %+v", line)
	}
}

// TestServeFlagValuesNamed: a value the packages below would refuse in
// their own words, naming a Go field (`sender: RelayTLS "plain"`, `worker:
// unknown policy`), is refused by serve first, naming the flag and what it
// takes, before anything starts.
func TestServeFlagValuesNamed(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--relay-tls", "plain"}, `--relay-tls "plain": want starttls, tls or none`},
		{[]string{"--relay", "nohostport"}, `--relay "nohostport": want host:port`},
		{[]string{"--tls-policy", "bogus"}, `--tls-policy "bogus": want opportunistic, required or none`},
		{[]string{"--unknown-policy", "bogus"}, `--unknown-policy "bogus": want retry or hold`},
		{[]string{"--hostname", "mta1 example"}, `--hostname "mta1 example": ' ' is not a host name's character; want one domain name`},
		// What went out in EHLO as written, and receivers that check it
		// refused: a port, a non-ASCII name, a bare address.
		{[]string{"--hostname", "mta1.example.com:25"}, `--hostname "mta1.example.com:25": ':' is not a host name's character`},
		{[]string{"--hostname", "mtä.example.com"}, `not ASCII: write an internationalized name as A-labels`},
		{[]string{"--hostname", "192.0.2.1"}, `an address goes in brackets`},
		{[]string{"--hostname", "[192.0.2.300]"}, `not an address literal`},
		{[]string{"--hostname", "[IPv6:fe80::1%lo]"}, `a zone (%lo) cannot be part of an address literal: [IPv6:fe80::1]`},
		{[]string{"--hostname", "::1"}, `an address goes in brackets: [IPv6:::1]`},
		{[]string{"--hostname", "-mta.example.com"}, `label "-mta" is not a host name's`},
		// Started, every message was deferred a day on the relay's
		// address and then dead-lettered.
		{[]string{"--relay", "127.0.0.1:99999"}, `--relay "127.0.0.1:99999": want host:port, like smtp.example.com:587 (bad port "99999")`},
		{[]string{"--relay", "127.0.0.1:abc"}, `bad port "abc"`},
		{[]string{"--relay", ":25"}, `(no host)`},
		// Ignored: the mail went straight to MX, or to the embedded server.
		{[]string{"--relay-user", "u", "--relay-password", "p"}, `--relay-user and --relay-password are the smarthost's: set --relay too`},
		{[]string{"--nats-creds", "/etc/outflow/nats.creds"}, `--nats-creds is for --nats-url`},
		{[]string{"--nats-replicas", "3"}, `--nats-replicas 3: the embedded server is one node; replicas need a cluster (--nats-url)`},
		// Meant as GiB: the store was full from the first message on.
		{[]string{"--store-max", "20"}, `--store-max 20: it counts bytes, and at least 134217728 (128 MiB)`},
	} {
		cfg, err := parseWith(t, emptyConfig(t), append(c.args, "--data", t.TempDir())...)
		if err != nil {
			t.Fatal(err)
		}
		err = serve(context.Background(), cfg, io.Discard)
		var u usageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want a usage error saying %s", c.args, err, c.want)
		}
	}
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte("[tls-destinations]\n\"bank.example\" = \"requried\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseWith(t, p)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.checkFlags(); err == nil || !strings.Contains(err.Error(), `[tls-destinations] "bank.example" = "requried"`) {
		t.Errorf("[tls-destinations]: %v", err)
	}
	for _, args := range [][]string{nil, {"--relay", "smtp.example.com:587", "--relay-tls", "none", "--tls-policy", "required", "--unknown-policy", "hold"},
		{"--hostname", "xn--mt-via.example.com."}, {"--hostname", "[192.0.2.1]"}, {"--hostname", "[IPv6:2001:db8::1]"}, {"--hostname", "vm"},
		{"--relay", "[::1]:2525"}} {
		cfg, err := parseWith(t, emptyConfig(t), args...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.checkFlags(); err != nil {
			t.Errorf("%q refused: %v", args, err)
		}
	}
}

// TestHostnameWarning: a hostname without a dot (the bare machine name
// os.Hostname gives on many hosts) gets a warning naming --hostname; a
// fully-qualified one none.
func TestHostnameWarning(t *testing.T) {
	for _, c := range []struct {
		name  string
		given bool
		warn  bool
	}{
		{"vm", false, true},
		{"localhost", true, true},
		{"vm.", false, true},
		{"mta1.example.com", true, false},
		{"mta1.example.com.", false, false},
		{"[IPv6:2001:db8::25]", true, false},
	} {
		msg := hostnameWarning(c.name, c.given)
		if (msg != "") != c.warn {
			t.Errorf("%q: warning %q", c.name, msg)
			continue
		}
		if c.warn && (!strings.Contains(msg, "--hostname") || !strings.Contains(msg, "504") || !strings.Contains(msg, `"`+c.name+`"`)) {
			t.Errorf("%q: warning %q does not name the name, --hostname and the refusal", c.name, msg)
		}
	}
}

// TestEffectiveWorkers: --workers 0 (or less) runs the default, and the
// start's log line says that number, not 0.
func TestEffectiveWorkers(t *testing.T) {
	for n, want := range map[int]int{0: worker.DefaultWorkers, -3: worker.DefaultWorkers, 1: 1, 64: 64} {
		if got := effectiveWorkers(n); got != want {
			t.Errorf("--workers %d: %d, want %d", n, got, want)
		}
	}
}

// TestZeroAndNegativeNumbersRefused: a zero or negative number or duration
// that the packages below would silently replace by their default is
// refused at start, naming its key and what it takes (`max-age = "0s"`,
// meant as "never expire", was a day; `max-attempts = 0` was 250), as is
// a port out of range; the zeros and negatives that
// docs/configuration.md gives a meaning to are taken.
func TestZeroAndNegativeNumbersRefused(t *testing.T) {
	for _, c := range []struct {
		file string   // config file, or
		args []string // flags
		want string
	}{
		{file: "max-age = \"0s\"\n", want: "--max-age 0s: want a positive duration; 0 would be taken as unset"},
		{file: "max-age = \"-1s\"\n", want: "--max-age -1s: want a positive duration"},
		{file: "max-attempts = 0\n", want: "--max-attempts 0: want a positive number"},
		{args: []string{"--max-attempts", "-1"}, want: "--max-attempts -1: want a positive number"},
		{file: "events-max-age = \"0s\"\n", want: "--events-max-age 0s"},
		{args: []string{"--ack-wait", "-1s"}, want: "--ack-wait -1s"},
		{args: []string{"--ack-wait", "0s"}, want: "--ack-wait 0s"},
		{args: []string{"--retry-base", "-5s"}, want: "--retry-base -5s"},
		{args: []string{"--retry-min", "0s"}, want: "--retry-min 0s"},
		{args: []string{"--retry-cap", "0s"}, want: "--retry-cap 0s"},
		{args: []string{"--retry-multiplier", "0"}, want: "--retry-multiplier 0"},
		{args: []string{"--ratelimit-base", "0s"}, want: "--ratelimit-base 0s"},
		{args: []string{"--shutdown-grace", "-1s"}, want: "--shutdown-grace -1s: want 0 (deliveries in progress are cut at once) or a positive duration"},
		{file: "connect-timeout = \"0s\"\n", want: "--connect-timeout 0s"},
		{args: []string{"--final-dot-timeout", "-1m"}, want: "--final-dot-timeout -1m0s"},
		{args: []string{"--smtp-port", "70000"}, want: "--smtp-port 70000: want a TCP port, 1 to 65535"},
		{args: []string{"--smtp-port", "0"}, want: "--smtp-port 0"},
		{args: []string{"--dest-rate", "-1"}, want: "--dest-rate -1: want 0 (unlimited) or a positive number"},
		{args: []string{"--dest-conns", "-2"}, want: "--dest-conns -2: want 0 (unlimited)"},
		{args: []string{"--nats-replicas", "0"}, want: "--nats-replicas 0"},
		{args: []string{"--max-message-size", "0"}, want: "--max-message-size 0"},
		{args: []string{"--max-connections", "-1"}, want: "--max-connections -1"},
		{args: []string{"--max-client-connections", "0"}, want: "--max-client-connections 0: want a positive number, or a negative one for no limit"},
		{args: []string{"--smtp-max-inflight-bytes", "0"}, want: "--smtp-max-inflight-bytes 0"},
		{args: []string{"--smtp-read-timeout", "0s"}, want: "--smtp-read-timeout 0s"},
		{args: []string{"--sync-window", "-1ms"}, want: "--sync-window -1ms: want 0 (never wait)"},
		{args: []string{"--gc-percent", "-1"}, want: "--gc-percent -1"},
		{args: []string{"--gc-min-heap", "-1"}, want: "--gc-min-heap -1"},
		{args: []string{"--mx-address-limit", "-1"}, want: "--mx-address-limit -1: want 0 (no limit)"},
		{args: []string{"--api-rate", "0"}, want: "--api-rate 0: want a positive number, or a negative one for no limit"},
		{args: []string{"--api-burst", "0"}, want: "--api-burst 0"},
		{args: []string{"--webhook-timeout", "0s"}, want: "--webhook-timeout 0s"},
		{args: []string{"--webhook-max-attempts", "-3"}, want: "--webhook-max-attempts -3"},
		{args: []string{"--dsn-pass-timeout", "-1s"}, want: "--dsn-pass-timeout -1s"},
	} {
		file := emptyConfig(t)
		if c.file != "" {
			file = filepath.Join(t.TempDir(), "outflow.toml")
			if err := os.WriteFile(file, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		cfg, err := parseWith(t, file, c.args...)
		if err != nil {
			t.Fatalf("%q %q: %v", c.file, c.args, err)
		}
		if err := cfg.checkFlags(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q %q: error %v, want one saying %s", c.file, c.args, err, c.want)
		}
	}
	// Refused by serve as a usage error before anything starts: no data
	// directory is made. (Taken, the daemon would run: until ctx ends.)
	data := filepath.Join(t.TempDir(), "data")
	cfg, err := parseWith(t, emptyConfig(t), serveArgs(data, "--max-age", "0s")...)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	err = serve(ctx, cfg, io.Discard)
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "--max-age 0s") {
		t.Errorf("serve --max-age 0s: error %v, want a usage error naming --max-age", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("serve --max-age 0s made its data directory (%v)", err)
	}

	for _, args := range [][]string{
		nil, // the defaults
		{"--max-client-connections", "-1", "--smtp-max-inflight-bytes", "-1", "--api-rate", "-1", "--api-max-inflight-bytes", "-1"},
		{"--dest-rate", "0", "--dest-conns", "0", "--sync-window", "0", "--gc-min-heap", "0", "--shutdown-grace", "0s"},
		{"--mx-address-limit", "0", "--mx-session-limit", "0", "--workers", "0", "--max-recipients-per-day", "0"},
		{"--dsn-delay-warning", "0s", "--dsn-sender-rate", "0", "--dsn-pass-timeout", "0s"},
		{"--max-age", "96h", "--max-attempts", "1", "--ack-wait", "2m", "--smtp-port", "2525", "--retry-multiplier", "1.5"},
	} {
		cfg, err := parseWith(t, emptyConfig(t), args...)
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.checkFlags(); err != nil {
			t.Errorf("%q refused: %v", args, err)
		}
	}
}

// TestDestLimitsGivenAsZero: dest-rate and dest-conns given as 0 (flag or
// key) lift [destinations.default]'s limits, as a value above 0 replaces
// them; not given, the table's stand. The file's 50/s stayed in force.
func TestDestLimitsGivenAsZero(t *testing.T) {
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte("[destinations.default]\nrate = 50\nconns = 20\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args        []string
		rate, conns float64
	}{
		{nil, 50, 20},
		{[]string{"--dest-rate", "0"}, 0, 20},
		{[]string{"--dest-conns", "0"}, 50, 0},
		{[]string{"--dest-rate", "0", "--dest-conns", "0"}, 0, 0},
		{[]string{"--dest-rate", "7"}, 7, 20},
	} {
		cfg, err := parseWith(t, p, c.args...)
		if err != nil {
			t.Fatal(err)
		}
		tc, err := cfg.throttleFile().ConfigWith(throttle.Limits{Rate: cfg.DestRate, Conns: cfg.DestConns})
		if err != nil {
			t.Fatal(err)
		}
		if tc.Defaults.Rate != c.rate || float64(tc.Defaults.Conns) != c.conns {
			t.Errorf("%q: default rate %v, conns %d; want %v and %v", c.args, tc.Defaults.Rate, tc.Defaults.Conns, c.rate, c.conns)
		}
	}
	p2 := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p2, []byte("dest-rate = 0\n[destinations.default]\nrate = 50\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseWith(t, p2)
	if err != nil {
		t.Fatal(err)
	}
	if tc, err := cfg.throttleFile().ConfigWith(throttle.Limits{}); err != nil || tc.Defaults.Rate != 0 {
		t.Errorf("dest-rate = 0 in the file: default rate %v (%v), want 0", tc.Defaults.Rate, err)
	}
}

// TestProviderGroupsByDefault: delivering to MX hosts, the built-in
// provider groups apply without a [[groups]] table (gmail.com and Google
// Workspace domains each learned their own rate against Google's one
// limit); through a relay the destinations stay the domains; the file's
// group-by-mx wins either way.
func TestProviderGroupsByDefault(t *testing.T) {
	dir := t.TempDir()
	file := func(body string) string {
		p := filepath.Join(dir, fmt.Sprintf("o%d.toml", len(body)))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		what, file string
		args       []string
		want       bool
	}{
		{"MX delivery, no file", "", nil, true},
		{"through a relay, no file", "", []string{"--relay", "127.0.0.1:2525"}, false},
		{"MX delivery, group-by-mx = false", file("[throttle]\ngroup-by-mx = false\n"), nil, false},
		{"through a relay, group-by-mx = true", file("[throttle]\ngroup-by-mx = true\n"), []string{"--relay", "127.0.0.1:2525"}, true},
		{"through a relay, [[groups]]", file("[[groups]]\nname = \"acme\"\nmx-suffixes = [\".acme.example\"]\n"), []string{"--relay", "127.0.0.1:2525"}, true},
	} {
		cfg, err := parseWith(t, c.file, c.args...)
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		tc, err := cfg.throttleFile().Config()
		if err != nil {
			t.Fatalf("%s: %v", c.what, err)
		}
		if tc.GroupByMX != c.want || len(tc.Groups) == 0 {
			t.Errorf("%s: group-by-mx %v with %d groups, want %v", c.what, tc.GroupByMX, len(tc.Groups), c.want)
		}
	}
}

// TestThrottleKnobsGivenAsZero: a [throttle] number set to 0 is refused,
// naming the key: the throttle took its default for it (breaker-failures
// = 0 was 10, max-wait = "0s" 2 s). A negative max-wait too.
func TestThrottleKnobsGivenAsZero(t *testing.T) {
	for _, line := range []string{`max-wait = "0s"`, "breaker-failures = 0", "learn-initial = 0", `learn-forget = "0s"`, "decrease-factor = 0.0", `max-wait = "-5s"`} {
		p := filepath.Join(t.TempDir(), "outflow.toml")
		if err := os.WriteFile(p, []byte("[throttle]\n"+line+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		key, _, _ := strings.Cut(line, " ")
		cfg, err := parseWith(t, p)
		if err == nil {
			_, err = cfg.throttleFile().Config()
		}
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("%s: %v, want an error naming %s", line, err, key)
		}
	}
	p := filepath.Join(t.TempDir(), "outflow.toml")
	if err := os.WriteFile(p, []byte("[throttle]\nmax-wait = \"1s\"\nlearn-initial = -1\nlearn = false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseWith(t, p); err != nil {
		t.Errorf("values that are not 0 refused: %v", err)
	}
}

// TestAutomationRuleNameChecked: an automation rule whose rule names no
// classify rule, embedded or the operator's, is refused at start, naming
// it and the nearest names: it would never fire, and nothing said so.
func TestAutomationRuleNameChecked(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "outflow.toml")
	conf := "[[automation]]\nname = \"gmail-auth\"\nrule = \"gmial-auth\"\naction = \"suspend\"\nfor = \"15m\"\n"
	if err := os.WriteFile(p, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := parseWith(t, p, "--data", filepath.Join(dir, "data"), "--smtp-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--api-addr", "", "--nats-addr", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = serve(ctx, cfg, io.Discard)
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), `rule "gmial-auth" is the start of no classify rule`) || !strings.Contains(err.Error(), "did you mean") {
		t.Fatalf("serve: %v, want a usage error naming the rule", err)
	}
}

// TestCheckHostnameAddressLiteral: an address literal in --hostname is as
// RFC 5321 4.1.3 writes it: IPv4 bare in brackets, IPv6 with the tag
// IPv6:, no zone (netip took one, and [IPv6:fe80::1%lo] went out in EHLO).
// A refusal shows the literal the address is written as, the IPv6 one for
// an IPv6 address (the hint showed [192.0.2.1] for ::1, and [::1] was "not
// an address literal" without a word of the tag).
func TestCheckHostnameAddressLiteral(t *testing.T) {
	for _, ok := range []string{"[192.0.2.1]", "[IPv6:2001:db8::1]", "[IPv6:::1]", "[IPv6:fe80::1]", "[IPv6:::ffff:192.0.2.1]", "mta1.example.com"} {
		if err := checkHostname(ok); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for name, want := range map[string]string{
		"[IPv6:fe80::1%lo]": "a zone (%lo) cannot be part of an address literal: [IPv6:fe80::1]",
		"[fe80::1%lo]":      "a zone (%lo) cannot be part of an address literal: [IPv6:fe80::1]",
		"[::1]":             "an IPv6 address literal has the tag IPv6: [IPv6:::1]",
		"[IPv6:192.0.2.1]":  "an IPv4 address literal has no tag: [192.0.2.1]",
		"::1":               "an address goes in brackets: [IPv6:::1]",
		"fe80::1%lo":        "an address goes in brackets, without its zone (%lo): [IPv6:fe80::1]",
		"192.0.2.1":         "an address goes in brackets: [192.0.2.1]",
		"[192.0.2.300]":     "not an address literal, like [192.0.2.1] or [IPv6:2001:db8::1]",
		"[IPv6:]":           "not an address literal, like [192.0.2.1] or [IPv6:2001:db8::1]",
	} {
		if err := checkHostname(name); err == nil || err.Error() != want {
			t.Errorf("%q: %v, want %q", name, err, want)
		}
	}
}

// TestTrustedNetworksNoOpenRelay: serve refuses trusted networks wider
// than any private range, before it starts anything: 0.0.0.0/0 (or
// ::ffff:0:0/96, which is every IPv4 client) let anyone submit to any
// recipient without AUTH, an open relay, and start said nothing.
func TestTrustedNetworksNoOpenRelay(t *testing.T) {
	for _, ok := range []string{"127.0.0.0/8", "10.0.0.0/8", "192.168.0.0/16", "::1/128", "fc00::/7", "fd00::/8", "::ffff:127.0.0.0/104", "::ffff:10.0.0.0/104", "2001:db8::/32"} {
		if err := checkTrustedNetwork(netip.MustParsePrefix(ok)); err != nil {
			t.Errorf("%s refused: %v", ok, err)
		}
	}
	for wide, want := range map[string]string{
		"0.0.0.0/0":      "0.0.0.0/0 is wider than /8",
		"64.0.0.0/2":     "64.0.0.0/2 is wider than /8",
		"::/0":           "::/0 is wider than /7",
		"2000::/3":       "2000::/3 is wider than /7",
		"::ffff:0:0/96":  "0.0.0.0/0, every IPv4 client it maps, is wider than /8",
		"::ffff:0:0/100": "0.0.0.0/4, every IPv4 client it maps, is wider than /8",
	} {
		err := checkTrustedNetwork(netip.MustParsePrefix(wide))
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "open relay") {
			t.Errorf("%s: %v, want %q… an open relay", wide, err, want)
		}
	}
	p := filepath.Join(t.TempDir(), "empty.toml")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseWith(t, p, "--data", t.TempDir(), "--trusted-networks", "127.0.0.0/8,0.0.0.0/0")
	if err != nil {
		t.Fatal(err)
	}
	err = serve(context.Background(), c, io.Discard)
	var u usageError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), `--trusted-networks "0.0.0.0/0": 0.0.0.0/0 is wider than /8`) {
		t.Errorf("serve: %v, want a --trusted-networks usage error", err)
	}
}
