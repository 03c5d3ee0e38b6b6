package throttle

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/outflow/outflow/internal/testutil"
)

const exampleThrottleTOML = `
[throttle]
breaker-failures = 5
breaker-cooldown = "45s"
decrease-for = "2m"

[destinations.default]
rate = 20
conns = 10
max-msgs-per-conn = 100

[destinations."gmail.com"]
rate = 5

[destinations.google]
rate = 50
conns = 40

[[groups]]
name = "mailhost"
mx-suffixes = [".mx.mailhost.example"]

[[automation]]
name = "gmail-unusual-rate"
rule = "gmail-rate"
threshold = 3
window = "1m"
action = "suspend"
for = "15m"

[[automation]]
name = "too-many-connections"
pattern = '(?i)too many (connections|concurrent)'
class = "transient"
threshold = 5
window = "30s"
action = "conns"
value = 2
for = "10m"
`

func TestThrottleFileConfig(t *testing.T) {
	var f File
	md, err := toml.Decode(exampleThrottleTOML, &f)
	if err != nil {
		t.Fatal(err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("undecoded keys: %v", und)
	}
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.Defaults != (Limits{Rate: 20, Conns: 10, MaxMsgsPerConn: 100}) {
		t.Errorf("defaults %+v", c.Defaults)
	}
	if got := c.Overrides["gmail.com"]; got != (Limits{Rate: 5, Conns: 10, MaxMsgsPerConn: 100}) {
		t.Errorf("gmail.com inherits unset keys: %+v", got)
	}
	if got := c.Overrides["google"]; got != (Limits{Rate: 50, Conns: 40, MaxMsgsPerConn: 100}) {
		t.Errorf("google %+v", got)
	}
	if !c.GroupByMX || c.Groups[0].Name != "mailhost" || len(c.Groups) != 1+len(DefaultGroups()) {
		t.Errorf("groups: by MX %v, %+v", c.GroupByMX, c.Groups)
	}
	if c.BreakerFailures != 5 || c.BreakerCooldown != 45*time.Second || c.DecreaseFor != 2*time.Minute {
		t.Errorf("settings: %+v", c)
	}
	if len(c.Automation) != 2 || c.Automation[0].Window != time.Minute || c.Automation[0].For != 15*time.Minute || c.Automation[1].Value != 2 {
		t.Errorf("automation %+v", c.Automation)
	}
}

func TestThrottleFileErrors(t *testing.T) {
	for _, c := range []struct {
		toml, want string
	}{
		{"[[automation]]\nname = \"bad\"\npattern = \"(\"\naction = \"suspend\"\nfor = \"1m\"\n", `automation rule "bad": pattern`},
		{"[[automation]]\nname = \"odd\"\nrule = \"x\"\naction = \"reboot\"\nfor = \"1m\"\n", `automation rule "odd": unknown action "reboot"`},
		{"[destinations.\"x.test\"]\nrate = -1\n", `destinations."x.test": rate`},
		{"[[groups]]\nname = \"g\"\n", `group "g": needs mx-suffixes`},
		{"[[groups]]\nname = \"big.co\"\nmx-suffixes = [\"mx.bigco.example\"]\n", `group "big.co": a group's name has no dot`},
		{"[throttle]\ndecrease-factor = 1.5\n", `decrease-factor`},
	} {
		var f File
		if _, err := toml.Decode(c.toml, &f); err != nil {
			t.Fatalf("%q: %v", c.toml, err)
		}
		_, err := f.Config()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.toml, err, c.want)
		}
	}
}

// TestDocsExampleParses keeps docs/throttling.md's example valid.
func TestDocsExampleParses(t *testing.T) {
	b, err := os.ReadFile("../docs/throttling.md")
	if err != nil {
		t.Skip("docs not present:", err)
	}
	m := regexp.MustCompile("(?s)```toml\n(.*?)```").FindAllSubmatch(b, -1)
	if len(m) == 0 {
		t.Fatal("no toml example in docs/throttling.md")
	}
	for _, ex := range m {
		var f File
		md, err := toml.Decode(string(ex[1]), &f)
		if err != nil {
			t.Fatalf("docs example: %v\n%s", err, ex[1])
		}
		if und := md.Undecoded(); len(und) > 0 {
			t.Fatalf("docs example has unknown keys %v", und)
		}
		if _, err := f.Config(); err != nil {
			t.Fatalf("docs example: %v", err)
		}
	}
}

