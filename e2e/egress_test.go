package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/emersion/go-smtp"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
)

// sourcesOf counts the messages an MX received per client address and
// fails on a message whose EHLO is not its address's.
func sourcesOf(t *testing.T, ms []fakemx.Message, ehlo map[string]string) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, m := range ms {
		out[m.Source]++
		if want := ehlo[m.Source]; m.Hostname != want {
			t.Errorf("message from %s came with EHLO %q, want %q", m.Source, m.Hostname, want)
		}
	}
	return out
}

// destSources is `dest status --json`'s per-source state of every worker,
// or nil when the CLI could not reach the daemon this time (a loaded
// machine can make its NATS connect time out; callers poll).
func destSources(t *testing.T, d *daemon, dest string) map[string]map[string]any {
	t.Helper()
	var st struct {
		Workers []struct {
			Sources []map[string]any `json:"sources"`
		} `json:"workers"`
	}
	out, err := d.cliErr("dest", "status", dest, "--json")
	if err != nil {
		t.Logf("dest status --json: %v (polling again)", err)
		return nil
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("dest status --json: %v\n%s", err, out)
	}
	res := map[string]map[string]any{}
	for _, w := range st.Workers {
		for _, s := range w.Sources {
			name, _ := s["dest"].(string)
			res[name] = s
		}
	}
	return res
}

// twoEgress is the [[egress]] part of the tests' configs: 127.0.0.2 and
// 127.0.0.3, each with an EHLO name of its own, for every tenant.
const twoEgress = `
[[egress]]
address = "127.0.0.2"
ehlo = "o2.outflow.test"

[[egress]]
address = "127.0.0.3"
ehlo = "o3.outflow.test"
`

// startEgressDaemon starts outflow with config (TOML), delivering to the
// MX hosts ns names, on port, and retrying within seconds; extra flags
// come last.
func startEgressDaemon(t *testing.T, config string, ns *fakedns.Server, port string, extra ...string) *daemon {
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "outflow.toml")
	if err := os.WriteFile(conf, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return startDaemon(t, dir+"/data", append([]string{"--config", conf, "--users", writeUsers(t, dir), "--dns", ns.Addr,
		"--mx-allow-loopback", "--smtp-port", port, "--retry-base", "500ms", "--retry-cap", "2s"}, extra...)...)
}

// sendEach submits n messages over c, one to each of prefix+"a"@dom,
// prefix+"b"@dom, …, each with its address's local part as Message-ID.
func sendEach(t *testing.T, c *smtp.Client, prefix, dom string, n int) {
	t.Helper()
	for i := range n {
		id := prefix + string(rune('a'+i))
		if err := submit(c, "app@sender.test", []string{id + "@" + dom}, message(id, "")); err != nil {
			t.Fatalf("submit %s: %v", id, err)
		}
	}
}

