package classify

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// referenceClassify is the classifier without its rule sets: every rule is
// tried in order and the first whose every condition holds wins, which is
// what the rule sets must reproduce. It shares the parsing and the result
// building with Classify, so only the choice of the rule is compared.
func referenceClassify(c *Classifier, in Input) Result {
	in = parsed(in)
	if in.Event != EventNone {
		return c.classifyEvent(in)
	}
	f := fieldsOf(in)
	m := c.matches(f.text, nil)
	for ri := range c.rules {
		r := &c.rules[ri]
		if r.events != 0 || !anyCode(r.codes, f.code) {
			continue
		}
		if r.stages != 0 && r.stages&(1<<in.Stage) == 0 {
			continue
		}
		if len(r.text) > 0 && !m.any(r.textMask) || len(r.notText) > 0 && m.any(r.notMask) {
			continue
		}
		if r.finalOK(&f, m) {
			return c.decide(ri, &f, in.Stage, m)
		}
	}
	return c.noRule(&f, in.Stage, m)
}

func anyCode(ps []codePattern, code int) bool {
	for _, p := range ps {
		if p.match(code) {
			return true
		}
	}
	return false
}

// sameAsReference fails t when Classify and referenceClassify disagree.
func sameAsReference(t *testing.T, c *Classifier, in Input) Result {
	t.Helper()
	got, want := c.Classify(in), referenceClassify(c, in)
	if got != want {
		t.Fatalf("Classify(%+v) = %+v, trying every rule in order gives %+v", in, got, want)
	}
	return got
}

// TestRuleSetsPickTheFirstMatchingRule classifies every reply of every
// corpus file, at every stage, as a log line and as the sender hands it
// over, with the embedded rules and with an operator's file that adds
// stage-bound, not_text and regexp rules in front of them, and requires the
// result Classify gets from its rule sets to be the one trying every rule
// in order gets.
func TestRuleSetsPickTheFirstMatchingRule(t *testing.T) {
	op, err := New(Options{ExtraRulesFile: writeRules(t, `
[[rule]]
name = "op-rcpt-quota"
note = "stage and phrase"
class = "throttled"
codes = ["45x", "55x"]
stages = ["rcpt"]
text = ["quota", "limit"]
not_text = ["mailbox"]

[[rule]]
name = "op-regex"
note = "regexp after phrases"
class = "permanent"
codes = ["4xx"]
enhanced = ["4.7.*"]
regex = '(?i)policy|spamhaus'
`)})
	if err != nil {
		t.Fatal(err)
	}
	// Enough distinct details that the rule sets by enhanced code are not
	// indexed and every candidate's patterns are tested.
	var many strings.Builder
	for d := 0; d < 300; d++ {
		fmt.Fprintf(&many, "[[rule]]\nname = \"op-detail-%d\"\nnote = \"x\"\nclass = \"throttled\"\nenhanced = [\"4.%d.%d\"]\ntext = [\"rate\"]\n", d, d%8, d+100)
	}
	wide, err := New(Options{ExtraRulesFile: writeRules(t, many.String())})
	if err != nil {
		t.Fatal(err)
	}
	if wide.enhRules != nil {
		t.Fatal("300 distinct details indexed: the unindexed path is not tested")
	}
	files := everyReplyFile
	n := 0
	used := map[string]bool{}
	for _, c := range []*Classifier{Default(), op, wide} {
		for _, file := range files {
			for _, row := range readReplies(t, file) {
				p := Parse(row.text)
				for st := StageUnknown; st <= StageDataEnd+1; st++ {
					used[sameAsReference(t, c, Input{Raw: row.text, Stage: st}).Rule] = true
					used[sameAsReference(t, c, Input{Code: p.Code, Enhanced: p.Enhanced, Text: p.Text, Stage: st}).Rule] = true
					n += 2
				}
			}
		}
		// New phrasings the token layer decides (see tokens_test.go).
		for _, raw := range []string{
			"451 4.7.1 Hourly volume for your IP reached",
			"421 You are sending too quickly, slow down",
			"550 5.7.1 Sending speed too high for this sender",
		} {
			used[sameAsReference(t, c, Input{Raw: raw}).Rule] = true
		}
		// The replies of the review, their paraphrases and the guards
		// (reviewed_test.go): near phrases, tags, also_text and
		// enhanced-code ranges decide them.
		for _, cases := range [][]replyCase{reviewedSlowDown, reviewedParaphrases, reviewedGuards} {
			for _, tc := range cases {
				p := Parse(tc.raw)
				for _, st := range []Stage{StageUnknown, tc.stage} {
					used[sameAsReference(t, c, Input{Raw: tc.raw, Stage: st}).Rule] = true
					sameAsReference(t, c, Input{Code: p.Code, Enhanced: p.Enhanced, Text: p.Text, Stage: st})
				}
			}
		}
		for code := 0; code < 700; code += 7 {
			sameAsReference(t, c, Input{Code: code, Text: "try again in " + strconv.Itoa(code) + " seconds"})
		}
	}
	for _, name := range []string{"op-rcpt-quota", "op-regex", TokenRule, "limit-exceeded", "spectrum-connection-limit", "microsoft-rate-4.7.65x", "mailbox-full"} {
		if !used[name] {
			t.Errorf("rule %s never decided: the comparison does not reach it", name)
		}
	}
	t.Logf("%d classifications agree", n)
}
