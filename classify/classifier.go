package classify

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures New. The zero value gives the embedded rules only.
type Options struct {
	// ExtraRulesFile is the path of an operator's TOML rules file (config
	// key classify-rules; --rules on outflow classify). Its rules are tried
	// before the embedded ones; a rule with the name of an embedded rule
	// replaces it, and its top-level disable list drops embedded rules by
	// name. "" means none.
	ExtraRulesFile string
}

// Classifier classifies replies and transport events with a compiled set of
// rules. It is immutable after New and safe for concurrent use.
type Classifier struct {
	rules    []rule
	byCode   [600][]int32 // reply rules that can match each basic code (index 0: no code), in order
	byEvent  [len(eventNames)][]int32
	idx      textIndex
	words    int      // length of a match set, in uint64 words
	unitMask matchSet // phrases of time units: a text without one has no retry hint
	tokIDs   []uint16 // phrase id of each tokenVocabulary entry
	tokenOn  []bool   // by rule index: the token layer may weigh this rule's result again
}

// unitPhrases are the fragments every retry hint contains ("seconds",
// "5 min", "30s", "1h"); registered in the text index so that the hint
// parser runs only on the few texts that have one.
var unitPhrases = func() []string {
	p := []string{"sec", "min", "hour", "hr", "day"}
	for d := '0'; d <= '9'; d++ {
		p = append(p, string(d)+"s", string(d)+"m", string(d)+"h")
	}
	return p
}()

// rule is one compiled rule. A reply matches when every condition that is
// set holds; a rule with events matches only those transport events.
type rule struct {
	name       string
	line       int
	class      Class
	scope      Scope  // 0: derived from the class and stage (defaultScope)
	stages     uint16 // bit per Stage; 0: any stage
	events     uint16 // bit per Event; 0: replies only
	codes      []codePattern
	enh        []enhPattern // any of; empty: any
	text       []uint16     // phrase ids, any of; empty: no condition
	notText    []uint16     // phrase ids, none of
	textMask   matchSet     // text as a bit set, tested a word at a time
	notMask    matchSet     // notText as a bit set
	re         *regexp.Regexp
	retryAfter time.Duration // hint used when the text gives none
	embedded   bool          // from the embedded rules, not an operator's file
}

// New compiles the embedded rules, preceded by the operator's rules from
// opts.ExtraRulesFile. A rules file that does not parse, names an unknown
// class, scope, stage or event, or has a bad code pattern, phrase, regex or
// duration is refused with a *RulesError that gives its line.
func New(opts Options) (*Classifier, error) {
	files, err := loadRuleFiles(opts.ExtraRulesFile)
	if err != nil {
		return nil, fmt.Errorf("classify: %w", err)
	}
	c := &Classifier{}
	if err := c.compile(files); err != nil {
		return nil, fmt.Errorf("classify: %w", err)
	}
	return c, nil
}

var defaultClassifier = sync.OnceValue(func() *Classifier {
	c, err := New(Options{})
	if err != nil {
		// The embedded rules are tested; this is a build defect.
		panic(err)
	}
	return c
})

// Default returns the classifier with the embedded rules only, compiled on
// first use and shared.
func Default() *Classifier { return defaultClassifier() }

