package classify

import (
	"embed"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

// The embedded rules, in the order they are tried: provider rules first
// (they know what a provider means by its words), then the generic rules
// (text signals, then enhanced codes, then basic codes, then transport
// events). docs/classification.md describes the format.
//
//go:embed rules/providers.toml rules/generic.toml
var embeddedRules embed.FS

var embeddedFiles = []string{"rules/providers.toml", "rules/generic.toml"}

// RulesError says where and why a rules file was refused. New returns it (or
// an error wrapping it) so that a bad operator file stops the process at
// start with the file, the line and the reason, rather than misclassifying
// mail later.
type RulesError struct {
	File   string // path of the rules file (embedded files are "embedded:rules/….toml")
	Line   int    // 1-based line of the problem; 0 when it cannot be told
	Rule   string // name of the rule at fault, when known
	Reason string // what is wrong, e.g. `unknown class "throtled"`
	Err    error  // underlying error (a TOML syntax error), or nil
}

// Error formats the problem as "rules file F line L: rule "R": reason".
func (e *RulesError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rules file %s", e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, " line %d", e.Line)
	}
	if e.Rule != "" {
		fmt.Fprintf(&b, ": rule %q", e.Rule)
	}
	b.WriteString(": ")
	b.WriteString(e.Reason)
	return b.String()
}

// Unwrap returns the underlying TOML error, if any.
func (e *RulesError) Unwrap() error { return e.Err }

// ruleKeys are the keys a [[rule]] table may have; any other key is refused
// so that a typo ("clas = ...") cannot silently widen a rule.
var ruleKeys = map[string]bool{
	"name": true, "provider": true, "note": true, "class": true, "scope": true,
	"codes": true, "enhanced": true, "stages": true, "events": true,
	"text": true, "not_text": true, "also_text": true, "tags": true, "regex": true, "retry_after": true,
}

// ruleSpec is one [[rule]] table as written.
type ruleSpec struct {
	Name       string
	Provider   string
	Note       string
	Class      string
	Scope      string
	Codes      []string
	Enhanced   []string
	Stages     []string
	Events     []string
	Text       []string
	NotText    []string
	AlsoText   []string
	Tags       []string
	Regex      string
	RetryAfter string
	line       int            // 1-based line of the [[rule]] header; 0 when unknown
	keyLines   map[string]int // 1-based line of each key, for error messages
}

// ruleFile is a parsed rules file.
type ruleFile struct {
	name    string
	rules   []ruleSpec
	disable []string
	disLine int
}

// parseRules decodes a rules file and checks its keys and value types; the
// meaning of values is checked by compile.
func parseRules(file string, data []byte) (*ruleFile, error) {
	src := string(data)
	lines := strings.Split(src, "\n")
	rf := &ruleFile{name: file}
	var top map[string]toml.Primitive
	md, err := toml.Decode(src, &top)
	if err != nil {
		re := &RulesError{File: file, Reason: err.Error(), Err: err}
		var pe toml.ParseError
		if errors.As(err, &pe) {
			re.Line = pe.Position.Line
			re.Reason = pe.Message
		}
		return nil, re
	}
	for key, prim := range top {
		switch key {
		case "disable":
			rf.disLine = keyLine(lines, 0, len(lines), key)
			if err := md.PrimitiveDecode(prim, &rf.disable); err != nil {
				return nil, &RulesError{File: file, Line: rf.disLine, Reason: "disable must be a list of rule names", Err: err}
			}
		case "rule":
			var tables []map[string]toml.Primitive
			if err := md.PrimitiveDecode(prim, &tables); err != nil {
				return nil, &RulesError{File: file, Line: keyLine(lines, 0, len(lines), key), Reason: "rule must be an array of tables ([[rule]])", Err: err}
			}
			// The i-th [[rule]] header starts the i-th table, unless the
			// file writes rules some other way (inline tables), when
			// lines are not reported.
			heads := headerLines(lines)
			known := len(heads) == len(tables)
			for i, t := range tables {
				start, end := 0, len(lines)
				if known {
					start = heads[i]
					if i+1 < len(heads) {
						end = heads[i+1]
					}
				}
				spec, err := decodeRule(md, t, lines, start, end, known)
				if err != nil {
					err.File = file
					return nil, err
				}
				rf.rules = append(rf.rules, spec)
			}
		default:
			return nil, &RulesError{File: file, Line: keyLine(lines, 0, len(lines), key), Reason: fmt.Sprintf("unknown key %q (want [[rule]] tables and disable)", key)}
		}
	}
	return rf, nil
}

