package rules

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Priority is how much a request matters when the backend is overloaded:
// load shedding refuses Sheddable requests first, then Normal ones, and
// Critical ones only past the last threshold. The zero value is unset (the
// route's default, else Shedding.Default).
type Priority uint8

const (
	PriorityUnset Priority = iota
	// Critical: refused only past the last threshold (logins, payments).
	Critical
	// Normal: the default.
	Normal
	// Sheddable: refused first (prefetches, analytics, batch jobs).
	Sheddable
	// NumPriorities sizes arrays indexed by a Priority.
	NumPriorities
)

var priorityNames = [...]string{"", "critical", "normal", "sheddable"}

func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// ParsePriority maps "critical", "normal" or "sheddable" to its Priority.
func ParsePriority(s string) (Priority, error) {
	for i, n := range priorityNames {
		if i > 0 && n == s {
			return Priority(i), nil
		}
	}
	return PriorityUnset, fmt.Errorf("unknown priority %q: want critical, normal or sheddable", s)
}

// Shedding configures priority load shedding (the rule file's top-level
// `shedding:`), after Stripe's load shedders ("Scaling your API with rate
// limiters", 2017) and Google SRE's criticality (Site Reliability
// Engineering, ch. 21, 2016): each request has a priority, and when the
// load (see enforcer.Limiter.Load: work in flight over capacity, or the
// backend's health) reaches a priority's threshold, requests of that
// priority are refused with 503 and Retry-After, before any rule is
// checked, so that a shed request charges no quota.
//
// A nil *Shedding sheds nothing.
type Shedding struct {
	// PriorityKey is the descriptor entry that carries a request's priority
	// (a custom key, e.g. Envoy's generic_key or a header_match entry named
	// so). Default "priority".
	PriorityKey string
	// Default is the priority of a request that carries none and whose
	// route has no default. Default Normal.
	Default Priority
	// Routes maps a route descriptor value to its default priority.
	Routes map[string]Priority
	// Thresholds[p] is the load at or above which requests of priority p
	// are shed, > 0, with Sheddable ≤ Normal ≤ Critical. Defaults 0.8, 0.9
	// and 1.0: critical requests are shed only when the work in flight
	// reaches the capacity.
	Thresholds [NumPriorities]float64
}

// DefaultShedding returns the defaults above.
func DefaultShedding() *Shedding {
	s := &Shedding{PriorityKey: "priority", Default: Normal}
	s.Thresholds[Sheddable], s.Thresholds[Normal], s.Thresholds[Critical] = 0.8, 0.9, 1.0
	return s
}

// Priority returns the priority of a request that gave given (its
// descriptor entry, "" if none) for route: given when known, else the
// route's default, else Default. An unknown given value is Default too (a
// client cannot raise its priority by misspelling it); ok is false then,
// for the caller to count.
func (s *Shedding) Priority(given, route string) (p Priority, ok bool) {
	if given != "" {
		switch given {
		case "critical":
			return Critical, true
		case "normal":
			return Normal, true
		case "sheddable":
			return Sheddable, true
		}
		ok = false
	} else {
		ok = true
	}
	if route != "" {
		if p, found := s.Routes[NormalizePath(route)]; found { // any spelling of the route
			return p, ok
		}
	}
	return s.Default, ok
}

// Sheds reports whether a request of priority p is refused at load.
func (s *Shedding) Sheds(p Priority, load float64) bool {
	if p == PriorityUnset || p >= NumPriorities {
		p = s.Default
	}
	return load >= s.Thresholds[p]
}

