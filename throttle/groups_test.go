package throttle

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outflow/outflow/classify"
)

// fakeMX resolves from a map and counts lookups.
type fakeMX struct {
	mu    sync.Mutex
	zone  map[string][]string
	calls map[string]int
}

func (f *fakeMX) LookupMX(_ context.Context, name string) ([]*net.MX, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[name]++
	hosts, ok := f.zone[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	var out []*net.MX
	for i := len(hosts) - 1; i >= 0; i-- { // reversed: the code must sort by preference
		out = append(out, &net.MX{Host: hosts[i], Pref: uint16(10 * (i + 1))})
	}
	return out, nil
}

func (f *fakeMX) count(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[name]
}

func TestGroupByMX(t *testing.T) {
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{
		"example.org":    {"aspmx.l.google.com.", "alt1.aspmx.l.google.com."},
		"workspace.test": {"smtp.google.com."},
		"legacy.test":    {"aspmx2.googlemail.com."},
		"corp.test":      {"corp-test.mail.protection.outlook.com."},
		"new365.test":    {"new365-test.o-v1.mx.microsoft."},
		"aolish.test":    {"mx-aol.mail.gm0.yahoodns.net."},
		"apple.test":     {"mx01.mail.icloud.com."},
		"own.test":       {"mx.own.test."},
		"tricky.test":    {"mx.notgoogle.com."},
		"backup.test":    {"mx.backup.test.", "aspmx.l.google.com."}, // own MX preferred
		"hosted.test":    {"aspmx.l.google.com."},
	}}
	g := newGrouper(true, false, DefaultGroups(), map[string]Limits{"Hosted.Test": {Rate: 1}}, res)
	ctx := context.Background()
	for domain, want := range map[string]string{
		"example.org":    "google",
		"Example.ORG.":   "google",
		"workspace.test": "google",
		"legacy.test":    "google",
		"gmail.com":      "google", // by name, no lookup
		"corp.test":      "microsoft",
		"new365.test":    "microsoft",
		"hotmail.com":    "microsoft",
		"aolish.test":    "yahoo",
		"apple.test":     "apple",
		"own.test":       "own.test",
		"tricky.test":    "tricky.test",
		"backup.test":    "backup.test",
		"hosted.test":    "hosted.test", // has its own limits
		"missing.test":   "missing.test",
	} {
		if got := g.group(ctx, domain); got != want {
			t.Errorf("group(%q) = %q, want %q", domain, got, want)
		}
	}
	if n := res.count("example.org"); n != 1 {
		t.Errorf("example.org looked up %d times, want 1 (cached)", n)
	}
	if n := res.count("gmail.com") + res.count("hosted.test"); n != 0 {
		t.Errorf("%d lookups for domains that need none", n)
	}

	off := newGrouper(false, true, DefaultGroups(), nil, res)
	if got := off.group(ctx, "Example.org"); got != "example.org" {
		t.Errorf("grouping off: %q", got)
	}
}

func TestThrottleGroupsShareOneBudget(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
		c.Overrides = map[string]Limits{"google": {Rate: 100}}
	})
	if g := th.Group("a.test"); g != "google" {
		t.Fatalf("Group(a.test) = %q", g)
	}
	attempt(t, th, "a.test", resThrottled)
	if s := th.Snapshot("google"); s.FleetRate != 50 {
		t.Fatalf("google rate %v after a throttle on a.test", s.FleetRate)
	}
}

// TestSuspendOneDomainOfAGroup: `dest suspend a.test`, a.test being in
// google's group, stops a.test's mail and nothing else of the group's.
func TestSuspendOneDomainOfAGroup(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
	})
	if g := th.Group("a.test"); g != "google" {
		t.Fatalf("Group(a.test) = %q", g)
	}
	if err := Suspend(ctxT(t), env.state, "a.test", time.Now().Add(time.Hour), "its owner asked", "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a.test refused while suspended", func() bool {
		p, r := th.Admit(ctxT(t), "a.test", "", "")
		if p != nil {
			p.Done(nil)
			return false
		}
		return r.Reason == "suspended"
	})
	p, r := th.Admit(ctxT(t), "b.test", "", "")
	if p == nil {
		t.Fatalf("b.test, of the same group, refused: %+v", r)
	}
	p.Done(nil)
}

