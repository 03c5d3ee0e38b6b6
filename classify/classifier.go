package classify

import (
	"fmt"
	"math/bits"
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
	byEvent  [len(eventNames)][]int32
	idx      textIndex
	words    int      // length of a match set, in uint64 words
	unitMask matchSet // phrases of time units: a text without one has no retry hint
	tokIDs   []uint16 // phrase id of each tokenVocabulary entry
	tokenOn  []bool   // by rule index: the token layer may weigh this rule's result again

	// Rule sets, a bit per rule in rule order, ruleWords uint64 words
	// each. A reply's candidates are the rules its code, stage and
	// enhanced code allow whose text condition its phrases meet, computed
	// with a few word operations instead of testing every rule in turn;
	// only they are tested for their regexp, in order, and the first one
	// wins, as if every rule had been tried.
	ruleWords  int
	codeRules  []uint64  // [code*ruleWords:]: reply rules that can match the code (0: none readable)
	stageRules []uint64  // [stage*ruleWords:]: rules allowed at the stage; index 16 for any other stage
	noText     []uint64  // rules without a text condition
	phraseText [][]int32 // by phrase id: rules with the phrase in text
	phraseNot  [][]int32 // by phrase id: rules with the phrase in not_text
	enhNone    []uint64  // rules a reply without a valid enhanced code can match
	// enhRules[((class*len(enhSub)+sub)*len(enhDet)+det)*ruleWords:] are
	// the rules an enhanced code can match, with class 0, 1, 2 for 2, 4,
	// 5, and sub and det the group of the code's subject and detail: the
	// values the same patterns' values and ranges contain form one group
	// (enhSubIdx, enhDetIdx; group 0 for a value no pattern names, which
	// only a wildcard matches), and enhSub and enhDet hold one value of
	// each group.
	enhRules  []uint64
	enhSub    []int16
	enhDet    []int16
	enhSubIdx [enhMax + 1]uint8
	enhDetIdx [enhMax + 1]uint8
}

// numCodes bounds the basic codes the rule sets are indexed by; index 0
// stands for a reply without a readable code.
const numCodes = 600

// maxStageBits is the number of stages a rule's stage bits can name; an
// input at a higher stage matches only rules without stages.
const maxStageBits = 16

// unitPhrases are the fragments every retry hint contains ("seconds",
// "5 min", "30s", "1h", and ":2" of a clock, "00:24:59"); registered in the
// text index so that the hint parser runs only on the few texts that have
// one.
var unitPhrases = func() []string {
	p := []string{"sec", "min", "hour", "hr", "day"}
	for d := '0'; d <= '9'; d++ {
		p = append(p, string(d)+"s", string(d)+"m", string(d)+"h")
		if d <= '5' {
			p = append(p, ":"+string(d))
		}
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
	text       []uint16     // phrase ids, any of; empty: no condition (near phrases: their first part; tags without text: their start)
	notText    []uint16     // phrase ids, none of
	plain      []uint16     // the phrases of text without gaps
	also       []uint16     // phrase ids, any of (a second condition on the text)
	near       []nearPhrase // the phrases of text with gaps (checked per candidate)
	tags       []tagPattern // provider codes, any of (checked per candidate)
	textMask   matchSet     // text as a bit set, tested a word at a time
	notMask    matchSet     // notText as a bit set
	plainMask  matchSet     // plain as a bit set
	alsoMask   matchSet     // also as a bit set
	re         *regexp.Regexp
	perCand    bool          // also, near, tags or re: conditions the rule sets leave to each candidate
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
		r.textMask, r.notMask, r.plainMask, r.alsoMask = c.mask(r.text), c.mask(r.notText), c.mask(r.plain), c.mask(r.also)
		r.perCand = len(r.also) > 0 || len(r.near) > 0 || len(r.tags) > 0 || r.re != nil
	}
	c.unitMask = c.mask(units)
	c.compileSets()
	for i := range c.rules {
		r := &c.rules[i]
		for ev := range c.byEvent {
			if r.events&(1<<ev) != 0 {
				c.byEvent[ev] = append(c.byEvent[ev], int32(i))
			}
		}
	}
	return nil
}

