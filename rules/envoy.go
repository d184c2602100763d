package rules

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// An envoyproxy/ratelimit config is a tree of descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing          # optional; "foo*" is a prefix wildcard
//	    descriptors:              # nested: the request's next entry
//	      - key: to_number
//	        rate_limit:
//	          unit: day           # second, minute, hour, day, week, month (30 d), year (365 d)
//	          requests_per_unit: 5
//	          name: marketing     # optional; what replaces names
//	          replaces: [{name: other}]
//	          # or unlimited: true
//	        shadow_mode: true
//	        detailed_metric: true
//	        share_threshold: true # wildcard values only: one counter for all
//	        value_to_metric: true # metrics only; no effect in sluice
//
// envoyproxy/ratelimit (src/config/config_impl.go, GetLimit) walks the tree
// with a request descriptor's entries in order. At each level it takes the
// child whose key and value equal the entry's, else the first wildcard
// child (in file order) whose value without its trailing * prefixes the
// entry's value, else the child with the entry's key and no value. A limit
// applies only when the walk ends, at the descriptor's last entry, on a node
// with a rate_limit. ParseEnvoy turns each rate_limit leaf into one flat
// Rule that matches exactly the descriptors that walk would bring to it:
// ExactKeys, one Match per level, and at each level the exclusions that
// give the walk's priority (see envoyMatch).

// IsEnvoy reports whether data looks like an envoyproxy/ratelimit config: a
// YAML mapping with a top-level descriptors field. Parse reads such a file
// with ParseEnvoy.
func IsEnvoy(data []byte) bool {
	var doc yaml.Node
	return yaml.Unmarshal(data, &doc) == nil && isEnvoyNode(&doc)
}

// isEnvoyNode is IsEnvoy on a parsed document.
func isEnvoyNode(doc *yaml.Node) bool {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return false
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(top.Content); i += 2 {
		if top.Content[i].Value == "descriptors" {
			return true
		}
	}
	return false
}

// ParseEnvoy parses an envoyproxy/ratelimit config into a Set with one rule
// per rate_limit (unlimited ones make none): a fixed_window rule of
// requests_per_unit per unit, windows aligned to the Unix epoch as
// envoyproxy/ratelimit counts them, exact_keys, shadow mode from
// shadow_mode, the rule id from the descriptor path alone, e.g.
// "message_type_marketing.to_number" (rate_limit.name is for replaces; see
// envoyAssignIDs), so that editing other descriptors never renames a rule
// and moves its counters. Parsing is
// strict: unknown fields, wrong types and values envoyproxy/ratelimit would
// reject or ignore are errors that name the file, line and column and the
// fix. The Set's version is 1.
//
// The differences from envoyproxy/ratelimit are in docs/rules-envoy.md: the
// order of a descriptor's entries is not checked, a key may appear once per
// descriptor, and values are compared as sluice normalises them.
func ParseEnvoy(name string, data []byte) (*Set, error) {
	s, _, err := parseEnvoy(name, data)
	return s, err
}

// envoyLeaf relates a rule to the descriptor it came from.
type envoyLeaf struct {
	rule *Rule
	// path is the descriptor's path as envoyproxy/ratelimit names it in its
	// stats, without the domain: "key" or "key_value" per level, joined
	// by dots.
	path string
	name string // rate_limit.name
	node *envoyNode
}

// envoyLevel is one level of a descriptor path: its key and its value as
// written ("" for none).
type envoyLevel struct{ key, value string }

type envoyNode struct {
	key, value string
	limit      *envoyLimit
	children   []*envoyNode
	shadow     bool
	detailed   bool
	share      bool
	at         *yaml.Node // the descriptor's mapping
	keyAt      *yaml.Node
	path       string
	levels     []envoyLevel // from the root down to this node
	addr       string       // a client_ip value as written, when value is its key form
}

