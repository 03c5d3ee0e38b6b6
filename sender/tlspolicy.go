package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/dane"
	"github.com/outflow/outflow/mtasts"
	"github.com/outflow/outflow/tlsrpt"
)

// MTASTSLookup finds a destination's MTA-STS policy; *mtasts.Client
// satisfies it.
type MTASTSLookup interface {
	Lookup(ctx context.Context, domain string) mtasts.Result
}

// TLSReporter receives TLS outcomes of policy domains for RFC 8460
// reports; *tlsrpt.Aggregator satisfies it. Record must not block.
type TLSReporter interface {
	Record(ev tlsrpt.Event)
}

// tlsMode is how one MX host's connection is secured.
type tlsMode int

const (
	modeOpportunistic tlsMode = iota // STARTTLS if offered, plaintext otherwise
	modeRequired                     // STARTTLS with a WebPKI-verified certificate (policy "required")
	modeNone                         // never STARTTLS
	modeDANE                         // STARTTLS verified against TLSA records (RFC 7672)
	modeDANEUnusable                 // secure TLSA RRset, none usable: STARTTLS, unauthenticated (RFC 7672 2.2)
	modeSTS                          // MTA-STS enforce: STARTTLS with a WebPKI-verified certificate (RFC 8461 4.2)
)

// poolSuffix keeps connections opened under different modes apart in
// the pool, so that a plaintext connection is never reused once DANE or
// MTA-STS applies to its host.
func (m tlsMode) poolSuffix() string {
	return [...]string{"", "|required", "|none", "|dane", "|dane-unusable", "|sts"}[m]
}

// tlsPlan is the TLS decision for one Send: the destination's policy and
// what MTA-STS said about the domain. hostTLS refines it per MX host.
type tlsPlan struct {
	domain string
	policy TLSPolicy
	sts    *mtasts.Policy // enforce or testing policy, nil otherwise
}

// hostPlan is the TLS decision for one MX host.
type hostPlan struct {
	mode  tlsMode
	tlsa  []*dns.TLSA // usable records (modeDANE)
	all   []*dns.TLSA // the whole secure RRset, for reports
	names []string    // DANE reference identifiers (RFC 7672 3.2.2)
	// stsTesting: an MTA-STS policy in testing mode applies; what would
	// fail is reported, nothing is refused.
	stsTesting *mtasts.Policy
	sts        *mtasts.Policy // enforce policy (modeSTS)
}

// planTLS looks up the destination's MTA-STS policy, once per Send.
func (s *Sender) planTLS(ctx context.Context, log *msgLog, domain string) *tlsPlan {
	p := &tlsPlan{domain: destName(domain), policy: s.cfg.policyFor(domain)}
	if s.cfg.Relay != "" || p.policy == TLSNone || s.cfg.MTASTS == nil {
		return p
	}
	res := s.cfg.MTASTS.Lookup(ctx, p.domain)
	if res.Failure != "" {
		// RFC 8461 3.3: no policy could be had and none is cached:
		// deliver as if the domain had none, and report it.
		log.Warn().Str("mta_sts_failure", res.Failure).Err(res.Err).Msg("MTA-STS policy announced but not available; delivering as without one")
		s.report(tlsrpt.Event{Domain: p.domain, PolicyType: tlsrpt.PolicySTS, Result: res.Failure, Detail: errText(res.Err)})
	}
	if res.Policy != nil && res.Policy.Mode != mtasts.ModeNone {
		p.sts = res.Policy
	}
	return p
}

