package rules

import (
	"net/netip"
	"slices"
)

// index finds the rules that match a request without trying each one. Every
// rule is filed under one anchor, the most selective of its conditions that
// a hash lookup can find: an exact value or list of values of a well-known
// or custom key, or a client_ip network (one table per prefix length, looked
// up with the request's address masked to that length, as a longest-prefix
// match done by hashing). Rules with no such condition (any value, prefix,
// wildcard, template) are tried one by one. A request then costs one lookup
// per key it carries and per prefix length, plus the unanchored rules.
type index struct {
	rules  []*Rule
	exact  [NumKeys]map[string][]int32
	custom map[string]map[string][]int32 // custom key name → value → rules
	cidrs  []cidrTable                   // by prefix length, IPv4 and IPv6
	scan   []int32                       // rules without an anchor
	// replaces is set when some rule replaces others (see Rule.Replaces).
	replaces bool
}

type cidrTable struct {
	bits int
	v6   bool
	m    map[netip.Prefix][]int32
}

func newIndex(rs []*Rule) *index {
	x := &index{rules: rs}
	for i, r := range rs {
		pos := int32(i)
		if len(r.Replaces) > 0 {
			x.replaces = true
		}
		m := anchor(r)
		switch {
		case m == nil:
			x.scan = append(x.scan, pos)
		case len(m.CIDR) > 0:
			for _, p := range m.CIDR {
				x.cidrTable(p.Bits(), p.Addr().Is6())[p] = appendOnce(x.cidrTable(p.Bits(), p.Addr().Is6())[p], pos)
			}
		default:
			vals := m.Values
			if m.Value != "" {
				vals = []string{m.Value}
			}
			var t map[string][]int32
			if m.Key == KeyCustom {
				if x.custom == nil {
					x.custom = map[string]map[string][]int32{}
				}
				if x.custom[m.Name] == nil {
					x.custom[m.Name] = map[string][]int32{}
				}
				t = x.custom[m.Name]
			} else {
				if x.exact[m.Key] == nil {
					x.exact[m.Key] = map[string][]int32{}
				}
				t = x.exact[m.Key]
			}
			for _, v := range vals {
				t[v] = appendOnce(t[v], pos)
			}
		}
	}
	// Longer prefixes first: the order of lookups does not change the result
	// (matches are sorted back into set order) but keeps it stable.
	slices.SortFunc(x.cidrs, func(a, b cidrTable) int { return b.bits - a.bits })
	return x
}

func appendOnce(s []int32, pos int32) []int32 {
	if len(s) > 0 && s[len(s)-1] == pos {
		return s
	}
	return append(s, pos)
}

func (x *index) cidrTable(bits int, v6 bool) map[netip.Prefix][]int32 {
	for i := range x.cidrs {
		if x.cidrs[i].bits == bits && x.cidrs[i].v6 == v6 {
			return x.cidrs[i].m
		}
	}
	x.cidrs = append(x.cidrs, cidrTable{bits: bits, v6: v6, m: map[netip.Prefix][]int32{}})
	return x.cidrs[len(x.cidrs)-1].m
}

// anchor picks the condition a rule is filed under: an exact value before a
// list (a list files the rule once per value), a list before a network; nil
// when the rule has none of them.
func anchor(r *Rule) *Match {
	var best *Match
	rank := func(m *Match) int {
		switch {
		case m.Value != "":
			return 3
		case len(m.Values) > 0:
			return 2
		case len(m.CIDR) > 0:
			return 1
		}
		return 0
	}
	for i := range r.Match {
		m := &r.Match[i]
		if m.IgnoreCase {
			continue // a hash lookup finds only the exact case
		}
		if rank(m) > 0 && (best == nil || rank(m) > rank(best)) {
			best = m
		}
	}
	return best
}

// maxFound bounds the matches one lookup sorts on the stack; past it, match
// tries every rule instead (still correct, only slower).
const maxFound = 128

// match appends the rules that match d to dst, in set order.
func (x *index) match(d *Descriptors, dst []*Rule) []*Rule {
	var found [maxFound]int32
	n := 0
	overflow := false
	try := func(ps []int32) {
		for _, p := range ps {
			if !x.rules[p].Matches(d) {
				continue
			}
			if slices.Contains(found[:n], p) {
				continue // a rule filed under two networks the address is in
			}
			if n == maxFound {
				overflow = true
				return
			}
			found[n] = p
			n++
		}
	}
	for k := range NumKeys {
		if t := x.exact[k]; t != nil && d[k] != "" {
			try(t[d[k]])
		}
	}
	if x.custom != nil {
		for i := int(NumKeys); i < len(d); i += 2 {
			if d[i] == "" || d[i+1] == "" {
				continue
			}
			if t := x.custom[d[i]]; t != nil {
				try(t[d[i+1]])
			}
		}
	}
	if len(x.cidrs) > 0 && d[KeyClientIP] != "" {
		if a, bits, ok := ipValue(d[KeyClientIP]); ok {
			for i := range x.cidrs {
				c := &x.cidrs[i]
				if c.v6 != a.Is6() || c.bits > bits {
					continue
				}
				if p, err := a.Prefix(c.bits); err == nil {
					try(c.m[p])
				}
			}
		}
	}
	try(x.scan)
	if overflow {
		for _, r := range x.rules {
			if r.Matches(d) {
				dst = append(dst, r)
			}
		}
		return dst
	}
	// Insertion sort: n is small, and slices.Sort would not allocate either
	// but costs more for a handful.
	for i := 1; i < n; i++ {
		for j := i; j > 0 && found[j] < found[j-1]; j-- {
			found[j], found[j-1] = found[j-1], found[j]
		}
	}
	for _, p := range found[:n] {
		dst = append(dst, x.rules[p])
	}
	return dst
}

// Replaced removes from matched, in place, every rule that another rule in
// matched replaces (see Rule.Replaces), keeping the order, and returns the
// shortened slice. It allocates nothing for up to 128 rules.
func Replaced(matched []*Rule) []*Rule {
	if !AnyReplaces(matched) {
		return matched
	}
	var stack [maxFound]bool
	gone := stack[:0]
	if len(matched) > maxFound {
		gone = make([]bool, 0, len(matched))
	}
	for i := range matched { // decide everything before moving anything
		gone = append(gone, IsReplaced(matched, i))
	}
	out := matched[:0]
	for i, r := range matched {
		if !gone[i] {
			out = append(out, r)
		}
	}
	return out
}

// AnyReplaces reports whether a rule in matched replaces others.
func AnyReplaces(matched []*Rule) bool {
	for _, r := range matched {
		if len(r.Replaces) > 0 {
			return true
		}
	}
	return false
}

// IsReplaced reports whether another rule in matched replaces matched[i].
func IsReplaced(matched []*Rule, i int) bool { return Replacer(matched, i) != nil }

// Replacer returns the rule in matched that replaces matched[i], or nil. A
// rule in shadow mode replaces nothing: trying an override in shadow mode
// must not lift the limit it would replace.
func Replacer(matched []*Rule, i int) *Rule {
	for j, o := range matched {
		if j != i && o.Mode != Shadow && slices.Contains(o.Replaces, matched[i].ID) {
			return o
		}
	}
	return nil
}
