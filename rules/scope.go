package rules

import "fmt"

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