// compileSets builds the rule sets classifyReply selects candidates with.
func (c *Classifier) compileSets() {
	rw := (len(c.rules) + 63) / 64
	c.ruleWords = rw
	c.codeRules = make([]uint64, numCodes*rw)
	c.stageRules = make([]uint64, (maxStageBits+1)*rw)
	c.noText = make([]uint64, rw)
	c.phraseText = make([][]int32, len(c.idx.phrases))
	c.phraseNot = make([][]int32, len(c.idx.phrases))
	for i := range c.rules {
		r := &c.rules[i]
		w, bit := i>>6, uint64(1)<<(i&63)
		if r.events == 0 {
			for code := 0; code < numCodes; code++ {
				if code != 0 && code < 200 {
					continue
				}
				for _, p := range r.codes {
					if p.match(code) {
						c.codeRules[code*rw+w] |= bit
						break
					}
				}
			}
		}
		for st := 0; st <= maxStageBits; st++ {
			if r.stages == 0 || st < maxStageBits && r.stages&(1<<st) != 0 {
				c.stageRules[st*rw+w] |= bit
			}
		}
		if len(r.text) == 0 {
			c.noText[w] |= bit
		}
		for _, id := range r.text {
			c.phraseText[id] = append(c.phraseText[id], int32(i))
		}
		for _, id := range r.notText {
			c.phraseNot[id] = append(c.phraseNot[id], int32(i))
		}
	}
	c.compileEnhSets()
}

// enhClasses are the classes of a valid enhanced code (RFC 3463 2).
var enhClasses = [3]int{2, 4, 5}

// compileEnhSets builds the rule sets by enhanced code. Patterns name a few
// subjects and details, or ranges of them; values that every pattern
// treats alike (in the same ranges) behave alike, so the sets are indexed
// by those groups of values (enhValueGroups) rather than by value, and each
// is computed with the rule's own match on one value of its group.
func (c *Classifier) compileEnhSets() {
	rw := c.ruleWords
	var subR, detR [][2]int16
	for _, r := range c.rules {
		for _, p := range r.enh {
			if p.none {
				continue
			}
			subR = append(subR, [2]int16{p.subLo, p.subHi})
			detR = append(detR, [2]int16{p.detLo, p.detHi})
		}
	}
	var okS, okD bool
	c.enhSub, okS = enhValueGroups(subR, &c.enhSubIdx)
	c.enhDet, okD = enhValueGroups(detR, &c.enhDetIdx)
	ns, nd := len(c.enhSub), len(c.enhDet)
	c.enhNone = make([]uint64, rw)
	for i, r := range c.rules {
		if len(r.enh) == 0 || anyEnh(r.enh, false, 0, 0, 0) {
			c.enhNone[i>>6] |= 1 << (i & 63)
		}
	}
	// An operator's file naming hundreds of subjects or details would make
	// the table large; then each candidate's patterns are tested instead.
	if !okS || !okD || ns*nd > maxEnhCells {
		c.enhRules = nil
		return
	}
	c.enhRules = make([]uint64, len(enhClasses)*ns*nd*rw)
	for i, r := range c.rules {
		w, bit := i>>6, uint64(1)<<(i&63)
		for ci, cl := range enhClasses {
			for si, sub := range c.enhSub {
				for di, det := range c.enhDet {
					if len(r.enh) == 0 || anyEnh(r.enh, true, cl, int(sub), int(det)) {
						c.enhRules[((ci*ns+si)*nd+di)*rw+w] |= bit
					}
				}
			}
		}
	}
}

// enhValueGroups groups the values 0-999 of a subject or detail by the
// ranges (of every pattern) that contain them: two values in the same
// ranges are matched by the same patterns. It sets idx[v] to v's group,
// group 0 being the values in no range (only a wildcard matches them), and
// returns one value of each group; ok is false when there are too many
// groups to index with a byte.
func enhValueGroups(ranges [][2]int16, idx *[enhMax + 1]uint8) (reps []int16, ok bool) {
	// Drop the wildcards and duplicates: they do not tell values apart.
	seen := map[[2]int16]bool{}
	var rs [][2]int16
	for _, r := range ranges {
		if r[0] == 0 && r[1] == enhMax || seen[r] {
			continue
		}
		seen[r] = true
		rs = append(rs, r)
	}
	groups := map[string]uint8{"": 0}
	reps = []int16{-1}
	words := (len(rs) + 63) / 64
	key := make([]byte, 8*words)
	for v := int16(0); v <= enhMax; v++ {
		clear(key)
		in := false
		for k, r := range rs {
			if r[0] <= v && v <= r[1] {
				key[k>>3] |= 1 << (k & 7)
				in = true
			}
		}
		if !in {
			idx[v] = 0
			if reps[0] < 0 {
				reps[0] = v
			}
			continue
		}
		g, found := groups[string(key)]
		if !found {
			if len(reps) >= 255 {
				return nil, false
			}
			g = uint8(len(reps))
			groups[string(key)] = g
			reps = append(reps, v)
		}
		idx[v] = g
	}
	if reps[0] < 0 {
		// Every value is in some range; group 0 is never looked up, and a
		// value past the end stands for it.
		reps[0] = enhMax + 1
	}
	return reps, true
}

// maxEnhCells bounds the subject and detail combinations compileEnhSets
// indexes (each a rule set per class).
const maxEnhCells = 4096

