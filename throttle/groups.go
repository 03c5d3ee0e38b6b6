package throttle

import (
	"context"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// GroupRule names a provider group: every recipient domain whose MX hosts
// end in one of MXSuffixes (or that is listed in Domains) shares the
// group's budget and shared state. Used only when Config.GroupByMX
// is set.
type GroupRule struct {
	Name string `toml:"name"` // destination name of the group, e.g. "google"
	// MXSuffixes are matched, case-insensitively, against the end of each
	// MX host name (trailing dot ignored), e.g. ".google.com", at a label
	// boundary: ".google.com" and "google.com" both match
	// "smtp.google.com" and "google.com", never "notgoogle.com".
	MXSuffixes []string `toml:"mx-suffixes"`
	// Domains are recipient domains known to belong to the group; they
	// skip the MX lookup.
	Domains []string `toml:"domains"`
}

// DefaultGroups are the large mailbox providers, by the MX host names they
// publish (checked against their live MX records):
//
//	google     gmail-smtp-in.l.google.com, aspmx.l.google.com, smtp.google.com,
//	           aspmx2.googlemail.com (legacy Workspace)
//	microsoft  *.olc.protection.outlook.com (outlook.com, hotmail.com),
//	           <tenant>.mail.protection.outlook.com (Microsoft 365),
//	           <tenant>.<x>.mx.microsoft (Microsoft 365, DNSSEC)
//	yahoo      mta5.am0.yahoodns.net (yahoo.com), mx-aol.mail.gm0.yahoodns.net (aol.com)
//	apple      mx01.mail.icloud.com (icloud.com, me.com, mac.com)
//	fastmail   in1-smtp.messagingengine.com
//	zoho       mx.zoho.com, mx.zoho.eu, mx.zoho.in
func DefaultGroups() []GroupRule {
	return []GroupRule{
		{Name: "google", MXSuffixes: []string{".google.com", ".googlemail.com"},
			Domains: []string{"gmail.com", "googlemail.com"}},
		{Name: "microsoft", MXSuffixes: []string{".outlook.com", ".mx.microsoft"},
			Domains: []string{"outlook.com", "hotmail.com", "live.com", "msn.com"}},
		{Name: "yahoo", MXSuffixes: []string{".yahoodns.net"},
			Domains: []string{"yahoo.com", "ymail.com", "aol.com"}},
		{Name: "apple", MXSuffixes: []string{".mail.icloud.com"},
			Domains: []string{"icloud.com", "me.com", "mac.com"}},
		{Name: "fastmail", MXSuffixes: []string{".messagingengine.com"}},
		{Name: "zoho", MXSuffixes: []string{".zoho.com", ".zoho.eu", ".zoho.in"}},
	}
}

// MXResolver looks up MX records; *net.Resolver implements it.
type MXResolver interface {
	LookupMX(ctx context.Context, name string) ([]*net.MX, error)
}

// Lifetimes of cached MX groupings.
const (
	mxCacheTTL   = 10 * time.Minute // a successful lookup
	mxNegTTL     = time.Minute      // a failed lookup (the domain is its own destination meanwhile)
	mxLookupWait = 5 * time.Second  // bound on one lookup
)

// grouper maps recipient domains to destinations.
type grouper struct {
	byMX      bool
	bySite    bool              // domains on the same MX hosts outside every group share a site (siteName)
	overrides map[string]bool   // destinations with their own limits: never grouped
	domains   map[string]string // domain -> group (GroupRule.Domains)
	rules     []GroupRule       // suffixes lower-cased
	res       MXResolver

	mu    sync.Mutex
	cache map[string]*mxEntry
}

type mxEntry struct {
	ready   chan struct{} // closed when group and expires are set
	group   string
	expires time.Time
}

func newGrouper(byMX, bySite bool, rules []GroupRule, overrides map[string]Limits, res MXResolver) *grouper {
	g := &grouper{byMX: byMX, bySite: bySite, overrides: map[string]bool{}, domains: map[string]string{}, res: res, cache: map[string]*mxEntry{}}
	for d := range overrides {
		g.overrides[NormalizeDest(d)] = true
	}
	for _, r := range rules {
		nr := GroupRule{Name: r.Name}
		for _, s := range r.MXSuffixes {
			s = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), "."))
			if s == "" {
				continue
			}
			if s[0] != '.' {
				s = "." + s // "google.com" must not match "notgoogle.com"
			}
			nr.MXSuffixes = append(nr.MXSuffixes, s)
		}
		for _, d := range r.Domains {
			if d = NormalizeDest(d); d != "" {
				if _, dup := g.domains[d]; !dup {
					g.domains[d] = r.Name
				}
			}
		}
		g.rules = append(g.rules, nr)
	}
	if g.res == nil {
		g.res = net.DefaultResolver
	}
	return g
}

