package rules

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// ChangeKind says how a rule changed between two sets.
type ChangeKind uint8

const (
	Added ChangeKind = iota
	Removed
	Changed
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Removed:
		return "removed"
	}
	return "changed"
}

// FieldChange is one field's old and new value, as the YAML writes them
// ("" when absent).
type FieldChange struct {
	Field, Old, New string
}

// RuleChange is one rule added, removed or changed. Rule is the new rule
// (the old one when removed); Fields lists a changed rule's fields.
type RuleChange struct {
	Kind   ChangeKind
	ID     string
	Rule   *Rule
	Fields []FieldChange
}

// SetDiff is what differs between two rule sets: the domain, the route
// costs, and the rules by id (sorted by id). The zero value is no change.
type SetDiff struct {
	Domain *FieldChange
	Costs  []FieldChange // Field is the route
	Rules  []RuleChange
}

// Diff compares two rule sets; either may be nil (no rules). It does not
// compare versions.
func Diff(old, new *Set) SetDiff {
	if old == nil {
		old = &Set{}
	}
	if new == nil {
		new = &Set{}
	}
	var d SetDiff
	if old.Domain != new.Domain {
		d.Domain = &FieldChange{Field: "domain", Old: old.Domain, New: new.Domain}
	}
	routes := map[string]bool{}
	for r := range old.Costs {
		routes[r] = true
	}
	for r := range new.Costs {
		routes[r] = true
	}
	for _, r := range slices.Sorted(maps.Keys(routes)) {
		o, okO := old.Costs[r]
		n, okN := new.Costs[r]
		if okO != okN || o != n {
			d.Costs = append(d.Costs, FieldChange{Field: r, Old: costText(o, okO), New: costText(n, okN)})
		}
	}
	ids := map[string]bool{}
	for _, r := range old.Rules {
		ids[r.ID] = true
	}
	for _, r := range new.Rules {
		ids[r.ID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(ids)) {
		o, n := old.Rule(id), new.Rule(id)
		switch {
		case o == nil:
			d.Rules = append(d.Rules, RuleChange{Kind: Added, ID: id, Rule: n})
		case n == nil:
			d.Rules = append(d.Rules, RuleChange{Kind: Removed, ID: id, Rule: o})
		default:
			of, nf := ruleFields(o), ruleFields(n)
			var fs []FieldChange
			for i := range of {
				if of[i].v != nf[i].v {
					fs = append(fs, FieldChange{Field: of[i].name, Old: of[i].v, New: nf[i].v})
				}
			}
			if len(fs) > 0 {
				d.Rules = append(d.Rules, RuleChange{Kind: Changed, ID: id, Rule: n, Fields: fs})
			}
		}
	}
	return d
}

func costText(c int64, ok bool) string {
	if !ok {
		return ""
	}
	return strconv.FormatInt(c, 10)
}

type ruleField struct{ name, v string }

// ruleFields lists a rule's fields as the YAML writes them, in a fixed order.
func ruleFields(r *Rule) []ruleField {
	// Each condition as explain words it ("path prefix /admin/"); a key
	// alone takes any value.
	ms := make([]string, len(r.Match))
	for i := range r.Match {
		m := &r.Match[i]
		ms[i] = m.KeyName()
		if c := m.Condition(); c != "any value" {
			ms[i] += " " + c
		}
	}
	zone := ""
	if r.Location != nil {
		zone = r.Location.String()
	}
	period := ""
	if r.Period != 0 {
		period = r.Period.String()
	}
	return []ruleField{
		{"description", r.Description},
		{"match", strings.Join(ms, "; ")},
		{"algorithm", r.Algorithm.String()},
		{"limit", strconv.FormatInt(r.Limit, 10)},
		{"period", period},
		{"burst", strconv.FormatInt(r.Burst, 10)},
		{"calendar", r.Calendar.String()},
		{"timezone", zone},
		{"mode", r.Mode.String()},
		{"failure_mode", r.FailureMode.String()},
		{"global", strconv.FormatBool(r.Global)},
		{"pinned", strconv.FormatBool(r.Pinned)},
		{"g_counter", strconv.FormatBool(r.GCounter)},
		{"exact_keys", strconv.FormatBool(r.ExactKeys)},
		{"replaces", strings.Join(r.Replaces, ", ")},
		{"scope", r.Scope.String()},
		{"adaptive_floor", strconv.FormatFloat(r.AdaptiveFloor, 'g', -1, 64)},
	}
}

// Empty reports whether the sets are the same.
func (d *SetDiff) Empty() bool {
	return d.Domain == nil && len(d.Costs) == 0 && len(d.Rules) == 0
}

// Summary counts the rules added, removed and changed, e.g. "+1 -0 ~2", and
// notes a domain or cost change.
func (d *SetDiff) Summary() string {
	var n [3]int
	for _, c := range d.Rules {
		n[c.Kind]++
	}
	s := fmt.Sprintf("+%d -%d ~%d", n[Added], n[Removed], n[Changed])
	if d.Domain != nil {
		s += ", domain"
	}
	if len(d.Costs) > 0 {
		s += ", costs"
	}
	return s
}

// WriteTo writes the difference for people, one change a line:
//
//	domain: api → api2
//	+ per-user: 10 per 1s, burst 10 (token bucket), enforce
//	- old: 5 per 1m (sliding window), shadow
//	~ per-ip: match client_ip → client_ip; route = /login, limit 10 → 20
//	~ cost /v1/search: 5 → 10
func (d *SetDiff) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	if d.Domain != nil {
		fmt.Fprintf(&b, "domain: %s → %s\n", d.Domain.Old, d.Domain.New)
	}
	for _, c := range d.Rules {
		switch c.Kind {
		case Added:
			fmt.Fprintf(&b, "+ %s: %s\n", c.ID, c.Rule.Describe())
		case Removed:
			fmt.Fprintf(&b, "- %s: %s\n", c.ID, c.Rule.Describe())
		default:
			fs := make([]string, len(c.Fields))
			for i, f := range c.Fields {
				fs[i] = fmt.Sprintf("%s %s → %s", f.Field, orNone(f.Old), orNone(f.New))
			}
			fmt.Fprintf(&b, "~ %s: %s\n", c.ID, strings.Join(fs, ", "))
		}
	}
	for _, c := range d.Costs {
		fmt.Fprintf(&b, "~ cost %s: %s → %s\n", c.Field, orNone(c.Old), orNone(c.New))
	}
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
