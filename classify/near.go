package classify

import (
	"fmt"
	"strconv"
	"strings"
)

// Two conditions a phrase alone cannot say, and how they stay cheap.
//
// A near phrase ("exceed ~4 limit") is a phrase with gaps: its parts must
// occur in order, each within so many words of the one before, so that
// "has exceeded the configured limit" and "exceeded permitted limits"
// match one phrase where a contiguous phrase would need one per wording.
// Every part is registered in the text index like any phrase; the rule is
// a candidate when the first part occurs, and the positions are checked
// only when every part does (nearPhrase.match).
//
// A tag ("AUP#I-{1300-1340}", "HL:ICC", "IB510") is a provider's reply code
// matched as a whole token, with an optional number range: the code tables
// providers publish (Cox, Spectrum, NetEase, GoDaddy) map such codes to
// meanings, and a substring would also find "IB510" in "IB5101". Its
// literal start is registered in the text index, so only replies that
// contain it are searched (tagPattern.match).

// nearPhrase is a compiled phrase with gaps: parts[i+1] must start after
// parts[i] ends, with at most gaps[i] words between them (-1: anywhere
// after).
type nearPhrase struct {
	parts []string // normalised, as in the text index
	ids   []uint16 // text index id of each part
	gaps  []int
}

// parseNear splits a normalised phrase at its gap words ("~", "~N") and
// reports whether it has any. A phrase without one is a plain phrase.
func parseNear(p string) (nearPhrase, bool, error) {
	words := strings.Split(p, " ")
	var np nearPhrase
	var cur []string
	gap := false
	for _, w := range words {
		g, ok := gapWord(w)
		if !ok {
			cur = append(cur, w)
			continue
		}
		gap = true
		if len(cur) == 0 {
			return np, true, fmt.Errorf("phrase %q: a gap (~ or ~N) must stand between two words", p)
		}
		np.parts = append(np.parts, strings.Join(cur, " "))
		np.gaps = append(np.gaps, g)
		cur = nil
	}
	if !gap {
		return np, false, nil
	}
	if len(cur) == 0 {
		return np, true, fmt.Errorf("phrase %q: a gap (~ or ~N) must stand between two words", p)
	}
	np.parts = append(np.parts, strings.Join(cur, " "))
	if len(np.parts) > maxNearParts {
		return np, true, fmt.Errorf("phrase %q: at most %d gaps", p, maxNearParts-1)
	}
	return np, true, nil
}

// maxNearParts bounds the parts of a near phrase.
const maxNearParts = 4

// The bounds that keep a near phrase's search linear in the text, whatever
// a remote server puts in its reply: a bounded gap spans at most
// nearWordMax octets per word it allows (a longer "word" is no word of a
// sentence), and only the first nearTextMax octets of a reply are searched
// for near phrases. Without them a reply of one long run without spaces
// in which a first part recurs ("exceedexceed…", 800 KB) took seconds: each
// place the first part starts scanned to the end of the text.
const (
	nearWordMax = 64
	nearTextMax = 16 << 10
)

// gapWord reports whether w is a gap word: "~" (anywhere after) or "~N"
// (at most N words between), N one digit.
func gapWord(w string) (int, bool) {
	if w == "~" {
		return -1, true
	}
	if len(w) == 2 && w[0] == '~' && isDigit(w[1]) {
		return int(w[1] - '0'), true
	}
	return 0, false
}

// present reports whether every part occurs somewhere in the text (m).
func (np *nearPhrase) present(m matchSet) bool {
	for _, id := range np.ids {
		if !m.has(id) {
			return false
		}
	}
	return true
}

// match reports whether the parts occur in text in order within their
// gaps, ignoring ASCII case and counting a whitespace run as one space.
func (np *nearPhrase) match(text string) bool {
	// failed[i] is the smallest position from which parts[i:] were not
	// found after an unbounded gap: they will not be found from any later
	// one either, so each unbounded gap is searched past a position once.
	if len(text) > nearTextMax {
		text = text[:nearTextMax]
	}
	var failed [maxNearParts]int
	for i := range failed {
		failed[i] = len(text) + 1
	}
	first := np.parts[0]
	for s := 0; s < len(text); s++ {
		if e, ok := matchAt(text, s, first); ok && np.rest(text, e, 1, &failed) {
			return true
		}
	}
	return false
}

// rest matches parts[i:] after position e, where parts[i-1] ended. The
// words between are the whitespace runs crossed, less one: adjacent words
// have one run between them, and a part may end or start inside a word
// (a stem: "exceed" in "exceeded").
func (np *nearPhrase) rest(text string, e, i int, failed *[maxNearParts]int) bool {
	if i == len(np.parts) {
		return true
	}
	part, gap := np.parts[i], np.gaps[i-1]
	if gap < 0 {
		if e >= failed[i] {
			return false
		}
		if np.restFrom(text, e, i, part, gap, failed) {
			return true
		}
		failed[i] = e
		return false
	}
	return np.restFrom(text, e, i, part, gap, failed)
}