// TestThrottleKeyDefaultsDocumented: every `key = value` that
// docs/configuration.md gives as a [throttle] key's default is the
// default: a file that sets it to that value configures exactly what a
// file without it does.
func TestThrottleKeyDefaultsDocumented(t *testing.T) {
	sec := testutil.DocSection(t, "../docs/configuration.md", "`[throttle]` keys and defaults:", "\n\n")
	withDefaults := func(toml string) Config {
		t.Helper()
		f := decodeFile(t, toml)
		c, err := f.Config()
		if err != nil {
			t.Fatalf("%q: %v", toml, err)
		}
		c.State = struct{ jetstream.KeyValue }{} // withDefaults wants a bucket; none is used
		if c, err = c.withDefaults(); err != nil {
			t.Fatalf("%q: %v", toml, err)
		}
		c.Now = nil
		return c
	}
	unset := withDefaults("")
	pairs := regexp.MustCompile("`([a-z-]+) =\\s+([^`{]+)`").FindAllStringSubmatch(sec, -1)
	for _, p := range pairs {
		set := "[throttle]\n" + p[1] + " = " + strings.TrimSpace(p[2]) + "\n"
		if got := withDefaults(set); !reflect.DeepEqual(got, unset) {
			t.Errorf("docs/configuration.md: %s = %s is not the default", p[1], p[2])
		}
	}
	if len(pairs) < 15 {
		t.Errorf("only %d documented [throttle] defaults compared; has the paragraph's layout changed?", len(pairs))
	}
}

func decodeFile(t *testing.T, s string) File {
	t.Helper()
	var f File
	md, err := toml.Decode(s, &f)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	if und := md.Undecoded(); len(und) > 0 {
		t.Fatalf("%q: unknown keys %v", s, und)
	}
	return f
}

// TestThrottleFileDefaultsFromFlags: --dest-rate and --dest-conns are
// inherited by a [destinations.X] table that does not set them, as the
// file's own [destinations.default] is; a table that sets one keeps its
// own.
func TestThrottleFileDefaultsFromFlags(t *testing.T) {
	var f File
	if _, err := toml.Decode("[destinations.\"gmail.com\"]\nconns = 5\n\n[destinations.\"yahoo.com\"]\nrate = 2\n", &f); err != nil {
		t.Fatal(err)
	}
	c, err := f.ConfigWith(Limits{Rate: 20, Conns: 8})
	if err != nil {
		t.Fatal(err)
	}
	if g := c.Overrides["gmail.com"]; g.Rate != 20 || g.Conns != 5 {
		t.Errorf("gmail.com %+v, want the default rate 20 and its own 5 connections", g)
	}
	if y := c.Overrides["yahoo.com"]; y.Rate != 2 || y.Conns != 8 {
		t.Errorf("yahoo.com %+v, want its own rate 2 and the default 8 connections", y)
	}
	if c.Defaults.Rate != 20 || c.Defaults.Conns != 8 {
		t.Errorf("defaults %+v", c.Defaults)
	}
}

// TestGroupNamesLowerCase: a group named in capitals is the group its
// [destinations.X] table (whose names are case-insensitive) limits, and
// the name a queue listing matches.
func TestGroupNamesLowerCase(t *testing.T) {
	var f File
	if _, err := toml.Decode(`
[[groups]]
name = "BigCo"
mx-suffixes = ["mx.bigco.example"]

[destinations.BigCo]
rate = 5
`, &f); err != nil {
		t.Fatal(err)
	}
	c, err := f.Config()
	if err != nil {
		t.Fatal(err)
	}
	if c.Groups[0].Name != "bigco" {
		t.Errorf("group name %q, want bigco", c.Groups[0].Name)
	}
	if l, ok := c.Overrides["bigco"]; !ok || l.Rate != 5 {
		t.Errorf("overrides %v: want bigco at 5/s", c.Overrides)
	}
}
