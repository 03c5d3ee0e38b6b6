package classify

// The token layer recognises a new phrasing of a known meaning. The rules
// match whole phrases ("rate limit exceeded"); a reply that says the same in
// other words ("you are sending too quickly", "hourly volume reached") would
// otherwise fall through to the rules that go by the code alone. For those
// replies, and only those, the layer weighs single words and short stems of
// three vocabularies (rate and volume, account and authorisation, retry will
// not succeed, plus the words of a passing problem) with the code class, and
// may move the result to another class when the words clearly say so.
//
// Safety comes before the words: a 4xx never becomes permanent here (only
// its text saying so, in a rule, does that), and a 5xx never becomes
// transient. What the layer can do is turn a 4xx or a 5xx that no rule
// recognised into throttled, or a 4xx into transient where it was already
// transient; anything else keeps the code rule's class.

// tokenClasses are the classes the token layer scores, in the order of
// tokenWeight.w.
var tokenClasses = [3]Class{Transient, Throttled, Permanent}

// tokenWeight is one vocabulary entry: a word or stem as it occurs in reply
// text (matched ignoring case, anywhere in a word unless it has spaces
// around it) and how strongly it speaks for each class, in nats.
type tokenWeight struct {
	phrase string
	w      [3]float32 // transient, throttled, permanent
}

// tokenVocabulary is hand-weighted (docs/classification.md says how it was
// checked against the validation split). Stems are short on purpose:
// "frequen" covers frequency, frequent and frequently.
var tokenVocabulary = []tokenWeight{
	// Rate, speed, frequency and recent volume.
	{"throttl", [3]float32{0, 3, 0}},
	{" rate ", [3]float32{0, 2, 0}},
	{" rate.", [3]float32{0, 2, 0}},
	{" rates", [3]float32{0, 2, 0}},
	{"quickly", [3]float32{0, 2, 0}},
	{"too fast", [3]float32{0, 3, 0}},
	{"fast", [3]float32{0, 0.5, 0}},
	{"speed", [3]float32{0, 2, 0}},
	{"frequen", [3]float32{0, 2, 0}},
	{"volume", [3]float32{0, 2, 0}},
	{"slow", [3]float32{0, 1.5, 0}},
	{"hourly", [3]float32{0, 1.5, 0}},
	{" hour", [3]float32{0, 1, 0}},
	{"daily", [3]float32{0, 1, 0}},
	{"per day", [3]float32{0, 1, 0}},
	{" minute", [3]float32{0, 0.5, 0}},
	{"concurren", [3]float32{0, 2, 0}},
	{"connections", [3]float32{0, 1.5, 0}},
	{"session", [3]float32{0, 1, 0}},
	{"too many", [3]float32{0, 2, 0}},
	{"too much", [3]float32{0, 1, 0}},
	{"exceed", [3]float32{0, 1, 0}},
	{"limit", [3]float32{0, 1, 0}},
	{"reached", [3]float32{0, 0.5, 0}},
	{"deferr", [3]float32{0.5, 1, 0}},
	{"backoff", [3]float32{0, 2, 0}},
	{"back off", [3]float32{0, 2, 0}},
	// Words that make a limit something other than a rate.
	{"size", [3]float32{0, -2, 1}},
	{"storage", [3]float32{0, -2, 1}},
	{"mailbox", [3]float32{0, -1, 0.5}},
	{"recipients", [3]float32{0.5, -0.5, 0}},
	{"errors", [3]float32{1, -1.5, 0}},
	// A passing problem.
	{"later", [3]float32{1, 0.5, 0}},
	{"temporar", [3]float32{1.5, 0.5, 0}},
	{"busy", [3]float32{2, 0, 0}},
	{"try again", [3]float32{1, 0.5, 0}},
	{"timeout", [3]float32{1.5, 0, 0}},
	{"timed out", [3]float32{1.5, 0, 0}},
	{"resources", [3]float32{1, 0, 0}},
	{"greylist", [3]float32{2, 0, 0}},
	// Account, authorisation, and retry will not succeed.
	{"never", [3]float32{0, 0, 2}},
	{"permanent", [3]float32{0, 0, 2}},
	{"not allowed", [3]float32{0, 0, 1.5}},
	{"not authori", [3]float32{0, 0, 1.5}},
	{"verif", [3]float32{0, 0, 1}},
	{"activat", [3]float32{0, 0, 1.5}},
	{"suspend", [3]float32{0, -0.5, 1.5}},
	{"paused", [3]float32{0, 0, 1.5}},
	{"disabled", [3]float32{0, 0, 1}},
	{"blocked", [3]float32{0, 0, 1}},
	{"denied", [3]float32{0, 0, 1}},
	{"spam", [3]float32{0, 0, 1}},
}

