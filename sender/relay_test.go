package sender

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

const relayPassword = "s3cret-Pa55"

// relayWorld starts a smarthost and a config pointing at it; the relay's
// host name is "localhost", which the fake's certificate covers.
func relayWorld(t *testing.T, opts fakemx.Options) (*world, *fakemx.Server, Config) {
	w := newWorld(t)
	fake := fakemx.Start(t, opts)
	_, port, _ := strings.Cut(fake.Addr(), ":")
	w.mu.Lock()
	w.routes["localhost:"+port] = fake.Addr()
	w.mu.Unlock()
	cfg := w.config()
	cfg.Relay = "localhost:" + port
	cfg.RelayUsername = "tenant"
	cfg.RelayPassword = relayPassword
	cfg.RootCAs = fake.CertPool()
	return w, fake, cfg
}

func TestRelaySTARTTLSAuth(t *testing.T) {
	for _, mech := range []string{"PLAIN", "LOGIN"} {
		t.Run(mech, func(t *testing.T) {
			w, fake, cfg := relayWorld(t, fakemx.Options{STARTTLS: true, RequireAuth: true,
				Users: map[string]string{"tenant": relayPassword}, AuthMechs: []string{mech}})
			s := w.sender(cfg)
			// The relay takes mail for any domain; no DNS is consulted.
			r := s.Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test"))
			checkDelivered(t, r)
			got := fake.Messages()
			if len(got) != 1 || got[0].AuthUser != "tenant" || !got[0].TLS || !r.TLS || !r.TLSVerified {
				t.Fatalf("fake got %+v; result %+v", got, r)
			}
			checkDelivered(t, s.Send(ctxT(t), msg("elsewhere.test", "carol@elsewhere.test")))
			if ok, _ := fake.AuthAttempts(); ok != 1 || fake.Connections() != 1 {
				t.Errorf("auth ok=%d connections=%d; want one login on one reused connection", ok, fake.Connections())
			}
			if strings.Contains(w.logBuf.String(), relayPassword) {
				t.Error("the relay password reached the log")
			}
		})
	}
}

func TestRelayImplicitTLS(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{ImplicitTLS: true, Users: map[string]string{"tenant": relayPassword}})
	cfg.RelayTLS = RelayImplicitTLS
	s := w.sender(cfg)
	r := s.Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test"))
	checkDelivered(t, r)
	if !r.TLS || !fake.Messages()[0].TLS || fake.Messages()[0].AuthUser != "tenant" {
		t.Errorf("result %+v", r)
	}
}

func TestRelaySTARTTLSMissing(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{Users: map[string]string{"tenant": relayPassword}})
	s := w.sender(cfg)
	checkAll(t, s.Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test")), classify.StageTLS, 0, classify.EventTLSFailure)
	if ok, failed := fake.AuthAttempts(); ok+failed != 0 {
		t.Error("credentials were sent without TLS")
	}
}

func TestRelayAuthFailureIsHeld(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{STARTTLS: true, Users: map[string]string{"tenant": "another password"}})
	s := w.sender(cfg)
	r := s.Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test", "carol@anywhere.test"))
	checkAll(t, r, classify.StageAuth, 535, classify.EventNone)
	if o := r.Rcpts[0].Outcome; o.Enhanced != "5.7.8" {
		t.Errorf("outcome %+v", o)
	}
	// The next messages get the same outcome without a new login.
	for range 3 {
		r = s.Send(ctxT(t), msg("anywhere.test", "dave@anywhere.test"))
		checkAll(t, r, classify.StageAuth, 535, classify.EventNone)
		if !strings.Contains(r.Rcpts[0].Outcome.Text, "cached relay AUTH refusal") {
			t.Errorf("text %q", r.Rcpts[0].Outcome.Text)
		}
	}
	if _, failed := fake.AuthAttempts(); failed != 1 || fake.Connections() != 1 {
		t.Errorf("failed logins=%d connections=%d; want 1 and 1", failed, fake.Connections())
	}
	if strings.Contains(w.logBuf.String(), relayPassword) || !strings.Contains(w.logBuf.String(), "relay AUTH refused") {
		t.Errorf("log:\n%s", w.logBuf.String())
	}
}

func TestRelayWithoutAuth(t *testing.T) {
	w, fake, cfg := relayWorld(t, fakemx.Options{})
	cfg.RelayTLS = RelayNoTLS
	cfg.RelayUsername, cfg.RelayPassword = "", ""
	s := w.sender(cfg)
	checkDelivered(t, s.Send(ctxT(t), msg("anywhere.test", "bob@anywhere.test")))
	if len(fake.Messages()) != 1 {
		t.Error("not delivered")
	}
}

