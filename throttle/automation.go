package throttle

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/outflow/outflow/classify"
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
}

// defaultAutoWindow is AutoRule.Window when unset.
const defaultAutoWindow = time.Minute

// autoRule is a validated AutoRule.
type autoRule struct {
	AutoRule
	re    *regexp.Regexp
	class classify.Class // 0: any
}

// compileAutoRules validates rules; an error names the offending rule.
func compileAutoRules(rules []AutoRule) ([]autoRule, error) {
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
		out = append(out, ar)
	}
	return out, nil
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
