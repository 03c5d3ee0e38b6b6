package throttle

import (
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/classify"
	"github.com/outflow/outflow/internal/editdist"
)

// Automation actions (AutoRule.Action).
const (
	ActionSuspend = "suspend" // suspend the destination for For
	ActionRate    = "rate"    // fleet rate override of Value messages/s for For
	ActionFactor  = "factor"  // cut the rate factor to Value (0 < Value <= 1) for For
	ActionConns   = "conns"   // fleet connection limit of Value for For
)

// AutoRule turns replies into an action on their destination: when
// Threshold attempts to one destination, within Window, got a result that
// matches (every condition set must hold: Rule, Class, Pattern), the action
// is applied for For through the shared state, so every worker follows it.
// It does not fire again while its action is in force.
//
// Matches are counted per worker, at most one per attempt (a reply repeated
// for every recipient of a message counts once), and never for outflow's
// own signals (classify rule "local", refusals, open breakers).
type AutoRule struct {
	Name string `toml:"name"` // for logs and errors; required, unique
	// Pattern is a regular expression (RE2) searched in the reply line as
	// logged: "421 4.7.28 text…" (code and enhanced code when present,
	// then the text). Optional.
	Pattern string `toml:"pattern"`
	// Rule is a classify rule name, or a prefix of one ("gmail-" matches
	// "gmail-rate-4.7.28"). Optional.
	Rule string `toml:"rule"`
	// Class is a reply class name (transient, throttled, …). Optional.
	Class string `toml:"class"`
	// Threshold is the number of matching attempts within Window that
	// fires the rule. Default 1.
	Threshold int `toml:"threshold"`
	// Window is the sliding window the matches are counted in. Default 1m.
	Window time.Duration `toml:"window"`
	// Action is "suspend", "rate", "factor" or "conns".
	Action string `toml:"action"`
	// Value is the action's argument: messages/s for "rate", a factor in
	// (0, 1] for "factor", connections for "conns"; unused by "suspend".
	Value float64 `toml:"value"`
	// For is how long the action lasts. Required.
	For time.Duration `toml:"for"`
	// WholeDestination makes a reply scoped to one tenant (classify scope
	// tenant: Gmail's 4.7.26 for one tenant's unauthenticated mail, a
	// sending quota) act on the whole destination, every tenant's mail,
	// as any other reply does. Without it such a reply acts on that
	// tenant's part only: a suspend suspends that tenant's mail to the
	// destination (DestState.Tenants), and a rate, factor or conns, which
	// has no part of one tenant, is not counted for it.
	WholeDestination bool `toml:"whole-destination"`
}

// defaultAutoWindow is AutoRule.Window when unset.
const defaultAutoWindow = time.Minute

// autoRule is a validated AutoRule.
type autoRule struct {
	AutoRule
	re    *regexp.Regexp
	class classify.Class // 0: any
	// key is the rule's key in DestState.Rules: its name and a hash of
	// its definition (ruleKey).
	key string
}

// ruleKey is r's key in DestState.Rules: "NAME#" and 8 hex digits of a hash
// of what the rule matches and does (defaults filled), so that a rule
// edited under the same name is another rule there, not held by its old
// version's end.
func ruleKey(r AutoRule) string {
	h := fnv.New32a()
	fmt.Fprintf(h, "%q|%q|%q|%d|%d|%q|%g|%d|%t", r.Pattern, r.Rule, r.Class, r.Threshold, r.Window, r.Action, r.Value, r.For, r.WholeDestination)
	return fmt.Sprintf("%s#%08x", r.Name, h.Sum32())
}

// CheckAutomation validates c's automation rules against c's
// ClassifyRules as New does, for serve to refuse a bad rule at start
// before it opens anything; an error names the offending rule.
func (c Config) CheckAutomation() error {
	_, err := compileAutoRules(c.Automation, c.ClassifyRules)
	return err
}