// envoyClientIPValue is the value a client_ip descriptor's exact value
// takes in sluice's rule: the address as the enforcer keys it, so that an
// entry such as remote_address=2001:db8::7 matches requests from that
// address (envoyproxy/ratelimit #365). An IPv6 address becomes its /64
// network (the enforcer's default keying, enforcer.Options.IPv6Prefix), an
// IPv4-mapped one IPv4, any other spelling of an address its canonical
// text. A wildcard or a text that is no address stays as it is.
func envoyClientIPValue(v string) string {
	if v == "" || strings.HasSuffix(v, "*") {
		return v
	}
	if a, err := netip.ParseAddr(v); err == nil {
		return NormalizeIP(a.String(), 64)
	}
	if p, err := netip.ParsePrefix(v); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
		return p.Masked().String()
	}
	return v
}

// wildcard reports whether the node's value is a prefix wildcard, and the prefix.
func (n *envoyNode) wildcard() (prefix string, ok bool) {
	if strings.HasSuffix(n.value, "*") {
		return n.value[:len(n.value)-1], true
	}
	return "", false
}

// label names the node in errors: key, or key=value.
func (n *envoyNode) label() string {
	if n.value == "" {
		return n.key
	}
	return n.key + "=" + n.value
}

type envoyLimit struct {
	period    time.Duration
	perUnit   int64
	unlimited bool
	name      string
	replaces  []string
	at        *yaml.Node
	replAt    []*yaml.Node
}

// envoyUnits are the units envoyproxy/ratelimit accepts (any case), as long
// as it counts them (src/utils/utilities.go, UnitToDivider): a month is 30
// days and a year 365.
var envoyUnits = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// unitName is the envoy unit of a period from envoyUnits.
func unitName(d time.Duration) string {
	for u, p := range envoyUnits {
		if p == d {
			return u
		}
	}
	return d.String()
}

// envoyParser reads one file's YAML nodes.
type envoyParser struct {
	name string
}

func (p *envoyParser) errorf(at *yaml.Node, format string, a ...any) error {
	if at == nil {
		return fmt.Errorf("%s: %s", p.name, fmt.Sprintf(format, a...))
	}
	return fmt.Errorf("%s:%d:%d: %s", p.name, at.Line, at.Column, fmt.Sprintf(format, a...))
}

// fields walks a mapping's fields, rejecting a field given twice and any
// field not in known (listed in the error as want).
func (p *envoyParser) fields(m *yaml.Node, where, want string, known []string, hint func(string) string, f func(k, v *yaml.Node) error) error {
	seen := map[string]*yaml.Node{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], deref(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return p.errorf(k, "a field name must be a plain word")
		}
		if k.Tag == "!!merge" {
			return p.errorf(k, "YAML merge keys (<<) are not supported here: write the fields out")
		}
		if prev, dup := seen[k.Value]; dup {
			return p.errorf(k, "field %s is given twice %s (also at line %d column %d): keep one", k.Value, where, prev.Line, prev.Column)
		}
		seen[k.Value] = k
		ok := false
		for _, n := range known {
			ok = ok || n == k.Value
		}
		if !ok {
			msg := fmt.Sprintf("unknown field %q %s (known: %s)", k.Value, where, want)
			if hint != nil {
				msg += hint(k.Value)
			}
			return p.errorf(k, "%s", msg)
		}
		if err := f(k, v); err != nil {
			return err
		}
	}
	return nil
}

// str reads a scalar as its text, as envoyproxy/ratelimit's YAML decoder
// does for its string fields (value: 500 is "500"); null is "".
func (p *envoyParser) str(field string, v *yaml.Node) (string, error) {
	if v.Kind != yaml.ScalarNode {
		return "", p.errorf(v, "%s: want a string, not a %s", field, yamlKindName(v))
	}
	if v.Tag == "!!null" {
		return "", nil
	}
	return v.Value, nil
}

