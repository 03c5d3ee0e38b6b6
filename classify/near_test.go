package classify

import (
	"fmt"
	"strings"
	"testing"
)

// A near phrase: parts in order, each within so many words of the one
// before, stems inside words, case and whitespace runs ignored.
func TestNearPhrase(t *testing.T) {
	for _, tc := range []struct {
		phrase, text string
		want         bool
	}{
		{"exceed ~4 limit", "has exceeded the configured limit", true},
		{"exceed ~4 limit", "has exceeded permitted limits within /64 range", true},
		{"exceed ~4 limit", "EXCEEDED   the\r\nconfigured\tLIMIT", true},
		{"exceed ~4 limit", "exceedlimit", true},
		{"exceed ~4 limit", "exceeded a b c d limit", true},
		{"exceed ~4 limit", "exceeded a b c d e limit", false},
		{"exceed ~4 limit", "limit exceeded", false},
		{"exceed ~0 limit", "exceeded limit", true},
		{"exceed ~0 limit", "exceeded the limit", false},
		{"too many ~3 session", "too many new TLS sessions from 192.0.2.1", true},
		{"too many ~3 session", "too   many SMTP sessions", true},
		{"too many ~3 session", "too many: open a new session", true},
		{"too many ~3 session", "too much mail; session closed", false},
		{"per ~1 minute", "only 5 recipients per 5 minutes allowed", true},
		{"per ~1 minute", "per minute", true},
		{"per ~1 minute", "per message, retry in 5 minutes", false},
		{"block ~ spam", "blocked for the day, for attempting to send too many messages containing content judged to be spam", true},
		{"block ~ spam", "spam, blocked", false},
		// The first occurrence of a part need not be the one that matches.
		{"exceed ~1 limit", "exceeded nothing; then exceeded the limit", true},
		{"a ~1 b ~1 c", "a x b y c", true},
		{"a ~1 b ~1 c", "a x b y z c", false},
		{"a ~1 b ~1 c", "a x y b c", false},
	} {
		np, gapped, err := parseNear(normPhrase(tc.phrase))
		if err != nil || !gapped {
			t.Fatalf("parseNear(%q): gapped %v, %v", tc.phrase, gapped, err)
		}
		if got := np.match(tc.text); got != tc.want {
			t.Errorf("%q in %q: %v, want %v", tc.phrase, tc.text, got, tc.want)
		}
	}
	if _, gapped, err := parseNear("rate limit"); gapped || err != nil {
		t.Errorf("plain phrase: gapped %v, %v", gapped, err)
	}
	// "~x" and "~10" are words, not gaps.
	for _, p := range []string{"a ~x b", "a ~10 b", "a~3 b"} {
		if _, gapped, err := parseNear(p); gapped || err != nil {
			t.Errorf("%q: gapped %v, %v; want a plain phrase", p, gapped, err)
		}
	}
	for _, p := range []string{"~3 limit", "limit ~3", "a ~ ~ b", "~"} {
		if _, _, err := parseNear(p); err == nil {
			t.Errorf("%q: no error", p)
		}
	}
}

// A tag: a whole token, ignoring case, with an optional number range.
func TestTag(t *testing.T) {
	for _, tc := range []struct {
		tag, text string
		want      bool
	}{
		{"IB510", "try again. IB510", true},
		{"IB510", "try again. ib510 <http://x.co>", true},
		{"IB510", "IB5101", false},
		{"IB510", "XIB510", false},
		{"HL:ICC", "421 HL:ICC 163 mx12", true},
		{"HL:ICC", "421 4.4.5 HL:ICC", true},
		{"HL:ICC", "XHL:ICC2", false},
		{"AUP#CXCNCT", "for more information. AUP#CXCNCT", true},
		{"AUP#CXCNCT", "AUP#CXCNCTX", false},
		{"AUP#I-{1300-1340}", "sender rejected AUP#I-1310", true},
		{"AUP#I-{1300-1340}", "AUP#I-1300.", true},
		{"AUP#I-{1300-1340}", "AUP#I-1340", true},
		{"AUP#I-{1300-1340}", "AUP#I-1299", false},
		{"AUP#I-{1300-1340}", "AUP#I-1341", false},
		{"AUP#I-{1300-1340}", "AUP#I-13100", false},
		{"AUP#I-{1300-1340}", "AUP#I-1310x", false},
		{"AUP#I-{1300-1340}", "AUP#I-", false},
		{"AUP#I-{1300-1340}", "AUP#I-1010 then AUP#I-1320", true},
		{"IB{500-510}x", "IB505x", true},
		{"IB{500-510}x", "IB505y", false},
		{"#RL{0-999}", "codes.php#RL000010", true},
	} {
		tp, err := parseTag(tc.tag)
		if err != nil {
			t.Fatalf("parseTag(%q): %v", tc.tag, err)
		}
		if got := tp.match(tc.text); got != tc.want {
			t.Errorf("tag %q in %q: %v, want %v", tc.tag, tc.text, got, tc.want)
		}
	}
	for _, bad := range []string{"", "I", "{1-2}", "AB CD", "AB{2-1}", "AB{1-x}", "AB{1}", "AB{1-2}{3-4}", "AB}"} {
		if _, err := parseTag(bad); err == nil {
			t.Errorf("parseTag(%q): no error", bad)
		}
	}
}

