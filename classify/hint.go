package classify

import (
	"strings"
	"time"
)

// maxHint caps a server's retry hint: a text that asks for more than a week
// is not a hint the backoff should follow, and capping keeps a typo ("try
// again in 99999999 hours") from overflowing time.Duration.
const maxHint = 7 * 24 * time.Hour

// retryHint reads a server's own retry hint from a reply text: "try again in
// 92 seconds", "retry in 5 minutes", "after 1 hour", "greylisted for 60
// seconds", "in 30s", "in a few hours" (read as 2 hours), "come back in
// 00:24:59" (hours, minutes, seconds). It returns 0 when
// the text gives none. The number must follow one of the words in, after,
// for, within or wait, so "sending over 5,000 emails per day" is no hint.
// It scans the text once and does not allocate.
func retryHint(text string) time.Duration {
	// The last three words before the current one, as substrings of text,
	// and whether each is a trigger word.
	var w1, w2, w3 string
	var t1, t2, t3 bool
	for i := 0; i < len(text); {
		if !alnumTab[text[i]] {
			i++
			continue
		}
		j := i + 1
		for j < len(text) && alnumTab[text[j]] {
			j++
		}
		w := text[i:j]
		// "come back in 00:24:59" (milter-greylist): a clock right after
		// the trigger word.
		if t1 {
			if d := clockAt(text[i:]); d > 0 {
				return d
			}
		}
		i = j
		// Most words follow no trigger word: skip them cheaply.
		if t1 || t2 || t3 {
			if d := hintAt(w3, w2, w1, w, t1, t2, t3); d > 0 {
				return d
			}
		}
		w3, w2, w1 = w2, w1, w
		t3, t2, t1 = t2, t1, isTrigger(w)
	}
	return 0
}

// hintAt reports the duration named by the words "trigger n unit", "trigger
// a few unit" or "trigger nUNIT" ending at w, or 0. tN says whether wN is a
// trigger word.
func hintAt(w3, w2, w1, w string, t1, t2, t3 bool) time.Duration {
	// "in 30s", "after 2h": number and unit in one word.
	if t1 {
		k := 0
		for k < len(w) && w[k] >= '0' && w[k] <= '9' {
			k++
		}
		if k > 0 && k < len(w) {
			if u := unit(w[k:]); u > 0 {
				return scale(number(w[:k]), u)
			}
		}
	}
	u := unit(w)
	if u == 0 {
		return 0
	}
	if n := number(w1); n > 0 && t2 {
		return scale(n, u)
	}
	// "in a few hours", "in several minutes".
	if strings.EqualFold(w1, "few") && strings.EqualFold(w2, "a") && t3 {
		return scale(2, u)
	}
	if strings.EqualFold(w1, "several") && t2 {
		return scale(3, u)
	}
	return 0
}

// clockAt reads a duration written H:MM:SS or HH:MM:SS at the start of s
// (milter-greylist's "please come back in 00:24:59"), or returns 0. Minutes
// and seconds must be two digits below 60, and the clock must not run on
// into more digits or colons.
func clockAt(s string) time.Duration {
	h := 0
	k := 0
	for k < len(s) && k < 3 && s[k] >= '0' && s[k] <= '9' {
		h = h*10 + int(s[k]-'0')
		k++
	}
	if k == 0 || k == 3 {
		return 0
	}
	var ms [2]int
	for p := range ms {
		if len(s) < k+3 || s[k] != ':' || !isDigit(s[k+1]) || !isDigit(s[k+2]) {
			return 0
		}
		ms[p] = int(s[k+1]-'0')*10 + int(s[k+2]-'0')
		if ms[p] >= 60 {
			return 0
		}
		k += 3
	}
	if k < len(s) && (isDigit(s[k]) || s[k] == ':') {
		return 0
	}
	d := time.Duration(h)*time.Hour + time.Duration(ms[0])*time.Minute + time.Duration(ms[1])*time.Second
	return min(d, maxHint)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func scale(n int, u time.Duration) time.Duration {
	if n <= 0 {
		return 0
	}
	if n > int(maxHint/u) {
		return maxHint
	}
	return time.Duration(n) * u
}

// isTrigger reports whether w (not empty) is a word a retry hint's number
// follows: in, for, wait, after or within, in any case.
func isTrigger(w string) bool {
	// Most words start with another letter: decide on it first.
	switch lower(w[0]) {
	case 'i', 'f', 'w', 'a':
	default:
		return false
	}
	switch len(w) {
	case 2:
		return strings.EqualFold(w, "in")
	case 3:
		return strings.EqualFold(w, "for")
	case 4:
		return strings.EqualFold(w, "wait")
	case 5:
		return strings.EqualFold(w, "after")
	case 6:
		return strings.EqualFold(w, "within")
	}
	return false
}

// number reads decimal digits or a small number word; 0 when w is neither.
func number(w string) int {
	if w == "" {
		return 0
	}
	if w[0] >= '0' && w[0] <= '9' {
		n := 0
		for i := 0; i < len(w); i++ {
			if w[i] < '0' || w[i] > '9' {
				return 0
			}
			if n > 1e9 {
				return n
			}
			n = n*10 + int(w[i]-'0')
		}
		return n
	}
	for _, nw := range numberWords {
		if strings.EqualFold(w, nw.word) {
			return nw.n
		}
	}
	return 0
}

var numberWords = []struct {
	word string
	n    int
}{
	{"a", 1}, {"an", 1}, {"one", 1}, {"two", 2}, {"three", 3}, {"four", 4},
	{"five", 5}, {"ten", 10}, {"fifteen", 15}, {"twenty", 20}, {"thirty", 30},
}

// unit returns the duration of one unit word, or 0. It is asked of most
// words that follow a trigger word ("for more information"), so it looks
// at the first letter before comparing whole words.
func unit(w string) time.Duration {
	if len(w) == 0 || len(w) > len("seconds") {
		return 0
	}
	var words []string
	var d time.Duration
	switch lower(w[0]) {
	case 's':
		words, d = unitSeconds, time.Second
	case 'm':
		words, d = unitMinutes, time.Minute
	case 'h':
		words, d = unitHours, time.Hour
	case 'd':
		words, d = unitDays, 24*time.Hour
	default:
		return 0
	}
	for _, u := range words {
		if len(u) == len(w) && strings.EqualFold(w, u) {
			return d
		}
	}
	return 0
}

// The unit words, by the unit they name.
var (
	unitSeconds = []string{"s", "sec", "secs", "second", "seconds"}
	unitMinutes = []string{"m", "min", "mins", "minute", "minutes"}
	unitHours   = []string{"h", "hr", "hrs", "hour", "hours"}
	unitDays    = []string{"day", "days"}
)

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// alnumTab marks the ASCII letters and digits that make up a word.
var alnumTab = func() (t [256]bool) {
	for c := 0; c < 256; c++ {
		t[c] = 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
	}
	return t
}()