func (p *envoyParser) boolean(field string, v *yaml.Node) (bool, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" {
		return false, p.errorf(v, "%s: %q is not true or false", field, v.Value)
	}
	var b bool
	if err := v.Decode(&b); err != nil {
		return false, p.errorf(v, "%s: %q is not true or false", field, v.Value)
	}
	return b, nil
}

// deref resolves a YAML alias (*name) to the node its anchor (&name) marks,
// as envoyproxy/ratelimit's YAML decoder does.
func deref(v *yaml.Node) *yaml.Node {
	for i := 0; v.Kind == yaml.AliasNode && v.Alias != nil && i < 100; i++ {
		v = v.Alias
	}
	return v
}

func yamlKindName(v *yaml.Node) string {
	switch v.Kind {
	case yaml.SequenceNode:
		return "list"
	case yaml.MappingNode:
		return "mapping"
	case yaml.AliasNode:
		return "alias"
	}
	return "scalar"
}

const (
	envoyTopFields   = "domain, descriptors"
	envoyDescFields  = "key, value, rate_limit, descriptors, shadow_mode, detailed_metric, share_threshold, value_to_metric"
	envoyLimitFields = "unit, requests_per_unit, unlimited, name, replaces"
)

func parseEnvoy(name string, data []byte) (*Set, []envoyLeaf, error) {
	p := &envoyParser{name: name}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("%s: empty rule file: want a mapping with domain and descriptors", name)
		}
		return nil, nil, positioned(name, data, err)
	}
	if line, ok := secondDocument(dec); ok {
		return nil, nil, fmt.Errorf("%s:%d:1: a second YAML document (---) starts here: envoyproxy/ratelimit reads one domain per file", name, line)
	}
	top := doc.Content[0]
	if top.Kind != yaml.MappingNode {
		return nil, nil, p.errorf(top, "want a mapping with domain and descriptors")
	}
	var (
		domain string
		roots  []*envoyNode
	)
	err := p.fields(top, "at the top level", envoyTopFields, []string{"domain", "descriptors"}, func(f string) string {
		switch f {
		case "rules", "custom_keys", "version", "costs":
			return fmt.Sprintf("; %s is sluice's own format, and a file with descriptors: is an envoyproxy/ratelimit config: keep to one format (sluice rules convert rewrites an envoy config in sluice's)", f)
		}
		return ""
	}, func(k, v *yaml.Node) error {
		var err error
		switch k.Value {
		case "domain":
			domain, err = p.str("domain", v)
		case "descriptors":
			roots, err = p.descriptors(v, nil)
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if domain == "" {
		return nil, nil, p.errorf(top, "domain is missing: add e.g. `domain: api` at the top")
	}
	return p.build(domain, roots)
}

// descriptors reads a descriptor list; parent is the enclosing descriptor
// (nil at the top).
func (p *envoyParser) descriptors(v *yaml.Node, parent *envoyNode) ([]*envoyNode, error) {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, p.errorf(v, "descriptors: want a list of descriptors, each a mapping with key (and value, rate_limit, descriptors)")
	}
	var out []*envoyNode
	byComposite := map[string]*envoyNode{}
	for _, item := range v.Content {
		n, err := p.descriptor(deref(item), parent)
		if err != nil {
			return nil, err
		}
		// envoyproxy/ratelimit files a node under "key" or "key_value".
		composite := n.key
		if n.value != "" {
			composite += "_" + n.value
		}
		if prev, dup := byComposite[composite]; dup {
			if prev.key == n.key && prev.value == n.value && prev.addr != n.addr {
				return nil, p.errorf(n.at, "descriptor %s=%s and %s=%s (line %d column %d) are both the client %s to sluice, which keys an IPv6 client by its /64 network (enforcer.Options.IPv6Prefix): keep one",
					n.key, n.addr, prev.key, prev.addr, prev.at.Line, prev.at.Column, n.value)
			}
			if prev.key == n.key && prev.value == n.value {
				return nil, p.errorf(n.at, "descriptor %s is given twice at this level (also at line %d column %d): merge the two", n.label(), prev.at.Line, prev.at.Column)
			}
			return nil, p.errorf(n.at, "descriptor %s and descriptor %s (line %d column %d) are both %q to envoyproxy/ratelimit, which joins key and value with _: rename one",
				n.label(), prev.label(), prev.at.Line, prev.at.Column, composite)
		}
		byComposite[composite] = n
		out = append(out, n)
	}
	return out, nil
}

func (p *envoyParser) descriptor(m *yaml.Node, parent *envoyNode) (*envoyNode, error) {
	if m.Kind != yaml.MappingNode {
		return nil, p.errorf(m, "a descriptor must be a mapping with key (and value, rate_limit, descriptors), not a %s", yamlKindName(m))
	}
	n := &envoyNode{at: m}
	var kids, share *yaml.Node
	var shadowAt, detailAt *yaml.Node
	err := p.fields(m, "in a descriptor", envoyDescFields,
		[]string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "detailed_metric", "share_threshold", "value_to_metric"},
		func(f string) string {
			switch f {
			case "unit", "requests_per_unit", "unlimited", "name", "replaces":
				return fmt.Sprintf("; %s belongs under rate_limit:", f)
			}
			return ""
		},
		func(k, v *yaml.Node) error {
			var err error
			switch k.Value {
			case "key":
				n.key, err = p.str("key", v)
				n.keyAt = v
			case "value":
				n.value, err = p.str("value", v)
			case "rate_limit":
				n.limit, err = p.rateLimit(v)
			case "descriptors":
				kids = v
			case "shadow_mode":
				n.shadow, err = p.boolean("shadow_mode", v)
				shadowAt = k
			case "detailed_metric":
				n.detailed, err = p.boolean("detailed_metric", v)
				detailAt = k
			case "share_threshold":
				n.share, err = p.boolean("share_threshold", v)
				share = k
			case "value_to_metric":
				_, err = p.boolean("value_to_metric", v) // names metrics only
			}
			return err
		})
	if err != nil {
		return nil, err
	}
	if n.key == "" {
		return nil, p.errorf(m, "a descriptor has no key: add e.g. key: remote_address")
	}
	if !ValidKeyName(n.key) {
		return nil, p.errorf(n.keyAt, "descriptor key %q: a key name is 1 to %d printable ASCII characters without spaces", n.key, maxIDLen)
	}
	n.path = n.key
	if n.value != "" {
		n.path += "_" + n.value
	}
	if parent != nil {
		n.path = parent.path + "." + n.path
		n.levels = append(n.levels, parent.levels...)
	}
	n.levels = append(n.levels, envoyLevel{n.key, n.value})
	if k, _ := KeyFor(n.key); k == KeyClientIP {
		n.addr = n.value
		n.value = envoyClientIPValue(n.value)
	}
	if n.shadow && n.limit == nil {
		return nil, p.errorf(shadowAt, "shadow_mode applies only to a descriptor with a rate_limit (it is not inherited): move it beside the rate_limit it should soften")
	}
	if n.detailed && n.limit == nil {
		return nil, p.errorf(detailAt, "detailed_metric applies only to a descriptor with a rate_limit (it is not inherited): move it beside that rate_limit")
	}
	if _, wild := n.wildcard(); n.share && !wild {
		return nil, p.errorf(share, "share_threshold applies only to a wildcard value (one ending in *, e.g. value: files/*), not to %s", n.label())
	}
	if kids != nil {
		if n.children, err = p.descriptors(kids, n); err != nil {
			return nil, err
		}
	}
	return n, nil
}