// enhSet returns the rules a reply's enhanced code allows, or nil when
// they are not indexed (see compileEnhSets) and each candidate's patterns
// must be tested.
func (c *Classifier) enhSet(f *replyFields) []uint64 {
	if !f.hasEnh {
		return c.enhNone
	}
	if c.enhRules == nil {
		return nil
	}
	ci := 0
	switch f.ec {
	case 4:
		ci = 1
	case 5:
		ci = 2
	}
	si, di := int(c.enhSubIdx[f.es]), int(c.enhDetIdx[f.ed])
	rw := c.ruleWords
	i := ((ci*len(c.enhSub)+si)*len(c.enhDet) + di) * rw
	return c.enhRules[i : i+rw]
}

// firstRule returns the first rule that code, stage and the enhanced
// code's rule set enh (nil: not known) allow, if any.
func (c *Classifier) firstRule(code int, stage Stage, enh []uint64) (int, bool) {
	rw := c.ruleWords
	st := min(int(stage), maxStageBits)
	codeSet := c.codeRules[code*rw : code*rw+rw]
	stageSet := c.stageRules[st*rw : st*rw+rw]
	for w := range rw {
		word := codeSet[w] & stageSet[w]
		if enh != nil {
			word &= enh[w]
		}
		if word != 0 {
			return w<<6 | bits.TrailingZeros64(word), true
		}
	}
	return 0, false
}

// candidates returns, in buf when it is long enough, the reply rules that
// code, stage, the enhanced code's rule set enh (nil: not known) and the
// text's phrases m allow: a rule's codes and stages match, at least one of
// its text phrases occurs (or it has none), and none of its not_text
// phrases does.
func (c *Classifier) candidates(code int, stage Stage, enh []uint64, m matchSet, buf []uint64) []uint64 {
	rw := c.ruleWords
	var cand []uint64
	if rw <= len(buf) {
		cand = buf[:rw:rw]
	} else {
		cand = make([]uint64, rw)
	}
	st := int(stage)
	if st > maxStageBits {
		st = maxStageBits
	}
	codeSet := c.codeRules[code*rw : code*rw+rw]
	stageSet := c.stageRules[st*rw : st*rw+rw]
	for w := range cand {
		cand[w] = codeSet[w] & stageSet[w]
	}
	if enh != nil {
		for w := range cand {
			cand[w] &= enh[w]
		}
	}
	// Text conditions: first the rules that one of the phrases found
	// satisfies, then those a found phrase excludes. The text rules not
	// satisfied are those still clear in sat.
	var satBuf [stackWords]uint64
	var sat []uint64
	if rw <= len(satBuf) {
		sat = satBuf[:rw]
	} else {
		sat = make([]uint64, rw)
	}
	copy(sat, c.noText)
	for w, word := range m {
		for word != 0 {
			id := w<<6 | bits.TrailingZeros64(word)
			word &= word - 1
			for _, ri := range c.phraseText[id] {
				sat[ri>>6] |= 1 << (ri & 63)
			}
			for _, ri := range c.phraseNot[id] {
				cand[ri>>6] &^= 1 << (ri & 63)
			}
		}
	}
	for w := range cand {
		cand[w] &= sat[w]
	}
	return cand
}

// RuleScopes is the name of every rule c knows, the embedded ones and
// those of its rules file, with the scope the rule declares (zero where
// its scope follows from the class and the stage). An automation rule
// names rules by these (throttle checks the names at start: a typo
// matched nothing and never fired).
func (c *Classifier) RuleScopes() map[string]Scope {
	out := make(map[string]Scope, len(c.rules))
	for _, r := range c.rules {
		out[r.name] = r.scope
	}
	return out
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
	in = parsed(in)
	if in.Event != EventNone {
		return c.classifyEvent(in)
	}
	return c.classifyReply(in)
}

// parsed returns in, parsed from Raw (or Text) when it has neither a code
// nor an event.
func parsed(in Input) Input {
	if in.Event != EventNone || in.Code != 0 || (in.Raw == "" && in.Text == "") {
		return in
	}
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
	return p
}

// replyFields is a reply as the rules test it: the basic code (0 when none
// is readable), a valid enhanced code or "" with its three parts, and the
// text on one line.
type replyFields struct {
	code       int
	enh, text  string
	hasEnh     bool
	ec, es, ed int
}

