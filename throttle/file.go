package throttle

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
)

// File is the throttling part of outflow's TOML config file, in
// the shape docs/throttling.md documents:
//
//	[throttle]                 # optional knobs (Settings)
//	[destinations.default]     # limits of every destination
//	[destinations."gmail.com"] # a domain's (or group's) own limits
//	[[groups]]                 # provider groups by MX suffix
//	[[automation]]             # reply -> action rules
//
// Decode the file into it with toml.Decode and call Config. The runtime
// fields of Config (WorkerID, buckets, resolver, callbacks,
// logger, registerer) are the caller's to fill.
type File struct {
	Throttle     Settings              `toml:"throttle"`     // [throttle]: knobs
	Destinations map[string]LimitsFile `toml:"destinations"` // [destinations.X]: "default", a domain or a group
	Groups       []GroupRule           `toml:"groups"`       // [[groups]]
	Automation   []AutoRule            `toml:"automation"`   // [[automation]]
}

// Settings are the [throttle] knobs; zero values take the
// Config defaults, the Default constants, which docs/configuration.md
// gives (TestThrottleKeyDefaultsDocumented holds it to them).
type Settings struct {
	// GroupByMX turns provider groups on. Unset: on when the file has
	// [[groups]], off otherwise.
	GroupByMX *bool `toml:"group-by-mx"`
	// GroupBySite, with group-by-mx, makes domains on the same MX hosts
	// outside every group one destination, their MX site. Default true.
	GroupBySite *bool `toml:"group-by-site"`
	// DefaultGroups adds DefaultGroups() after the file's own groups (a
	// file group with the same name replaces the built-in one). Default true.
	DefaultGroups   *bool         `toml:"default-groups"`
	BreakerFailures int           `toml:"breaker-failures"`  // default DefaultBreakerFailures
	BreakerCooldown time.Duration `toml:"breaker-cooldown"`  // default DefaultBreakerCooldown
	SourceBlockHold time.Duration `toml:"source-block-hold"` // default DefaultSourceBlockHold
	MaxWait         time.Duration `toml:"max-wait"`          // default DefaultMaxWait
	DecreaseFactor  float64       `toml:"decrease-factor"`   // default DefaultDecreaseFactor
	DecreaseFor     time.Duration `toml:"decrease-for"`      // default DefaultDecreaseFor
	IncreaseStep    float64       `toml:"increase-step"`     // default DefaultIncreaseStep
	IncreaseEvery   time.Duration `toml:"increase-every"`    // default DefaultIncreaseEvery
	MinFactor       float64       `toml:"min-factor"`        // default DefaultMinFactor

	// Learn turns learned limits on for destinations without a
	// configured rate. Default true.
	Learn       *bool         `toml:"learn"`
	LearnWindow time.Duration `toml:"learn-window"` // default DefaultLearnWindow
	LearnHold   time.Duration `toml:"learn-hold"`   // default DefaultLearnHold
	LearnEvery  time.Duration `toml:"learn-every"`  // default DefaultLearnEvery
	LearnStep   float64       `toml:"learn-step"`   // default DefaultLearnStep
	LearnForget time.Duration `toml:"learn-forget"` // default DefaultLearnForget
	LearnMin    float64       `toml:"learn-min"`    // default DefaultLearnMin (msgs/s)
	// LearnInitial is the fleet's attempts in flight to a destination
	// with no rate yet (first contact); default DefaultLearnInitial, -1
	// for no limit.
	LearnInitial int `toml:"learn-initial"`
	// TenantWeights weigh tenants' shares of a busy destination's rate;
	// unlisted tenants weigh 1.
	TenantWeights map[string]float64 `toml:"tenant-weights"`
}