// compileAutoRules validates rules; an error names the offending rule.
// known, when not nil, are the classify rules replies can be given (name
// to the scope the rule declares, 0 for one derived from the reply):
// a rule's Rule must then be the start of one of them (checkRuleName).
func compileAutoRules(rules []AutoRule, known map[string]classify.Scope) ([]autoRule, error) {
	out := make([]autoRule, 0, len(rules))
	seen := map[string]bool{}
	for i, r := range rules {
		name := r.Name
		if name == "" {
			return nil, fmt.Errorf("automation rule #%d: no name", i+1)
		}
		if seen[name] {
			return nil, fmt.Errorf("automation rule %q: duplicate name", name)
		}
		seen[name] = true
		ar := autoRule{AutoRule: r}
		if r.Pattern == "" && r.Rule == "" && r.Class == "" {
			return nil, fmt.Errorf("automation rule %q: needs a pattern, a rule or a class to match", name)
		}
		if r.Pattern != "" {
			re, err := regexp.Compile(r.Pattern)
			if err != nil {
				return nil, fmt.Errorf("automation rule %q: pattern: %w", name, err)
			}
			ar.re = re
		}
		if err := checkRuleName(r, known); err != nil {
			return nil, err
		}
		if r.Class != "" {
			if err := ar.class.UnmarshalText([]byte(r.Class)); err != nil {
				return nil, fmt.Errorf("automation rule %q: class: %w", name, err)
			}
		}
		if r.Threshold < 0 {
			return nil, fmt.Errorf("automation rule %q: threshold %d: want >= 1", name, r.Threshold)
		}
		if ar.Threshold == 0 {
			ar.Threshold = 1
		}
		if r.Window < 0 {
			return nil, fmt.Errorf("automation rule %q: window %s: want > 0", name, r.Window)
		}
		if ar.Window == 0 {
			ar.Window = defaultAutoWindow
		}
		if r.For <= 0 {
			return nil, fmt.Errorf("automation rule %q: for: want a duration > 0", name)
		}
		switch r.Action {
		case ActionSuspend:
		case ActionRate:
			if !(r.Value > 0) {
				return nil, fmt.Errorf("automation rule %q: action rate needs value > 0 (messages per second)", name)
			}
		case ActionFactor:
			if !(r.Value > 0 && r.Value <= 1) {
				return nil, fmt.Errorf("automation rule %q: action factor needs 0 < value <= 1", name)
			}
		case ActionConns:
			if !(r.Value >= 1) || r.Value != float64(int(r.Value)) {
				return nil, fmt.Errorf("automation rule %q: action conns needs a whole value >= 1", name)
			}
		case "":
			return nil, fmt.Errorf("automation rule %q: no action", name)
		default:
			return nil, fmt.Errorf("automation rule %q: unknown action %q (want suspend, rate, factor or conns)", name, r.Action)
		}
		if err := checkRuleScope(r, known); err != nil {
			return nil, err
		}
		ar.key = ruleKey(ar.AutoRule)
		out = append(out, ar)
	}
	return out, nil
}

// builtinRules are the rule names a result can carry beside the rules
// files': no rule matched, the token layer decided.
var builtinRules = []string{"no-rule", classify.TokenRule}