// decodeRule decodes one [[rule]] table found in lines[start:end]; known
// says whether those bounds are right, so lines can be reported.
func decodeRule(md toml.MetaData, t map[string]toml.Primitive, lines []string, start, end int, known bool) (ruleSpec, *RulesError) {
	var spec ruleSpec
	if known {
		spec.line = start + 1
	}
	if p, ok := t["name"]; ok {
		_ = md.PrimitiveDecode(p, &spec.Name)
	}
	for key, p := range t {
		line := spec.line
		if known {
			line = keyLine(lines, start, end, key)
		}
		if spec.keyLines == nil {
			spec.keyLines = make(map[string]int, len(t))
		}
		spec.keyLines[key] = line
		if !ruleKeys[key] {
			return spec, &RulesError{Line: line, Rule: spec.Name, Reason: fmt.Sprintf("unknown key %q", key)}
		}
		var dst any
		switch key {
		case "name":
			dst = &spec.Name
		case "provider":
			dst = &spec.Provider
		case "note":
			dst = &spec.Note
		case "class":
			dst = &spec.Class
		case "scope":
			dst = &spec.Scope
		case "regex":
			dst = &spec.Regex
		case "retry_after":
			dst = &spec.RetryAfter
		case "codes":
			dst = &spec.Codes
		case "enhanced":
			dst = &spec.Enhanced
		case "stages":
			dst = &spec.Stages
		case "events":
			dst = &spec.Events
		case "text":
			dst = &spec.Text
		case "not_text":
			dst = &spec.NotText
		case "also_text":
			dst = &spec.AlsoText
		case "tags":
			dst = &spec.Tags
		}
		if err := md.PrimitiveDecode(p, dst); err != nil {
			want := "a string"
			if _, ok := dst.(*[]string); ok {
				want = "a list of strings"
			}
			return spec, &RulesError{Line: line, Rule: spec.Name, Reason: fmt.Sprintf("%s must be %s", key, want), Err: err}
		}
	}
	return spec, nil
}

// headerLines returns the 0-based line index of each [[rule]] header.
func headerLines(lines []string) []int {
	var heads []int
	for i, l := range lines {
		if strings.HasPrefix(strings.ReplaceAll(strings.TrimSpace(l), " ", ""), "[[rule]]") {
			heads = append(heads, i)
		}
	}
	return heads
}

// keyLine returns the 1-based line of the first "key =" in lines[start:end],
// or of start when not found.
func keyLine(lines []string, start, end int, key string) int {
	for i := start; i < end && i < len(lines); i++ {
		l := strings.TrimSpace(lines[i])
		if rest, ok := strings.CutPrefix(l, key); ok {
			if r := strings.TrimLeft(rest, " \t"); strings.HasPrefix(r, "=") {
				return i + 1
			}
		}
	}
	return start + 1
}