// Enhanced-code patterns may give a subject or a detail as a range.
func TestEnhancedRanges(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		code    string
		want    bool
	}{
		{"4.7.500-699", "4.7.500", true},
		{"4.7.500-699", "4.7.550", true},
		{"4.7.500-699", "4.7.699", true},
		{"4.7.500-699", "4.7.499", false},
		{"4.7.500-699", "4.7.700", false},
		{"4.7.500-699", "5.7.550", false},
		{"4.7.500-699", "4.6.550", false},
		{"*.1-2.*", "5.2.2", true},
		{"*.1-2.*", "4.3.2", false},
		{"5.7.*", "5.7.999", true},
		{"4.7.1", "4.7.1", true},
	} {
		p, ok := parseEnhancedPattern(tc.pattern)
		if !ok {
			t.Fatalf("parseEnhancedPattern(%q) refused", tc.pattern)
		}
		c, s, d := enhancedParts(tc.code)
		if got := p.match(true, c, s, d); got != tc.want {
			t.Errorf("%s matches %s: %v, want %v", tc.pattern, tc.code, got, tc.want)
		}
	}
	for _, bad := range []string{"4.7.699-500", "4-5.7.1", "4.7.500-", "4.7.-5", "4.7.1000", "4.7.5-1000", "4.7.5--6"} {
		if _, ok := parseEnhancedPattern(bad); ok {
			t.Errorf("parseEnhancedPattern(%q) accepted", bad)
		}
	}
	// The rule sets index details by the groups the ranges cut 0-999
	// into; every detail must pick the rule trying each in order picks.
	c, err := New(Options{ExtraRulesFile: writeRules(t, `
[[rule]]
name = "op-wide"
note = "x"
class = "throttled"
enhanced = ["4.7.100-299", "5.1-3.*"]

[[rule]]
name = "op-inner"
note = "x"
class = "permanent"
enhanced = ["4.7.150-160", "4.7.290-310", "4.7.5"]
`)})
	if err != nil {
		t.Fatal(err)
	}
	if c.enhRules == nil {
		t.Fatal("the enhanced-code rule sets are not indexed")
	}
	for cl := 4; cl <= 5; cl++ {
		for sub := 0; sub <= 9; sub++ {
			for det := 0; det <= 999; det++ {
				sameAsReference(t, c, Input{Code: cl*100 + 51, Enhanced: fmt.Sprintf("%d.%d.%d", cl, sub, det), Text: "x", Stage: StageRcpt})
			}
		}
	}
	for _, tc := range []struct {
		enh, rule string
	}{
		{"4.7.100", "op-wide"}, {"4.7.155", "op-wide"}, {"4.7.300", "op-inner"}, {"4.7.5", "op-inner"},
		{"4.7.311", "rfc3463-transient"}, {"5.2.7", "op-wide"}, {"5.4.7", "rfc3463-permanent"},
	} {
		in := Input{Code: 451, Enhanced: tc.enh, Text: "x"}
		if tc.enh[0] == '5' {
			in.Code = 550
		}
		if r := c.Classify(in); r.Rule != tc.rule {
			t.Errorf("%s: rule %s, want %s", tc.enh, r.Rule, tc.rule)
		}
	}
}