func (p *envoyParser) rateLimit(m *yaml.Node) (*envoyLimit, error) {
	if m.Kind != yaml.MappingNode {
		return nil, p.errorf(m, "rate_limit: want a mapping with unit and requests_per_unit, not a %s", yamlKindName(m))
	}
	l := &envoyLimit{at: m}
	var unitAt, perUnitAt, replAt *yaml.Node
	err := p.fields(m, "in rate_limit", envoyLimitFields, []string{"unit", "requests_per_unit", "unlimited", "name", "replaces"},
		func(f string) string {
			switch f {
			case "shadow_mode", "detailed_metric", "descriptors", "key", "value":
				return fmt.Sprintf("; %s belongs to the descriptor, beside rate_limit:", f)
			}
			return ""
		},
		func(k, v *yaml.Node) error {
			switch k.Value {
			case "unit":
				unitAt = v
				u, err := p.str("unit", v)
				if err != nil {
					return err
				}
				period, ok := envoyUnits[strings.ToLower(u)]
				if !ok {
					return p.errorf(v, "rate_limit unit %q: want second, minute, hour, day, week, month or year", u)
				}
				l.period = period
			case "requests_per_unit":
				perUnitAt = v
				n, err := strconv.ParseInt(v.Value, 10, 64)
				if v.Kind != yaml.ScalarNode || v.Tag != "!!int" || err != nil || n < 0 || n > math.MaxUint32 {
					return p.errorf(v, "requests_per_unit %q: want a whole number from 0 to %d (0 denies every request)", v.Value, uint32(math.MaxUint32))
				}
				l.perUnit = n
			case "unlimited":
				var err error
				l.unlimited, err = p.boolean("unlimited", v)
				return err
			case "name":
				var err error
				l.name, err = p.str("name", v)
				return err
			case "replaces":
				replAt = k
				if v.Kind != yaml.SequenceNode {
					return p.errorf(v, "replaces: want a list of {name: ...}, e.g. replaces: [{name: per_user}]")
				}
				for _, e := range v.Content {
					e = deref(e)
					var name string
					if e.Kind != yaml.MappingNode {
						return p.errorf(e, "a replaces entry is a mapping with a name, e.g. - name: per_user")
					}
					err := p.fields(e, "in a replaces entry", "name", []string{"name"}, nil, func(_, v *yaml.Node) error {
						var err error
						name, err = p.str("name", v)
						return err
					})
					if err != nil {
						return err
					}
					if name == "" {
						return p.errorf(e, "a replaces entry has no name: name the rate_limit it replaces, e.g. - name: per_user")
					}
					l.replaces = append(l.replaces, name)
					l.replAt = append(l.replAt, e)
				}
			}
			return nil
		})
	if err != nil {
		return nil, err
	}
	switch {
	case l.unlimited && unitAt != nil:
		return nil, p.errorf(unitAt, "an unlimited rate_limit has no unit: remove unit, or unlimited")
	case l.unlimited && perUnitAt != nil:
		return nil, p.errorf(perUnitAt, "an unlimited rate_limit has no requests_per_unit: remove requests_per_unit, or unlimited")
	case l.unlimited && replAt != nil:
		return nil, p.errorf(replAt, "an unlimited rate_limit makes no rule in sluice, so it cannot replace others: remove replaces, or give it a limit")
	case l.unlimited:
	case unitAt == nil:
		return nil, p.errorf(m, "rate_limit has no unit: add unit: second (or minute, hour, day, week, month, year), or unlimited: true")
	case perUnitAt == nil:
		return nil, p.errorf(m, "rate_limit has no requests_per_unit: add e.g. requests_per_unit: 100 (0 denies every request), or unlimited: true")
	}
	for i, r := range l.replaces {
		if r == l.name {
			return nil, p.errorf(l.replAt[i], "rate_limit %q replaces itself: remove its own name from replaces", r)
		}
	}
	return l, nil
}

