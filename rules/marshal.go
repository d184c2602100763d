package rules

import (
	"bytes"
	"fmt"
	"slices"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"
)

// Marshal writes a Set in the YAML rule format that Parse reads, so that
// Parse(Marshal(s)) gives back an equal Set: version (when not 1), domain,
// custom_keys (every custom key the rules match, sorted), rules in set
// order with only the fields that differ from their defaults, and costs
// sorted by route. A rule's DetailedMetric has no field in the format and is
// written as a comment. Dynamic rules (see Rule.Dynamic) have no YAML form
// and are an error.
func Marshal(s *Set) ([]byte, error) {
	return marshal(s, "", nil)
}

// marshal is Marshal with a comment above the file (head) and above rules
// (by id).
func marshal(s *Set, head string, notes map[string]string) ([]byte, error) {
	top := &yaml.Node{Kind: yaml.MappingNode, HeadComment: head}
	field := func(m *yaml.Node, k string, v *yaml.Node) {
		m.Content = append(m.Content, yamlStr(k), v)
	}
	if s.Version != 0 && s.Version != 1 {
		field(top, "version", yamlInt(s.Version))
	}
	field(top, "domain", yamlStr(s.Domain))
	var custom []string
	for _, r := range s.Rules {
		for i := range r.Match {
			if m := &r.Match[i]; m.Key == KeyCustom && !slices.Contains(custom, m.Name) {
				custom = append(custom, m.Name)
			}
		}
	}
	if len(custom) > 0 {
		slices.Sort(custom)
		field(top, "custom_keys", yamlStrs(custom))
	}
	list := &yaml.Node{Kind: yaml.SequenceNode}
	for _, r := range s.Rules {
		if r.Dynamic() {
			return nil, fmt.Errorf("rule %q is dynamic (from %s): only static rules have a YAML form", r.ID, r.Origin)
		}
		rn, err := marshalRule(r)
		if err != nil {
			return nil, err
		}
		rn.HeadComment = notes[r.ID]
		if r.DetailedMetric {
			if rn.HeadComment != "" {
				rn.HeadComment += "\n"
			}
			rn.HeadComment += "detailed_metric: decision records carry every value; sluice makes no per-value metric"
		}
		list.Content = append(list.Content, rn)
	}
	field(top, "rules", list)
	if len(s.Costs) > 0 {
		routes := make([]string, 0, len(s.Costs))
		for r := range s.Costs {
			routes = append(routes, r)
		}
		slices.Sort(routes)
		costs := &yaml.Node{Kind: yaml.MappingNode}
		for _, r := range routes {
			field(costs, r, yamlInt(s.Costs[r]))
		}
		field(top, "costs", costs)
	}
	if s.Shedding != nil {
		field(top, "shedding", marshalShedding(s.Shedding))
	}
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, Content: []*yaml.Node{top}}); err != nil {
		return nil, fmt.Errorf("writing rules: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("writing rules: %w", err)
	}
	return b.Bytes(), nil
}

func marshalRule(r *Rule) (*yaml.Node, error) {
	n := &yaml.Node{Kind: yaml.MappingNode}
	field := func(k string, v *yaml.Node) { n.Content = append(n.Content, yamlStr(k), v) }
	field("id", yamlStr(r.ID))
	ms := &yaml.Node{Kind: yaml.SequenceNode}
	for i := range r.Match {
		ms.Content = append(ms.Content, marshalMatch(&r.Match[i]))
	}
	if r.Description != "" {
		field("description", yamlStr(r.Description))
	}
	field("match", ms)
	if r.Algorithm != TokenBucket {
		field("algorithm", yamlStr(r.Algorithm.String()))
	}
	field("limit", yamlInt(r.Limit))
	switch {
	case r.Algorithm == Concurrency:
		if r.Period != DefaultLease {
			field("lease", yamlStr(marshalDuration(r.Period)))
		}
	case r.Calendar != NoCalendar:
		field("calendar", yamlStr(r.Calendar.String()))
		if r.Location != nil && r.Location != time.UTC {
			field("timezone", yamlStr(r.Location.String()))
		}
	default:
		field("period", yamlStr(marshalDuration(r.Period)))
	}
	if r.Algorithm == TokenBucket && r.Burst != r.Limit {
		field("burst", yamlInt(r.Burst))
	}
	if r.Mode != Enforce {
		field("mode", yamlStr(r.Mode.String()))
	}
	if r.FailureMode != FailOpen {
		field("failure_mode", yamlStr(r.FailureMode.String()))
	}
	if r.Global {
		field("global", yamlBool(true))
	}
	if r.Pinned {
		field("pinned", yamlBool(true))
	}
	if r.GCounter {
		field("g_counter", yamlBool(true))
	}
	if r.ExactKeys {
		field("exact_keys", yamlBool(true))
	}
	if len(r.Replaces) > 0 {
		field("replaces", yamlStrs(r.Replaces))
	}
	if r.Scope != ScopeRegion {
		field("scope", yamlStr(r.Scope.String()))
	}
	if r.AdaptiveFloor > 0 {
		a := &yaml.Node{Kind: yaml.MappingNode}
		a.Content = append(a.Content, yamlStr("floor"), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(r.AdaptiveFloor, 'g', -1, 64)})
		field("adaptive", a)
	}
	return n, nil
}

func marshalMatch(m *Match) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
	field := func(k string, v *yaml.Node) { n.Content = append(n.Content, yamlStr(k), v) }
	field("key", yamlStr(m.KeyName()))
	switch {
	case m.Value != "":
		field("value", yamlStr(m.Value))
	case m.Values != nil:
		field("values", yamlStrs(m.Values))
	case m.Prefix != "":
		field("prefix", yamlStr(m.Prefix))
	case m.Wildcard != "":
		field("wildcard", yamlStr(m.Wildcard))
	case m.CIDR != nil:
		cs := make([]string, len(m.CIDR))
		for i, p := range m.CIDR {
			cs[i] = p.String()
		}
		field("cidr", yamlStrs(cs))
	case m.Template != "":
		field("template", yamlStr(m.Template))
	}
	if len(m.Not) > 0 {
		field("not", yamlStrs(m.Not))
	}
	if len(m.NotPrefix) > 0 {
		field("not_prefix", yamlStrs(m.NotPrefix))
	}
	if m.Shared {
		field("shared", yamlBool(true))
	}
	if m.IgnoreCase {
		field("ignore_case", yamlBool(true))
	}
	return n
}

// marshalDuration writes d in the largest whole unit of h, m, s or ms
// (24h, 90s), which time.ParseDuration reads back exactly.
func marshalDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0s"
	case d%time.Hour == 0:
		return strconv.FormatInt(int64(d/time.Hour), 10) + "h"
	case d%time.Minute == 0:
		return strconv.FormatInt(int64(d/time.Minute), 10) + "m"
	case d%time.Second == 0:
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	case d%time.Millisecond == 0:
		return strconv.FormatInt(int64(d/time.Millisecond), 10) + "ms"
	}
	return d.String()
}

// yamlStr is a string scalar; the encoder quotes it when it would read as
// another type ("500", "true", "*").
func yamlStr(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s} }

func yamlInt(n int64) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatInt(n, 10)}
}

func yamlBool(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func yamlStrs(ss []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
	for _, s := range ss {
		n.Content = append(n.Content, yamlStr(s))
	}
	return n
}