// parseShedding reads the `shedding:` mapping n of file name; every error
// names the file, line and column of the value at fault and the fix.
func parseShedding(name string, n *yaml.Node) (*Shedding, error) {
	s := DefaultShedding()
	at := func(n *yaml.Node) string { return fmt.Sprintf("%s:%d:%d", name, n.Line, n.Column) }
	if n.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: shedding: want a mapping with priority_key, default, routes and thresholds", at(n))
	}
	priority := func(field string, v *yaml.Node) (Priority, error) {
		p, err := ParsePriority(v.Value)
		if err != nil || v.Kind != yaml.ScalarNode {
			return 0, fmt.Errorf("%s: shedding: %s: unknown priority %q: want critical, normal or sheddable", at(v), field, v.Value)
		}
		return p, nil
	}
	if k := duplicateKey(n); k != nil {
		return nil, fmt.Errorf("%s: shedding: %s is given twice", at(k), k.Value)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch k.Value {
		case "priority_key":
			if v.Kind != yaml.ScalarNode || v.Value == "" || len(v.Value) > maxIDLen {
				return nil, fmt.Errorf("%s: shedding: priority_key: want the name of a descriptor entry, e.g. priority", at(v))
			}
			if kk, ok := KeyFor(v.Value); !ok || kk != KeyCustom {
				return nil, fmt.Errorf("%s: shedding: priority_key %q: want a custom key's name, not a well-known key", at(v), v.Value)
			}
			s.PriorityKey = v.Value
		case "default":
			p, err := priority("default", v)
			if err != nil {
				return nil, err
			}
			s.Default = p
		case "routes":
			if v.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("%s: shedding: routes: want a mapping of route to priority, e.g. {/v1/search: sheddable}", at(v))
			}
			s.Routes = make(map[string]Priority, len(v.Content)/2)
			for j := 0; j+1 < len(v.Content); j += 2 {
				route := v.Content[j].Value
				if !strings.HasPrefix(route, "/") {
					return nil, fmt.Errorf("%s: shedding: routes: route %q: want a path that starts with /, as the route descriptor is (the request's path without its query)", at(v.Content[j]), route)
				}
				p, err := priority(fmt.Sprintf("route %q", route), v.Content[j+1])
				if err != nil {
					return nil, err
				}
				route = NormalizePath(route) // as requests' routes are compared
				if _, dup := s.Routes[route]; dup {
					return nil, fmt.Errorf("%s: shedding: routes: route %q is given twice", at(v.Content[j]), route)
				}
				s.Routes[route] = p
			}
		case "thresholds":
			if v.Kind != yaml.MappingNode {
				return nil, fmt.Errorf("%s: shedding: thresholds: want a mapping of priority to load, e.g. {sheddable: 0.8, normal: 0.9, critical: 1}", at(v))
			}
			if k := duplicateKey(v); k != nil {
				return nil, fmt.Errorf("%s: shedding: thresholds: %s is given twice", at(k), k.Value)
			}
			for j := 0; j+1 < len(v.Content); j += 2 {
				pk, pv := v.Content[j], v.Content[j+1]
				p, err := ParsePriority(pk.Value)
				if err != nil {
					return nil, fmt.Errorf("%s: shedding: thresholds: unknown priority %q: want critical, normal or sheddable", at(pk), pk.Value)
				}
				f, err := yamlNumber(pv)
				if err != nil {
					return nil, fmt.Errorf("%s: shedding: thresholds: %s: %q is not a number: give the load (work in flight ÷ capacity) at which %s requests are shed, e.g. 0.8", at(pv), p, pv.Value, p)
				}
				if !(f > 0) || math.IsInf(f, 0) {
					return nil, fmt.Errorf("%s: shedding: thresholds: %s: %v: want a load above 0, e.g. 0.8", at(pv), p, pv.Value)
				}
				s.Thresholds[p] = f
			}
		default:
			return nil, fmt.Errorf("%s: shedding: unknown field %s (known: priority_key, default, routes, thresholds)", at(k), k.Value)
		}
	}
	if t := s.Thresholds; t[Sheddable] > t[Normal] || t[Normal] > t[Critical] {
		return nil, fmt.Errorf("%s: shedding: thresholds: want sheddable ≤ normal ≤ critical (sheddable requests are shed first), got %v, %v, %v",
			at(n), t[Sheddable], t[Normal], t[Critical])
	}
	return s, nil
}

// duplicateKey returns the first key of mapping n given a second time, or
// nil: yaml.v3 refuses duplicate keys only where it decodes into a struct or
// map, not in a node read by hand.
func duplicateKey(n *yaml.Node) *yaml.Node {
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		if seen[k.Value] {
			return k
		}
		seen[k.Value] = true
	}
	return nil
}

// yamlNumber reads a plain (unquoted) YAML number: a quoted "0.5" is a
// string, refused as the rule format refuses limit: "5".
func yamlNumber(n *yaml.Node) (float64, error) {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!float" && n.ShortTag() != "!!int") {
		return 0, errors.New("not a number")
	}
	return strconv.ParseFloat(n.Value, 64)
}

// marshalShedding writes s as parseShedding reads it, every field given.
func marshalShedding(s *Shedding) *yaml.Node {
	m := &yaml.Node{Kind: yaml.MappingNode}
	field := func(m *yaml.Node, k string, v *yaml.Node) { m.Content = append(m.Content, yamlStr(k), v) }
	field(m, "priority_key", yamlStr(s.PriorityKey))
	field(m, "default", yamlStr(s.Default.String()))
	if len(s.Routes) > 0 {
		routes := make([]string, 0, len(s.Routes))
		for r := range s.Routes {
			routes = append(routes, r)
		}
		slices.Sort(routes)
		rm := &yaml.Node{Kind: yaml.MappingNode}
		for _, r := range routes {
			field(rm, r, yamlStr(s.Routes[r].String()))
		}
		field(m, "routes", rm)
	}
	th := &yaml.Node{Kind: yaml.MappingNode}
	for _, p := range []Priority{Sheddable, Normal, Critical} {
		field(th, p.String(), &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(s.Thresholds[p], 'g', -1, 64)})
	}
	field(m, "thresholds", th)
	return m
}