// build turns the tree into rules, in file order.
func (p *envoyParser) build(domain string, roots []*envoyNode) (*Set, []envoyLeaf, error) {
	// One sluice key per envoy key name: two aliases of one key
	// (remote_address and client_ip) would match each other's descriptors.
	keyNodes := map[Key]*envoyNode{}
	var check func(ns []*envoyNode, above []*envoyNode) error
	check = func(ns []*envoyNode, above []*envoyNode) error {
		for _, n := range ns {
			k, _ := KeyFor(n.key)
			if k != KeyCustom {
				if prev, ok := keyNodes[k]; ok && prev.key != n.key {
					return p.errorf(n.keyAt, "descriptor keys %q and %q (line %d) both mean sluice's %s: use one name for it", n.key, prev.key, prev.keyAt.Line, k)
				}
				keyNodes[k] = n
			}
			for _, a := range above {
				if a.key == n.key {
					return p.errorf(n.keyAt, "descriptor key %q repeats the key of an enclosing descriptor (line %d): sluice matches a descriptor's entries by key, so a key can appear at one level only", n.key, a.keyAt.Line)
				}
			}
			if err := check(n.children, append(above, n)); err != nil {
				return err
			}
		}
		return nil
	}
	if err := check(roots, nil); err != nil {
		return nil, nil, err
	}

	// Every rate_limit name, also of unlimited and unreachable ones, which
	// make no rule: replacing them is valid, and does nothing.
	named := map[string]bool{}
	var names func(ns []*envoyNode)
	names = func(ns []*envoyNode) {
		for _, n := range ns {
			if n.limit != nil && n.limit.name != "" {
				named[n.limit.name] = true
			}
			names(n.children)
		}
	}
	names(roots)
	var leaves []envoyLeaf
	var walk func(ns []*envoyNode, ms []Match) error
	walk = func(ns []*envoyNode, ms []Match) error {
		for _, n := range ns {
			m, ok := envoyMatch(n, ns)
			if !ok {
				continue // an earlier sibling takes every value this one would
			}
			path := append(append([]Match(nil), ms...), m)
			if n.limit != nil && !n.limit.unlimited {
				mode := Enforce
				if n.shadow {
					mode = Shadow
				}
				r := &Rule{Match: path, Algorithm: FixedWindow, Limit: n.limit.perUnit, Period: n.limit.period,
					Mode: mode, ExactKeys: true, DetailedMetric: n.detailed}
				leaves = append(leaves, envoyLeaf{rule: r, path: n.path, name: n.limit.name, node: n})
			}
			if err := walk(n.children, path); err != nil {
				return err
			}
		}
		return nil
	}
	if err := walk(roots, nil); err != nil {
		return nil, nil, err
	}
	if err := p.envoyAssignIDs(leaves); err != nil {
		return nil, nil, err
	}

	byName := map[string][]string{}
	for _, l := range leaves {
		if l.name != "" {
			byName[l.name] = append(byName[l.name], l.rule.ID)
		}
	}
	rs := make([]*Rule, 0, len(leaves))
	for _, l := range leaves {
		lim := l.node.limit
		for i, name := range lim.replaces {
			if !named[name] {
				return nil, nil, p.errorf(lim.replAt[i], "replaces %q: no rate_limit in this file has that name", name)
			}
			for _, id := range byName[name] {
				if !slices.Contains(l.rule.Replaces, id) {
					l.rule.Replaces = append(l.rule.Replaces, id)
				}
			}
		}
		if max := int64(1<<52) / lim.period.Milliseconds(); lim.perUnit > max {
			return nil, nil, p.errorf(lim.at, "requests_per_unit %d per %s is more than sluice counts in one window (at most %d: a count times the window in milliseconds stays within 2^52): use a shorter unit with a proportional limit",
				lim.perUnit, unitName(lim.period), max)
		}
		if err := l.rule.Validate(); err != nil {
			return nil, nil, p.errorf(lim.at, "rate_limit of %s: %v", l.path, err)
		}
		rs = append(rs, l.rule)
	}
	if len(rs) == 0 {
		return nil, nil, fmt.Errorf("%s: no rate limits: no descriptor has a rate_limit that sluice would enforce (unlimited ones make no rule)", p.name)
	}
	return NewSet(domain, 1, rs), leaves, nil
}