// loginPeer is a relay (plaintext, AUTH PLAIN) that tells the test of each
// EHLO and AUTH and answers AUTH with reply once the channel that
// hold returns is closed (hold is asked when the AUTH arrives).
func loginPeer(t *testing.T, reply string, hold func() chan struct{}) (p *peer, ehlos, auths chan struct{}, cfg Config, w *world) {
	ehlos, auths = make(chan struct{}, 100), make(chan struct{}, 100)
	p = startPeer(t, []string{"PIPELINING", "AUTH PLAIN"}, func(_ int, cmd string) string {
		switch {
		case strings.HasPrefix(cmd, "EHLO "):
			ehlos <- struct{}{}
		case strings.HasPrefix(cmd, "AUTH "):
			release := hold()
			auths <- struct{}{}
			<-release
			return reply
		}
		return ""
	})
	w = newWorld(t)
	cfg = w.config()
	cfg.Dial = (&net.Dialer{}).DialContext
	cfg.Relay = p.addr()
	cfg.RelayTLS = RelayNoTLS
	cfg.RelayUsername, cfg.RelayPassword = "tenant", relayPassword
	return p, ehlos, auths, cfg, w
}

// Concurrent Sends to a relay that refuses the password make one failed
// login, not one each: the check of the held refusal at the start of a
// Send misses a refusal still on its way, and 20 Sends once made 20
// failed logins (again each time the hold ended), which relays with a
// lockout (fail2ban, Microsoft 365 smart lockout) punish.
func TestRelayRefusedLoginOncePerBurst(t *testing.T) {
	var mu sync.Mutex
	release := make(chan struct{})
	p, ehlos, auths, cfg, w := loginPeer(t, "535 5.7.8 authentication credentials invalid\r\n", func() chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		return release
	})
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-release:
		default:
			close(release)
		}
	})
	s := w.sender(cfg)
	const n = 20
	burst := func(round int) {
		t.Helper()
		before := p.count("AUTH ")
		results := make(chan Result, n)
		for i := range n {
			go func() {
				results <- s.Send(ctxT(t), msg("anywhere.test", fmt.Sprintf("r%d-%d@anywhere.test", round, i)))
			}()
		}
		// Every Send has connected and greeted, past the check at its
		// start; one login is on its way. Then the relay refuses it.
		for range n {
			<-ehlos
		}
		<-auths
		mu.Lock()
		close(release)
		mu.Unlock()
		for range n {
			r := <-results
			checkAll(t, r, classify.StageAuth, 535, classify.EventNone)
		}
		if got := p.count("AUTH ") - before; got != 1 {
			t.Errorf("round %d: %d logins for %d concurrent Sends, want 1", round, got, n)
		}
	}
	burst(1)
	// The hold ends: the next burst again makes one login, not n.
	s.authMu.Lock()
	s.authUntil = time.Now().Add(-time.Second)
	s.authMu.Unlock()
	mu.Lock()
	release = make(chan struct{})
	mu.Unlock()
	burst(2)
}

// A successful login lets every waiting Send log in: until then the
// others wait for its result rather than present the password alongside.
func TestRelayLoginSuccessReleasesWaiters(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	first, early := true, 0
	p, ehlos, auths, cfg, w := loginPeer(t, "235 2.7.0 ok\r\n", func() chan struct{} {
		mu.Lock()
		defer mu.Unlock()
		if first {
			first = false
			return release
		}
		select {
		case <-release:
		default:
			early++ // a login while the first was unanswered
		}
		return release
	})
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	s := w.sender(cfg)
	const n = 20
	results := make(chan Result, n)
	for i := range n {
		go func() { results <- s.Send(ctxT(t), msg("anywhere.test", fmt.Sprintf("r%d@anywhere.test", i))) }()
	}
	for range n {
		<-ehlos
	}
	<-auths
	once.Do(func() { close(release) })
	for range n {
		checkDelivered(t, <-results)
	}
	mu.Lock()
	defer mu.Unlock()
	if early != 0 || p.count("AUTH ") != n {
		t.Errorf("%d logins while the first was unanswered, %d in all; want 0 and %d", early, p.count("AUTH "), n)
	}
}

// A Send waiting for another's login gives up with its context.
func TestRelayLoginWaitEndsWithContext(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	p, _, auths, cfg, w := loginPeer(t, "535 5.7.8 authentication credentials invalid\r\n", func() chan struct{} { return release })
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	s := w.sender(cfg)
	first := make(chan Result, 1)
	go func() { first <- s.Send(ctxT(t), msg("anywhere.test", "first@anywhere.test")) }()
	<-auths
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r := s.Send(ctx, msg("anywhere.test", "second@anywhere.test"))
	checkAll(t, r, classify.StageAuth, 0, classify.EventTimeout)
	if o := r.Rcpts[0].Outcome; !strings.Contains(o.Text, "waiting for another login") {
		t.Errorf("outcome %+v", o)
	}
	once.Do(func() { close(release) })
	checkAll(t, <-first, classify.StageAuth, 535, classify.EventNone)
	if n := p.count("AUTH "); n != 1 {
		t.Errorf("%d logins, want 1", n)
	}
}
