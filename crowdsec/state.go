package crowdsec

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-rl/sluice/rules"
)

// state is the bouncer's picture of the Local API's active decisions,
// grouped into the rules they make: the I/O-free, single-threaded core of a
// Bouncer. apply takes each answer of the decision stream; desired gives
// the rules every region's Redis should hold. Not safe for concurrent use.
type state struct {
	m          Mapping
	groups     map[string]*group // by rule id
	byDecision map[int64]string  // decision id → rule id
	// refused holds the ids of decisions that make no rule, so that each
	// is counted and logged once, not again at every startup answer.
	refused map[int64]bool
}

// group is the decisions that make one rule.
type group struct {
	want
	decisions map[int64]held
	received  time.Time // when its first decision arrived: the lag's start, and the cap's order
}

// held is one decision of a group.
type held struct {
	until            time.Time
	origin, scenario string
	scope, value     string // as the Local API wrote them
}

// refused is a decision that makes no rule, to count and log.
type refused struct {
	d   Decision
	why *refusal
}

func newState(m Mapping) *state {
	m.defaults()
	return &state{m: m, groups: map[string]*group{}, byDecision: map[int64]string{}, refused: map[int64]bool{}}
}

// apply takes one answer of the decision stream, received at now: with
// startup, the answer is every active decision and replaces what the state
// held (a decision it already held keeps its expiry, so a resumed stream
// rewrites nothing); else it is the changes since the previous answer. It
// returns the decisions that make no rule (each once while it lasts), and
// whether the rules changed.
func (s *state) apply(st *Stream, startup bool, now time.Time) (out []refused, changed bool) {
	var prev map[int64]time.Time
	seen := s.refused
	if startup {
		s.refused = map[int64]bool{}
		prev = map[int64]time.Time{}
		for _, g := range s.groups {
			for id, h := range g.decisions {
				prev[id] = h.until
			}
		}
		changed = len(s.groups) > 0
		clear(s.groups)
		clear(s.byDecision)
	}
	for i := range st.Deleted {
		delete(s.refused, st.Deleted[i].ID)
		if s.remove(st.Deleted[i].ID) {
			changed = true
		}
	}
	for i := range st.New {
		d := &st.New[i]
		w, why := s.m.match(d)
		until, whyT := expiry(d, now)
		if why == nil {
			why = whyT
		}
		if why != nil {
			if !seen[d.ID] {
				out = append(out, refused{*d, why})
			}
			s.refused[d.ID] = true
			if s.remove(d.ID) { // a decision that changed into one sluice cannot express
				changed = true
			}
			continue
		}
		if t, ok := prev[d.ID]; ok {
			until = t
		}
		if old, ok := s.byDecision[d.ID]; ok && old != w.id {
			s.remove(d.ID)
		}
		g := s.groups[w.id]
		if g == nil {
			g = &group{want: w, decisions: map[int64]held{}, received: now}
			s.groups[w.id] = g
		}
		g.decisions[d.ID] = held{until: until, origin: d.Origin, scenario: d.Scenario, scope: d.Scope, value: d.Value}
		s.byDecision[d.ID] = w.id
		changed = true
	}
	return out, changed
}

// remove forgets one decision; it reports whether the state held it.
func (s *state) remove(id int64) bool {
	rid, ok := s.byDecision[id]
	if !ok {
		return false
	}
	delete(s.byDecision, id)
	if g := s.groups[rid]; g != nil {
		delete(g.decisions, id)
		if len(g.decisions) == 0 {
			delete(s.groups, rid)
		}
	}
	return true
}

// desired is the rules the decisions make, as every region should hold
// them: immutable once built, shared by the regions' goroutines.
type desired struct {
	rules []desiredRule // in the order a cap keeps them: bans first, then by arrival
	byID  map[string]int
	// decisions counts the decisions behind the rules.
	decisions int
}

// desiredRule is one rule with its true expiry (its ExpiresAt, which a
// region clamps to rules.MaxDynamicTTL at each write) and when its first
// decision arrived.
type desiredRule struct {
	rule     rules.Rule
	received time.Time
}

// desired builds the rules of the decisions still active at now, and
// returns the errors of rules that do not validate (none, with a Mapping
// whose limits ParseLimit took), which are left out.
func (s *state) desired(now time.Time) (*desired, []error) {
	out := &desired{byID: map[string]int{}}
	var bad []error
	for _, g := range s.groups {
		r, n := g.rule(s.m, now)
		if n == 0 {
			continue
		}
		if err := r.Validate(); err != nil {
			bad = append(bad, err)
			continue
		}
		out.rules = append(out.rules, desiredRule{rule: r, received: g.received})
		out.decisions += n
	}
	slices.SortFunc(out.rules, func(a, b desiredRule) int {
		if c := cmp.Compare(a.rule.Limit, b.rule.Limit); c != 0 { // 0: bans first
			return c
		}
		if c := a.received.Compare(b.received); c != 0 {
			return c
		}
		return strings.Compare(a.rule.ID, b.rule.ID)
	})
	for i := range out.rules {
		out.byID[out.rules[i].rule.ID] = i
	}
	return out, bad
}

// maxListed bounds the decision ids a rule's evidence lists.
const maxListed = 10

// rule builds the group's rule from its decisions active at now (n of
// them; none: no rule). Its origin, reason and scenario are those of the
// lowest decision id, so that they do not move while it lasts; it expires
// with its last decision.
func (g *group) rule(m Mapping, now time.Time) (rules.Rule, int) {
	ids := slices.Sorted(maps.Keys(g.decisions))
	var until time.Time
	var live []int64
	for _, id := range ids {
		if h := g.decisions[id]; h.until.After(now) {
			live = append(live, id)
			if h.until.After(until) {
				until = h.until
			}
		}
	}
	if len(live) == 0 {
		return rules.Rule{}, 0
	}
	first := g.decisions[live[0]]
	listed := make([]string, 0, min(len(live), maxListed))
	for _, id := range live[:min(len(live), maxListed)] {
		listed = append(listed, strconv.FormatInt(id, 10))
	}
	ds := strings.Join(listed, ",")
	if len(live) > maxListed {
		ds += fmt.Sprintf(" and %d more", len(live)-maxListed)
	}
	origin := clean(first.origin, 40)
	if origin == "" {
		origin = "unknown"
	}
	r := rules.Rule{
		ID:     g.id,
		Match:  []rules.Match{g.match},
		Limit:  g.limit.Limit,
		Period: g.limit.Period,
		Origin: Origin + origin,
		Reason: clean(fmt.Sprintf("CrowdSec %s on %s %s: %s", g.typ, first.scope, first.value, first.scenario), 200),
		Evidence: map[string]string{
			"crowdsec_decisions": ds,
			"crowdsec_type":      clean(g.typ, 40),
			"crowdsec_scope":     clean(first.scope, 40),
			"crowdsec_value":     clean(first.value, 100),
			"crowdsec_scenario":  clean(first.scenario, 200),
			"crowdsec_origin":    origin,
		},
		ExpiresAt: until,
		Version:   live[len(live)-1],
	}
	if m.Shadow {
		r.Mode = rules.Shadow
	}
	return r, len(live)
}
