package e2e

import (
	"crypto/tls"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testpki"
)

// policyHost is a local HTTPS server playing mta-sts.<domain> for every
// domain of policies, with a certificate from ca.
func policyHost(t *testing.T, ca *testpki.CA, policies map[string]string) string {
	t.Helper()
	var names []string
	for d := range policies {
		names = append(names, "mta-sts."+d)
	}
	leaf, err := ca.Issue(names, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{leaf.TLS}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, ok := policies[strings.TrimPrefix(r.Host, "mta-sts.")]
		if !ok || r.URL.Path != "/.well-known/mta-sts.txt" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte(body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// writeCA writes ca's root as a PEM file for --tls-ca-file.
func writeCA(t *testing.T, dir string, ca *testpki.CA) string {
	t.Helper()
	p := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(p, ca.RootPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// lastReplyOf waits (up to 2 minutes: each cli call starts a process, and
// the machine may be loaded) until the message to domain is deferred and
// returns its last reply.
func lastReplyOf(t *testing.T, d *daemon, domain string) string {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := d.cliErr("queue", "list", "--json", "--state", "deferred", "--dest", domain)
		if err == nil {
			for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
				var r struct {
					LastReply string `json:"last_reply"`
				}
				if json.Unmarshal([]byte(line), &r) == nil && r.LastReply != "" {
					return r.LastReply
				}
			}
		}
		if time.Now().After(deadline) {
			all, _ := d.cliErr("queue", "list", "--json")
			t.Fatalf("no deferred message to %s; queue:\n%s\nlogs:\n%s", domain, all, d.Logs())
		}
		time.Sleep(200 * time.Millisecond) // polling interval
	}
}

// TestMTASTSEnforce: a domain in enforce mode, its policy served by a local
// HTTPS server whose certificate comes from a CA given with --tls-ca-file.
// Mail to a listed MX with a valid certificate is delivered over verified
// TLS; mail to a domain whose only MX is not listed is deferred with the
// synthetic reply that says so, and never reaches that MX.
func TestMTASTSEnforce(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewRoot("e2e MTA-STS CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"mx1.sts.test", "mx.unlisted.test"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mx := fakemx.Start(t, fakemx.Options{STARTTLS: true, Certificate: &leaf.TLS})
	_, port, _ := net.SplitHostPort(mx.Addr())

	dns := fakedns.Start(t)
	dns.MustAddZone(t, "sts.test",
		"@ MX 10 mx1.sts.test.",
		"mx1 A 127.0.0.1",
		`_mta-sts TXT "v=STSv1; id=20260301;"`)
	dns.MustAddZone(t, "unlisted.test",
		"@ MX 10 mx.unlisted.test.",
		"mx A 127.0.0.1",
		`_mta-sts TXT "v=STSv1; id=1;"`)
	policies := policyHost(t, ca, map[string]string{
		"sts.test":      "version: STSv1\nmode: enforce\nmx: *.sts.test\nmax_age: 86400\n",
		"unlisted.test": "version: STSv1\nmode: enforce\nmx: mx.elsewhere.test\nmax_age: 86400\n",
	})

	d := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--dns", dns.Addr, "--mx-allow-loopback",
		"--tls-ca-file", writeCA(t, dir, ca), "--smtp-port", port, "--mta-sts-policy-addr", policies,
		"--tls-report-dir", filepath.Join(dir, "reports"))
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	if err := submit(c, "app@sender.test", []string{"bob@sts.test"}, message("sts-ok", "")); err != nil {
		t.Fatal(err)
	}
	if err := submit(c, "app@sender.test", []string{"eve@unlisted.test"}, message("sts-unlisted", "")); err != nil {
		t.Fatal(err)
	}
	_ = c.Quit()

	if err := mx.WaitForMessages(1, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	got := mx.Messages()[0]
	if !got.TLS || got.Rcpts[0] != "bob@sts.test" {
		t.Fatalf("delivered %+v", got)
	}
	reply := lastReplyOf(t, d, "unlisted.test")
	if !strings.Contains(reply, "outflow (synthetic, no server reply): MX host mx.unlisted.test is not listed in the MTA-STS policy of unlisted.test") {
		t.Fatalf("deferred with %q", reply)
	}
	for _, m := range mx.Messages() {
		if strings.Contains(strings.Join(m.Rcpts, ","), "unlisted.test") {
			t.Fatalf("the unlisted MX got the message: %+v", m)
		}
	}

	// The day's TLS report counts survive the shutdown: a success for
	// sts.test and a failure for unlisted.test.
	d.Stop()
	b, err := os.ReadFile(filepath.Join(dir, "data", "tlsrpt-state.json"))
	if err != nil {
		t.Fatal(err)
	}
	state := string(b)
	if !strings.Contains(state, `"policy-domain":"sts.test"`) || !strings.Contains(state, `"policy-domain":"unlisted.test"`) || !strings.Contains(state, `"validation-failure"`) {
		t.Fatalf("TLS report state: %s", state)
	}
}
