package sender

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/foxcpp/go-mockdns"
	"github.com/miekg/dns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/fakemx"
	"github.com/outflow/outflow/internal/testpki"
	"github.com/outflow/outflow/mtasts"
	"github.com/outflow/outflow/tlsrpt"
)

type fakeSTS struct{ res mtasts.Result }

func (f *fakeSTS) Lookup(context.Context, string) mtasts.Result { return f.res }

type tlsaAnswer struct {
	recs []*dns.TLSA
	ad   bool
	err  error
}

type fakeTLSA map[string]tlsaAnswer // "_25._tcp.host" → answer

func (f fakeTLSA) LookupTLSA(_ context.Context, port int, proto, host string) ([]*dns.TLSA, bool, error) {
	a, ok := f[host]
	if !ok {
		return nil, false, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return a.recs, a.ad, a.err
}

type reports struct {
	mu  sync.Mutex
	evs []tlsrpt.Event
}

func (r *reports) Record(ev tlsrpt.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evs = append(r.evs, ev)
}

func (r *reports) all() []tlsrpt.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tlsrpt.Event(nil), r.evs...)
}

// pkiMX is a fake MX whose certificate (for mx.example.test, through an
// intermediate) comes from a test CA.
type pkiMX struct {
	w     *world
	fake  *fakemx.Server
	root  *testpki.CA
	inter *testpki.CA
	leaf  *testpki.Leaf
}

func newPKIMX(t *testing.T, opts fakemx.Options) *pkiMX {
	t.Helper()
	root, err := testpki.NewRoot("test root")
	if err != nil {
		t.Fatal(err)
	}
	inter, err := root.Intermediate("test intermediate")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := inter.Issue([]string{"mx.example.test"}, time.Time{}, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Certificate = &leaf.TLS
	w, fake := oneMX(t, opts)
	return &pkiMX{w: w, fake: fake, root: root, inter: inter, leaf: leaf}
}

func spkiTLSA(usage uint8, c *x509.Certificate) *dns.TLSA {
	sum := sha256.Sum256(c.RawSubjectPublicKeyInfo)
	return &dns.TLSA{Usage: usage, Selector: 1, MatchingType: 1, Certificate: hex.EncodeToString(sum[:])}
}

func checkTransient(t *testing.T, r Result, want string) {
	t.Helper()
	for _, rr := range r.Rcpts {
		res := classify.Default().Classify(rr.Outcome)
		if res.Class != classify.Transient || !strings.Contains(rr.Outcome.Text, want) || !strings.HasPrefix(rr.Outcome.Text, "outflow (synthetic") {
			t.Errorf("%s: outcome %+v classified %s; want a transient synthetic reply containing %q", rr.Rcpt, rr.Outcome, res.Class, want)
		}
	}
}

func lastReport(t *testing.T, rep *reports) tlsrpt.Event {
	t.Helper()
	evs := rep.all()
	if len(evs) == 0 {
		t.Fatal("nothing reported")
	}
	return evs[len(evs)-1]
}

// tlsCase is one delivery to a pkiMX under a TLS policy: setup sets the
// policy on the sender's config (whose TLS reports go to rep), check looks
// at the result.
type tlsCase struct {
	name     string
	starttls bool // the fake MX offers STARTTLS
	setup    func(p *pkiMX, cfg *Config)
	check    func(t *testing.T, p *pkiMX, r Result, rep *reports)
}

func runTLSCases(t *testing.T, cases []tlsCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPKIMX(t, fakemx.Options{STARTTLS: c.starttls})
			rep := &reports{}
			cfg := p.w.config()
			cfg.TLSReport = rep
			c.setup(p, &cfg)
			c.check(t, p, p.w.sender(cfg).Send(ctxT(t), msg("example.test", "bob@example.test")), rep)
		})
	}
}

// tlsa is a secure (ad) or insecure answer for mx.example.test.
// insecureAddrs is fakeTLSA whose hosts' address records are not
// DNSSEC-secure (dane.AddrAuthenticator).
type insecureAddrs struct{ fakeTLSA }

func (insecureAddrs) AddrAuthenticated(context.Context, string) (bool, error) { return false, nil }

