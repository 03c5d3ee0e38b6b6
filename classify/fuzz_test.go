package classify

import (
	"strings"
	"testing"
)

// FuzzParseReply feeds arbitrary bytes to the reply parser and to the
// classifier: neither may panic, what they return must be well formed, and
// the classifier's rule sets must pick the rule that trying every rule in
// order picks.
// The Makefile runs it with -fuzz=FuzzParseReply -fuzztime=10s.
func FuzzParseReply(f *testing.F) {
	for _, row := range readReplies(f, "testdata/smtp-replies.tsv") {
		f.Add(row.text)
	}
	for _, s := range []string{
		"", " ", "2", "25", "250", "250-", "250 ", "250-\r\n", "421-4.7.0 a\r\n421 4.7.0 b",
		"550 5.", "550 5.1.", "550 5.1.1", "550 #", "550 #5.1.1", "5.1.1", "4.7.1 x (451)", "x (451", "(451)",
		"[552]", " 552", "said: 550", "host x said: ", "421 5.7.0 in 1", "in 99999999999999999999999 s",
		"250-a\n250-b\n", "\r\n\r\n", "550-550-550-", "550 550 550", "timed out while sending end of data",
		// Near phrases, tags, also_text and enhanced-code ranges.
		"421 4.4.2 rate has exceeded the configured limit", "550 exceeded exceeded a b c d e limit", "too many too many ~3 sessions",
		"550 5.1.0 sender rejected AUP#I-1310", "AUP#I-99999999999999999999", "AUP#I-", "421 HL:ICC", "HL:ICCC", "IB510IB510",
		"451 4.7.550 Access denied", "451 4.7.999 x", "552 5.2.2 quota exceeded mailbox", "550 block spam too many",
	} {
		f.Add(s)
	}
	c := Default()
	f.Fuzz(func(t *testing.T, raw string) {
		in := Parse(raw)
		if in.Code != 0 && (in.Code < 200 || in.Code > 599) {
			t.Fatalf("Parse(%q): code %d out of range", raw, in.Code)
		}
		if in.Enhanced != "" && !validEnhanced(in.Enhanced) {
			t.Fatalf("Parse(%q): invalid enhanced code %q", raw, in.Enhanced)
		}
		if in.Raw != raw {
			t.Fatalf("Parse(%q): Raw changed to %q", raw, in.Raw)
		}
		if len(in.Text) > len(raw) {
			t.Fatalf("Parse(%q): text %q longer than the input", raw, in.Text)
		}
		if in.Code != 0 && strings.ContainsAny(in.Text, "\r\n") {
			t.Fatalf("Parse(%q): text %q still has line breaks", raw, in.Text)
		}
		for _, x := range []Input{in, {Raw: raw, Stage: StageRcpt}, {Code: 451, Text: raw}, {Code: 552, Enhanced: raw, Text: raw, Stage: StageRcpt}} {
			res := c.Classify(x)
			if res.Class < Delivered || res.Class > Unknown || res.Scope < ScopeRecipient || res.Scope > ScopeSource || res.Rule == "" {
				t.Fatalf("Classify(%+v) = %+v", x, res)
			}
			if res.RetryAfter < 0 || res.RetryAfter > maxHint {
				t.Fatalf("Classify(%+v): RetryAfter %v", x, res.RetryAfter)
			}
			sameAsReference(t, c, x)
		}
	})
}