func (np *nearPhrase) restFrom(text string, e, i int, part string, gap int, failed *[maxNearParts]int) bool {
	runs, inSpace := 0, false
	end := len(text)
	if gap >= 0 {
		end = min(end, e+(gap+1)*nearWordMax+len(part))
	}
	for s := e; s < end; s++ {
		if isSpace(text[s]) {
			if !inSpace {
				runs++
				if gap >= 0 && runs > gap+1 {
					return false
				}
			}
			inSpace = true
			continue
		}
		inSpace = false
		if end, ok := matchAt(text, s, part); ok && np.rest(text, end, i+1, failed) {
			return true
		}
	}
	return false
}

// matchAt reports whether the normalised phrase p occurs in text at s,
// ignoring ASCII case, a space in p matching any run of whitespace, and
// returns where it ends.
func matchAt(text string, s int, p string) (int, bool) {
	j := s
	for i := 0; i < len(p); i++ {
		if j >= len(text) {
			return 0, false
		}
		if p[i] == ' ' {
			if !isSpace(text[j]) {
				return 0, false
			}
			for j < len(text) && isSpace(text[j]) {
				j++
			}
			continue
		}
		if lower(text[j]) != p[i] {
			return 0, false
		}
		j++
	}
	return j, true
}

// tagPattern is a compiled tag: a literal start, then optionally a decimal
// number in [lo, hi] and a literal end, matched as a whole token (no ASCII
// letter or digit just before or just after).
type tagPattern struct {
	prefix string // lower case, not empty
	ranged bool
	lo, hi uint64
	suffix string // lower case
	id     uint16 // text index id of prefix
}

// parseTag compiles a tag as written in a rules file: "HL:ICC",
// "AUP#I-{1300-1340}", "IB{500-510}".
func parseTag(s string) (tagPattern, error) {
	var t tagPattern
	if s == "" {
		return t, fmt.Errorf("empty tag")
	}
	for i := 0; i < len(s); i++ {
		if isSpace(s[i]) {
			return t, fmt.Errorf("tag %q has a space (a tag is one token)", s)
		}
	}
	lit := s
	if i := strings.IndexByte(s, '{'); i >= 0 {
		j := strings.IndexByte(s, '}')
		if j < i {
			return t, fmt.Errorf("tag %q: want a range as {lo-hi}", s)
		}
		lo, hi, ok := strings.Cut(s[i+1:j], "-")
		var err1, err2 error
		t.lo, err1 = strconv.ParseUint(lo, 10, 32)
		t.hi, err2 = strconv.ParseUint(hi, 10, 32)
		if !ok || err1 != nil || err2 != nil || t.lo > t.hi {
			return t, fmt.Errorf("tag %q: want a range as {lo-hi}, lo <= hi", s)
		}
		t.ranged = true
		t.suffix = strings.ToLower(s[j+1:])
		if strings.ContainsAny(t.suffix, "{}") {
			return t, fmt.Errorf("tag %q: at most one range", s)
		}
		lit = s[:i]
	} else if strings.ContainsAny(s, "}") {
		return t, fmt.Errorf("tag %q: want a range as {lo-hi}", s)
	}
	if len(lit) < 2 {
		return t, fmt.Errorf("tag %q: want at least two characters before a range", s)
	}
	t.prefix = strings.ToLower(lit)
	return t, nil
}

func isAlnum(c byte) bool {
	c = lower(c)
	return 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
}

// match reports whether the tag occurs in text as a whole token.
func (t *tagPattern) match(text string) bool {
	for s := 0; s+len(t.prefix) <= len(text); s++ {
		if s > 0 && isAlnum(text[s-1]) && isAlnum(t.prefix[0]) {
			continue
		}
		e, ok := matchAt(text, s, t.prefix)
		if !ok {
			continue
		}
		if t.ranged {
			n, d := uint64(0), 0
			for e < len(text) && isDigit(text[e]) && d < 10 {
				n = n*10 + uint64(text[e]-'0')
				e++
				d++
			}
			if d == 0 || d == 10 || n < t.lo || n > t.hi {
				continue
			}
			if e, ok = matchAt(text, e, t.suffix); !ok {
				continue
			}
		}
		if e < len(text) && isAlnum(text[e]) && e > 0 && isAlnum(text[e-1]) {
			continue
		}
		return true
	}
	return false
}