// TestResumeOneDomainOfAGroup: the recovery of one domain of a provider
// group, suspended by itself, releases that domain's deferred mail (and
// only its), at the group's rate: its mail is admitted in the group's
// budget. Before, serve matched the deferred envelopes by group alone
// (a.test's group is google, never a.test), so none was released, and
// the rate given was a.test's own limits, the defaults.
func TestResumeOneDomainOfAGroup(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	type recovery struct {
		dest string
		rate float64
	}
	recovered := make(chan recovery, 4)
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
		c.Defaults.Rate = 5
		c.Overrides = map[string]Limits{"google": {Rate: 50}}
		c.OnRecover = func(dest string, rate float64) { recovered <- recovery{dest, rate} }
	})
	if g := th.Group("a.test"); g != "google" {
		t.Fatalf("Group(a.test) = %q", g)
	}
	for _, c := range []struct {
		dest, domain string
		want         bool
	}{
		{"a.test", "a.test", true},
		{"a.test", "A.Test.", true},
		{"a.test", "b.test", false},
		{"google", "a.test", true},
		{"google", "b.test", true},
		{"google", "c.test", false},
		{"c.test", "c.test", true},
		{"a.test@192.0.2.10", "a.test", true},
	} {
		if got := th.Recovers(c.dest, c.domain); got != c.want {
			t.Errorf("Recovers(%q, %q) = %v, want %v", c.dest, c.domain, got, c.want)
		}
	}

	for _, dest := range []string{"a.test", "google"} {
		if err := Suspend(ctxT(t), env.state, dest, time.Now().Add(time.Hour), "for a while", "ops"); err != nil {
			t.Fatal(err)
		}
		eventually(t, 5*time.Second, dest+" suspended", func() bool { return th.Snapshot(dest).Suspended })
		if _, err := Resume(ctxT(t), env.state, dest, "ops"); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-recovered:
			if r.dest != dest || r.rate != 50 {
				t.Errorf("OnRecover(%q, %v), want (%q, 50): the group's rate", r.dest, r.rate, dest)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s resumed: no OnRecover", dest)
		}
	}
}

