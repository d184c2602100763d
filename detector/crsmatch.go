package detector

import (
	"fmt"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode/utf8"
)

// The native evaluator's prefilter: one pass of a multi-pattern automaton
// (Aho-Corasick, "Efficient string matching: an aid to bibliographic
// search", CACM 18(6), 1975) over a transformed value says which rules can
// match it. Its patterns are the phrases of every @pm and @pmFromFile rule
// (whose verdict it gives outright: the phrase is there or not) and, for
// every @rx rule, a set of literals one of which each match of the regular
// expression contains (rxLiterals): a rule none of whose literals is in the
// value is not run. Matching is ASCII case-insensitive, as @pm's is, which
// keeps the literals of a case-sensitive expression a necessary condition.

// crsMaskWords bounds the rules an automaton reports on: 64 per word.
const crsMaskWords = 4

// ruleMask is a set of rule indexes.
type ruleMask [crsMaskWords]uint64

func (m *ruleMask) set(i int)      { m[i/64] |= 1 << (i % 64) }
func (m *ruleMask) has(i int) bool { return m[i/64]&(1<<(i%64)) != 0 }
func (m *ruleMask) or(o *ruleMask) {
	m[0], m[1], m[2], m[3] = m[0]|o[0], m[1]|o[1], m[2]|o[2], m[3]|o[3]
}
func (m *ruleMask) isZero() bool { return m[0]|m[1]|m[2]|m[3] == 0 }
func (m *ruleMask) andNot(o *ruleMask) {
	m[0], m[1], m[2], m[3] = m[0]&^o[0], m[1]&^o[1], m[2]&^o[2], m[3]&^o[3]
}

// phraseMatcher is a deterministic Aho-Corasick automaton over ASCII
// case-folded bytes whose states report the ids (bits of a set of words
// 64-bit words) of the phrases that end there. Built once, read by any
// number of goroutines.
type phraseMatcher struct {
	class  [256]uint8 // byte -> input class (0: in no phrase)
	nclass int
	words  int
	delta  []uint32 // state*nclass+class -> state
	out    []uint32 // state -> index of its output set in masks (0: none)
	masks  []uint64 // distinct output sets, words each
}

// newPhraseMatcher builds the automaton: phrases[i] reports id ids[i], in
// sets of (max id)/64+1 words.
func newPhraseMatcher(phrases []string, ids []int) *phraseMatcher {
	m := &phraseMatcher{words: 1}
	for _, id := range ids {
		m.words = max(m.words, id/64+1)
	}
	for _, p := range phrases {
		for i := 0; i < len(p); i++ {
			m.class[foldByte(p[i])] = 1
		}
	}
	for c := range 256 {
		if m.class[c] != 0 {
			m.nclass++
			m.class[c] = uint8(m.nclass)
		}
	}
	m.nclass++
	for c := range 256 {
		m.class[c] = m.class[foldByte(byte(c))]
	}
	// The trie, with its outputs.
	w := m.words
	type node struct{ next map[uint8]uint32 }
	nodes := []node{{next: map[uint8]uint32{}}}
	outs := make([]uint64, w)
	for i, p := range phrases {
		s := uint32(0)
		for j := 0; j < len(p); j++ {
			c := m.class[p[j]]
			t, ok := nodes[s].next[c]
			if !ok {
				t = uint32(len(nodes))
				nodes = append(nodes, node{next: map[uint8]uint32{}})
				outs = append(outs, make([]uint64, w)...)
				nodes[s].next[c] = t
			}
			s = t
		}
		outs[int(s)*w+ids[i]/64] |= 1 << (ids[i] % 64)
	}
	// Breadth first: failure links folded into full transitions, and
	// each state's output merged with its failure state's.
	n := len(nodes)
	m.delta = make([]uint32, n*m.nclass)
	queue := make([]uint32, 0, n)
	fail := make([]uint32, n)
	for c := 0; c < m.nclass; c++ {
		if t, ok := nodes[0].next[uint8(c)]; ok {
			m.delta[c] = t
			queue = append(queue, t)
		}
	}
	for len(queue) > 0 {
		s := queue[0]
		queue = queue[1:]
		for k := range w {
			outs[int(s)*w+k] |= outs[int(fail[s])*w+k]
		}
		for c := 0; c < m.nclass; c++ {
			t, ok := nodes[s].next[uint8(c)]
			if !ok {
				m.delta[int(s)*m.nclass+c] = m.delta[int(fail[s])*m.nclass+c]
				continue
			}
			fail[t] = m.delta[int(fail[s])*m.nclass+c]
			m.delta[int(s)*m.nclass+c] = t
			queue = append(queue, t)
		}
	}
	m.out = make([]uint32, n)
	m.masks = make([]uint64, w)
	index := map[string]uint32{fmt.Sprint(make([]uint64, w)): 0}
	for s := range n {
		set := outs[s*w : (s+1)*w]
		key := fmt.Sprint(set)
		i, ok := index[key]
		if !ok {
			i = uint32(len(m.masks) / w)
			m.masks = append(m.masks, set...)
			index[key] = i
		}
		m.out[s] = i
	}
	return m
}

// scan adds to dst (words long) the ids of the phrases in s.
func (m *phraseMatcher) scan(s string, dst []uint64) {
	state, nc, w := uint32(0), m.nclass, m.words
	last := uint32(0)
	for i := 0; i < len(s); i++ {
		state = m.delta[int(state)*nc+int(m.class[s[i]])]
		if o := m.out[state]; o != 0 && o != last {
			for k, x := range m.masks[int(o)*w : int(o+1)*w] {
				dst[k] |= x
			}
			last = o
		}
	}
}