// fieldsOf normalises a reply's code, enhanced code and text.
func fieldsOf(in Input) replyFields {
	f := replyFields{code: in.Code, enh: in.Enhanced, text: in.Text}
	if f.code < 200 || f.code > 599 {
		f.code = 0
	}
	if f.enh != "" && !validEnhanced(f.enh) {
		f.enh = ""
	}
	// go-smtp and other clients leave the enhanced code in the text when
	// the server did not announce ENHANCEDSTATUSCODES.
	if e, rest := cutEnhanced(f.text); e != "" && (f.enh == "" || e == f.enh) {
		f.enh, f.text = e, rest
	}
	if f.code != 0 && (strings.IndexByte(f.text, '\n') >= 0 || strings.IndexByte(f.text, '\r') >= 0) {
		f.text = joinLines(strconv.Itoa(f.code), f.enh, f.text)
	}
	f.hasEnh = f.enh != ""
	if f.hasEnh {
		f.ec, f.es, f.ed = enhancedParts(f.enh)
	}
	return f
}

// classifyReply classifies a reply: the first rule, in order, whose every
// condition holds decides it.
func (c *Classifier) classifyReply(in Input) Result {
	f := fieldsOf(in)
	enh := c.enhSet(&f)
	// When the first rule the code, stage and enhanced code allow has no
	// text condition, it wins whatever the text says (a 250 to the final
	// dot): the text need not be scanned.
	if ri, ok := c.firstRule(f.code, in.Stage, enh); ok {
		if r := &c.rules[ri]; len(r.text) == 0 && len(r.notText) == 0 && !r.perCand && !c.tokenOn[ri] && enh != nil {
			return c.decide(ri, &f, in.Stage, nil)
		}
	}
	var buf, cbuf [stackWords]uint64
	m := c.matches(f.text, buf[:])
	for w, word := range c.candidates(f.code, in.Stage, enh, m, cbuf[:]) {
		for word != 0 {
			ri := w<<6 | bits.TrailingZeros64(word)
			word &= word - 1
			if r := &c.rules[ri]; enh != nil && !r.perCand || r.finalOK(&f, m) {
				return c.decide(ri, &f, in.Stage, m)
			}
		}
	}
	return c.noRule(&f, in.Stage, m)
}

// finalOK tests the conditions of r that the rule sets may leave to each
// candidate: its enhanced codes (when there were too many values to index
// them), its also_text, near phrases, tags and regexp. m is the text's
// match set.
func (r *rule) finalOK(f *replyFields, m matchSet) bool {
	return (len(r.enh) == 0 || anyEnh(r.enh, f.hasEnh, f.ec, f.es, f.ed)) && r.perCandOK(f.text, m)
}

// perCandOK tests r's also_text, near phrases, tags and regexp on text,
// whose match set m already satisfies r's text and not_text as the rule
// sets see them (a near phrase's first part counts there as the phrase).
func (r *rule) perCandOK(text string, m matchSet) bool {
	if !r.perCand {
		return true
	}
	if len(r.also) > 0 && !m.any(r.alsoMask) {
		return false
	}
	if len(r.near) > 0 && !m.any(r.plainMask) {
		ok := false
		for i := range r.near {
			if np := &r.near[i]; np.present(m) && np.match(text) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.tags) > 0 {
		ok := false
		for i := range r.tags {
			if t := &r.tags[i]; m.has(t.id) && t.match(text) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return r.re == nil || r.re.MatchString(text)
}

// decide returns the result of rule ri, which matched the reply: the
// rule's, or the token layer's when ri goes by the code alone and the
// words say otherwise.
func (c *Classifier) decide(ri int, f *replyFields, stage Stage, m matchSet) Result {
	r := &c.rules[ri]
	if c.tokenOn[ri] {
		// Never permanent where the rule is not: the only such rule is
		// a 5xx whose class-4 enhanced code says retry ("550 4.2.1
		// Mailbox disabled temporarily"), and the 5xx's prior alone
		// turned it permanent.
		if cl, ok := tokenDecide(f.code, r.class, c.tokenScores(f.code, m)); ok && (cl != Permanent || r.class == Permanent) {
			return c.result(cl, 0, TokenRule, 0, stage, f.code, f.enh, f.text, m)
		}
	}
	return c.result(r.class, r.scope, r.name, r.retryAfter, stage, f.code, f.enh, f.text, m)
}

// noRule is the result when no rule matched (only when an operator
// disabled the generic fallbacks): it goes by the first digit, unknown
// codes counting as temporary, as maddy does.
func (c *Classifier) noRule(f *replyFields, stage Stage, m matchSet) Result {
	class := Transient
	switch f.code / 100 {
	case 2:
		class = Delivered
	case 5:
		class = Permanent
	}
	return c.result(class, 0, "no-rule", 0, stage, f.code, f.enh, f.text, m)
}

func (c *Classifier) classifyEvent(in Input) Result {
	text := in.Text
	if text == "" {
		text = in.Event.String()
	}
	if int(in.Event) < len(c.byEvent) {
		var buf [stackWords]uint64
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
// textOK reports whether r's phrase, tag and regexp conditions hold for text.
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
	if r.perCand && m == nil {
		m = c.matches(text, buf)
	}
	return m, r.perCandOK(text, m)
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