// isGroup reports whether name is one of the provider groups' names, or
// an MX site's (SitePrefix).
func (g *grouper) isGroup(name string) bool {
	if IsSite(name) {
		return true
	}
	for _, r := range g.rules {
		if r.Name == name {
			return true
		}
	}
	return false
}

// group returns the destination of a recipient domain: the domain itself
// when grouping is off, when the domain has limits of its own, or when no
// group's suffix matches its MX hosts and they are the domain's own (or
// the lookup fails); the MX site of hosts outside the domain (siteName),
// with bySite.
func (g *grouper) group(ctx context.Context, domain string) string {
	d := NormalizeDest(domain)
	if !g.byMX || d == "" || g.overrides[d] || len(g.rules) == 0 && !g.bySite {
		return d
	}
	if name, ok := g.domains[d]; ok {
		return name
	}
	now := time.Now()
	g.mu.Lock()
	e := g.cache[d]
	if e != nil {
		select {
		case <-e.ready:
			if now.Before(e.expires) {
				g.mu.Unlock()
				return e.group
			}
			e = nil // expired: look up again
		default: // a lookup is in flight: wait for it below
		}
	}
	if e != nil {
		g.mu.Unlock()
		select {
		case <-e.ready:
			return e.group
		case <-ctx.Done():
			return d
		}
	}
	e = &mxEntry{ready: make(chan struct{})}
	g.cache[d] = e
	g.mu.Unlock()

	group, ok := g.lookup(ctx, d)
	ttl := mxCacheTTL
	if !ok {
		ttl = mxNegTTL
	}
	e.group, e.expires = group, time.Now().Add(ttl)
	close(e.ready)
	return group
}

// lookup resolves d's MX hosts and returns the group of the most preferred
// hosts, their site (with bySite), or d; ok is false when the lookup
// failed.
func (g *grouper) lookup(ctx context.Context, d string) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, mxLookupWait)
	defer cancel()
	mxs, err := g.res.LookupMX(ctx, d)
	if err != nil {
		return d, false
	}
	// Only the most preferred hosts count: mail goes there, and a
	// provider listed as a backup MX does not make the domain its customer.
	sort.SliceStable(mxs, func(i, j int) bool { return mxs[i].Pref < mxs[j].Pref })
	var best []string
	for _, mx := range mxs {
		if mx.Pref != mxs[0].Pref {
			break
		}
		if name := g.matchHost(mx.Host); name != "" {
			return name, true
		}
		best = append(best, mx.Host)
	}
	if g.bySite {
		return siteName(d, best), true
	}
	return d, true
}

// SitePrefix starts the name of an MX site: the destination of the
// recipient domains whose most preferred MX hosts are the same hosts,
// outside those domains and outside every provider group, such as a
// hosting company's mx1.hoster.example for all its customers' domains.
// They share one budget, breaker and learned rate, since they share the
// hosts' one limit (KumoMTA's "MX rollup"). The prefix tells a site from
// a domain (it has a colon, which no domain has) and from a group.
const SitePrefix = "mx:"

// siteMaxLen bounds a site's name; the hosts past it are left out of the
// name (it stays the same for the same hosts: they are sorted).
const siteMaxLen = 200

// IsSite reports whether the destination name is an MX site's.
func IsSite(name string) bool { return strings.HasPrefix(name, SitePrefix) }

// siteName is the destination of domain d whose most preferred MX hosts
// are hosts: d itself when there are none (a null MX) or when every one is
// d or inside it (mx.example.com for example.com: nobody else's host, and
// the domain is the name an operator knows); else SitePrefix and the
// hosts, lower-cased, sorted and joined by "+": "mx:mx1.hoster.example",
// "mx:a.mx.example+b.mx.example".
func siteName(d string, hosts []string) string {
	var hs []string
	own := true
	for _, h := range hosts {
		h = strings.ToLower(strings.TrimSuffix(h, "."))
		if h == "" || slices.Contains(hs, h) {
			continue
		}
		hs = append(hs, h)
		if h != d && !strings.HasSuffix(h, "."+d) {
			own = false
		}
	}
	if len(hs) == 0 || own {
		return d
	}
	sort.Strings(hs)
	name := SitePrefix + hs[0]
	for _, h := range hs[1:] {
		if len(name)+1+len(h) > siteMaxLen {
			break
		}
		name += "+" + h
	}
	return name
}

// matchHost returns the group whose suffix host ends with, or "".
func (g *grouper) matchHost(host string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, r := range g.rules {
		for _, s := range r.MXSuffixes {
			if strings.HasSuffix(host, s) || host == s[1:] {
				return r.Name
			}
		}
	}
	return ""
}

// prune drops expired cache entries, so the cache holds only the domains
// seen in the last mxCacheTTL.
func (g *grouper) prune(now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for d, e := range g.cache {
		select {
		case <-e.ready:
			if !now.Before(e.expires) {
				delete(g.cache, d)
			}
		default:
		}
	}
}