// hostTLS decides how to secure the connection to host: DANE first
// (RFC 8461 2: a host with usable DANE records is not subject to
// MTA-STS), then MTA-STS, then the configured policy. An error means the
// host must not be used.
func (s *Sender) hostTLS(ctx context.Context, p *tlsPlan, host string) (*hostPlan, error) {
	hp := &hostPlan{mode: modeOpportunistic}
	switch p.policy {
	case TLSNone:
		hp.mode = modeNone
		return hp, nil
	case TLSRequired:
		hp.mode = modeRequired
	}
	if s.cfg.Relay != "" {
		return hp, nil
	}
	if s.cfg.DANE != nil {
		recs, base, err := s.lookupTLSA(ctx, host)
		if err != nil {
			s.report(tlsrpt.Event{Domain: base, PolicyType: tlsrpt.PolicyTLSA, ReceivingMX: host,
				Result: tlsrpt.ResultDNSSECInvalid, Detail: err.Error()})
			return nil, &stepErr{in: classify.Input{Stage: classify.StageDNS, Event: classify.EventDNSServFail,
				Text: syntheticText(fmt.Sprintf("%s: %v; its DANE status is unknown, so it is not used (RFC 7672 2.2)", host, err))}, err: err}
		}
		if recs.Secure {
			hp.all, hp.tlsa = recs.All, recs.Usable
			// RFC 7672 3.2.2: a DANE-TA certificate may name the TLSA
			// base domain, the MX host name when that is an alias, or
			// the destination domain. The first is also the policy
			// domain of reports (RFC 8460 3).
			hp.names = []string{base}
			for _, n := range []string{nameKey(host), p.domain} {
				if !slices.Contains(hp.names, n) {
					hp.names = append(hp.names, n)
				}
			}
		}
		if len(recs.Usable) > 0 {
			hp.mode = modeDANE
			return hp, nil
		}
		if recs.Secure {
			// Signed records, none usable: TLS is mandatory (RFC 7672
			// 2.2), but DANE authenticates nothing, so MTA-STS and the
			// configured policy still apply (only usable records set
			// MTA-STS aside, RFC 8461 2). Once they let the session
			// go unauthenticated, it is unauthenticated TLS.
			defer func() {
				if hp.mode == modeOpportunistic {
					hp.mode = modeDANEUnusable
				}
			}()
		}
	}
	if p.sts == nil {
		return hp, nil
	}
	if p.sts.Mode == mtasts.ModeTesting {
		// What would fail is reported once per session, by secure
		// (reportHost), an unlisted host included.
		hp.stsTesting = p.sts
		return hp, nil
	}
	if !p.sts.Match(host) {
		// RFC 8461 4.2: an MX host that matches no pattern is not a
		// candidate at all.
		detail := fmt.Sprintf("MX host %s is not listed in the MTA-STS policy of %s (mode enforce, policy id %s); not delivering to it (RFC 8461 4.2)", host, p.domain, p.sts.ID)
		s.reportSTS(p, host, "", false, tlsrpt.ResultValidationFailure, "MX host is not listed in the policy")
		return nil, &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure, Text: syntheticText(detail)}}
	}
	hp.mode = modeSTS
	hp.sts = p.sts
	return hp, nil
}

// canonicalNamer is a dane.Resolver that can also say where an MX host's
// address records are: the name at the end of its CNAME chain, and
// whether the chain validated (package resolver's does).
type canonicalNamer interface {
	CanonicalName(ctx context.Context, host string) (name string, authenticated bool, err error)
}

// lookupTLSA looks up host's TLSA records where RFC 7672 2.2.2 has them:
// when host is an alias (CNAME) whose chain to its addresses validated,
// at the fully expanded name first, and at host itself when there are
// none there (no records, or an answer that did not validate); otherwise
// at host. base is the TLSA base domain the records came from (or were
// last looked for), lower case. An insecure chain is not followed: its
// target is not the secure name's to vouch for (RFC 7671 7).
func (s *Sender) lookupTLSA(ctx context.Context, host string) (recs dane.Records, base string, err error) {
	host = nameKey(host)
	if cn, ok := s.cfg.DANE.(canonicalNamer); ok {
		if name, secure, cerr := cn.CanonicalName(ctx, host); cerr == nil && secure && nameKey(name) != host {
			name = nameKey(name)
			recs, err := dane.Lookup(ctx, s.cfg.DANE, name, s.cfg.Port)
			if err != nil || recs.Secure {
				return recs, name, err
			}
		}
	}
	recs, err = dane.Lookup(ctx, s.cfg.DANE, host, s.cfg.Port)
	return recs, host, err
}