// envoyMatch is the condition at n's level that reproduces the walk's
// choice among n's siblings ns (n included) with the same key: an exact
// value is taken first, then the first wildcard (in file order) whose prefix
// fits, then the node without a value. So a wildcard node excludes its
// siblings' exact values and the prefixes of earlier wildcards, and a node
// without a value excludes every sibling value and wildcard prefix; a
// sibling counts whether or not it has a rate_limit. ok is false when n can
// never be chosen (an earlier wildcard's prefix covers its own).
func envoyMatch(n *envoyNode, ns []*envoyNode) (m Match, ok bool) {
	m.Key, _ = KeyFor(n.key)
	if m.Key == KeyCustom {
		m.Name = n.key
	}
	m.Shared = n.share
	prefix, wild := n.wildcard()
	switch {
	case n.value != "" && !wild:
		m.Value = n.value
		return m, true
	case wild:
		m.Prefix = prefix
	}
	// The prefixes that would win before n: every wildcard for a node
	// without a value, the earlier ones for a wildcard.
	var before []string
	for _, s := range ns {
		if s == n && wild {
			break
		}
		if sp, sw := s.wildcard(); s != n && s.key == n.key && sw {
			if strings.HasPrefix(prefix, sp) {
				return m, false // sp takes every value n would
			}
			if strings.HasPrefix(sp, prefix) {
				before = append(before, sp)
			}
		}
	}
	m.NotPrefix = envoyMinimalPrefixes(before)
	covered := func(v string) bool {
		for _, p := range m.NotPrefix {
			if strings.HasPrefix(v, p) {
				return true
			}
		}
		return false
	}
	// Values taken by an exact lookup first; a wildcard's own text too
	// (value "foo*" looks up node "foo*" exactly).
	for _, s := range ns {
		if s != n && s.key == n.key && s.value != "" && strings.HasPrefix(s.value, prefix) && !covered(s.value) {
			m.Not = append(m.Not, s.value)
		}
	}
	return m, true
}