// compileRule checks a rule's values and turns it into the form Classify
// uses. Phrases are registered in idx.
func compileRule(spec ruleSpec, idx *textIndex) (rule, *RulesError) {
	// bad reports a problem with the value of key ("" for the rule as a
	// whole) at that key's line.
	bad := func(key, format string, args ...any) (rule, *RulesError) {
		line := spec.line
		if l, ok := spec.keyLines[key]; ok && l > 0 {
			line = l
		}
		return rule{}, &RulesError{Line: line, Rule: spec.Name, Reason: fmt.Sprintf(format, args...)}
	}
	r := rule{name: spec.Name, line: spec.line}
	if spec.Name == "" {
		return bad("", "name is missing")
	}
	var err error
	if spec.Class == "" {
		return bad("", "class is missing")
	}
	if r.class, err = ParseClass(spec.Class); err != nil {
		return bad("class", "%v (want delivered, transient, throttled, permanent or unknown)", err)
	}
	if spec.Scope != "" {
		if r.scope, err = ParseScope(spec.Scope); err != nil {
			return bad("scope", "%v (want recipient, message, tenant, destination, connection or source)", err)
		}
	}
	for _, s := range spec.Stages {
		st, err := ParseStage(s)
		if err != nil {
			return bad("stages", "%v", err)
		}
		r.stages |= 1 << st
	}
	for _, s := range spec.Events {
		ev, err := ParseEvent(s)
		if err != nil || ev == EventNone {
			return bad("events", "unknown event %q", s)
		}
		r.events |= 1 << ev
	}
	// Unknown means "no reply to the final dot, it may have been
	// delivered" and drives its own policy; nothing else may claim it.
	if r.class == Unknown && (r.stages != 1<<StageDataEnd || r.events == 0 || r.events&^(1<<EventTimeout|1<<EventConnLost) != 0) {
		return bad("class", `class unknown is only for events timeout and conn-lost at stage data-end (no reply to the final dot)`)
	}
	if r.events != 0 && (len(spec.Codes) > 0 || len(spec.Enhanced) > 0) {
		return bad("events", "a rule matches either events or replies: drop codes and enhanced, or events")
	}
	if len(spec.Codes) == 0 {
		// Without codes, a reply rule matches every reply that is not
		// positive: a provider phrase must not turn a 250 into a failure.
		spec.Codes = []string{"3xx", "4xx", "5xx", "none"}
	}
	for _, c := range spec.Codes {
		p, ok := parseCodePattern(c)
		if !ok {
			return bad("codes", "bad code %q (want three characters of digits and x, like 421 or 4xx, or none)", c)
		}
		r.codes = append(r.codes, p)
	}
	for _, e := range spec.Enhanced {
		p, ok := parseEnhancedPattern(e)
		if !ok {
			return bad("enhanced", "bad enhanced code %q (want class.subject.detail with * for any part and lo-hi for a range of subjects or details, like 5.7.*, *.2.2 or 4.7.500-699, or none)", e)
		}
		r.enh = append(r.enh, p)
	}
	for _, t := range spec.Text {
		p := normPhrase(t)
		if p == "" {
			return bad("text", "empty phrase in text")
		}
		np, gapped, err := parseNear(p)
		if err != nil {
			return bad("text", "%v", err)
		}
		if !gapped {
			id := idx.add(p)
			r.text = append(r.text, id)
			r.plain = append(r.plain, id)
			continue
		}
		// A near phrase makes the rule a candidate when its first part
		// occurs; the rest is checked on the candidate (nearPhrase).
		for _, part := range np.parts {
			np.ids = append(np.ids, idx.add(part))
		}
		r.text = append(r.text, np.ids[0])
		r.near = append(r.near, np)
	}
	for _, t := range spec.NotText {
		p := normPhrase(t)
		if p == "" {
			return bad("not_text", "empty phrase in not_text")
		}
		if _, gapped, _ := parseNear(p); gapped {
			return bad("not_text", "phrase %q: gaps (~, ~N) are for text, not not_text", t)
		}
		r.notText = append(r.notText, idx.add(p))
	}
	for _, t := range spec.AlsoText {
		p := normPhrase(t)
		if p == "" {
			return bad("also_text", "empty phrase in also_text")
		}
		if _, gapped, _ := parseNear(p); gapped {
			return bad("also_text", "phrase %q: gaps (~, ~N) are for text, not also_text", t)
		}
		r.also = append(r.also, idx.add(p))
	}
	for _, t := range spec.Tags {
		tp, err := parseTag(t)
		if err != nil {
			return bad("tags", "%v", err)
		}
		tp.id = idx.add(normPhrase(tp.prefix))
		r.tags = append(r.tags, tp)
	}
	// Without text, a tag's literal start is what makes the rule a
	// candidate; with text, the text does, and the tags are checked on
	// the candidate.
	if len(spec.Text) == 0 {
		for _, tp := range r.tags {
			r.text = append(r.text, tp.id)
		}
	}
	if len(idx.phrases) > maxPhrases-1 {
		return bad("", "too many phrases (more than %d in all rules)", maxPhrases-1)
	}
	if spec.Regex != "" {
		if r.re, err = regexp.Compile(spec.Regex); err != nil {
			return bad("regex", "bad regex: %v", err)
		}
	}
	if spec.RetryAfter != "" {
		if r.retryAfter, err = time.ParseDuration(spec.RetryAfter); err != nil || r.retryAfter <= 0 {
			return bad("retry_after", "bad retry_after %q (want a positive Go duration like 90s or 1h)", spec.RetryAfter)
		}
	}
	return r, nil
}