func foldByte(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// foldsBeyondASCII reports whether s holds a code point that Go's
// case-insensitive matching folds to an ASCII letter: U+017F (long s, to
// s) and U+212A (the Kelvin sign, to k). The prefilter, which folds ASCII
// only, cannot vouch for such a value.
func foldsBeyondASCII(s string) bool {
	return strings.Contains(s, "\u017f") || strings.Contains(s, "\u212a")
}

// litSet is what rxLiterals knows of a subexpression: nothing (any), or a
// set of strings one of which each of its matches contains; exact when
// each match is one of them, whole, so that neighbours can be joined.
type litSet struct {
	any   bool
	exact bool
	s     []string
}

const (
	maxLitCross = 64   // strings a concatenation's product may hold
	maxLitUnion = 4096 // strings an alternation may hold
	maxLitClass = 16   // runes a character class may hold
)

var anyLits = litSet{any: true}

// rxLiterals returns lower-case ASCII literals one of which every match of
// the regular expression expr contains, or nil when it finds no such set
// (the expression can match without any literal, or only by non-ASCII
// ones). It errs on the side of nil: a set it returns is a necessary
// condition, never a guess.
func rxLiterals(expr string) []string {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return nil
	}
	l := literals(re.Simplify())
	if l.any || len(l.s) == 0 || slices.Contains(l.s, "") {
		return nil
	}
	slices.Sort(l.s)
	return slices.Compact(l.s)
}

// foldRune folds a rune as the prefilter compares: ASCII to lower case, the
// two non-ASCII runes that fold to ASCII letters to them; ok false for
// any other non-ASCII rune.
func foldRune(r rune) (byte, bool) {
	switch {
	case r < utf8.RuneSelf:
		return foldByte(byte(r)), true
	case r == 0x17f:
		return 's', true
	case r == 0x212a:
		return 'k', true
	}
	return 0, false
}

func literals(re *syntax.Regexp) litSet {
	switch re.Op {
	case syntax.OpLiteral:
		// A literal with a non-ASCII rune still contains its ASCII runs.
		var runs []string
		var b []byte
		for _, r := range re.Rune {
			c, ok := foldRune(r)
			if !ok {
				runs = append(runs, string(b))
				b = b[:0]
				continue
			}
			b = append(b, c)
		}
		if len(runs) == 0 {
			return litSet{exact: true, s: []string{string(b)}}
		}
		runs = append(runs, string(b))
		longest := ""
		for _, r := range runs {
			if len(r) > len(longest) {
				longest = r
			}
		}
		if longest == "" {
			return anyLits
		}
		return litSet{s: []string{longest}}
	case syntax.OpCharClass:
		var set []string
		n := 0
		for i := 0; i+1 < len(re.Rune); i += 2 {
			n += int(re.Rune[i+1]-re.Rune[i]) + 1
			if n > maxLitClass {
				return anyLits
			}
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				c, ok := foldRune(r)
				if !ok {
					return anyLits
				}
				set = append(set, string(c))
			}
		}
		slices.Sort(set)
		return litSet{exact: true, s: slices.Compact(set)}
	case syntax.OpEmptyMatch, syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText,
		syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return litSet{exact: true, s: []string{""}}
	case syntax.OpCapture:
		return literals(re.Sub[0])
	case syntax.OpPlus:
		l := literals(re.Sub[0])
		l.exact = false
		return l
	case syntax.OpRepeat:
		if re.Min < 1 {
			return anyLits
		}
		l := literals(re.Sub[0])
		l.exact = l.exact && re.Min == 1 && re.Max == 1
		return l
	case syntax.OpQuest:
		l := literals(re.Sub[0])
		if l.any || !l.exact || len(l.s) >= maxLitUnion {
			return anyLits
		}
		return litSet{exact: true, s: append([]string{""}, l.s...)}
	case syntax.OpAlternate:
		out := litSet{exact: true}
		for _, sub := range re.Sub {
			l := literals(sub)
			if l.any || len(out.s)+len(l.s) > maxLitUnion {
				return anyLits
			}
			out.exact = out.exact && l.exact
			out.s = append(out.s, l.s...)
		}
		return out
	case syntax.OpConcat:
		return concatLiterals(re.Sub)
	}
	return anyLits
}

// concatLiterals joins the exact sets of neighbouring subexpressions into
// longer strings (up to maxLitCross of them) and returns the best run: the
// set whose shortest string is longest, then the smallest.
func concatLiterals(subs []*syntax.Regexp) litSet {
	var best litSet
	bestScore := -1
	consider := func(l litSet) {
		if l.any || len(l.s) == 0 {
			return
		}
		score := len(l.s[0])
		for _, s := range l.s {
			score = min(score, len(s))
		}
		if score > bestScore || score == bestScore && len(l.s) < len(best.s) {
			best, bestScore = litSet{s: l.s}, score
		}
	}
	cur := litSet{exact: true, s: []string{""}}
	whole := true
	for _, sub := range subs {
		l := literals(sub)
		if !l.any && l.exact && len(cur.s)*len(l.s) <= maxLitCross {
			var next []string
			for _, a := range cur.s {
				for _, b := range l.s {
					next = append(next, a+b)
				}
			}
			cur.s = next
			continue
		}
		whole = false
		consider(cur)
		cur = litSet{exact: true, s: []string{""}}
		if !l.any && l.exact {
			cur = l
		} else {
			consider(l)
		}
	}
	if whole {
		return cur
	}
	consider(cur)
	if bestScore <= 0 {
		return anyLits
	}
	return best
}