func (c *Classifier) compile(files []*ruleFile) error {
	// Operator rules shadow embedded rules of the same name, and the
	// operator's disable list drops embedded rules.
	drop := map[string]bool{}
	embeddedNames := map[string]bool{}
	for _, rf := range files {
		if strings.HasPrefix(rf.name, "embedded:") {
			for _, s := range rf.rules {
				embeddedNames[s.Name] = true
			}
		}
	}
	for _, rf := range files {
		if strings.HasPrefix(rf.name, "embedded:") {
			continue
		}
		for _, n := range rf.disable {
			if !embeddedNames[n] {
				return &RulesError{File: rf.name, Line: rf.disLine, Reason: fmt.Sprintf("disable names unknown rule %q", n)}
			}
			drop[n] = true
		}
		for _, s := range rf.rules {
			drop[s.Name] = true
		}
	}
	for _, rf := range files {
		embedded := strings.HasPrefix(rf.name, "embedded:")
		seen := map[string]bool{}
		for _, spec := range rf.rules {
			if spec.Name != "" && seen[spec.Name] {
				return &RulesError{File: rf.name, Line: spec.line, Rule: spec.Name, Reason: "duplicate rule name"}
			}
			seen[spec.Name] = true
			if embedded && drop[spec.Name] {
				continue
			}
			r, rerr := compileRule(spec, &c.idx)
			if rerr != nil {
				rerr.File = rf.name
				return rerr
			}
			r.embedded = embedded
			c.rules = append(c.rules, r)
		}
	}
	var units []uint16
	for _, p := range unitPhrases {
		units = append(units, c.idx.add(p))
	}
	for _, tw := range tokenVocabulary {
		c.tokIDs = append(c.tokIDs, c.idx.add(tw.phrase))
	}
	c.tokenOn = make([]bool, len(c.rules))
	for i, r := range c.rules {
		c.tokenOn[i] = r.embedded && tokenFallbacks[r.name]
	}
	c.idx.build()
	c.words = (len(c.idx.phrases) + 63) / 64
	for i := range c.rules {
		r := &c.rules[i]
		r.textMask, r.notMask = c.mask(r.text), c.mask(r.notText)
	}
	c.unitMask = c.mask(units)
	for i := range c.rules {
		r := &c.rules[i]
		if r.events != 0 {
			for ev := range c.byEvent {
				if r.events&(1<<ev) != 0 {
					c.byEvent[ev] = append(c.byEvent[ev], int32(i))
				}
			}
			continue
		}
		for code := range c.byCode {
			if code != 0 && code < 200 {
				continue
			}
			for _, p := range r.codes {
				if p.match(code) {
					c.byCode[code] = append(c.byCode[code], int32(i))
					break
				}
			}
		}
	}
	return nil
}

// Classify says what one reply or transport event means. It does no I/O,
// keeps no state, and for a typical reply does not allocate (a multi-line
// text costs one allocation to join its lines).
//
// An Input with Code 0 and no Event is parsed from Raw (or Text) first; a
// Stage set by the caller wins over one found in the text. A reply
// classifies even when malformed: a missing or invalid enhanced code
// leaves only the basic code and the text, and an unreadable code leaves
// the text (class transient unless a rule recognises it).
func (c *Classifier) Classify(in Input) Result {
	if in.Event == EventNone && in.Code == 0 && (in.Raw != "" || in.Text != "") {
		raw := in.Raw
		if raw == "" {
			raw = in.Text
		}
		p := Parse(raw)
		if in.Stage != StageUnknown {
			p.Stage = in.Stage
		}
		if p.Enhanced == "" && p.Code == 0 && validEnhanced(in.Enhanced) {
			p.Enhanced = in.Enhanced
		}
		in = p
	}
	if in.Event != EventNone {
		return c.classifyEvent(in)
	}
	return c.classifyReply(in)
}

// ClassifyReply parses raw (a reply as received, or a log line holding one)
// and classifies it as a reply at stage.
func (c *Classifier) ClassifyReply(raw string, stage Stage) Result {
	return c.Classify(Input{Raw: raw, Stage: stage})
}

func (c *Classifier) classifyReply(in Input) Result {
	code := in.Code
	if code < 200 || code > 599 {
		code = 0
	}
	enh := in.Enhanced
	if enh != "" && !validEnhanced(enh) {
		enh = ""
	}
	text := in.Text
	// go-smtp and other clients leave the enhanced code in the text when
	// the server did not announce ENHANCEDSTATUSCODES.
	if e, rest := cutEnhanced(text); e != "" && (enh == "" || e == enh) {
		enh, text = e, rest
	}
	if code != 0 && (strings.IndexByte(text, '\n') >= 0 || strings.IndexByte(text, '\r') >= 0) {
		text = joinLines(strconv.Itoa(code), enh, text)
	}
	var ec, es, ed int
	hasEnh := enh != ""
	if hasEnh {
		ec, es, ed = enhancedParts(enh)
	}

	var buf [8]uint64
	var m matchSet
	for _, ri := range c.byCode[code] {
		r := &c.rules[ri]
		if r.stages != 0 && r.stages&(1<<in.Stage) == 0 {
			continue
		}
		if len(r.enh) > 0 && !anyEnh(r.enh, hasEnh, ec, es, ed) {
			continue
		}
		var ok bool
		if m, ok = c.textOK(r, text, m, buf[:]); !ok {
			continue
		}
		if c.tokenOn[ri] {
			if m == nil {
				m = c.matches(text, buf[:])
			}
			if cl, ok := tokenDecide(code, r.class, c.tokenScores(code, m)); ok {
				return c.result(cl, 0, TokenRule, 0, in.Stage, code, enh, text, m)
			}
		}
		return c.result(r.class, r.scope, r.name, r.retryAfter, in.Stage, code, enh, text, m)
	}
	// No rule matched (only when an operator disabled the generic
	// fallbacks): go by the first digit, unknown codes counting as
	// temporary, as maddy does.
	class := Transient
	switch code / 100 {
	case 2:
		class = Delivered
	case 5:
		class = Permanent
	}
	return c.result(class, 0, "no-rule", 0, in.Stage, code, enh, text, m)
}

