package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakemx"
)

// TestOutagesRecover puts the relay through four kinds of outage, one after
// the other on the same daemon: connection refused, a server that accepts
// and never answers, a 421 greeting, and a 4xx to every RCPT. During each,
// a batch is submitted (every one must get 250: the outage is downstream);
// nothing may arrive while it lasts; after recovery every message of the
// batch must arrive exactly once, within the retry budget (nothing in dead
// letters) and within a bound after recovery.
//
// Each outage lasts 4 s by default, 20 s with OUTFLOW_LONG=1.
func TestOutagesRecover(t *testing.T) {
	t.Parallel()
	period, batch := 4*time.Second, 10
	if longMode() {
		period, batch = 20*time.Second, 50
	}
	var rcpt4xx atomic.Bool
	mx := fakemx.Start(t, fakemx.Options{Hook: func(stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && rcpt4xx.Load() {
			return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "Local error in processing"}
		}
		return nil
	}})
	front := newSwitchFront(t, mx.Addr())
	front.greet = "421 4.3.2 Service not available, closing transmission channel\r\n"
	dir := t.TempDir()
	// The destination's circuit breaker opens after consecutive connection
	// failures and stays open for its cooldown, which bounds how fast
	// delivery resumes after a connection-level outage: the default run
	// uses the default cooldown (throttle.DefaultBreakerCooldown), the long
	// run a ten times longer one.
	cooldown := 3 * time.Second
	if longMode() {
		cooldown = 30 * time.Second
	}
	conf := filepath.Join(dir, "outflow.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("[throttle]\nbreaker-cooldown = %q\n", cooldown)), 0o600); err != nil {
		t.Fatal(err)
	}
	// Short sender timeouts so a hanging server costs seconds, not the RFC's
	// minutes; a generous attempt budget that an outage must not exhaust.
	d := startDaemon(t, dir+"/data", append([]string{"--config", conf, "--users", writeUsers(t, dir), "--relay", front.addr,
		"--connect-timeout", "2s", "--command-timeout", "2s", "--data-timeout", "2s", "--final-dot-timeout", "5s",
		"--max-attempts", "100", "--max-age", "10m"}, fastRetry...)...)
	cl := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer cl.Close()

	// Breaker cooldown, then a half-open probe and the release of the
	// deferred mail; retry cap 1 s + contention offset ≤ 2 s; slack for a
	// loaded 2-core machine.
	recoverBound := cooldown + 20*time.Second
	total := 0
	for _, o := range []struct {
		name    string
		start   func()
		recover func()
		// evidence is a log fragment every deferral during the outage shows.
		evidence string
	}{
		{"refused", func() { front.Set("refuse") }, func() { front.Set("proxy") }, `"lane":"retry"`},
		{"hanging", func() { front.Set("hang") }, func() { front.Set("proxy") }, `"lane":"retry"`},
		{"greeting 421", func() { front.Set("greet") }, func() { front.Set("proxy") }, `"code":421`},
		{"rcpt 4xx", func() { rcpt4xx.Store(true) }, func() { rcpt4xx.Store(false) }, `"code":451`},
	} {
		t.Run(o.name, func(t *testing.T) {
			atSink := len(mx.Messages())
			deferredBefore := d.countLog(`"outcome":"deferred"`, o.evidence)
			refusedBefore := d.countLog(`"coordinator refused`)
			o.start()
			start := time.Now()
			ids := map[string]bool{}
			for i := range batch {
				id := fmt.Sprintf("outage-%s-%d", strings.ReplaceAll(o.name, " ", "_"), i)
				if err := submit(cl, "app@sender.test", []string{"o@dest.test"}, message(id, "")); err != nil {
					t.Fatalf("submit during outage: %v", err)
				}
				ids["<"+id+"@e2e.test>"] = true
			}
			// The outage must really have been hit: a deferral with its
			// evidence is logged.
			waitFor(t, 30*time.Second, "a deferral during the outage", func() bool {
				return d.countLog(`"outcome":"deferred"`, o.evidence) > deferredBefore
			})
			for time.Since(start) < period {
				if n := len(mx.Messages()); n != atSink {
					t.Fatalf("%d messages delivered during the outage", n-atSink)
				}
				time.Sleep(100 * time.Millisecond) // the outage lasts its period
			}
			deferrals := d.countLog(`"outcome":"deferred"`, o.evidence) - deferredBefore
			o.recover()
			recovered := time.Now()
			waitAllDelivered(t, ids, mx, recoverBound, d.Logs)
			took := time.Since(recovered)
			got := sinkCounts(mx)
			for id := range ids {
				if got[id] != 1 {
					t.Errorf("%s delivered %d times", id, got[id])
				}
			}
			total += batch
			t.Logf("FIGURES outage %s: period=%v breaker_cooldown=%v messages=%d attempts_deferred=%d breaker_refusals=%d delivered_after_recovery_in=%v losses=0 duplicates=0",
				o.name, period, cooldown, batch, deferrals, d.countLog(`"coordinator refused`)-refusedBefore, took.Round(10*time.Millisecond))
		})
	}
	if n := d.countLog(`"moved to dead letters"`); n != 0 {
		t.Errorf("%d envelopes went to dead letters: the budget must outlast the outages", n)
	}
	if got := len(mx.Messages()); got != total {
		t.Errorf("the sink has %d messages, want %d", got, total)
	}
	requireNoPanic(t, d.Logs())
	if p := os.Getenv("OUTFLOW_DUMP_LOG"); p != "" {
		_ = os.WriteFile(p, []byte(d.Logs()), 0o644)
	}
	_ = cl.Quit()
	d.Stop()
}
