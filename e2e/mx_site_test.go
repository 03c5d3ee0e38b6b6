package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/ratedmx"
)

// TestDomainsOnOneHostLearnOneRate: three customer domains of a hosting
// company, their MX the company's mx.hoster.test, which takes 10/s for all
// of them, and a domain on its own MX host. Delivering to MX hosts with no
// configuration file, the three are one destination, the MX site
// mx:mx.hoster.test, that learns one rate, and the fourth keeps its name.
// Before sites, the three learned a rate each against the one limit and
// met each other's throttles (docs/benchmarks.md, "Domains on one
// provider's MX hosts").
func TestDomainsOnOneHostLearnOneRate(t *testing.T) {
	const limit, perDomain = 10, 40
	doms := []string{"one.test", "two.test", "three.test"}
	p := ratedmx.Start(t, ratedmx.Options{Rate: limit, Limited: func(rcpt string) bool { return !strings.Contains(rcpt, "own.test") }})
	_, port, _ := net.SplitHostPort(p.Addr())
	ns := fakedns.Start(t)
	ns.MustAddZone(t, "hoster.test", "mx A 127.0.0.1")
	for _, d := range doms {
		ns.MustAddZone(t, d, "@ MX 10 mx.hoster.test.")
	}
	ns.MustAddZone(t, "own.test", "@ MX 10 mx", "mx A 127.0.0.1")

	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--dns", ns.Addr, "--mx-allow-loopback", "--smtp-port", port)
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	start := time.Now()
	for i := range perDomain {
		for _, dom := range doms {
			if err := submit(c, "app@sender.test", []string{"r@" + dom}, message(fmt.Sprintf("%s-%d", dom, i), "")); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := submit(c, "app@sender.test", []string{"r@own.test"}, message("own", "")); err != nil {
		t.Fatal(err)
	}
	total := perDomain * len(doms)
	if err := p.WaitForMessages(total+1, 120*time.Second); err != nil {
		t.Fatalf("%v; %s\n%s", err, measure(p, total, start), grepLines(d.Logs(), `"destination state changed"`))
	}
	t.Log(measure(p, total, start))

	logs := d.Logs()
	if n := len(decisions(logs, "mx:mx.hoster.test")); n < total {
		t.Errorf("%d decisions for the site mx:mx.hoster.test, want at least %d", n, total)
	}
	for _, dom := range doms {
		if n := len(decisions(logs, dom)); n != 0 {
			t.Errorf("%d decisions for %s as a destination of its own", n, dom)
		}
	}
	if n := len(decisions(logs, "own.test")); n != 1 {
		t.Errorf("%d decisions for own.test, on its own MX host, want 1", n)
	}
	list := d.cli(t, "dest", "list")
	if !strings.Contains(list, "mx:mx.hoster.test") {
		t.Errorf("dest list has no site:\n%s", list)
	}
	for _, dom := range doms {
		if strings.Contains(list, dom) {
			t.Errorf("dest list has %s of its own:\n%s", dom, list)
		}
	}
	if status := d.cli(t, "dest", "status", "mx:mx.hoster.test"); strings.Contains(status, "learned:       nothing") {
		t.Errorf("the site learned no rate:\n%s", status)
	}
	if v := d.scrape(t)[`outflow_dest_learned_rate{dest="mx:mx.hoster.test"}`]; v <= 0 || v > 2*limit {
		t.Errorf("outflow_dest_learned_rate of the site = %v", v)
	}
}