func (c *Classifier) classifyEvent(in Input) Result {
	text := in.Text
	if text == "" {
		text = in.Event.String()
	}
	if int(in.Event) < len(c.byEvent) {
		var buf [8]uint64
		var m matchSet
		for _, ri := range c.byEvent[in.Event] {
			r := &c.rules[ri]
			if r.stages != 0 && r.stages&(1<<in.Stage) == 0 {
				continue
			}
			var ok bool
			if m, ok = c.textOK(r, text, m, buf[:]); !ok {
				continue
			}
			return c.result(r.class, r.scope, r.name, r.retryAfter, in.Stage, 0, "", text, m)
		}
	}
	// RFC 5321 6.1: with no reply to the final dot the message may have
	// been delivered; that, and only that, is unknown.
	class := Transient
	if in.Stage == StageDataEnd && (in.Event == EventTimeout || in.Event == EventConnLost) {
		class = Unknown
	}
	return c.result(class, 0, "no-rule", 0, in.Stage, 0, "", text, nil)
}

// matches scans text once for every rule phrase. buf avoids an allocation
// when the phrases fit in it.
// textOK reports whether r's phrase and regexp conditions hold for text.
// The phrase matches are computed once per classification, on the first
// rule that needs them (m is nil until then, backed by buf), and returned
// for the next rule; returning rather than taking a pointer keeps them off
// the heap.
func (c *Classifier) textOK(r *rule, text string, m matchSet, buf []uint64) (matchSet, bool) {
	if len(r.text) > 0 || len(r.notText) > 0 {
		if m == nil {
			m = c.matches(text, buf)
		}
		if len(r.text) > 0 && !m.any(r.textMask) || len(r.notText) > 0 && m.any(r.notMask) {
			return m, false
		}
	}
	return m, r.re == nil || r.re.MatchString(text)
}

func (c *Classifier) matches(text string, buf []uint64) matchSet {
	var m matchSet
	if c.words <= len(buf) {
		m = buf[:c.words:c.words]
	} else {
		m = make(matchSet, c.words)
	}
	c.idx.scan(text, m)
	return m
}

// result builds the Result of a matched rule. m is the text's match set if
// it was scanned, or nil; the retry hint is read only for results that
// will be retried, and only when the text names a time unit.
func (c *Classifier) result(class Class, scope Scope, name string, hint time.Duration, stage Stage, code int, enh, text string, m matchSet) Result {
	if scope == 0 {
		scope = defaultScope(class, stage)
	}
	res := Result{Class: class, Scope: scope, Rule: name, Code: code, Enhanced: enh, Text: text}
	if class == Transient || class == Throttled {
		if m == nil || m.any(c.unitMask) {
			if d := retryHint(text); d > 0 {
				hint = d
			}
		}
		res.RetryAfter = hint
	}
	return res
}

// defaultScope is the scope of a rule that names none: a throttle is about
// the destination; otherwise the stage tells what the reply was about.
func defaultScope(class Class, stage Stage) Scope {
	if class == Throttled {
		return ScopeDestination
	}
	switch stage {
	case StageRcpt:
		return ScopeRecipient
	case StageAuth:
		return ScopeTenant
	case StageDNS, StageConnect, StageGreeting, StageEHLO, StageTLS:
		if class == Permanent {
			return ScopeDestination
		}
		return ScopeConnection
	}
	return ScopeMessage
}

func anyEnh(ps []enhPattern, has bool, c, s, d int) bool {
	for _, p := range ps {
		if p.match(has, c, s, d) {
			return true
		}
	}
	return false
}

// mask returns the phrase ids as a bit set of c.words words.
func (c *Classifier) mask(ids []uint16) matchSet {
	m := make(matchSet, c.words)
	for _, id := range ids {
		m[id>>6] |= 1 << (id & 63)
	}
	return m
}