// knownMatches are the names in known that a rule's Rule matches: those
// it starts, and the one it names with a suffix the worker adds after a
// "/" ("rfc3463-permanent/soft-bounce").
func knownMatches(rule string, known map[string]classify.Scope) []string {
	var out []string
	for name := range known {
		if strings.HasPrefix(name, rule) || strings.HasPrefix(rule, name+"/") {
			out = append(out, name)
		}
	}
	for _, name := range builtinRules {
		if _, dup := known[name]; !dup && strings.HasPrefix(name, rule) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// checkRuleName refuses a rule whose Rule can never match: outflow's own
// signals ("local…"), which never feed automation, and, when the known
// classify rules are given, a Rule that is the start of none of them (a
// typo, "gmial-auth", was accepted and never fired). The error names the
// nearest known names.
func checkRuleName(r AutoRule, known map[string]classify.Scope) error {
	if r.Rule == "" {
		return nil
	}
	if strings.HasPrefix(r.Rule, "local") {
		return fmt.Errorf("automation rule %q: rule %q: outflow's own signals (local suspensions, refusals, open breakers) never feed automation", r.Name, r.Rule)
	}
	if known == nil || len(knownMatches(r.Rule, known)) > 0 {
		return nil
	}
	msg := fmt.Sprintf("automation rule %q: rule %q is the start of no classify rule (embedded or in classify-rules), so it would never fire", r.Name, r.Rule)
	if near := nearestNames(r.Rule, known, 3); len(near) > 0 {
		msg += "; did you mean " + strings.Join(near, ", ") + "?"
	}
	return errors.New(msg)
}

// checkRuleScope refuses, when the known classify rules are given, a rate,
// factor or conns rule whose Rule matches only rules scoped to the tenant,
// without WholeDestination: such a reply is about one tenant's mail, and
// those actions have no part of one tenant, so the rule would never act.
// And WholeDestination on a rule whose Rule matches no tenant-scoped rule,
// where it means nothing (a rule meant for another reply, most likely).
func checkRuleScope(r AutoRule, known map[string]classify.Scope) error {
	if r.Rule == "" || known == nil {
		return nil
	}
	names := knownMatches(r.Rule, known)
	tenant := 0
	for _, n := range names {
		if known[n] == classify.ScopeTenant {
			tenant++
		}
	}
	switch {
	case len(names) > 0 && tenant == len(names) && r.Action != ActionSuspend && !r.WholeDestination:
		return fmt.Errorf("automation rule %q: rule %q matches only classify rules scoped to the tenant (%s): such a reply is about one tenant's mail, and action %s would slow every tenant, so it is not applied for it and the rule would never act; use action = \"suspend\" (that tenant's mail to the destination only) or, to act on every tenant's mail, whole-destination = true",
			r.Name, r.Rule, strings.Join(names, ", "), r.Action)
	case r.WholeDestination && tenant == 0:
		return fmt.Errorf("automation rule %q: whole-destination is for replies scoped to one tenant, and rule %q matches none (%s)", r.Name, r.Rule, strings.Join(names, ", "))
	}
	return nil
}

// nearestNames are up to n known names (and built-in ones) nearest to s by
// edit distance, each name compared whole and cut to s's length (s may be
// a prefix), nearest first; none further than half of s's length.
func nearestNames(s string, known map[string]classify.Scope, n int) []string {
	type cand struct {
		name string
		d    int
	}
	var cands []cand
	add := func(name string) {
		d := editdist.Distance(s, name)
		if len(name) > len(s) {
			d = min(d, editdist.Distance(s, name[:len(s)]))
		}
		if d <= max(2, len(s)/2) {
			cands = append(cands, cand{name, d})
		}
	}
	for name := range known {
		add(name)
	}
	for _, name := range builtinRules {
		if _, dup := known[name]; !dup {
			add(name)
		}
	}
	slices.SortFunc(cands, func(a, b cand) int {
		if a.d != b.d {
			return a.d - b.d
		}
		return strings.Compare(a.name, b.name)
	})
	var out []string
	for i := 0; i < len(cands) && i < n; i++ {
		out = append(out, strconv.Quote(cands[i].name))
	}
	return out
}

// isLocal reports whether a result is outflow's own signal (a local
// suspension, a breaker rejection): classify's rule "local" for
// EventLocal, and the worker's "local-<reason>" refusal rules. Such
// results never feed automation, breakers or the adaptive rate.
func isLocal(r classify.Result) bool {
	return strings.HasPrefix(r.Rule, "local")
}

// match reports whether a result matches the rule's conditions.
func (r *autoRule) match(res classify.Result) bool {
	if isLocal(res) {
		return false
	}
	if r.Rule != "" && !strings.HasPrefix(res.Rule, r.Rule) {
		return false
	}
	if r.class != 0 && res.Class != r.class {
		return false
	}
	if r.re != nil && !r.re.MatchString(replyText(res)) {
		return false
	}
	return true
}

// replyText is the reply line a pattern is matched against:
// "421 4.7.28 text", without the parts that are absent.
func replyText(r classify.Result) string {
	if r.Code == 0 && r.Enhanced == "" {
		return r.Text
	}
	var b strings.Builder
	if r.Code != 0 {
		b.WriteString(strconv.Itoa(r.Code))
		b.WriteByte(' ')
	}
	if r.Enhanced != "" {
		b.WriteString(r.Enhanced)
		b.WriteByte(' ')
	}
	b.WriteString(r.Text)
	return b.String()
}

// window counts matches of one rule for one destination: a ring of the
// last Threshold match times; the rule fires when the oldest of them is
// within Window of the newest.
type window struct {
	times []time.Time
	next  int
	n     int
	// activeUntil: the rule's action is in force until then (this worker's
	// view); it does not fire again before.
	activeUntil time.Time
	// idleLogged: a firing that changed nothing was logged at Info since
	// the rule last acted (the next are logged at Debug).
	idleLogged bool
}

// tenantKey is a window of one rule for one tenant's part of a
// destination (dest.autoTenant).
type tenantKey struct {
	rule   int
	tenant string
}

// tenantWindow is rule's window for tenant's part of d; d.mu held.
func (d *dest) tenantWindow(rule int, tenant string) *window {
	k := tenantKey{rule, tenant}
	if w := d.autoTenant[k]; w != nil {
		return w
	}
	if d.autoTenant == nil {
		d.autoTenant = map[tenantKey]*window{}
	}
	w := &window{}
	d.autoTenant[k] = w
	return w
}

// add records a match at now and reports whether the rule fires.
func (w *window) add(now time.Time, threshold int, span time.Duration) bool {
	if now.Before(w.activeUntil) {
		return false
	}
	if len(w.times) != threshold {
		w.times, w.next, w.n = make([]time.Time, threshold), 0, 0
	}
	w.times[w.next] = now
	w.next = (w.next + 1) % threshold
	if w.n < threshold {
		w.n++
	}
	if w.n < threshold {
		return false
	}
	oldest := w.times[w.next] // the ring is full: next is the oldest
	if now.Sub(oldest) > span {
		return false
	}
	w.n = 0 // start counting afresh after firing
	return true
}
