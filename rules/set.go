package rules

import (
	"slices"
	"strings"
)

// Set is an immutable, versioned collection of rules for one domain. The zero
// value is an empty set. A Set is safe for concurrent use; swap whole sets
// (e.g. through an atomic.Pointer) to change rules.
type Set struct {
	Domain  string
	Version int64
	Rules   []*Rule
	// Costs is the default cost (hits_addend) of a request per route
	// descriptor value, used when the request gives none; else 1.
	Costs map[string]int64
	// Shedding configures priority load shedding (the file's `shedding:`);
	// nil sheds nothing.
	Shedding *Shedding

	idx  *index           // built by NewSet; nil (a zero Set, or one built by hand) tries every rule
	byID map[string]*Rule // built by NewSet, for Rule
	// names are the custom keys the rules match and queryKeys those of them
	// filled from query parameters (QueryKeyPrefix); built by NewSet.
	names      map[string]bool
	customKeys []string // names, sorted
	queryKeys  []string
}

// MaxCost is the largest cost one request may have.
const MaxCost = 1 << 30

// Cost returns the cost of a request: its own hits_addend when > 0, else its
// route's default from Costs, else 1.
func (s *Set) Cost(requested uint32, route string) int64 {
	if requested > 0 {
		return int64(requested)
	}
	if s != nil && route != "" {
		if c, ok := s.Costs[route]; ok {
			return c
		}
	}
	return 1
}

// NewSet returns a set of the given rules, indexed for Match. The rules must
// be valid, and neither they nor rs may change afterwards.
func NewSet(domain string, version int64, rs []*Rule) *Set {
	byID := make(map[string]*Rule, len(rs))
	for _, r := range rs {
		if _, dup := byID[r.ID]; !dup { // the first, as a search in order finds
			byID[r.ID] = r
		}
	}
	names, query := customNames(rs)
	return &Set{Domain: domain, Version: version, Rules: rs, idx: newIndex(rs), byID: byID, names: names, customKeys: sortedKeys(names), queryKeys: query}
}

// customNames returns the custom keys that rules match, and those of them
// named after a query parameter, in rule order.
func customNames(rs []*Rule) (names map[string]bool, query []string) {
	names = map[string]bool{}
	for _, r := range rs {
		for i := range r.Match {
			m := &r.Match[i]
			if m.Key != KeyCustom || names[m.Name] {
				continue
			}
			names[m.Name] = true
			if strings.HasPrefix(m.Name, QueryKeyPrefix) {
				query = append(query, m.Name)
			}
		}
	}
	return names, query
}

// NamesKey reports whether the custom descriptor key name means anything to
// the set: a rule matches it, or the shedding block reads a priority from
// it. A request's entry under any other custom key matches no rule: a
// misspelt key (remote_adress) or one the rule file forgot.
func (s *Set) NamesKey(name string) bool {
	if s == nil {
		return false
	}
	if s.Shedding != nil && s.Shedding.PriorityKey == name {
		return true
	}
	if s.names != nil {
		return s.names[name]
	}
	names, _ := customNames(s.Rules)
	return names[name]
}

// CustomKeys returns the custom keys the set's rules match, sorted.
func (s *Set) CustomKeys() []string {
	if s == nil {
		return nil
	}
	if s.names != nil {
		return s.customKeys
	}
	names, _ := customNames(s.Rules)
	return sortedKeys(names)
}

func sortedKeys(m map[string]bool) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// QueryKeys returns the custom keys of the set's rules that name a query
// parameter (query:page): the enforcer fills each from the request path's
// query (see QueryParam). The slice is the set's: do not change it.
func (s *Set) QueryKeys() []string {
	if s == nil {
		return nil
	}
	if s.names != nil {
		return s.queryKeys
	}
	_, q := customNames(s.Rules)
	return q
}

// Match appends to dst the rules that match d, in set order, and returns it.
// It allocates nothing when dst has room. A set from NewSet or Parse finds
// them through an index (a hash lookup per descriptor the request carries,
// see index); one built as a struct literal tries every rule.
func (s *Set) Match(d *Descriptors, dst []*Rule) []*Rule {
	if s == nil {
		return dst
	}
	if s.idx != nil {
		return s.idx.match(d, dst)
	}
	for _, r := range s.Rules {
		if r.Matches(d) {
			dst = append(dst, r)
		}
	}
	return dst
}

// Rule returns the rule with the given id, or nil.
func (s *Set) Rule(id string) *Rule {
	if s == nil {
		return nil
	}
	if s.byID != nil {
		return s.byID[id]
	}
	for _, r := range s.Rules {
		if r.ID == id {
			return r
		}
	}
	return nil
}