// envoyMinimalPrefixes drops every prefix that a shorter one in ps covers.
func envoyMinimalPrefixes(ps []string) []string {
	var out []string
	for i, p := range ps {
		keep := true
		for j, q := range ps {
			if i != j && strings.HasPrefix(p, q) && (len(q) < len(p) || j < i) {
				keep = false
				break
			}
		}
		if keep {
			out = append(out, p)
		}
	}
	return out
}

// envoyAssignIDs gives each leaf's rule an id that depends only on its own
// descriptor path (see envoyRuleID), never on its rate_limit name, on other
// descriptors or on their order: a reload that adds, removes or moves other
// descriptors keeps every other rule's id, and so its counters. rate_limit
// names are for replaces only, as in envoyproxy/ratelimit, where names need
// not be unique. Two paths that make one id (they differ only in bytes an id
// cannot hold, e.g. values "/a*" and "/a?") are an error naming both lines.
func (p *envoyParser) envoyAssignIDs(leaves []envoyLeaf) error {
	used := map[string]*envoyLeaf{}
	for i := range leaves {
		l := &leaves[i]
		id := envoyRuleID(l.node.levels, l.path)
		if prev, dup := used[id]; dup {
			return p.errorf(l.node.at, "descriptor path %s makes the rule id %q, as %s (line %d column %d) does: an id keeps letters, digits, _ . and - only, so rename a key or value of one of them",
				l.path, id, prev.path, prev.node.at.Line, prev.node.at.Column)
		}
		used[id] = l
		l.rule.ID = id
	}
	return nil
}