// tokenCodePrior is what the code class alone says, in nats: a 4xx speaks
// for transient, a 5xx for permanent, no readable code for transient.
func tokenCodePrior(code int) [3]float32 {
	switch code / 100 {
	case 4:
		return [3]float32{2, 0, 0}
	case 5:
		return [3]float32{0, 0, 2}
	}
	return [3]float32{1, 0, 0}
}

// tokenMargin is how far (in nats) the words' class must lead the code's
// before the layer changes a result.
const tokenMargin = 1.0

// tokenFallbacks are the embedded rules that go by the code alone; only
// their results are weighed again by the token layer.
var tokenFallbacks = map[string]bool{
	"enhanced-class-5-in-4xx": true, "enhanced-class-4-in-5xx": true,
	"rfc3463-permanent": true, "rfc3463-transient": true,
	"transient": true, "permanent": true, "no-code": true,
	// Rules that go by a code whose meaning servers stretch: 421 (any
	// refusal that closes the connection), X.4.1/X.4.2 and X.4.5 (sent with
	// "submission rate for this client exceeded" or "hourly volume"), and
	// X.1.x (GoDaddy's 5.1.1 "too many recipients this hour", Spectrum's
	// 5.1.0 connection limits). A user-unknown text never reaches X.1.x
	// here: user-unknown comes first. Not rfc3463-too-many-recipients: its
	// texts say "recipient limit exceeded" of one message, and against its
	// class (transient) a 5xx's prior leaves those words nothing to beat.
	"service-closing": true, "rfc3463-network-temporary": true, "rfc3463-congestion": true,
	"rfc3463-bad-recipient": true,
}

// TokenRule is the rule name of a result the token layer decided.
const TokenRule = "token-signal"

// tokenScores adds up the vocabulary found in m, with the code prior.
func (c *Classifier) tokenScores(code int, m matchSet) [3]float32 {
	s := tokenCodePrior(code)
	for i, id := range c.tokIDs {
		if m.has(id) {
			w := &tokenVocabulary[i].w
			s[0] += w[0]
			s[1] += w[1]
			s[2] += w[2]
		}
	}
	return s
}

// tokenDecide returns the class the words say, within what the code allows
// (4xx and no code: transient or throttled; 5xx: permanent or throttled),
// if it leads the rule's class by tokenMargin; otherwise ok is false.
func tokenDecide(code int, rc Class, s [3]float32) (Class, bool) {
	allowed := [3]bool{true, true, false} // 4xx, 3xx, no code
	if code/100 == 5 {
		allowed = [3]bool{false, true, true}
	}
	best, ruleIdx := -1, -1
	for i, cl := range tokenClasses {
		if cl == rc {
			ruleIdx = i
		}
		if allowed[i] && (best < 0 || s[i] > s[best]) {
			best = i
		}
	}
	if best < 0 || ruleIdx < 0 || tokenClasses[best] == rc || s[best]-s[ruleIdx] < tokenMargin {
		return 0, false
	}
	return tokenClasses[best], true
}