// ownFlight is th's attempts in flight under dest's own limits (own.go).
func ownFlight(th *Throttle, dest string) int {
	d := th.lookDest(dest)
	if d == nil {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ownFlight
}

// TestOwnLimitsOfOneDomainOfAGroup: a rate pin, a connection limit and a
// suspension from one source, set on a.test while a.test is in google's
// group, hold for a.test's mail on top of the group's budget, and leave
// the rest of the group alone. Before, the pin and the connection limit
// were stored and printed as in force, and admission read google's state
// alone; so was the pair a.test@SOURCE's suspension.
func TestOwnLimitsOfOneDomainOfAGroup(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
		c.NoLearn = true // google without a rate: only a.test's own limits hold
		c.MaxWait = -1   // never wait for a token: a second within the pin's period is refused
	})
	if g := th.Group("a.test"); g != "google" {
		t.Fatalf("Group(a.test) = %q", g)
	}
	ctx := ctxT(t)
	seen := func(dest string, cond func(s DestState) bool) {
		t.Helper()
		eventually(t, 5*time.Second, dest+"'s state seen", func() bool {
			d := th.lookDest(dest)
			if d == nil {
				return false
			}
			d.mu.Lock()
			defer d.mu.Unlock()
			return cond(d.state)
		})
	}

	// A pin of 1/s: the first send goes, the next within the second is
	// refused for the rate, at the pin's spacing; b.test goes on.
	if err := SetRate(ctx, env.state, "a.test", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	seen("a.test", func(s DestState) bool { return s.RateOverride == 1 })
	if ok, r := admitted(t, th, "a.test", "", resDelivered); !ok {
		t.Fatalf("a.test's first send refused: %+v", r)
	}
	ok, r := admitted(t, th, "a.test", "", resDelivered)
	if ok || r.Reason != "rate" {
		t.Fatalf("a.test's second send within its pinned 1/s: admitted %v, %+v; want refused for the rate", ok, r)
	}
	if ahead := time.Until(r.Until); ahead < 800*time.Millisecond || ahead > 1200*time.Millisecond {
		t.Errorf("a.test's next place %v ahead, want the pin's period, 1 s", ahead.Round(time.Millisecond))
	}
	for range 5 {
		if ok, r := admitted(t, th, "b.test", "", resDelivered); !ok {
			t.Fatalf("b.test, of the same group, refused: %+v", r)
		}
	}
	if n := ownFlight(th, "a.test"); n != 0 {
		t.Errorf("a.test: %d in flight after every attempt was done or refused", n)
	}
	if err := SetRate(ctx, env.state, "a.test", 0, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	seen("a.test", func(s DestState) bool { return s.RateOverride == 0 })

	// A connection limit of one: a second attempt while the first is out
	// is refused "conns".
	if err := SetConns(ctx, env.state, "a.test", 1, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	seen("a.test", func(s DestState) bool { return s.ConnsOverride == 1 })
	first := mustAdmit(t, th, "a.test")
	if ok, r := admitted(t, th, "a.test", "", resDelivered); ok || r.Reason != "conns" {
		t.Errorf("a.test's second connection under its limit of one: admitted %v, %+v; want refused \"conns\"", ok, r)
	}
	if ok, r := admitted(t, th, "b.test", "", resDelivered); !ok {
		t.Errorf("b.test refused while a.test holds its one connection: %+v", r)
	}
	first.Done([]classify.Result{resDelivered})
	if ok, r := admitted(t, th, "a.test", "", resDelivered); !ok {
		t.Errorf("a.test refused with its one connection free again: %+v", r)
	}

	// A suspension of a.test from one source stops that address only.
	if err := Suspend(ctx, env.state, PairName("a.test", "192.0.2.10"), time.Now().Add(time.Hour), "blocked", "ops"); err != nil {
		t.Fatal(err)
	}
	seen(PairName("a.test", "192.0.2.10"), func(s DestState) bool { return !s.SuspendedUntil.IsZero() })
	if ok, r := admitted(t, th, "a.test", "192.0.2.10", resDelivered); ok || r.Reason != "suspended" {
		t.Errorf("a.test from its suspended address: admitted %v, %+v; want refused \"suspended\"", ok, r)
	}
	for _, c := range []struct{ domain, source string }{{"a.test", "192.0.2.11"}, {"b.test", "192.0.2.10"}} {
		if ok, r := admitted(t, th, c.domain, c.source, resDelivered); !ok {
			t.Errorf("%s from %s refused: %+v", c.domain, c.source, r)
		}
	}
}

// TestOwnPinWaitsApartFromTheGroup: an attempt to a domain pinned by
// itself inside its group waits for the pin's token before it reserves
// the group's, so the rest of the group is not held behind it.
func TestOwnPinWaitsApartFromTheGroup(t *testing.T) {
	env := startKV(t)
	res := &fakeMX{calls: map[string]int{}, zone: map[string][]string{"a.test": {"aspmx.l.google.com."}, "b.test": {"alt2.aspmx.l.google.com."}}}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.Groups, c.Resolver = true, DefaultGroups(), res
		c.Overrides = map[string]Limits{"google": {Rate: 20}}
		c.MaxWait = 2 * time.Second
	})
	if err := SetRate(ctxT(t), env.state, "a.test", 2, time.Time{}, "ops"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "a.test's pin seen", func() bool {
		d := th.lookDest("a.test")
		if d == nil {
			return false
		}
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.state.RateOverride == 2
	})
	attempt(t, th, "a.test", resDelivered)
	start := time.Now()
	second := make(chan time.Duration, 1)
	go func() {
		p, r := th.Admit(context.Background(), "a.test", "", "")
		if p == nil {
			t.Errorf("a.test's second send refused: %+v", r)
			second <- 0
			return
		}
		second <- time.Since(start)
		p.Done([]classify.Result{resDelivered})
	}()
	eventually(t, 5*time.Second, "a.test's second send waiting for its token", func() bool {
		return ownFlight(th, "a.test") == 1
	})
	attempt(t, th, "b.test", resDelivered)
	if el := time.Since(start); el > 300*time.Millisecond {
		t.Errorf("b.test admitted %v in, behind a.test's pinned turn", el.Round(time.Millisecond))
	}
	if el := <-second; el < 400*time.Millisecond {
		t.Errorf("a.test's second send %v after its first, want the pin's 500 ms", el.Round(time.Millisecond))
	}
}

// prefMX resolves from a map of MX records with their preferences as given.
type prefMX map[string][]*net.MX

func (p prefMX) LookupMX(_ context.Context, name string) ([]*net.MX, error) {
	mxs, ok := p[name]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return mxs, nil
}