func tlsa(ad bool, recs ...*dns.TLSA) fakeTLSA {
	return fakeTLSA{"mx.example.test": {recs: recs, ad: ad}}
}

// otherLeaf is a certificate for mx.example.test that the MX does not use.
func otherLeaf(p *pkiMX) *x509.Certificate {
	other, _ := p.inter.Issue([]string{"mx.example.test"}, time.Time{}, time.Time{})
	return other.Cert
}

func noDelivery(t *testing.T, p *pkiMX) {
	t.Helper()
	if n := len(p.fake.Messages()); n != 0 {
		t.Errorf("%d messages delivered", n)
	}
}

func noDial(t *testing.T, p *pkiMX) {
	t.Helper()
	if d := p.w.dials(); len(d) != 0 {
		t.Errorf("dialled %v", d)
	}
}

func TestDANE(t *testing.T) {
	runTLSCases(t, []tlsCase{
		{"DANE-EE match delivers", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(3, p.leaf.Cert))
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if !r.TLS || !r.TLSVerified {
				t.Errorf("TLS=%v verified=%v", r.TLS, r.TLSVerified)
			}
			if ev := lastReport(t, rep); !ev.Success || ev.PolicyType != tlsrpt.PolicyTLSA || ev.Domain != "mx.example.test" || len(ev.Policy) != 1 {
				t.Errorf("report %+v", ev)
			}
		}},
		{"DANE-TA match delivers", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(2, p.inter.Cert))
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
		}},
		{"mismatch is refused", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(3, otherLeaf(p)))
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
			checkTransient(t, r, "DANE: no TLSA record matches the certificate of mx.example.test")
			noDelivery(t, p)
			if ev := lastReport(t, rep); ev.Success || ev.Result != tlsrpt.ResultTLSAInvalid || ev.ReceivingIP != "127.0.0.2" {
				t.Errorf("report %+v", ev)
			}
		}},
		{"no STARTTLS is refused, never plaintext", false, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(3, p.leaf.Cert))
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkTransient(t, r, "does not offer STARTTLS and it publishes DANE TLSA records")
			noDelivery(t, p)
			if ev := lastReport(t, rep); ev.Result != tlsrpt.ResultSTARTTLSNotSupported {
				t.Errorf("report %+v", ev)
			}
		}},
		{"answer without AD is ignored", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(false, spkiTLSA(3, otherLeaf(p)))
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if !r.TLS || r.TLSVerified {
				t.Errorf("TLS=%v verified=%v: want opportunistic TLS, unverified", r.TLS, r.TLSVerified)
			}
		}},
		{"secure but unusable records make TLS mandatory", false, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(1, p.leaf.Cert)) // PKIX-EE
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkTransient(t, r, "does not offer STARTTLS")
		}},
		{"lookup failure skips the host", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = fakeTLSA{"mx.example.test": {err: errors.New("SERVFAIL")}}
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkAll(t, r, classify.StageDNS, 0, classify.EventDNSServFail)
			checkTransient(t, r, "DANE status is unknown")
			noDial(t, p)
		}},
		{"lookup failure for a host of an unsigned zone does not rule it out", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = insecureAddrs{fakeTLSA{"mx.example.test": {err: errors.New("SERVFAIL")}}}
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
		}},
		{"unusable records do not set a required policy aside", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(1, p.leaf.Cert)) // PKIX-EE only
			cfg.TLSPerDestination = map[string]TLSPolicy{"example.test": TLSRequired}
			// RootCAs nil: the system pool does not know the test CA.
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
			noDelivery(t, p)
		}},
		{"unusable records do not set MTA-STS enforce aside", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(1, p.leaf.Cert))
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.elsewhere.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkTransient(t, r, "is not listed in the MTA-STS policy of example.test")
			noDial(t, p)
		}},
		{"takes precedence over MTA-STS", true, func(p *pkiMX, cfg *Config) {
			cfg.DANE = tlsa(true, spkiTLSA(3, p.leaf.Cert))
			// An enforce policy that lists another host, and no RootCAs
			// for the WebPKI: DANE alone decides.
			cfg.MTASTS = &fakeSTS{mtasts.Result{Policy: &mtasts.Policy{Mode: mtasts.ModeEnforce, MX: []string{"elsewhere.test"}, MaxAge: time.Hour, ID: "1"}}}
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
		}},
	})
}