// envoyRuleID is the rule id of a descriptor path: envoyproxy/ratelimit's
// stats name for it (without the domain), "key_value" or "key" per level
// joined by dots, e.g. generic_key_api.remote_address, made a valid id
// (ValidID). In a value a final wildcard * is written "any" (billing-* is
// billing-any, * alone any) and each run of other bytes an id cannot hold
// is one - (trimmed at the value's ends: /v1/users is v1-users). An id over
// 64 bytes is shortened, from the root down: the outer levels that have a
// value lose their key name (api.billing-any.remote_address_10.0.0.1), then
// outer levels go altogether, then the last level's key, then the value is
// cut; a shortened id ends in - and 8 hex digits of
// the path's SHA-256, so it stays distinct and stable.
func envoyRuleID(levels []envoyLevel, path string) string {
	full := make([]string, len(levels))
	short := make([]string, len(levels))
	for i, l := range levels {
		full[i] = envoyIDSlug(l.key, false)
		short[i] = full[i]
		if l.value != "" {
			short[i] = envoyIDSlug(l.value, true)
			full[i] += "_" + short[i]
		}
	}
	id := strings.Join(full, ".")
	if len(id) <= maxIDLen {
		return id
	}
	sum := sha256.Sum256([]byte(path))
	tag := "-" + hex.EncodeToString(sum[:4])
	budget := maxIDLen - len(tag)
	last := len(full) - 1
	for i := range last {
		full[i] = short[i]
		if id = strings.Join(full, "."); len(id) <= budget {
			return id + tag
		}
	}
	for len(full) > 1 {
		full = full[1:]
		if id = strings.Join(full, "."); len(id) <= budget {
			return id + tag
		}
	}
	if id = short[last]; len(id) > budget {
		id = strings.TrimRight(id[:budget], "-._")
	}
	return id + tag
}

// envoyIDSlug writes a key or value in an id's bytes (see envoyRuleID).
func envoyIDSlug(s string, value bool) string {
	wild := value && strings.HasSuffix(s, "*")
	if wild {
		s = s[:len(s)-1]
	}
	var b strings.Builder
	bad := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-' {
			if bad && b.Len() > 0 {
				b.WriteByte('-')
			}
			bad = false
			b.WriteByte(c)
			continue
		}
		bad = true
	}
	out := b.String()
	switch {
	case wild && out == "":
		return "any"
	case wild && strings.HasSuffix(out, "-"), wild && strings.HasSuffix(out, "."), wild && strings.HasSuffix(out, "_"):
		return out + "any"
	case wild:
		return out + "-any"
	case out == "":
		return "_"
	}
	return out
}

// ConvertEnvoy rewrites an envoyproxy/ratelimit config (see ParseEnvoy) in
// sluice's own rule format (see Parse and Marshal): custom_keys, and one
// rule per rate_limit with its match conditions, exact_keys, mode and
// replaces, each under a comment naming the descriptor it came from.
// Parse reads the result back into the Set that ParseEnvoy gives (a
// rule's detailed_metric stays a comment). name is the input's name for
// errors.
func ConvertEnvoy(name string, data []byte) ([]byte, error) {
	if !IsEnvoy(data) {
		return nil, fmt.Errorf("%s: not an envoyproxy/ratelimit config: it has no top-level descriptors", name)
	}
	s, leaves, err := parseEnvoy(name, data)
	if err != nil {
		return nil, err
	}
	notes := make(map[string]string, len(leaves))
	for _, l := range leaves {
		switch {
		case l.name != "" && l.name != l.rule.ID:
			notes[l.rule.ID] = "from " + l.path + " (rate_limit name " + strconv.Quote(l.name) + ")"
		case l.path != l.rule.ID:
			notes[l.rule.ID] = "from " + l.path
		}
	}
	head := "Converted by `sluice rules convert` from the envoyproxy/ratelimit config " + filepath.Base(name) + ".\n" +
		"Each rule matches exactly the descriptors that envoyproxy/ratelimit's walk of the\n" +
		"descriptor tree brings to its rate_limit: the same keys (exact_keys), and at each\n" +
		"level the values that a more specific sibling takes first excluded (not, not_prefix).\n" +
		"Unlimited descriptors make no rule."
	return marshal(s, head, notes)
}
