package classify

import "testing"

// withoutTokens returns a copy of the default classifier with the token
// layer switched off, for comparisons.
func withoutTokens() *Classifier {
	c := *Default()
	c.tokenOn = make([]bool, len(c.rules))
	return &c
}

// New phrasings of known meanings that no rule names: the token layer
// recognises them; the rules alone would go by the code.
func TestTokenLayerRecognisesNewPhrasings(t *testing.T) {
	for _, tc := range []struct {
		raw  string
		want Class
	}{
		{"451 4.7.1 Hourly volume for your IP reached, come back in a while", Throttled},
		{"450 Delivery speed from your network is above what we accept; back off", Throttled},
		{"554 5.7.1 Your sending speed and volume are above what we accept from new senders", Throttled},
		{"421 4.3.0 Our servers are busy at the moment", Transient},
	} {
		res := check(t, Input{Raw: tc.raw}, tc.want, 0, "")
		if tc.want == Throttled && res.Rule != TokenRule {
			t.Errorf("%q: rule %s, want %s", tc.raw, res.Rule, TokenRule)
		}
		if tc.want == Throttled && withoutTokens().Classify(Input{Raw: tc.raw}).Class == Throttled {
			t.Errorf("%q: throttled without the token layer too; the case does not test it", tc.raw)
		}
	}
}

// The layer never makes a 4xx permanent nor a 5xx transient, however the
// words lean.
func TestTokenLayerKeepsTheSafetyRules(t *testing.T) {
	res := Default().Classify(Input{Raw: "451 4.3.0 Never again: permanent, blocked, denied, spam, disabled"})
	if res.Class == Permanent {
		t.Errorf("4xx made permanent by words (rule %s)", res.Rule)
	}
	res = Default().Classify(Input{Raw: "550 5.3.0 Busy, temporarily, try again later, timeout, resources"})
	if res.Class == Transient {
		t.Errorf("5xx made transient by words (rule %s)", res.Rule)
	}
	// An operator's rule of the same name as a fallback is not re-weighed.
	c, err := New(Options{ExtraRulesFile: writeRules(t, "[[rule]]\nname = \"transient\"\nnote = \"x\"\nclass = \"transient\"\ncodes = [\"4xx\"]\n")})
	if err != nil {
		t.Fatal(err)
	}
	if res := c.Classify(Input{Raw: "451 4.7.1 Hourly volume for your IP reached"}); res.Rule != "transient" {
		t.Errorf("operator rule re-weighed: rule %s", res.Rule)
	}
}

// TestTokenLayerOnTheSplit reports what the layer changes on the corpus and
// requires that it costs nothing on either side of the split.
func TestTokenLayerOnTheSplit(t *testing.T) {
	train, held := split(t)
	for _, side := range []struct {
		name string
		rows []replyRow
	}{{"training", train}, {"held out", held}} {
		with, _, _ := agreement(Default(), side.rows)
		without, _, _ := agreement(withoutTokens(), side.rows)
		t.Logf("%s: %.1f%% with the token layer, %.1f%% without", side.name, 100*with, 100*without)
		if with < without {
			t.Errorf("%s: the token layer lowers agreement from %.1f%% to %.1f%%", side.name, 100*without, 100*with)
		}
	}
}
