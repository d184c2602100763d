package rules

import (
	"fmt"

	"go.yaml.in/yaml/v3"
)

// Scope says where a rule's state is counted.
type Scope uint8

const (
	// ScopeRegion, the default: the rule is counted in the region's Redis,
	// shared by every enforcer of the region (and across regions when
	// Global).
	ScopeRegion Scope = iota
	// ScopeLocal (YAML `scope: local`): the rule is counted in the
	// enforcer's own memory and never in Redis. Its limit holds per
	// enforcer process (a region with N enforcers admits up to N × limit),
	// its state is bounded (least recently used entities are forgotten and
	// start again full) and survives no restart. For coarse edge guards
	// (per client IP, per ASN, per prefix) whose key space an attacker
	// controls: a botnet's millions of addresses cost Redis nothing. Only
	// token buckets, not Global.
	ScopeLocal
)

var scopeNames = [...]string{"region", "local"}

func (s Scope) String() string {
	if int(s) < len(scopeNames) {
		return scopeNames[s]
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// ParseScope maps a YAML name ("region", "local") to its Scope; "" is
// ScopeRegion.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "", "region":
		return ScopeRegion, nil
	case "local":
		return ScopeLocal, nil
	}
	return 0, fmt.Errorf("scope %q: want region (counted in the region's Redis, the default) or local (counted in each enforcer's memory)", s)
}

// Local reports whether the rule is counted in the enforcer's memory only
// (ScopeLocal).
func (r *Rule) Local() bool { return r.Scope == ScopeLocal }

// validateScope checks what a local rule may be.
func (r *Rule) validateScope() error {
	switch {
	case r.Scope > ScopeLocal:
		return fmt.Errorf("unknown scope %d", r.Scope)
	case r.Scope != ScopeLocal:
		return nil
	case r.Global:
		return fmt.Errorf("a local rule is counted in each enforcer's memory, so it cannot be global: remove global, or scope")
	case r.Algorithm != TokenBucket:
		return fmt.Errorf("a local rule is a token bucket in the enforcer's memory: remove algorithm %s, or scope", r.Algorithm)
	case r.Dynamic():
		return fmt.Errorf("dynamic rules are counted in Redis: scope local applies to static rules only")
	}
	return nil
}

// Adaptive reports whether the rule's limit follows the backend's health
// (AdaptiveFloor > 0).
func (r *Rule) Adaptive() bool { return r.AdaptiveFloor > 0 }

// DefaultAdaptiveFloor is an adaptive rule's floor when its adaptive:
// mapping gives none: a tenth of its limit.
const DefaultAdaptiveFloor = 0.1

// parseAdaptive reads a rule's `adaptive:` mapping: {floor: F}, F in (0, 1].
func parseAdaptive(n *yaml.Node) (float64, error) {
	if n.Kind != yaml.MappingNode {
		return 0, fmt.Errorf("want a mapping such as {floor: 0.2} (the least fraction of the limit it may fall to)")
	}
	floor := DefaultAdaptiveFloor
	if k := duplicateKey(n); k != nil {
		return 0, fmt.Errorf("%s is given twice", k.Value)
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Value != "floor" {
			return 0, fmt.Errorf("unknown field %s (known: floor)", k.Value)
		}
		f, err := yamlNumber(v)
		if err != nil {
			return 0, fmt.Errorf("floor %q is not a number: give the least fraction of the limit, in (0, 1], e.g. 0.2", v.Value)
		}
		if !(f > 0 && f <= 1) {
			return 0, fmt.Errorf("floor %v: want a fraction of the limit in (0, 1], e.g. 0.2", v.Value)
		}
		floor = f
	}
	return floor, nil
}