// codePattern matches a basic code digit by digit; -1 is "x" (any digit).
// none matches replies without a readable code.
type codePattern struct {
	d    [3]int8
	none bool
}

func parseCodePattern(s string) (codePattern, bool) {
	if s == "none" {
		return codePattern{none: true}, true
	}
	var p codePattern
	if len(s) != 3 {
		return p, false
	}
	for i := 0; i < 3; i++ {
		switch c := s[i]; {
		case c == 'x' || c == 'X':
			p.d[i] = -1
		case c >= '0' && c <= '9':
			p.d[i] = int8(c - '0')
		default:
			return p, false
		}
	}
	return p, true
}

func (p codePattern) match(code int) bool {
	if code == 0 {
		return p.none
	}
	if p.none {
		return false
	}
	ds := [3]int8{int8(code / 100), int8(code / 10 % 10), int8(code % 10)}
	for i, d := range p.d {
		if d >= 0 && d != ds[i] {
			return false
		}
	}
	return true
}

// enhPattern matches an enhanced code part by part: the class exactly or
// any (-1), the subject and the detail each within a range of values
// ("*" is 0-999, "7" is 7-7, "500-699" is itself). none matches replies
// without a valid enhanced code.
type enhPattern struct {
	class        int16
	subLo, subHi int16
	detLo, detHi int16
	none         bool
}

// enhMax is the largest value of an enhanced code's subject or detail
// (RFC 3463 2: one to three digits).
const enhMax = 999

func parseEnhancedPattern(s string) (enhPattern, bool) {
	if s == "none" {
		return enhPattern{none: true}, true
	}
	parts := strings.Split(s, ".")
	if len(parts) != 3 {
		return enhPattern{}, false
	}
	var lo, hi [3]int16
	for i, p := range parts {
		if p == "*" {
			lo[i], hi[i] = 0, enhMax
			if i == 0 {
				lo[i], hi[i] = -1, -1
			}
			continue
		}
		a, b, isRange := strings.Cut(p, "-")
		if isRange && i == 0 {
			return enhPattern{}, false
		}
		x, ok := enhNumber(a)
		if !ok {
			return enhPattern{}, false
		}
		y := x
		if isRange {
			if y, ok = enhNumber(b); !ok || y < x {
				return enhPattern{}, false
			}
		}
		lo[i], hi[i] = x, y
	}
	if lo[0] != -1 && lo[0] != 2 && lo[0] != 4 && lo[0] != 5 {
		return enhPattern{}, false
	}
	return enhPattern{class: lo[0], subLo: lo[1], subHi: hi[1], detLo: lo[2], detHi: hi[2]}, true
}

// enhNumber parses one to three digits.
func enhNumber(p string) (int16, bool) {
	if len(p) == 0 || len(p) > 3 {
		return 0, false
	}
	n := int16(0)
	for j := 0; j < len(p); j++ {
		if p[j] < '0' || p[j] > '9' {
			return 0, false
		}
		n = n*10 + int16(p[j]-'0')
	}
	return n, true
}

func (p enhPattern) match(has bool, c, s, d int) bool {
	if !has {
		return p.none
	}
	return !p.none && (p.class < 0 || int(p.class) == c) &&
		int(p.subLo) <= s && s <= int(p.subHi) && int(p.detLo) <= d && d <= int(p.detHi)
}

// loadRuleFiles reads the operator's file (if any) and the embedded files,
// in the order their rules are tried.
func loadRuleFiles(extra string) ([]*ruleFile, error) {
	var files []*ruleFile
	if extra != "" {
		data, err := os.ReadFile(extra)
		if err != nil {
			return nil, fmt.Errorf("read rules file: %w", err)
		}
		rf, err := parseRules(extra, data)
		if err != nil {
			return nil, err
		}
		files = append(files, rf)
	}
	for _, name := range embeddedFiles {
		data, err := embeddedRules.ReadFile(name)
		if err != nil {
			return nil, fmt.Errorf("read embedded rules: %w", err)
		}
		rf, err := parseRules("embedded:"+name, data)
		if err != nil {
			return nil, err
		}
		if len(rf.disable) > 0 {
			return nil, &RulesError{File: rf.name, Line: rf.disLine, Reason: "disable is for operator rules files"}
		}
		files = append(files, rf)
	}
	return files, nil
}
