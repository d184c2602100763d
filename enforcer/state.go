package enforcer

import (
	"time"

	"github.com/sluice-rl/sluice/rules"
	"github.com/sluice-rl/sluice/rules/store"
)

// ruleState is what one decision sees: the static rule set, and the dynamic
// rules, shares and hot keys loaded with Refresh, swapped together so that a
// request sees one whole pair (see SetRules and Refresh).
type ruleState struct {
	static *rules.Set
	ctl    *store.Control
	// dyn indexes the dynamic rules that may apply; nil when none do or the
	// kill switch is on.
	dyn *rules.Set
	// dropped counts the dynamic rules left out because they could loosen
	// a static rule: one that takes a static rule's id (it would share, and
	// could raise, its bucket) or names rules to replace.
	dropped []string // their ids
	killed  bool
}

// newState pairs a static set with control state. Dynamic rules only ever
// add limits: every matching rule must allow, so a dynamic rule cannot loosen
// a static one, except by the two routes it is refused here.
// With noDynamic (Options.NoDynamic), or the kill switch on in Redis
// (ctl.Killed), none applies.
func newState(static *rules.Set, ctl *store.Control, noDynamic bool) *ruleState {
	st := &ruleState{static: static, ctl: ctl, killed: noDynamic || ctl.Killed}
	if st.killed || len(ctl.Rules) == 0 {
		return st
	}
	keep := make([]*rules.Rule, 0, len(ctl.Rules))
	for _, r := range ctl.Rules {
		if len(r.Replaces) > 0 || static.Rule(r.ID) != nil {
			st.dropped = append(st.dropped, r.ID)
			continue
		}
		keep = append(keep, r)
	}
	if len(keep) > 0 {
		st.dyn = rules.NewSet(static.Domain, 0, keep)
	}
	return st
}

// matchDynamic appends the dynamic rules that match d and have not expired
// at now (a rule lapses at its ExpiresAt even between refreshes).
func (st *ruleState) matchDynamic(d *rules.Descriptors, now func() time.Time, dst []*rules.Rule) []*rules.Rule {
	from := len(dst)
	dst = st.dyn.Match(d, dst)
	if len(dst) == from {
		return dst
	}
	t := now()
	out := dst[:from]
	for _, r := range dst[from:] {
		if r.ExpiresAt.IsZero() || t.Before(r.ExpiresAt) {
			out = append(out, r)
		}
	}
	return out
}
