package sender

import (
	"crypto/tls"
	"slices"
	"strings"
	"testing"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
)

func TestSTARTTLSOfferedInLowerCase(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{STARTTLS: true, LowercaseExtensions: true})
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if !r.TLS {
		t.Error("lower-case starttls was not used")
	}
	got := fake.Messages()
	if len(got) != 1 || !got[0].TLS {
		t.Fatalf("fake got %+v", got)
	}
	// Our name on every EHLO, the one before STARTTLS included.
	if names := fake.EHLONames(); !slices.Equal(names, []string{testHostname, testHostname}) {
		t.Errorf("EHLO names %q", names)
	}
}

func TestOpportunisticTLSDoesNotRequireAValidCertificate(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{STARTTLS: true}) // self-signed, not in RootCAs
	s := w.sender(w.config())
	r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if !r.TLS || r.TLSVerified || !fake.Messages()[0].TLS {
		t.Errorf("TLS=%v verified=%v", r.TLS, r.TLSVerified)
	}
}

// TestOpportunisticTLSTakesAnOldVersion: a server that speaks TLS 1.0 at
// most gets an encrypted session under opportunistic TLS, where the
// alternative is plaintext (the handshake failed, and the sender went on
// in plaintext); a policy that requires TLS still wants 1.2.
func TestOpportunisticTLSTakesAnOldVersion(t *testing.T) {
	w, fake := oneMX(t, fakemx.Options{STARTTLS: true, MaxTLSVersion: tls.VersionTLS10, CertHosts: []string{"mx.example.test"}})
	r := w.sender(w.config()).Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkDelivered(t, r)
	if !r.TLS || !fake.Messages()[0].TLS {
		t.Fatalf("opportunistic TLS to a TLS 1.0 server: TLS=%v; want an encrypted session, not plaintext", r.TLS)
	}
	cfg := w.config()
	cfg.TLS, cfg.RootCAs = TLSRequired, fake.CertPool()
	r = w.sender(cfg).Send(ctxT(t), msg("example.test", "bob@example.test"))
	checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
	if len(fake.Messages()) != 1 {
		t.Fatalf("required TLS delivered over TLS 1.0")
	}
}

func TestTLSRequired(t *testing.T) {
	t.Run("verified", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{STARTTLS: true, CertHosts: []string{"mx.example.test"}})
		cfg := w.config()
		cfg.TLSPerDestination = map[string]TLSPolicy{"Example.Test": TLSRequired}
		cfg.RootCAs = fake.CertPool()
		s := w.sender(cfg)
		r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
		checkDelivered(t, r)
		if !r.TLS || !r.TLSVerified {
			t.Errorf("TLS=%v verified=%v", r.TLS, r.TLSVerified)
		}
	})
	t.Run("untrusted certificate", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{STARTTLS: true, CertHosts: []string{"mx.example.test"}})
		cfg := w.config()
		cfg.TLS = TLSRequired // RootCAs nil: the system pool does not know the fake
		s := w.sender(cfg)
		r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
		checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
		if len(fake.Messages()) != 0 {
			t.Error("delivered despite an untrusted certificate")
		}
	})
	t.Run("wrong host name", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{STARTTLS: true}) // cert not for mx.example.test
		cfg := w.config()
		cfg.TLS = TLSRequired
		cfg.RootCAs = fake.CertPool()
		s := w.sender(cfg)
		checkAll(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")), classify.StageTLS, 0, classify.EventTLSFailure)
	})
	t.Run("not offered", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{})
		cfg := w.config()
		cfg.TLS = TLSRequired
		s := w.sender(cfg)
		r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
		checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
		if !strings.Contains(r.Rcpts[0].Outcome.Text, "synthetic") || fake.Transactions() != 0 {
			t.Errorf("outcome %+v", r.Rcpts[0].Outcome)
		}
	})
}

func TestTLSHandshakeFailure(t *testing.T) {
	t.Run("opportunistic retries in plaintext", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{BrokenTLS: true})
		s := w.sender(w.config())
		r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
		checkDelivered(t, r)
		if r.TLS || fake.Connections() != 2 {
			t.Errorf("TLS=%v connections=%d", r.TLS, fake.Connections())
		}
		if log := w.logBuf.String(); !strings.Contains(log, "retrying this host in plaintext") {
			t.Errorf("fallback not logged:\n%s", log)
		}
	})
	t.Run("required fails", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{BrokenTLS: true})
		cfg := w.config()
		cfg.TLSPerDestination = map[string]TLSPolicy{"example.test": TLSRequired}
		s := w.sender(cfg)
		checkAll(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")), classify.StageTLS, 0, classify.EventTLSFailure)
		if fake.Connections() != 1 || len(fake.Messages()) != 0 {
			t.Errorf("connections=%d messages=%d", fake.Connections(), len(fake.Messages()))
		}
	})
	t.Run("policy none never tries", func(t *testing.T) {
		w, fake := oneMX(t, fakemx.Options{BrokenTLS: true})
		cfg := w.config()
		cfg.TLS = TLSNone
		s := w.sender(cfg)
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
		if fake.Connections() != 1 {
			t.Errorf("connections=%d", fake.Connections())
		}
	})
}