// TestEgressAddresses sends from two egress addresses, 127.0.0.2 and
// 127.0.0.3, through DNS to a fake MX on 127.0.0.30. The MX sees each
// message from one of them with that address's EHLO name; an operator's
// block of one address (dest suspend DEST@SOURCE) and the MX throttling one
// address (421 4.7.28) each leave the other one sending everything.
func TestEgressAddresses(t *testing.T) {
	var throttleTwo atomic.Bool
	var throttled atomic.Int32
	mxs, port := mxFleet(t, fakemx.Options{SourceHook: func(source string, stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage == fakemx.StageMail && source == "127.0.0.2" && throttleTwo.Load() {
			throttled.Add(1)
			return &smtp.SMTPError{Code: 421, EnhancedCode: smtp.EnhancedCode{4, 7, 28},
				Message: "Gmail has detected an unusual rate of email from your IP address"}
		}
		return nil
	}}, "127.0.0.30")
	mx := mxs[0]
	ns := fakedns.Start(t)
	ns.MustAddZone(t, "eg.test", "@ MX 10 mx", "mx A 127.0.0.30")

	d := startEgressDaemon(t, `
[[egress]]
address = "127.0.0.2"
ehlo = "o2.outflow.test"
pool = "bulk"

[[egress]]
address = "127.0.0.3"
ehlo = "o3.outflow.test"
pool = "bulk"

[tenants.app]
egress-pool = "bulk"
`, ns, port, "--ratelimit-base", "500ms", "--ratelimit-min", "200ms", "--ratelimit-cap", "2s")
	ehlo := map[string]string{"127.0.0.2": "o2.outflow.test", "127.0.0.3": "o3.outflow.test"}
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()

	// Both addresses in turn.
	sendEach(t, c, "both", "eg.test", 4)
	if err := mx.WaitForMessages(4, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	if got := sourcesOf(t, mx.Messages(), ehlo); got["127.0.0.2"] == 0 || got["127.0.0.3"] == 0 || len(got) != 2 {
		t.Fatalf("sources seen %v: want both egress addresses and nothing else", got)
	}

	// An operator blocks 127.0.0.2 for this destination.
	waitFor(t, 60*time.Second, "dest suspend", func() bool {
		_, err := d.cliErr("dest", "suspend", "eg.test@127.0.0.2", "--for", "1h", "--reason", "provider blocks this address")
		return err == nil
	})
	waitFor(t, 30*time.Second, "the block seen by the worker", func() bool {
		s := destSources(t, d, "eg.test")["eg.test@127.0.0.2"]
		return s != nil && s["suspended"] == true
	})
	before := len(mx.Messages())
	sendEach(t, c, "block", "eg.test", 4)
	if err := mx.WaitForMessages(before+4, 60*time.Second); err != nil {
		t.Fatalf("while 127.0.0.2 is blocked: %v\n%s", err, d.Logs())
	}
	if got := sourcesOf(t, mx.Messages()[before:], ehlo); got["127.0.0.3"] != 4 {
		t.Fatalf("while 127.0.0.2 is blocked, sources %v: want all 4 from 127.0.0.3", got)
	}
	var st string
	waitFor(t, 60*time.Second, "dest status", func() bool {
		var err error
		st, err = d.cliErr("dest", "status", "eg.test")
		return err == nil
	})
	if !strings.Contains(st, "per source address") || !strings.Contains(st, "127.0.0.2") || !strings.Contains(st, "until ") {
		t.Errorf("dest status does not show the blocked source:\n%s", st)
	}

	// The MX throttles 127.0.0.2 (Gmail's 421 4.7.28): the other address
	// carries the mail, and only the throttled pair learns a limit.
	waitFor(t, 60*time.Second, "dest resume", func() bool {
		_, err := d.cliErr("dest", "resume", "eg.test@127.0.0.2")
		return err == nil
	})
	waitFor(t, 30*time.Second, "the resume seen by the worker", func() bool {
		s := destSources(t, d, "eg.test")["eg.test@127.0.0.2"]
		return s != nil && s["suspended"] == false
	})
	throttleTwo.Store(true)
	before = len(mx.Messages())
	sendEach(t, c, "thr", "eg.test", 6)
	if err := mx.WaitForMessages(before+6, 90*time.Second); err != nil {
		t.Fatalf("while 127.0.0.2 is throttled: %v\n%s", err, d.Logs())
	}
	if got := sourcesOf(t, mx.Messages()[before:], ehlo); got["127.0.0.3"] != 6 {
		t.Fatalf("while 127.0.0.2 is throttled, sources %v: want all 6 from 127.0.0.3", got)
	}
	if throttled.Load() == 0 {
		t.Fatal("127.0.0.2 was never tried after the resume: the throttle part tested nothing")
	}
	var two, three map[string]any
	waitFor(t, 60*time.Second, "dest status per source", func() bool {
		srcs := destSources(t, d, "eg.test")
		two, three = srcs["eg.test@127.0.0.2"], srcs["eg.test@127.0.0.3"]
		return two != nil && three != nil
	})
	if lr, _ := two["learned_rate"].(float64); lr <= 0 {
		t.Errorf("the throttled address learned no rate: %v", two)
	}
	if lr, _ := three["learned_rate"].(float64); lr != 0 {
		t.Errorf("the other address learned a rate it was never throttled to: %v", three)
	}
}

// TestBlocklistedSourceIsSuspended: the MX refuses 127.0.0.2 at RCPT as
// listed in a DNS blocklist. outflow reads the reply as a refusal of the
// address (classify scope source): nothing bounces, every message is
// delivered from 127.0.0.3, and the pair eg.test@127.0.0.2 is suspended
// with the reply as its reason, so that later mail does not try the
// blocked address at all.
func TestBlocklistedSourceIsSuspended(t *testing.T) {
	var refused atomic.Int32
	mxs, port := mxFleet(t, fakemx.Options{SourceHook: func(source string, stage fakemx.Stage, _ string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && source == "127.0.0.2" {
			refused.Add(1)
			return &smtp.SMTPError{Code: 554, EnhancedCode: smtp.EnhancedCode{5, 7, 1},
				Message: "Service unavailable; Client host [127.0.0.2] blocked using zen.spamhaus.org"}
		}
		return nil
	}}, "127.0.0.30")
	mx := mxs[0]
	ns := fakedns.Start(t)
	ns.MustAddZone(t, "eg.test", "@ MX 10 mx", "mx A 127.0.0.30")
	d := startEgressDaemon(t, twoEgress, ns, port)
	ehlo := map[string]string{"127.0.0.3": "o3.outflow.test"}
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	sendEach(t, c, "first", "eg.test", 6)
	if err := mx.WaitForMessages(6, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	if got := sourcesOf(t, mx.Messages(), ehlo); got["127.0.0.3"] != 6 {
		t.Fatalf("sources %v: want all 6 from 127.0.0.3", got)
	}
	if refused.Load() == 0 {
		t.Fatal("127.0.0.2 was never tried: the test tested nothing")
	}
	if strings.Contains(d.Logs(), `"message":"bounced"`) {
		t.Errorf("a message bounced for the blocked address:\n%s", tail(d.Logs(), 30))
	}
	var two map[string]any
	waitFor(t, 60*time.Second, "the pair suspended, with the reply as its reason", func() bool {
		two = destSources(t, d, "eg.test")["eg.test@127.0.0.2"]
		return two != nil && two["suspended"] == true
	})
	st, _ := json.Marshal(two)
	if !strings.Contains(string(st), "blocked using zen.spamhaus.org") {
		t.Errorf("the pair's state does not give the reply: %s", st)
	}

	// Later mail goes out from the other address without trying the
	// blocked one.
	before, tried := len(mx.Messages()), refused.Load()
	sendEach(t, c, "later", "eg.test", 4)
	if err := mx.WaitForMessages(before+4, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	if n := refused.Load() - tried; n != 0 {
		t.Errorf("the suspended address was tried %d more times", n)
	}
}

// TestBlocklistedSourceInAProviderGroup: two domains hosted by Microsoft
// 365 (MX under .mail.protection.outlook.com, group-by-mx on: one
// destination, microsoft). One customer's own block list refuses
// 127.0.0.2. Only that domain is suspended from that address: the other
// domain goes on sending from both, and `dest status` of the refusing
// domain shows its address suspended (it showed the group's pair, not).
func TestBlocklistedSourceInAProviderGroup(t *testing.T) {
	var refused atomic.Int32
	mxs, port := mxFleet(t, fakemx.Options{SourceHook: func(source string, stage fakemx.Stage, arg string) *smtp.SMTPError {
		if stage == fakemx.StageRcpt && source == "127.0.0.2" && strings.HasSuffix(strings.Trim(arg, "<>"), "@a.test") {
			refused.Add(1)
			return &smtp.SMTPError{Code: 550, EnhancedCode: smtp.EnhancedCode{5, 7, 1},
				Message: "Service unavailable, Client host [127.0.0.2] blocked using Customer Block list (AS16012607)"}
		}
		return nil
	}}, "127.0.0.30")
	mx := mxs[0]
	ns := fakedns.Start(t)
	ns.MustAddZone(t, "a.test", "@ MX 10 a-test.mail.protection.outlook.com.")
	ns.MustAddZone(t, "b.test", "@ MX 10 b-test.mail.protection.outlook.com.")
	ns.MustAddZone(t, "mail.protection.outlook.com", "a-test A 127.0.0.30", "b-test A 127.0.0.30")
	d := startEgressDaemon(t, twoEgress+"\n[throttle]\ngroup-by-mx = true\n", ns, port)
	ehlo := map[string]string{"127.0.0.2": "o2.outflow.test", "127.0.0.3": "o3.outflow.test"}
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	for i := range 4 {
		for _, dom := range []string{"a.test", "b.test"} {
			id := fmt.Sprintf("g%d-%s", i, strings.TrimSuffix(dom, ".test"))
			if err := submit(c, "app@sender.test", []string{id + "@" + dom}, message(id, "")); err != nil {
				t.Fatalf("submit %s: %v", id, err)
			}
		}
	}
	if err := mx.WaitForMessages(8, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	if refused.Load() == 0 {
		t.Fatal("127.0.0.2 was never tried for a.test: the test tested nothing")
	}
	bySource := map[string]map[string]int{"a.test": {}, "b.test": {}}
	for _, m := range mx.Messages() {
		_, dom, _ := strings.Cut(m.Rcpts[0], "@")
		bySource[dom][m.Source]++
		if want := ehlo[m.Source]; m.Hostname != want {
			t.Errorf("message from %s came with EHLO %q, want %q", m.Source, m.Hostname, want)
		}
	}
	if bySource["a.test"]["127.0.0.3"] != 4 {
		t.Errorf("a.test's mail from %v: want all 4 from 127.0.0.3", bySource["a.test"])
	}
	if bySource["b.test"]["127.0.0.2"] == 0 {
		t.Errorf("b.test's mail from %v: the other customer's block held it from 127.0.0.2 too", bySource["b.test"])
	}
	var a, b map[string]any
	waitFor(t, 60*time.Second, "dest status per source of both domains", func() bool {
		a, b = destSources(t, d, "a.test")["a.test@127.0.0.2"], destSources(t, d, "b.test")["microsoft@127.0.0.2"]
		return a != nil && b != nil
	})
	if a["suspended"] != true || !strings.Contains(fmt.Sprint(a["state"]), "Customer Block list") {
		t.Errorf("dest status a.test: 127.0.0.2 is not shown suspended, with the reply: %v", a)
	}
	if b["suspended"] != false {
		t.Errorf("dest status b.test: 127.0.0.2 shown suspended: %v", b)
	}
}