// secure runs the TLS part of a new MX session per hp. It returns the
// client to use, which for an opportunistic fallback is a new plaintext
// one.
func (s *Sender) secure(ctx context.Context, log *msgLog, c *client, p *tlsPlan, hp *hostPlan) (*client, error) {
	host, addr := c.host, c.addr
	switch hp.mode {
	case modeNone:
		return c, nil
	case modeRequired, modeSTS, modeDANE, modeDANEUnusable:
		what := map[tlsMode]string{
			modeRequired:     "the destination's TLS policy is required",
			modeSTS:          fmt.Sprintf("the MTA-STS policy of %s (mode enforce, policy id %s) requires it", p.domain, stsID(hp.sts)),
			modeDANE:         "it publishes DANE TLSA records (RFC 7672)",
			modeDANEUnusable: "it publishes DNSSEC-signed TLSA records (RFC 7672 2.2)",
		}[hp.mode]
		if !c.has("STARTTLS") {
			s.reportHost(p, hp, c, false, tlsrpt.ResultSTARTTLSNotSupported, "STARTTLS not offered")
			return nil, &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure,
				Text: syntheticText(fmt.Sprintf("%s (%s) does not offer STARTTLS and %s; not delivering in plaintext", host, addr, what))}}
		}
		verify, must := (func(tls.ConnectionState) error)(nil), true
		switch hp.mode {
		case modeDANE:
			verify = dane.VerifyConnection(hp.tlsa, hp.names)
		case modeDANEUnusable:
			must = false
		}
		if err := c.startTLS(ctx, must, verify, tls.VersionTLS12); err != nil {
			var se *stepErr
			if !errors.As(err, &se) || se.in.Stage != classify.StageTLS {
				return nil, err
			}
			if c.verifyErr == nil {
				s.reportHost(p, hp, c, false, tlsrpt.ResultValidationFailure, se.in.Text)
				if se.in.Code >= 500 {
					// STARTTLS offered and then refused with a 5xx: a
					// fault of this host's TLS, not a refusal of the
					// message, so a temporary failure that the next MX
					// may not have (RFC 8461 5.1, RFC 7672 2.2; Postfix
					// defers too). Passed on, the reply bounced the mail.
					return nil, &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure,
						Text: syntheticText(fmt.Sprintf("%s (%s) refused STARTTLS (%d %s) and %s; not delivering in plaintext", host, addr, se.in.Code, se.in.Text, what))}, err: err}
				}
				return nil, err
			}
			s.reportHost(p, hp, c, false, resultOf(c.verifyErr), errText(c.verifyErr))
			if hp.mode != modeRequired {
				why := c.verifyErr.Error() // a *dane.Error says "DANE: …" itself
				if hp.mode == modeSTS {
					why = "MTA-STS certificate verification failed: " + why
				}
				return nil, &stepErr{in: classify.Input{Stage: classify.StageTLS, Event: classify.EventTLSFailure,
					Text: syntheticText(fmt.Sprintf("%s (%s): %s; not delivering without it", host, addr, why))}, err: err}
			}
			return nil, err
		}
		s.reportHost(p, hp, c, true, "", "")
		return c, nil
	}
	// Opportunistic (RFC 7435), possibly under an MTA-STS testing policy
	// that only reports.
	if !c.has("STARTTLS") {
		if hp.stsTesting != nil {
			s.reportHost(p, hp, c, false, tlsrpt.ResultSTARTTLSNotSupported, "STARTTLS not offered")
		}
		return c, nil
	}
	if err := c.startTLS(ctx, false, nil, tls.VersionTLS10); err != nil {
		var se *stepErr
		if !errors.As(err, &se) || se.in.Stage != classify.StageTLS || ctx.Err() != nil {
			return nil, err
		}
		if hp.stsTesting != nil {
			s.reportHost(p, hp, c, false, tlsrpt.ResultValidationFailure, se.in.Text)
		}
		if !c.broken && se.in.Code != 0 {
			// STARTTLS refused with a reply (e.g. 454): the session goes
			// on in plaintext (RFC 3207 4).
			log.Warn().Str("mx", host).Str("addr", addr).Int("code", se.in.Code).Str("reply", se.in.Text).
				Msg("STARTTLS refused; continuing in plaintext as the opportunistic TLS policy allows")
			return c, nil
		}
		// The handshake failed; the connection is dead. Opportunistic
		// policy allows plaintext: redial without STARTTLS.
		log.Warn().Str("mx", host).Str("addr", addr).Str("error", se.in.Text).
			Msg("TLS handshake failed; retrying this host in plaintext as the opportunistic TLS policy allows")
		c.close()
		return s.openPlain(ctx, log, host, addr, c.key)
	}
	if c.tlsVerified {
		s.reportHost(p, hp, c, true, "", "")
	} else {
		s.reportHost(p, hp, c, false, resultOf(c.verifyErr), errText(c.verifyErr))
	}
	return c, nil
}

