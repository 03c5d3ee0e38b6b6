package classify

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// The automaton must find exactly what a naive search of the folded text
// finds: ASCII case ignored, whitespace runs read as one space.
func TestTextIndexMatchesNaiveSearch(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const alphabet = "abAB \t\r\n-.1"
	word := func(n int) string {
		var b strings.Builder
		for range n {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		return b.String()
	}
	for round := 0; round < 200; round++ {
		var x textIndex
		var phrases []string
		for range 1 + rng.IntN(12) {
			if p := normPhrase(word(1 + rng.IntN(5))); p != "" {
				x.add(p)
				phrases = append(phrases, p)
			}
		}
		x.build()
		for range 20 {
			text := word(rng.IntN(40))
			m := make(matchSet, (len(x.phrases)+63)/64)
			x.scan(text, m)
			folded := normPhrase(text)
			for _, p := range phrases {
				id := x.ids[p]
				if want := strings.Contains(folded, p); m.has(id) != want {
					t.Fatalf("phrase %q in %q (folded %q): got %v, want %v", p, text, folded, m.has(id), want)
				}
			}
		}
	}
}

func TestTextIndexAcrossLines(t *testing.T) {
	var x textIndex
	id := x.add(normPhrase("temporarily  Rate\tlimited"))
	x.build()
	m := make(matchSet, 1)
	x.scan("has been temporarily\r\n   RATE LIMITED.", m)
	if !m.has(id) {
		t.Error("phrase split over a line break not found")
	}
}