// also_text, tags and near phrases in an operator's file, and a file that
// gets them wrong.
func TestNewRuleConditions(t *testing.T) {
	c, err := New(Options{ExtraRulesFile: writeRules(t, `
[[rule]]
name = "op-also"
note = "quota with a mailbox word"
class = "permanent"
codes = ["5xx"]
text = ["quota"]
also_text = ["mailbox", "inbox"]

[[rule]]
name = "op-tag-and-text"
note = "the tag and the text"
class = "throttled"
text = ["slow"]
tags = ["ACME-{1-9}"]

[[rule]]
name = "op-tag"
note = "the tag alone"
class = "transient"
tags = ["ACME-{10-20}"]

[[rule]]
name = "op-near"
note = "near, or plain"
class = "throttled"
text = ["acme ~2 busy", "acme overloaded"]
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		raw, rule string
	}{
		{"550 Quota reached for this mailbox", "op-also"},
		{"550 Quota reached", "permanent"},
		{"451 ACME-3 please go slow", "op-tag-and-text"},
		{"451 ACME-3", "transient"},
		{"451 please go slow ACME-30", "transient"},
		{"550 please go slow ACME-12", "op-tag"},
		{"451 acme is very busy", "op-near"},
		{"451 acme is not at all busy", "transient"},
		{"451 acme overloaded", "op-near"},
	} {
		got := sameAsReference(t, c, Input{Raw: tc.raw})
		if got.Rule != tc.rule {
			t.Errorf("%q: rule %s, want %s", tc.raw, got.Rule, tc.rule)
		}
	}
	for _, tc := range []struct{ body, reason string }{
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\ntags = [\"A B\"]\n", "tag \"A B\" has a space"},
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\ntags = [\"AB{9-1}\"]\n", "want a range as {lo-hi}"},
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\ntext = [\"~3 limit\"]\n", "must stand between two words"},
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\nnot_text = [\"a ~3 b\"]\n", "gaps (~, ~N) are for text"},
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\nalso_text = [\" \"]\n", "empty phrase in also_text"},
		{"[[rule]]\nname = \"x\"\nclass = \"transient\"\nenhanced = [\"4.7.600-500\"]\n", `bad enhanced code "4.7.600-500"`},
	} {
		_, err := New(Options{ExtraRulesFile: writeRules(t, tc.body)})
		if err == nil || !strings.Contains(err.Error(), tc.reason) || !strings.Contains(err.Error(), "line 4") {
			t.Errorf("%q: error %v, want line 4 and %q", tc.body, err, tc.reason)
		}
	}
}

// The new conditions cost no allocation either.
func TestNewConditionsDoNotAllocate(t *testing.T) {
	c := Default()
	ins := []Input{
		{Stage: StageDataEnd, Code: 421, Enhanced: "4.4.2", Text: "Message submission rate for this client has exceeded the configured limit"},
		{Stage: StageRcpt, Code: 550, Enhanced: "5.1.0", Text: "sender rejected AUP#I-1310"},
		{Stage: StageRcpt, Code: 552, Enhanced: "5.2.2", Text: "Mailbox quota exceeded"},
		{Stage: StageRcpt, Code: 451, Enhanced: "4.7.550", Text: "Access denied, please try again later"},
	}
	if n := testing.AllocsPerRun(100, func() {
		for _, in := range ins {
			c.Classify(in)
		}
	}); n != 0 {
		t.Errorf("%v allocations per run, want 0", n)
	}
}

// A near phrase's search stays linear on a long text that repeats its
// first part: an unbounded gap is searched past a position once.
func TestNearPhraseLongText(t *testing.T) {
	text := strings.Repeat("too many ", 20000) + "x"
	for _, p := range []string{"too many ~ spam", "too many ~3 session", "too many ~ many ~ spam", "too ~ many ~2 too ~ spam"} {
		np, _, err := parseNear(normPhrase(p))
		if err != nil {
			t.Fatal(err)
		}
		if np.match(text) {
			t.Errorf("%q matched", p)
		}
	}
	if np, _, _ := parseNear("too many ~ x"); !np.match(text[len(text)-nearTextMax+100:]) {
		t.Error("too many ~ x: not matched within the searched length")
	}
	// Past nearTextMax a reply is not searched for near phrases, and a
	// bounded gap does not cross a "word" longer than nearWordMax: each
	// kept a reply without spaces from costing the square of its length.
	if np, _, _ := parseNear("too many ~ x"); np.match(text) {
		t.Error("too many ~ x: matched past nearTextMax")
	}
	np, _, _ := parseNear("exceed ~2 limit")
	if !np.match("exceeded the " + strings.Repeat("a", nearWordMax-1) + " limit") {
		t.Error("a gap of words of ordinary length not crossed")
	}
	if np.match("exceeded " + strings.Repeat("a", 4*nearWordMax) + " limit") {
		t.Error("a gap crossed a word of 256 octets")
	}
	if _, _, err := parseNear("a ~ b ~ c ~ d ~ e"); err == nil {
		t.Error("four gaps accepted")
	}
	r := Default().Classify(Input{Raw: "554 " + text})
	if r.Class != Permanent {
		t.Errorf("long text: %s (%s)", r.Class, r.Rule)
	}
}

// BenchmarkNearPhraseAdversarial: a reply a hostile MX can send to every
// RCPT, 200 lines of 4,096 octets without a space in which a near
// phrase's first part recurs. Before the bounds on the search (nearTextMax,
// nearWordMax), one classification took 9.7 s.
func BenchmarkNearPhraseAdversarial(b *testing.B) {
	raw := "550 limit " + strings.Repeat(strings.Repeat("exceed", 682)+"\r\n", 200)
	c := Default()
	b.SetBytes(int64(len(raw)))
	for b.Loop() {
		c.Classify(Input{Raw: raw})
	}
}