// LimitsFile is one [destinations.X] table. A key left out inherits
// [destinations.default] (whose own left-out keys mean unlimited).
type LimitsFile struct {
	Rate           *float64 `toml:"rate"`              // messages per second, fleet-wide; 0 = unlimited
	Conns          *int     `toml:"conns"`             // concurrent connections, fleet-wide; 0 = unlimited
	MaxMsgsPerConn *int     `toml:"max-msgs-per-conn"` // messages per connection; 0 = no limit
}

// DefaultDestination is the [destinations.X] name of the defaults.
const DefaultDestination = "default"

// Config validates the file and returns the Config it describes.
// Errors name the destination, group or rule at fault.
func (f File) Config() (Config, error) { return f.ConfigWith(Limits{}) }

// ConfigWith is Config with defaults given outside the file (serve's
// --dest-rate and --dest-conns): their non-zero fields replace the
// [destinations.default] table's before the other destinations' tables
// inherit from it, so a destination tuned for its connections still gets
// the default rate.
func (f File) ConfigWith(defaults Limits) (Config, error) {
	var c Config
	s := f.Throttle
	c.BreakerFailures, c.BreakerCooldown, c.MaxWait = s.BreakerFailures, s.BreakerCooldown, s.MaxWait
	c.SourceBlockHold = s.SourceBlockHold
	c.DecreaseFactor, c.DecreaseFor = s.DecreaseFactor, s.DecreaseFor
	c.IncreaseStep, c.IncreaseEvery, c.MinFactor = s.IncreaseStep, s.IncreaseEvery, s.MinFactor
	c.NoLearn = s.Learn != nil && !*s.Learn
	c.LearnWindow, c.LearnHold, c.LearnEvery, c.LearnForget = s.LearnWindow, s.LearnHold, s.LearnEvery, s.LearnForget
	c.LearnStep, c.LearnMin, c.TenantWeights = s.LearnStep, s.LearnMin, s.TenantWeights
	c.LearnInitial = s.LearnInitial
	switch {
	case s.LearnWindow < 0, s.LearnHold < 0, s.LearnEvery < 0, s.LearnForget < 0:
		return c, fmt.Errorf("throttle: learn-window, learn-hold, learn-every and learn-forget must be > 0")
	case s.LearnStep < 0 || s.LearnStep > 1:
		return c, fmt.Errorf("throttle: learn-step %v: want 0 < step <= 1", s.LearnStep)
	case s.LearnMin < 0:
		return c, fmt.Errorf("throttle: learn-min %v: want > 0", s.LearnMin)
	case s.LearnInitial < -1:
		return c, fmt.Errorf("throttle: learn-initial %d: want >= 1, or -1 for no first-contact window", s.LearnInitial)
	case s.BreakerFailures < 0:
		return c, fmt.Errorf("throttle: breaker-failures %d: want >= 1", s.BreakerFailures)
	case s.MaxWait < 0:
		return c, fmt.Errorf("throttle: max-wait %v: want > 0", s.MaxWait)
	case s.BreakerCooldown < 0, s.SourceBlockHold < 0, s.DecreaseFor < 0, s.IncreaseEvery < 0:
		return c, fmt.Errorf("throttle: durations must be > 0")
	case s.DecreaseFactor != 0 && !(s.DecreaseFactor > 0 && s.DecreaseFactor < 1):
		return c, fmt.Errorf("throttle: decrease-factor %v: want 0 < f < 1", s.DecreaseFactor)
	case s.IncreaseStep < 0 || s.IncreaseStep > 1:
		return c, fmt.Errorf("throttle: increase-step %v: want 0 < step <= 1", s.IncreaseStep)
	case s.MinFactor != 0 && !(s.MinFactor > 0 && s.MinFactor <= 1):
		return c, fmt.Errorf("throttle: min-factor %v: want 0 < f <= 1", s.MinFactor)
	}

	def, err := mergeLimits(Limits{}, DefaultDestination, f.Destinations[DefaultDestination])
	if err != nil {
		return c, err
	}
	if defaults.Rate > 0 {
		def.Rate = defaults.Rate
	}
	if defaults.Conns > 0 {
		def.Conns = defaults.Conns
	}
	c.Defaults = def
	names := make([]string, 0, len(f.Destinations))
	for name := range f.Destinations {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == DefaultDestination {
			continue
		}
		d := NormalizeDest(name)
		if d == "" {
			return c, fmt.Errorf("destinations: empty destination name")
		}
		l, err := mergeLimits(def, name, f.Destinations[name])
		if err != nil {
			return c, err
		}
		if c.Overrides == nil {
			c.Overrides = map[string]Limits{}
		}
		if _, dup := c.Overrides[d]; dup {
			return c, fmt.Errorf("destinations.%q: given twice (names are case-insensitive)", name)
		}
		c.Overrides[d] = l
	}

	seen := map[string]bool{}
	for i, g := range f.Groups {
		// A group's name is matched as destinations are (lower case: its
		// [destinations.X] table, `dest` commands, the queue's --dest),
		// and is told from a domain by having no dot.
		g.Name = strings.ToLower(strings.TrimSpace(g.Name))
		if g.Name == "" {
			return c, fmt.Errorf("groups #%d: no name", i+1)
		}
		if strings.ContainsAny(g.Name, ".@ \t,;*>") {
			return c, fmt.Errorf("group %q: a group's name has no dot (it would read as a domain), @, space or wildcard", g.Name)
		}
		if seen[g.Name] {
			return c, fmt.Errorf("group %q: defined twice", g.Name)
		}
		seen[g.Name] = true
		if len(g.MXSuffixes) == 0 && len(g.Domains) == 0 {
			return c, fmt.Errorf("group %q: needs mx-suffixes or domains", g.Name)
		}
		for _, sfx := range g.MXSuffixes {
			if strings.Trim(strings.TrimSpace(sfx), ".") == "" {
				return c, fmt.Errorf("group %q: empty mx suffix", g.Name)
			}
		}
		c.Groups = append(c.Groups, g)
	}
	if s.DefaultGroups == nil || *s.DefaultGroups {
		for _, g := range DefaultGroups() {
			if !seen[g.Name] {
				c.Groups = append(c.Groups, g)
			}
		}
	}
	c.GroupByMX = len(f.Groups) > 0
	if s.GroupByMX != nil {
		c.GroupByMX = *s.GroupByMX
	}
	c.GroupBySite = s.GroupBySite == nil || *s.GroupBySite

	for tenant, w := range s.TenantWeights {
		if !(w > 0) || math.IsInf(w, 0) {
			return c, fmt.Errorf("throttle: tenant-weights.%q = %v: want > 0", tenant, w)
		}
	}
	if _, err := compileAutoRules(f.Automation, nil); err != nil {
		return c, err
	}
	c.Automation = append([]AutoRule(nil), f.Automation...)
	return c, nil
}

// merge fills the keys f sets over base; name is for errors.
func mergeLimits(base Limits, name string, f LimitsFile) (Limits, error) {
	l := base
	if f.Rate != nil {
		if *f.Rate < 0 || math.IsNaN(*f.Rate) || math.IsInf(*f.Rate, 0) {
			return l, fmt.Errorf("destinations.%q: rate %v: want >= 0 (0 = unlimited)", name, *f.Rate)
		}
		l.Rate = *f.Rate
	}
	if f.Conns != nil {
		if *f.Conns < 0 {
			return l, fmt.Errorf("destinations.%q: conns %d: want >= 0 (0 = unlimited)", name, *f.Conns)
		}
		l.Conns = *f.Conns
	}
	if f.MaxMsgsPerConn != nil {
		if *f.MaxMsgsPerConn < 0 {
			return l, fmt.Errorf("destinations.%q: max-msgs-per-conn %d: want >= 0 (0 = no limit)", name, *f.MaxMsgsPerConn)
		}
		l.MaxMsgsPerConn = *f.MaxMsgsPerConn
	}
	return l, nil
}
