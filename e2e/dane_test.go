package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/outflow/outflow/internal/fakedns"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testpki"
)

// TestDANE: three domains whose MX hosts share one fake MX. With a
// DNSSEC-authenticated (AD) TLSA record that matches its key, mail is
// delivered; with an authenticated record that does not match, it is
// deferred with the synthetic DANE reply and never sent; with the same
// mismatching record in a zone whose answers lack AD, DANE does not apply
// and delivery proceeds with opportunistic TLS.
func TestDANE(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewRoot("e2e DANE CA (trusted by nobody)")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Issue([]string{"mx.dane.test"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := ca.Issue([]string{"mx.dane.test"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	mx := fakemx.Start(t, fakemx.Options{STARTTLS: true, Certificate: &leaf.TLS})
	_, port, _ := net.SplitHostPort(mx.Addr())
	spki := func(l *testpki.Leaf) string {
		sum := sha256.Sum256(l.Cert.RawSubjectPublicKeyInfo)
		return hex.EncodeToString(sum[:])
	}

	dns := fakedns.Start(t)
	zone := func(origin, hash string, ad bool) {
		z := dns.MustAddZone(t, origin,
			"@ MX 10 mx."+origin+".",
			"mx A 127.0.0.1",
			"_"+port+"._tcp.mx TLSA 3 1 1 "+hash)
		z.SetAD(ad)
	}
	zone("dane.test", spki(leaf), true)
	zone("dane-bad.test", spki(other), true)
	zone("dane-noad.test", spki(other), false)

	d := startDaemon(t, filepath.Join(dir, "data"), "--users", writeUsers(t, dir), "--dns", dns.Addr, "--mx-allow-loopback", "--smtp-port", port)
	c := dialAuth(t, d.SMTPAddr, testUser, testPassword)
	for _, to := range []string{"a@dane.test", "b@dane-bad.test", "c@dane-noad.test"} {
		if err := submit(c, "app@sender.test", []string{to}, message("dane-"+strings.Split(to, "@")[1], "")); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Quit()

	if err := mx.WaitForMessages(2, 60*time.Second); err != nil {
		t.Fatalf("%v\n%s", err, d.Logs())
	}
	reply := lastReplyOf(t, d, "dane-bad.test")
	if !strings.HasPrefix(reply, "outflow (synthetic, no server reply): mx.dane-bad.test") || !strings.Contains(reply, "DANE: no TLSA record matches") {
		t.Fatalf("deferred with %q", reply)
	}
	got := map[string]bool{}
	for _, m := range mx.Messages() {
		if !m.TLS {
			t.Errorf("delivered without TLS: %+v", m.Rcpts)
		}
		got[m.Rcpts[0]] = true
	}
	if !got["a@dane.test"] || !got["c@dane-noad.test"] || got["b@dane-bad.test"] {
		t.Fatalf("delivered to %v", got)
	}
	d.Stop()
}
