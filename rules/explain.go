package rules

import (
	"fmt"
	"slices"
)

// Explanation says why one rule does or does not apply to a request.
type Explanation struct {
	Rule    *Rule
	Matched bool // the rule matched the descriptors
	// ReplacedBy is the id of a matching rule that replaces this one (it
	// then does not apply, though it matched); "" if none.
	ReplacedBy string
	// Why lists, for a match, each condition and the value that passed it;
	// for a miss, the first condition that failed and why.
	Why []string
}

// Applies reports whether the rule is enforced (or, in shadow mode,
// evaluated) for the request.
func (e *Explanation) Applies() bool { return e.Matched && e.ReplacedBy == "" }

// Explain tells, for every rule of s in order, whether it applies to a
// request with descriptors d and why: for `sluice rules explain`. It is not
// for the request path (it allocates).
func Explain(s *Set, d *Descriptors) []Explanation {
	out := make([]Explanation, 0, len(s.Rules))
	var matched []*Rule
	for _, r := range s.Rules {
		e := Explanation{Rule: r, Matched: true}
		for i := range r.Match {
			m := &r.Match[i]
			v := d.Get(m.Key, m.Name)
			switch {
			case v == "":
				e.Matched = false
				e.Why = []string{fmt.Sprintf("the request has no %s", m.KeyName())}
			case !m.Passes(v):
				e.Matched = false
				e.Why = []string{fmt.Sprintf("%s %q fails %s", m.KeyName(), v, m.Condition())}
			default:
				e.Why = append(e.Why, fmt.Sprintf("%s %q passes %s", m.KeyName(), v, m.Condition()))
			}
			if !e.Matched {
				break
			}
		}
		if e.Matched && r.ExactKeys && !r.onlyKeys(d) {
			e.Matched = false
			e.Why = []string{"exact_keys: the request carries other keys than the rule's"}
		}
		if e.Matched {
			matched = append(matched, r)
		}
		out = append(out, e)
	}
	for i := range out {
		if !out[i].Matched {
			continue
		}
		j := slices.Index(matched, out[i].Rule)
		if o := Replacer(matched, j); o != nil {
			out[i].ReplacedBy = o.ID
		}
	}
	return out
}
