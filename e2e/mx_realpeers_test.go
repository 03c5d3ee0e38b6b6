package e2e

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestMXDeliveryRealPeers is TestMXDeliveryThroughDNS against real peers
// instead of the in-process fakes: dnsmasq serves the zones (MX records, a
// null MX, an A record without MX, and NXDOMAIN for the rest of .test) and
// Postfix's smtp-sink plays the MX hosts. The primary MX of pref.test
// (127.0.0.40) refuses connections, so its mail must reach the secondary;
// amx.test has no MX, so its mail goes to its A record; null.test says it
// takes no mail and nx.test does not exist, so both bounce at once. Each
// sink must hold exactly its one message.
func TestMXDeliveryRealPeers(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end against dnsmasq and smtp-sink; skipped with -short")
	}
	dnsmasq := debianTool(t, "dnsmasq", "dnsmasq-base")
	sinkBin := postfixTool(t, "smtp-sink")

	// Both sinks on one port: --smtp-port is one number for every MX host.
	port := freePortOn(t, "tcp", "127.0.0.41", "127.0.0.42")
	secondary := startSink(t, sinkBin, net.JoinHostPort("127.0.0.41", port))
	implicit := startSink(t, sinkBin, net.JoinHostPort("127.0.0.42", port))

	nsAddr := net.JoinHostPort("127.0.0.39", freePortOn(t, "dns", "127.0.0.39"))
	host, nsPort, _ := net.SplitHostPort(nsAddr)
	ns := exec.Command(dnsmasq, "--keep-in-foreground", "--conf-file=/dev/null", "--pid-file=",
		"--no-resolv", "--no-hosts", "--no-poll", "--bind-interfaces",
		"--listen-address="+host, "--port="+nsPort, "--log-facility=-",
		"--local=/test/", // answer NXDOMAIN for the rest of .test, never REFUSED
		"--mx-host=pref.test,mx1.pref.test,10", "--mx-host=pref.test,mx2.pref.test,20",
		"--host-record=mx1.pref.test,127.0.0.40", "--host-record=mx2.pref.test,127.0.0.41",
		"--host-record=amx.test,127.0.0.42",
		"--mx-host=null.test,.,0")
	nsLog, err := os.Create(filepath.Join(t.TempDir(), "dnsmasq.log"))
	if err != nil {
		t.Fatal(err)
	}
	ns.Stdout, ns.Stderr = nsLog, nsLog
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ns.Process.Kill(); _ = ns.Wait() })
	waitFor(t, 10*time.Second, "dnsmasq to answer", func() bool {
		m := new(dns.Msg)
		m.SetQuestion("pref.test.", dns.TypeMX)
		r, err := dns.Exchange(m, nsAddr)
		return err == nil && len(r.Answer) == 2
	})

	dir := t.TempDir()
	d := startDaemon(t, dir+"/data", "--users", writeUsers(t, dir), "--dns", nsAddr, "--mx-allow-loopback", "--smtp-port", port,
		"--connect-timeout", "2s", "--retry-base", "1m", "--retry-min", "1m")
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	defer c.Close()
	for _, rcpt := range []string{"a@pref.test", "b@null.test", "c@amx.test", "d@nx.test"} {
		if err := submit(c, "app@sender.test", []string{rcpt}, message(strings.Split(rcpt, "@")[1], "")); err != nil {
			t.Fatalf("submit to %s: %v", rcpt, err)
		}
	}

	secondary.waitRcpts(t, d, "a@pref.test")
	implicit.waitRcpts(t, d, "c@amx.test")
	waitFor(t, 60*time.Second, "the bounces of null.test and nx.test", func() bool {
		logs := d.Logs()
		return hasDecision(logs, "null.test", "permanent") && hasDecision(logs, "nx.test", "permanent")
	})
	for _, dl := range decisions(d.Logs(), "null.test") {
		if dl.Class != "permanent" || !strings.Contains(dl.Reply, "null MX") {
			t.Errorf("null.test: %+v", dl)
		}
	}
	// Every message is settled (two delivered, two bounced), so nothing
	// more can reach a sink; each holds its one message.
	secondary.waitRcpts(t, d, "a@pref.test")
	implicit.waitRcpts(t, d, "c@amx.test")
	if t.Failed() {
		b, _ := os.ReadFile(nsLog.Name())
		t.Logf("dnsmasq:\n%s", b)
	}
}

// debianTool finds name on PATH or in /usr/sbin. `make deps` installs pkg;
// under CI a missing tool fails the test, elsewhere it skips it.
func debianTool(t *testing.T, name, pkg string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/" + name); err == nil {
		return "/usr/sbin/" + name
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not installed (Debian package %s; make deps installs it)", name, pkg)
	}
	t.Skipf("%s not installed (Debian package %s; make deps installs it)", name, pkg)
	return ""
}

// freePortOn returns a port free on every one of hosts: for "tcp" a TCP
// port, for "dns" one free for both UDP and TCP.
func freePortOn(t *testing.T, kind string, hosts ...string) string {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(hosts[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		l.Close()
		ok := true
		for i, h := range hosts {
			if i > 0 {
				if l2, err := net.Listen("tcp", net.JoinHostPort(h, port)); err != nil {
					ok = false
				} else {
					l2.Close()
				}
			}
			if kind == "dns" {
				if pc, err := net.ListenPacket("udp", net.JoinHostPort(h, port)); err != nil {
					ok = false
				} else {
					pc.Close()
				}
			}
		}
		if ok {
			return port
		}
	}
	t.Fatalf("no port free on %v", hosts)
	return ""
}

// smtpSink is one smtp-sink process dumping every transaction into dir.
type smtpSink struct {
	addr, dir string
}

// startSink starts smtp-sink on addr, each transaction dumped to a file of
// its own (envelope first: X-Rcpt-Args lines), and waits until it accepts
// connections.
func startSink(t *testing.T, bin, addr string) *smtpSink {
	t.Helper()
	dir, err := os.MkdirTemp("", "sink")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	args := []string{"-d", filepath.Join(dir, "%M.")}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "nobody") // smtp-sink will not run as root
		if err := os.Chmod(dir, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, append(args, addr, "16")...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, 10*time.Second, "smtp-sink on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return &smtpSink{addr: addr, dir: dir}
}

// rcpts returns the recipients of every complete transaction dumped so
// far, one entry per transaction (its recipients joined with ",").
func (s *smtpSink) rcpts() []string {
	ents, _ := os.ReadDir(s.dir)
	var out []string
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(s.dir, e.Name()))
		if err != nil || !strings.Contains(string(b), "body of ") {
			continue // still being written
		}
		var rs []string
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "X-Rcpt-Args: "); ok {
				rs = append(rs, strings.Trim(v, "<>"))
			}
		}
		out = append(out, strings.Join(rs, ","))
	}
	return out
}

// waitRcpts waits until the sink holds one transaction and checks that it
// is the only one, for want.
func (s *smtpSink) waitRcpts(t *testing.T, d *daemon, want string) {
	t.Helper()
	waitFor(t, 60*time.Second, "a message at "+s.addr, func() bool { return len(s.rcpts()) > 0 })
	if got := s.rcpts(); len(got) != 1 || got[0] != want {
		t.Errorf("%s received %s, want exactly one message for %s\n%s", s.addr, strconv.Quote(strings.Join(got, " | ")), want, d.Logs())
	}
}