// TestGroupBySite: domains whose most preferred MX hosts are the same
// hosts, outside the domains and every provider group, are one
// destination named after the hosts; a domain on its own hosts, a group's
// customer, a null MX and a domain with limits of its own are not.
func TestGroupBySite(t *testing.T) {
	mx := func(host string, pref uint16) *net.MX { return &net.MX{Host: host, Pref: pref} }
	res := prefMX{
		"a.test":      {mx("mx1.hoster.example.", 10)},
		"b.test":      {mx("MX1.Hoster.Example", 10), mx("backup.other.example.", 20)}, // a backup MX does not count
		"c.test":      {mx("mx2.hoster.example.", 10)},
		"pair1.test":  {mx("b.mx.example.", 5), mx("a.mx.example.", 5)},
		"pair2.test":  {mx("a.mx.example.", 10), mx("b.mx.example.", 10), mx("a.mx.example.", 10)},
		"own.test":    {mx("mx.own.test.", 10), mx("own.test.", 10)},
		"mixed.test":  {mx("mx.mixed.test.", 10), mx("mx1.hoster.example.", 10)},
		"gapps.test":  {mx("aspmx.l.google.com.", 10)},
		"null.test":   {mx(".", 0)},
		"hosted.test": {mx("mx1.hoster.example.", 10)},
	}
	g := newGrouper(true, true, DefaultGroups(), map[string]Limits{"hosted.test": {Rate: 1}}, res)
	ctx := context.Background()
	for domain, want := range map[string]string{
		"a.test":       "mx:mx1.hoster.example",
		"B.Test.":      "mx:mx1.hoster.example",
		"c.test":       "mx:mx2.hoster.example",
		"pair1.test":   "mx:a.mx.example+b.mx.example",
		"pair2.test":   "mx:a.mx.example+b.mx.example",
		"own.test":     "own.test",
		"mixed.test":   "mx:mx.mixed.test+mx1.hoster.example",
		"gapps.test":   "google",
		"null.test":    "null.test",
		"hosted.test":  "hosted.test",
		"missing.test": "missing.test",
	} {
		if got := g.group(ctx, domain); got != want {
			t.Errorf("group(%q) = %q, want %q", domain, got, want)
		}
	}
	if !g.isGroup("mx:mx1.hoster.example") || g.isGroup("a.test") {
		t.Error("isGroup does not tell a site from a domain")
	}

	noGroups := newGrouper(true, true, nil, nil, res) // default-groups = false, no [[groups]]
	if got := noGroups.group(ctx, "a.test"); got != "mx:mx1.hoster.example" {
		t.Errorf("without provider groups: %q", got)
	}
	off := newGrouper(true, false, DefaultGroups(), nil, res)
	if got := off.group(ctx, "a.test"); got != "a.test" {
		t.Errorf("group-by-site off: %q", got)
	}
}

// TestSiteNameBounded: a site of many hosts has a name of bounded length,
// the same whatever order DNS gives them in.
func TestSiteNameBounded(t *testing.T) {
	var hosts []string
	for i := 0; i < 40; i++ {
		hosts = append(hosts, fmt.Sprintf("mx%02d.a-rather-long-hosting-company-name.example.", i))
	}
	a := siteName("d.test", hosts)
	slices.Reverse(hosts)
	b := siteName("d.test", hosts)
	if a != b || len(a) > siteMaxLen || !strings.HasPrefix(a, "mx:mx00.") {
		t.Fatalf("names %q and %q (%d octets)", a, b, len(a))
	}
}

// TestThrottleSitesShareOneBudget: a throttle met by one domain of a site
// slows the site, which every other domain on its hosts is delivered by.
func TestThrottleSitesShareOneBudget(t *testing.T) {
	env := startKV(t)
	res := prefMX{
		"a.test": {&net.MX{Host: "mx.hoster.example.", Pref: 10}},
		"b.test": {&net.MX{Host: "mx.hoster.example.", Pref: 10}},
	}
	th := newThrottle(t, env, "a", func(c *Config) {
		c.GroupByMX, c.GroupBySite, c.Groups, c.Resolver = true, true, DefaultGroups(), res
		c.Overrides = map[string]Limits{"mx:mx.hoster.example": {Rate: 100}}
	})
	if a, b := th.Group("a.test"), th.Group("b.test"); a != "mx:mx.hoster.example" || b != a {
		t.Fatalf("Group: a.test %q, b.test %q", a, b)
	}
	attempt(t, th, "a.test", resThrottled)
	if s := th.Snapshot("mx:mx.hoster.example"); s.FleetRate != 50 {
		t.Fatalf("site rate %v after a throttle on a.test", s.FleetRate)
	}
	if !th.Recovers("mx:mx.hoster.example", "b.test") {
		t.Error("the site's recovery does not release b.test's mail")
	}
}
