package classify

import "strings"

// textIndex finds, in one pass over a reply text, every rule phrase that
// occurs in it: an Aho-Corasick automaton over all phrases of all rules,
// compiled into a dense transition table. Matching ignores ASCII case and
// treats any run of spaces, tabs and line breaks as one space, so a phrase
// matches across the line breaks of a multi-line reply. Without it, each
// rule would search the text again, and a hundred rules would cost a
// hundred passes.
type textIndex struct {
	class  [256]uint8 // byte -> alphabet class; 0 for bytes in no phrase
	nclass int        // alphabet size, including class 0
	// stride is the length of a state's row in delta: nclass transitions,
	// then one column that says where the state's outputs start in outs
	// (they end where the next row's start). delta[state*stride+class] is
	// next*stride: the scan moves without multiplying, and finds a state's
	// outputs without dividing. States are numbered so that those where
	// phrases end come last, from outBase on: testing for output is one
	// comparison off the critical path of the next load. A last row,
	// never entered, closes the outputs of the last state.
	stride  int
	delta   []int32
	outBase int32 // offset (state*stride) of the first state with output
	outs    []uint16
	phrases []string // by id, normalised
	ids     map[string]uint16
}

// maxPhrases bounds the phrase ids (uint16) and keeps the per-call match
// set on the stack for the usual case (see matchSet).
const maxPhrases = 1 << 16

// stackWords is the size, in 64-bit words, of the bit sets Classify keeps
// on the stack (the phrases found, the candidate rules): up to 1,024
// phrases and rules it does not allocate. The embedded rules have 566
// phrases: with room for 512 (8 words), every classification allocated
// its sets, and an operator's rules file only adds to them.
const stackWords = 16

// normPhrase lower-cases ASCII letters and collapses whitespace runs to one
// space, the same folding the scan applies to reply text.
func normPhrase(p string) string {
	var b strings.Builder
	space := true // drop leading spaces
	for i := 0; i < len(p); i++ {
		c := p[i]
		if isSpace(c) {
			if !space {
				b.WriteByte(' ')
			}
			space = true
			continue
		}
		space = false
		b.WriteByte(lower(c))
	}
	return strings.TrimRight(b.String(), " ")
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'
}

// add registers a phrase (already normalised, not empty) and returns its id.
func (x *textIndex) add(p string) uint16 {
	if x.ids == nil {
		x.ids = make(map[string]uint16)
	}
	if id, ok := x.ids[p]; ok {
		return id
	}
	id := uint16(len(x.phrases))
	x.ids[p] = id
	x.phrases = append(x.phrases, p)
	return id
}

// build compiles the automaton once every phrase has been added.
func (x *textIndex) build() {
	// Alphabet: one class per distinct byte used in a phrase; upper case
	// shares the lower-case class, every whitespace byte the space class.
	x.nclass = 1
	for _, p := range x.phrases {
		for i := 0; i < len(p); i++ {
			if c := p[i]; x.class[c] == 0 {
				x.class[c] = uint8(x.nclass)
				x.nclass++
			}
		}
	}
	for c := 'A'; c <= 'Z'; c++ {
		x.class[c] = x.class[c+'a'-'A']
	}
	for _, c := range []byte{'\t', '\r', '\n', '\v', '\f'} {
		x.class[c] = x.class[' ']
	}

	// Trie, with -1 for missing edges.
	k := x.nclass
	x.delta = make([]int32, k)
	for i := range x.delta {
		x.delta[i] = -1
	}
	own := [][]uint16{nil}
	var spaceStates []int32 // states entered by a space
	for id, p := range x.phrases {
		s := int32(0)
		for i := 0; i < len(p); i++ {
			c := int32(x.class[p[i]])
			next := x.delta[s*int32(k)+c]
			if next < 0 {
				next = int32(len(own))
				own = append(own, nil)
				x.delta[s*int32(k)+c] = next
				if p[i] == ' ' {
					spaceStates = append(spaceStates, next)
				}
				for j := 0; j < k; j++ {
					x.delta = append(x.delta, -1)
				}
			}
			s = next
		}
		own[s] = append(own[s], uint16(id))
	}

	// Breadth-first: failure links, and missing edges filled from the
	// failure state's, so the scan never follows a failure link.
	n := len(own)
	fail := make([]int32, n)
	out := make([][]uint16, n)
	queue := make([]int32, 0, n)
	for c := 0; c < k; c++ {
		if t := x.delta[c]; t < 0 {
			x.delta[c] = 0
		} else {
			fail[t] = 0
			queue = append(queue, t)
		}
	}
	out[0] = own[0]
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		out[s] = append(append([]uint16(nil), own[s]...), out[fail[s]]...)
		for c := 0; c < k; c++ {
			t := x.delta[int(s)*k+c]
			f := x.delta[int(fail[s])*k+c]
			if t < 0 {
				x.delta[int(s)*k+c] = f
				continue
			}
			fail[t] = f
			queue = append(queue, t)
		}
	}
	// Whitespace runs count as one space: a state entered by a space stays
	// put on the next one. (Any other state that sees a space is not in
	// the middle of one, because a state's prefix ends with the byte that
	// entered it, and no phrase starts with a space.) This keeps the
	// collapsing out of the scan loop.
	if sp := x.class[' ']; sp != 0 {
		for _, s := range spaceStates {
			x.delta[int(s)*k+int(sp)] = s
		}
	}

	// Renumber: the root stays 0, states without output next, states with
	// output last.
	newID := make([]int32, n)
	next := int32(0)
	for s := 0; s < n; s++ {
		if s == 0 || len(out[s]) == 0 {
			newID[s] = next
			next++
		}
	}
	x.outBase = next * int32(k)
	for s := 1; s < n; s++ {
		if len(out[s]) > 0 {
			newID[s] = next
			next++
		}
	}
	stride := k + 1
	x.stride = stride
	x.outBase = x.outBase / int32(k) * int32(stride)
	delta := make([]int32, (n+1)*stride)
	outs := make([][]uint16, n)
	for s := 0; s < n; s++ {
		ns := int(newID[s])
		outs[ns] = out[s]
		for c := 0; c < k; c++ {
			delta[ns*stride+c] = newID[x.delta[s*k+c]] * int32(stride)
		}
	}
	x.delta = delta
	for s := 0; s <= n; s++ {
		x.delta[s*stride+k] = int32(len(x.outs))
		if s < n {
			x.outs = append(x.outs, outs[s]...)
		}
	}
}

// matchSet is a bit set of phrase ids.
type matchSet []uint64

func (m matchSet) has(id uint16) bool { return m[id>>6]&(1<<(id&63)) != 0 }

// any reports whether m and mask (of the same length) share a phrase.
func (m matchSet) any(mask matchSet) bool {
	mask = mask[:len(m)]
	for i, w := range m {
		if w&mask[i] != 0 {
			return true
		}
	}
	return false
}

// scan marks in m every phrase that occurs in text.
func (x *textIndex) scan(text string, m matchSet) {
	if len(x.phrases) == 0 {
		return
	}
	out := int32(x.nclass)        // column of a row's first output
	next := int32(x.stride) + out // the same column of the next row
	delta := x.delta
	class := &x.class
	base := x.outBase
	off := int32(0) // current state * stride
	for _, b := range []byte(text) {
		off = delta[uint32(off)+uint32(class[b])]
		if off >= base {
			for _, id := range x.outs[delta[off+out]:delta[off+next]] {
				m[id>>6] |= 1 << (id & 63)
			}
		}
	}
}