func stsPolicy(mode mtasts.Mode, mx ...string) *fakeSTS {
	return &fakeSTS{mtasts.Result{Policy: &mtasts.Policy{Mode: mode, MX: mx, MaxAge: time.Hour, ID: "20260301", Fetched: time.Now()}}}
}

func TestMTASTS(t *testing.T) {
	runTLSCases(t, []tlsCase{
		{"enforce, listed host with a valid certificate", true, func(p *pkiMX, cfg *Config) {
			cfg.RootCAs = p.root.Pool()
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "*.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if !r.TLSVerified {
				t.Error("not verified")
			}
			if ev := lastReport(t, rep); !ev.Success || ev.PolicyType != tlsrpt.PolicySTS {
				t.Errorf("report %+v", ev)
			}
		}},
		{"enforce, unlisted host is not used", true, func(p *pkiMX, cfg *Config) {
			cfg.RootCAs = p.root.Pool()
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.elsewhere.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkAll(t, r, classify.StageTLS, 0, classify.EventTLSFailure)
			checkTransient(t, r, "is not listed in the MTA-STS policy of example.test")
			noDial(t, p)
		}},
		{"enforce, untrusted certificate", true, func(p *pkiMX, cfg *Config) {
			// RootCAs nil: the system pool does not know the test CA.
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkTransient(t, r, "MTA-STS certificate verification failed")
			noDelivery(t, p)
			if ev := lastReport(t, rep); ev.Result != tlsrpt.ResultNotTrusted {
				t.Errorf("report %+v", ev)
			}
		}},
		{"enforce, no STARTTLS", false, func(p *pkiMX, cfg *Config) {
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkTransient(t, r, "does not offer STARTTLS and the MTA-STS policy of example.test")
		}},
		{"enforce, the listed second MX is used", true, func(p *pkiMX, cfg *Config) {
			p.w.zones["example.test."] = mockdns.Zone{MX: []net.MX{{Host: "bad.example.test.", Pref: 5}, {Host: "mx.example.test.", Pref: 10}}}
			p.w.host("bad.example.test", "127.0.0.9")
			cfg.RootCAs = p.root.Pool()
			cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if d := p.w.dials(); len(d) != 1 || d[0] != "127.0.0.2:25" {
				t.Errorf("dialled %v", d)
			}
		}},
		{"testing only reports", true, func(p *pkiMX, cfg *Config) {
			cfg.MTASTS = stsPolicy(mtasts.ModeTesting, "mx.elsewhere.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			var results []string
			for _, ev := range rep.all() {
				results = append(results, ev.Result)
			}
			// One session, one failure: the host is not listed (its
			// untrusted certificate is not counted a second time).
			if strings.Join(results, ",") != "validation-failure" {
				t.Errorf("reported %v", results)
			}
		}},
		{"testing, listed host, untrusted certificate: one failure", true, func(p *pkiMX, cfg *Config) {
			cfg.MTASTS = stsPolicy(mtasts.ModeTesting, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if evs := rep.all(); len(evs) != 1 || evs[0].Success || evs[0].Result != tlsrpt.ResultNotTrusted {
				t.Errorf("reported %+v, want one certificate-not-trusted", evs)
			}
		}},
		{"testing, listed host, verified: one success", true, func(p *pkiMX, cfg *Config) {
			cfg.RootCAs = p.root.Pool()
			cfg.MTASTS = stsPolicy(mtasts.ModeTesting, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if evs := rep.all(); len(evs) != 1 || !evs[0].Success {
				t.Errorf("reported %+v, want one success", evs)
			}
		}},
		{"required under testing, unlisted host, verified: one failure", true, func(p *pkiMX, cfg *Config) {
			cfg.TLS = TLSRequired
			cfg.RootCAs = p.root.Pool()
			cfg.MTASTS = stsPolicy(mtasts.ModeTesting, "mx.elsewhere.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if evs := rep.all(); len(evs) != 1 || evs[0].Success || evs[0].Result != tlsrpt.ResultValidationFailure {
				t.Errorf("reported %+v, want one validation-failure (the host is not listed)", evs)
			}
		}},
		{"required under testing, untrusted certificate: reported", true, func(p *pkiMX, cfg *Config) {
			cfg.TLS = TLSRequired
			cfg.MTASTS = stsPolicy(mtasts.ModeTesting, "mx.example.test")
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			noDelivery(t, p)
			if evs := rep.all(); len(evs) != 1 || evs[0].Result != tlsrpt.ResultNotTrusted {
				t.Errorf("reported %+v, want one certificate-not-trusted", evs)
			}
		}},
		{"none is respected", false, func(p *pkiMX, cfg *Config) {
			cfg.MTASTS = stsPolicy(mtasts.ModeNone)
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
		}},
		{"fetch failure delivers as without a policy and reports", false, func(p *pkiMX, cfg *Config) {
			cfg.MTASTS = &fakeSTS{mtasts.Result{Failure: mtasts.FailureFetch, Err: errors.New("HTTP 404")}}
		}, func(t *testing.T, p *pkiMX, r Result, rep *reports) {
			checkDelivered(t, r)
			if ev := lastReport(t, rep); ev.Result != tlsrpt.ResultSTSPolicyFetch {
				t.Errorf("report %+v", ev)
			}
		}},
	})
	t.Run("a pooled plaintext connection is not reused under a policy", func(t *testing.T) {
		p := newPKIMX(t, fakemx.Options{STARTTLS: true})
		sts := &fakeSTS{}
		cfg := p.w.config()
		cfg.TLS = TLSNone
		cfg.RootCAs = p.root.Pool()
		cfg.MTASTS = sts
		s := p.w.sender(cfg)
		checkDelivered(t, s.Send(ctxT(t), msg("example.test", "bob@example.test")))
		s.cfg.TLS = TLSOpportunistic
		sts.res = stsPolicy(mtasts.ModeEnforce, "mx.example.test").res
		r := s.Send(ctxT(t), msg("example.test", "bob@example.test"))
		checkDelivered(t, r)
		if r.Reused || !r.TLSVerified {
			t.Errorf("reused=%v verified=%v", r.Reused, r.TLSVerified)
		}
	})
}

// TestSTARTTLSRefusedUnderPolicy: a host that offers STARTTLS and then
// answers it with a 5xx, under a policy that requires TLS (MTA-STS
// enforce, DANE, required), is a temporary failure of that host: the
// message is not bounced for the host's broken TLS, and not sent in
// plaintext. Opportunistic TLS goes on in plaintext.
func TestSTARTTLSRefusedUnderPolicy(t *testing.T) {
	for _, mode := range []string{"sts-enforce", "required", "dane", "opportunistic"} {
		t.Run(mode, func(t *testing.T) {
			p := newPKIMX(t, fakemx.Options{ExtraExtensions: []string{"STARTTLS"}})
			cfg := p.w.config()
			cfg.RootCAs = p.root.Pool()
			switch mode {
			case "sts-enforce":
				cfg.MTASTS = stsPolicy(mtasts.ModeEnforce, "mx.example.test")
			case "required":
				cfg.TLS = TLSRequired
			case "dane":
				cfg.DANE = tlsa(true, spkiTLSA(3, p.leaf.Cert))
			}
			r := p.w.sender(cfg).Send(ctxT(t), msg("example.test", "bob@example.test"))
			o := r.Rcpts[0].Outcome
			if mode == "opportunistic" {
				if len(p.fake.Messages()) != 1 {
					t.Fatalf("not delivered in plaintext: %+v", o)
				}
				return
			}
			c := classify.Default().Classify(o)
			if len(p.fake.Messages()) != 0 || c.Class != classify.Transient || o.Stage != classify.StageTLS || !strings.Contains(o.Text, "refused STARTTLS") {
				t.Fatalf("outcome %+v classified %s (%s), %d delivered; want a transient TLS failure and nothing sent", o, c.Class, c.Rule, len(p.fake.Messages()))
			}
		})
	}
}
