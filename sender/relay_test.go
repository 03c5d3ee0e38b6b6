package sender

import (
	"strings"
	"testing"

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
