package classify

import "sort"

// Explanation says why Classify decided as it did: which rule matched, the
// vocabulary the token layer found with its weights, each class's token
// score, and how close the runner-up class came. It is for people
// (`outflow classify --explain`) and costs allocations; the worker's path
// never builds one.
type Explanation struct {
	Result Result
	// DecidedBy is "rule" when a rule's class stands, "tokens" when the
	// token layer changed it (Result.Rule is then TokenRule).
	DecidedBy string
	// Rule is the rule that matched first; with DecidedBy "tokens", the
	// code rule whose class the words overrode.
	Rule string
	// Tokens are the vocabulary entries found in the text, strongest first.
	Tokens []TokenContribution
	// Scores are the token scores (code prior plus words) of transient,
	// throttled and permanent, in nats.
	Scores []ClassScore
	// RunnerUp is the best-scoring class other than the result's, and
	// Margin how far (in nats) the result's class leads it; negative when a
	// rule decided against the words.
	RunnerUp Class
	Margin   float64
}

// TokenContribution is one vocabulary entry found in a reply.
type TokenContribution struct {
	Token   string  // the word or stem, as in the vocabulary
	Class   Class   // the class it speaks for most
	Weight  float64 // its weight for that class, in nats
	Weights [3]float64
}

// ClassScore is one class's token score.
type ClassScore struct {
	Class Class
	Score float64
}

// Explain classifies in and says why.
func (c *Classifier) Explain(in Input) Explanation {
	res := c.Classify(in)
	ex := Explanation{Result: res, DecidedBy: "rule", Rule: res.Rule}
	if in.Event != EventNone {
		return ex
	}
	m := c.matches(res.Text, nil)
	if res.Rule == TokenRule {
		ex.DecidedBy = "tokens"
		ex.Rule = c.codeRule(in, res)
	}
	for i, id := range c.tokIDs {
		if !m.has(id) {
			continue
		}
		tw := tokenVocabulary[i]
		tc := TokenContribution{Token: tw.phrase}
		best := 0
		for k := range tw.w {
			tc.Weights[k] = float64(tw.w[k])
			if tw.w[k] > tw.w[best] {
				best = k
			}
		}
		tc.Class, tc.Weight = tokenClasses[best], float64(tw.w[best])
		ex.Tokens = append(ex.Tokens, tc)
	}
	sort.SliceStable(ex.Tokens, func(i, j int) bool { return ex.Tokens[i].Weight > ex.Tokens[j].Weight })
	s := c.tokenScores(res.Code, m)
	own := -1
	for i, cl := range tokenClasses {
		ex.Scores = append(ex.Scores, ClassScore{cl, float64(s[i])})
		if cl == res.Class {
			own = i
		}
	}
	if own >= 0 {
		ru := -1
		for i := range tokenClasses {
			if i != own && (ru < 0 || s[i] > s[ru]) {
				ru = i
			}
		}
		ex.RunnerUp, ex.Margin = tokenClasses[ru], float64(s[own]-s[ru])
	}
	return ex
}

// codeRule finds the code rule a token-layer result overrode, by
// classifying again with the layer off.
func (c *Classifier) codeRule(in Input, res Result) string {
	off := *c
	off.tokenOn = make([]bool, len(c.rules))
	return off.Classify(in).Rule
}
