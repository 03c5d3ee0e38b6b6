package e2e

import (
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
)

// mxFleet starts fake MX servers on the given loopback addresses, all on
// one port (outflow's --smtp-port is one number for every MX host), and
// returns them with that port.
func mxFleet(t *testing.T, opts fakemx.Options, ips ...string) ([]*fakemx.Server, string) {
	t.Helper()
	var port string
	var out []*fakemx.Server
	for _, ip := range ips {
		o := opts
		o.Addr = net.JoinHostPort(ip, "0")
		if port != "" {
			o.Addr = net.JoinHostPort(ip, port)
		}
		s := fakemx.Start(t, o)
		_, port, _ = net.SplitHostPort(s.Addr())
		out = append(out, s)
	}
	return out, port
}

// decisionLine is the part of a backoff decision log line the tests read.
type decisionLine struct {
	Msg     string `json:"message"`
	Outcome string `json:"outcome"`
	Dest    string `json:"dest"`
	Class   string `json:"class"`
	Lane    string `json:"lane"`
	Reply   string `json:"reply"`
}

// decisions returns the decision lines for dest in the daemon's log.
func decisions(logs, dest string) []decisionLine {
	var out []decisionLine
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"backoff decision"`) {
			continue
		}
		var d decisionLine
		if json.Unmarshal([]byte(line), &d) == nil && d.Dest == dest {
			out = append(out, d)
		}
	}
	return out
}

func hasDecision(logs, dest, class string) bool {
	for _, d := range decisions(logs, dest) {
		if d.Class == class {
			return true
		}
	}
	return false
}

// TestMXDeliveryThroughDNS runs `outflow serve` without --relay against a
// DNS server on loopback (--dns) and fake MX hosts on 127.0.0.x: the
// primary MX is down and the secondary takes the mail; a null MX bounces;
// a domain without MX gets its mail at its A record; a domain whose DNS
// never answers is deferred as transient, not bounced.
func TestMXDeliveryThroughDNS(t *testing.T) {
	// 127.0.0.20 is the primary MX and nothing listens there.
	mxs, port := mxFleet(t, fakemx.Options{}, "127.0.0.21", "127.0.0.22")
	secondary, implicit := mxs[0], mxs[1]

	ns := fakedns.Start(t)
	ns.MustAddZone(t, "pref.test", "@ MX 10 mx1", "@ MX 20 mx2", "mx1 A 127.0.0.20", "mx2 A 127.0.0.21")
	ns.MustAddZone(t, "null.test", "@ MX 0 .")
	ns.MustAddZone(t, "amx.test", "@ A 127.0.0.22")
	ns.MustAddZone(t, "slow.test", "@ MX 10 mx", "mx A 127.0.0.21")
	ns.Timeout("slow.test")

	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--dns", ns.Addr, "--mx-allow-loopback", "--smtp-port", port,
		"--connect-timeout", "2s", "--retry-base", "1m", "--retry-min", "1m")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	for _, rcpt := range []string{"a@pref.test", "b@null.test", "c@amx.test", "d@slow.test"} {
		if err := submit(c, "app@sender.test", []string{rcpt}, message(strings.Split(rcpt, "@")[1], "")); err != nil {
			t.Fatalf("submit to %s: %v", rcpt, err)
		}
	}

	if err := secondary.WaitForMessages(1, 60*time.Second); err != nil {
		t.Fatalf("secondary MX: %v\n%s", err, d.Logs())
	}
	if got := secondary.Messages()[0].Rcpts; len(got) != 1 || got[0] != "a@pref.test" {
		t.Errorf("secondary MX got %v", got)
	}
	if err := implicit.WaitForMessages(1, 60*time.Second); err != nil {
		t.Fatalf("implicit MX (A record): %v\n%s", err, d.Logs())
	}
	if got := implicit.Messages()[0].Rcpts; len(got) != 1 || got[0] != "c@amx.test" {
		t.Errorf("implicit MX got %v", got)
	}
	waitFor(t, 60*time.Second, "the null MX bounce and the DNS timeout's deferral", func() bool {
		logs := d.Logs()
		return hasDecision(logs, "null.test", "permanent") && hasDecision(logs, "slow.test", "transient")
	})
	logs := d.Logs()
	for _, dl := range decisions(logs, "null.test") {
		if dl.Class != "permanent" || !strings.Contains(dl.Reply, "null MX") {
			t.Errorf("null.test: %+v", dl)
		}
	}
	for _, dl := range decisions(logs, "slow.test") {
		if dl.Class != "transient" || dl.Lane != "retry" {
			t.Errorf("slow.test must be deferred on the retry lane: %+v", dl)
		}
	}
	if n := len(secondary.Messages()) + len(implicit.Messages()); n != 2 {
		t.Errorf("%d messages reached an MX, want 2 (nothing for null.test or slow.test)", n)
	}
	if ns.Queries("pref.test", dns.TypeMX) == 0 || ns.Queries("slow.test", dns.TypeMX) == 0 {
		t.Error("the daemon did not ask the --dns server")
	}
	m := d.scrape(t)
	if m["outflow_dns_cache_misses_total"] < 4 || m["outflow_dns_cache_entries"] < 1 {
		t.Errorf("cache metrics: misses %v entries %v", m["outflow_dns_cache_misses_total"], m["outflow_dns_cache_entries"])
	}
}