// reportHost records a session outcome for the policy that governed it,
// once per session. Under an MTA-STS testing policy, a session with a host
// the policy does not list is that failure, whatever its TLS did (RFC 8461
// 4.2 would not have used the host at all).
func (s *Sender) reportHost(p *tlsPlan, hp *hostPlan, c *client, ok bool, result, detail string) {
	if hp.stsTesting != nil && hp.mode != modeDANE && hp.mode != modeDANEUnusable && !hp.stsTesting.Match(c.host) {
		ok, result, detail = false, tlsrpt.ResultValidationFailure, "MX host is not listed in the policy"
	}
	switch {
	case hp.mode == modeDANE || hp.mode == modeDANEUnusable:
		// RFC 8460 3: a DANE policy is the MX host's, and so is its
		// report.
		s.report(tlsrpt.Event{Domain: hp.names[0], PolicyType: tlsrpt.PolicyTLSA, Policy: dane.Strings(hp.all),
			Success: ok, Result: result, ReceivingMX: c.host, ReceivingIP: hostOf(c.addr), Detail: detail})
	case hp.mode == modeSTS || hp.stsTesting != nil:
		s.reportSTS(p, c.host, hostOf(c.addr), ok, result, detail)
	}
}

func (s *Sender) reportSTS(p *tlsPlan, host, ip string, ok bool, result, detail string) {
	s.report(tlsrpt.Event{Domain: p.domain, PolicyType: tlsrpt.PolicySTS, Policy: p.sts.Lines(), MXHosts: p.sts.MX,
		Success: ok, Result: result, ReceivingMX: host, ReceivingIP: ip, Detail: detail})
}

func (s *Sender) report(ev tlsrpt.Event) {
	if s.cfg.TLSReport != nil {
		s.cfg.TLSReport.Record(ev)
	}
}

// resultOf maps a certificate verification error to its RFC 8460 result
// type.
func resultOf(err error) string {
	var de *dane.Error
	var he x509.HostnameError
	var ua x509.UnknownAuthorityError
	var ci x509.CertificateInvalidError
	switch {
	case err == nil:
		return tlsrpt.ResultValidationFailure
	case errors.As(err, &de):
		return de.Result
	case errors.As(err, &he):
		return tlsrpt.ResultHostMismatch
	case errors.As(err, &ua):
		return tlsrpt.ResultNotTrusted
	case errors.As(err, &ci) && ci.Reason == x509.Expired:
		return tlsrpt.ResultExpired
	}
	return tlsrpt.ResultValidationFailure
}

// syntheticText marks an outcome outflow decided itself.
func syntheticText(s string) string { return "outflow (synthetic, no server reply): " + s }

func stsID(p *mtasts.Policy) string {
	if p == nil {
		return ""
	}
	return p.ID
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func hostOf(addr string) string {
	if i := strings.LastIndexByte(addr, ':'); i >= 0 {
		return strings.Trim(addr[:i], "[]")
	}
	return addr
}
