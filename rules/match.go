package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// Match is one condition of a rule: the request must carry the descriptor
// Key (for KeyCustom, the custom key Name), with a value that passes the
// condition below. At most one of Value, Values, Prefix, Wildcard, CIDR and
// Template is set; none means any value. Not and NotPrefix then exclude
// values.
//
// A rule keeps one bucket per distinct value of each matched key (its
// entity, see EntityTag), as envoyproxy/ratelimit keys its cache by the
// request's values; with Shared, every value that passes the condition
// shares one bucket (e.g. one limit for a whole CIDR).
type Match struct {
	Key  Key    `json:"key"`
	Name string `json:"name,omitempty"` // the custom key's name, when Key == KeyCustom

	Value    string         `json:"value,omitempty"`    // exactly this value
	Values   []string       `json:"values,omitempty"`   // any of these values (a list)
	Prefix   string         `json:"prefix,omitempty"`   // a value that starts with Prefix
	Wildcard string         `json:"wildcard,omitempty"` // a glob: '*' matches any run of characters
	CIDR     []netip.Prefix `json:"cidr,omitempty"`     // client_ip in any of these networks
	// Template is a route template over path or route values: segments
	// split by '/', where {name} or * matches one non-empty segment and a
	// final {name...} or ** matches the rest (zero or more segments). The
	// query string (from '?') is ignored. E.g. /v1/users/{id}/orders.
	Template  string   `json:"template,omitempty"`
	Not       []string `json:"not,omitempty"`        // excluded values
	NotPrefix []string `json:"not_prefix,omitempty"` // excluded prefixes
	Shared    bool     `json:"shared,omitempty"`
	// IgnoreCase compares the value with every condition above without
	// regard to ASCII case, and keys the bucket by the value in lower case:
	// /V1/Login and /v1/login are one path to such a rule. Paths are
	// case-sensitive otherwise, as nginx and Go's ServeMux route them. Not
	// for client_ip.
	IgnoreCase bool `json:"ignore_case,omitempty"`
}

// KeyName returns the match's key name: a well-known key's YAML name, or the
// custom key's.
func (m *Match) KeyName() string {
	if m.Key == KeyCustom {
		return m.Name
	}
	return m.Key.String()
}

// Exact reports whether the match names one exact value.
func (m *Match) Exact() bool {
	return m.Value != ""
}

// Condition describes the match's value condition in the YAML's own terms,
// e.g. "prefix /v1/", for explain and diff; "any value" when there is none.
func (m *Match) Condition() string {
	var s string
	switch {
	case m.Value != "":
		s = "= " + m.Value
	case len(m.Values) > 0:
		s = "in [" + strings.Join(m.Values, ", ") + "]"
	case m.Prefix != "":
		s = "prefix " + m.Prefix
	case m.Wildcard != "":
		s = "wildcard " + m.Wildcard
	case len(m.CIDR) > 0:
		ps := make([]string, len(m.CIDR))
		for i, p := range m.CIDR {
			ps[i] = p.String()
		}
		s = "in cidr [" + strings.Join(ps, ", ") + "]"
	case m.Template != "":
		s = "template " + m.Template
	default:
		s = "any value"
	}
	if len(m.Not) > 0 {
		s += ", not [" + strings.Join(m.Not, ", ") + "]"
	}
	if len(m.NotPrefix) > 0 {
		s += ", not prefix [" + strings.Join(m.NotPrefix, ", ") + "]"
	}
	if m.Shared {
		s += ", shared"
	}
	if m.IgnoreCase {
		s += ", ignoring case"
	}
	return s
}

// Passes reports whether the value v (non-empty) passes the match's condition.
// A path or route value is compared in NormalizePath's form, which the
// enforcer gives it; a prefix that ends in '/' also passes the path without
// it (prefix /admin/ passes /admin, as /admin/ is normalized to it).
func (m *Match) Passes(v string) bool {
	if v == "" {
		return false
	}
	eq := strEqual
	if m.IgnoreCase {
		eq = foldEqual
	}
	switch {
	case m.Value != "":
		if !eq(v, m.Value) {
			return false
		}
	case len(m.Values) > 0:
		in := false
		for _, x := range m.Values {
			if eq(x, v) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	case m.Prefix != "":
		if !m.hasPrefix(v, m.Prefix, eq) {
			return false
		}
	case m.Wildcard != "":
		if !globCase(m.Wildcard, v, m.IgnoreCase) {
			return false
		}
	case len(m.CIDR) > 0:
		a, bits, ok := ipValue(v)
		if !ok {
			return false
		}
		in := false
		for _, p := range m.CIDR {
			if p.Bits() <= bits && p.Contains(a) {
				in = true
				break
			}
		}
		if !in {
			return false
		}
	case m.Template != "":
		if !templateMatch(m.Template, v, eq) {
			return false
		}
	}
	for _, x := range m.Not {
		if eq(v, x) {
			return false
		}
	}
	for _, x := range m.NotPrefix {
		if m.hasPrefix(v, x, eq) {
			return false
		}
	}
	return true
}

// hasPrefix reports whether v begins with p; for a path, a prefix that ends
// in '/' also takes the path without the slash, which normalization
// drops.
func (m *Match) hasPrefix(v, p string, eq func(a, b string) bool) bool {
	if len(v) >= len(p) && eq(v[:len(p)], p) {
		return true
	}
	return (m.Key == KeyPath || m.Key == KeyRoute) && len(p) > 1 && p[len(p)-1] == '/' && eq(v, p[:len(p)-1])
}

func strEqual(a, b string) bool { return a == b }

// foldEqual reports whether a and b are equal ignoring ASCII case (the case
// that IgnoreCase folds: bytes of UTF-8 sequences compare exactly, so a
// value's key and its comparison agree).
func foldEqual(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		if lowerASCII(a[i]) != lowerASCII(b[i]) {
			return false
		}
	}
	return true
}

func lowerASCII(c byte) byte {
	if c >= 'A' && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// ipValue parses a client_ip descriptor value: an address, or the /n network
// that NormalizeIP makes of an IPv6 address. bits is the address's known
// length (32 or 128, or n).
func ipValue(v string) (a netip.Addr, bits int, ok bool) {
	if strings.IndexByte(v, '/') >= 0 {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			return netip.Addr{}, 0, false
		}
		return p.Addr().Unmap(), p.Bits(), true
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	a = a.Unmap()
	return a, a.BitLen(), true
}

// Glob reports whether s matches pattern (a rule's wildcard match, the
// content signal's lists), where '*' matches any run of
// characters (also none) and every other byte itself. Linear in practice:
// the classic single-backtrack-point algorithm (each '*' restarts the match
// once).
func Glob(pattern, s string) bool { return globCase(pattern, s, false) }

// globCase is Glob, ignoring ASCII case when fold is set.
func globCase(pattern, s string, fold bool) bool {
	p, i := 0, 0
	star, mark := -1, 0
	for i < len(s) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, i
			p++
		case p < len(pattern) && (pattern[p] == s[i] || fold && lowerASCII(pattern[p]) == lowerASCII(s[i])):
			p++
			i++
		case star >= 0:
			p = star + 1
			mark++
			i = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}

// templateMatch reports whether the path v matches a route template (see
// Match.Template), comparing literal segments with eq. It allocates nothing.
func templateMatch(tmpl, v string, eq func(a, b string) bool) bool {
	if i := strings.IndexByte(v, '?'); i >= 0 {
		v = v[:i]
	}
	for {
		ts, trest, tmore := cutSegment(tmpl)
		if restSegment(ts) {
			return true // the rest, zero or more segments
		}
		vs, vrest, vmore := cutSegment(v)
		switch {
		case ts == "*" || (len(ts) > 2 && ts[0] == '{' && ts[len(ts)-1] == '}'):
			if vs == "" {
				return false
			}
		case !eq(ts, vs):
			return false
		}
		if !tmore || !vmore {
			// Both ended, or the path ended where only a rest segment is left.
			return tmore == vmore || (tmore && restSegment(trest))
		}
		tmpl, v = trest, vrest
	}
}

func restSegment(s string) bool {
	return s == "**" || (len(s) > 5 && s[0] == '{' && strings.HasSuffix(s, "...}"))
}

// cutSegment returns s's first '/'-separated segment and the rest; more is
// false when s had no '/'.
func cutSegment(s string) (seg, rest string, more bool) {
	if i := strings.IndexByte(s, '/'); i >= 0 {
		return s[:i], s[i+1:], true
	}
	return s, "", false
}

// validate checks a match's condition; the error says what to fix.
func (m *Match) validate() error {
	if m.Key > KeyCustom {
		return fmt.Errorf("unknown descriptor key %d", m.Key)
	}
	if m.Key == KeyCustom && !ValidKeyName(m.Name) {
		return fmt.Errorf("custom descriptor key %q: want 1 to %d printable ASCII characters without spaces", m.Name, maxIDLen)
	}
	if m.Key == KeyCustom && m.Name == QueryKeyPrefix {
		return fmt.Errorf("custom descriptor key %q: name the query parameter, e.g. %spage", m.Name, QueryKeyPrefix)
	}
	if m.Key != KeyCustom && m.Name != "" {
		return fmt.Errorf("match %s has a custom key name %q", m.Key, m.Name)
	}
	n := 0
	for _, set := range []bool{m.Value != "", m.Values != nil, m.Prefix != "", m.Wildcard != "", m.CIDR != nil, m.Template != ""} {
		if set {
			n++
		}
	}
	if n > 1 {
		return fmt.Errorf("match %s: use one of value, values, prefix, wildcard, cidr and template", m.KeyName())
	}
	if m.Values != nil && len(m.Values) == 0 {
		return fmt.Errorf("match %s: values is an empty list", m.KeyName())
	}
	for _, lists := range [][]string{m.Values, m.Not, m.NotPrefix} {
		for _, v := range lists {
			if v == "" {
				return fmt.Errorf("match %s: an empty value in a list matches nothing: remove it", m.KeyName())
			}
		}
	}
	if m.Wildcard != "" && !strings.Contains(m.Wildcard, "*") {
		return fmt.Errorf("match %s: wildcard %q has no '*': use value for an exact match", m.KeyName(), m.Wildcard)
	}
	if m.CIDR != nil {
		if m.Key != KeyClientIP {
			return fmt.Errorf("match %s: cidr applies only to client_ip", m.KeyName())
		}
		if len(m.CIDR) == 0 {
			return fmt.Errorf("match client_ip: cidr is an empty list")
		}
		for _, p := range m.CIDR {
			if !p.IsValid() || p != p.Masked() {
				return fmt.Errorf("match client_ip: cidr %s: write the network's first address, %s", p, p.Masked())
			}
		}
	}
	if m.IgnoreCase && m.Key == KeyClientIP {
		return fmt.Errorf("match client_ip: ignore_case applies to text, not to addresses")
	}
	m.normalizePaths()
	if m.Template != "" {
		if m.Key != KeyPath && m.Key != KeyRoute {
			return fmt.Errorf("match %s: template applies only to path and route", m.KeyName())
		}
		if err := validTemplate(m.Template); err != nil {
			return fmt.Errorf("match %s: template %q: %v", m.KeyName(), m.Template, err)
		}
	}
	if m.Key == KeyClientIP {
		for _, lists := range [][]string{{m.Value}, m.Values, m.Not} {
			for _, v := range lists {
				if a, err := netip.ParseAddr(v); err == nil && (a.Is4In6() || a.String() != v) {
					return fmt.Errorf("match client_ip: %q: write the address as the enforcer keys it: %s", v, a.Unmap())
				}
				if p, err := netip.ParsePrefix(v); err == nil && p.Masked().String() != v {
					return fmt.Errorf("match client_ip: %q: write the network as a gateway masks it: %s", v, p.Masked())
				}
			}
		}
	}
	return nil
}

// normalizePaths writes a path's or route's values, prefixes and template
// in NormalizePath's form, the form the enforcer gives requests' paths, so
// that the rule matches every spelling of them: value /v1/login/ is
// /v1/login, /v1/%6Cogin is /v1/login. A route that is a name (no leading
// '/') is left as it is.
func (m *Match) normalizePaths() {
	if m.Key != KeyPath && m.Key != KeyRoute {
		return
	}
	// Written only where it changes: a rule in a set may be validated
	// again while requests read it.
	set := func(p *string, v string) {
		if *p != v {
			*p = v
		}
	}
	set(&m.Value, normalPathValue(m.Value, false))
	set(&m.Prefix, normalPathValue(m.Prefix, true))
	for _, l := range [][]string{m.Values, m.Not} {
		for i := range l {
			set(&l[i], normalPathValue(l[i], false))
		}
	}
	for i := range m.NotPrefix {
		set(&m.NotPrefix[i], normalPathValue(m.NotPrefix[i], true))
	}
	set(&m.Template, normalTemplate(m.Template))
}

// normalTemplate writes a template's literal segments in NormalizePath's
// form, leaving its parameters ({id}, *, {rest...}, **) as they are.
func normalTemplate(t string) string {
	if !strings.HasPrefix(t, "/") {
		return t
	}
	if len(t) > 1 {
		t = strings.TrimRight(t, "/") // requests' paths have no trailing slash
		if t == "" {
			t = "/"
		}
	}
	out := make([]byte, 0, len(t))
	for rest, more := t[1:], true; more; {
		var seg string
		seg, rest, more = cutSegment(rest)
		out = append(out, '/')
		if seg == "*" || seg == "**" || strings.ContainsAny(seg, "{}") || seg == "" {
			out = append(out, seg...)
			continue
		}
		n := NormalizePath("/" + seg)
		out = append(out, n[1:]...)
	}
	return string(out)
}

// CheckClientIPValue checks an exact client_ip value written by a person
// (sluice's rule files, `sluice rules dynamic add`): an IPv4 address as the
// enforcer keys it, or a text that is no address (a hostname in a log).
// A network, an IPv6 address (keyed by its /64 by default) or an
// IPv4-mapped IPv6 address would equal a request's key only when a gateway
// sends it so (Envoy's masked_remote_address), so the error points to cidr,
// which matches networks whatever the keying. Envoy configs, which have no
// cidr, keep such values as text, as envoyproxy/ratelimit compares them.
func CheckClientIPValue(v string) error {
	if v == "" {
		return nil
	}
	if p, err := netip.ParsePrefix(v); err == nil {
		return fmt.Errorf("a network: write cidr: [%s]", p.Masked())
	}
	a, err := netip.ParseAddr(v)
	switch {
	case err != nil:
		return nil
	case a.Is4In6():
		return fmt.Errorf("an IPv4-mapped address is keyed as IPv4: write %s", a.Unmap())
	case a.Is6():
		return fmt.Errorf("IPv6 clients are keyed by their network (/64 by default, enforcer.Options.IPv6Prefix): write cidr: [%s/128], which matches when the enforcer keys whole addresses, or the network, e.g. cidr: [%s]", a.WithZone(""), netip.PrefixFrom(a.WithZone(""), 64).Masked())
	case a.String() != v:
		return fmt.Errorf("write the address as the enforcer keys it: %s", a)
	}
	return nil
}

// validTemplate checks a route template: it starts with /, every {name} is
// closed within its segment, and a rest segment ({name...} or **) comes
// last.
func validTemplate(t string) error {
	if !strings.HasPrefix(t, "/") {
		return fmt.Errorf("must start with /")
	}
	var names []string
	for rest, more := t[1:], true; more; {
		var seg string
		seg, rest, more = cutSegment(rest)
		open, close := strings.Count(seg, "{"), strings.Count(seg, "}")
		if open == 1 && close == 1 {
			name := strings.TrimSuffix(strings.Trim(seg, "{}"), "...")
			if slices.Contains(names, name) {
				return fmt.Errorf("parameter {%s} is named twice", name)
			}
			names = append(names, name)
		}
		switch {
		case seg == "" && more:
			return fmt.Errorf("an empty segment (//) matches only a path with // in it: remove it")
		case open != close || open > 1 || (open == 1 && (seg[0] != '{' || seg[len(seg)-1] != '}')):
			return fmt.Errorf("segment %q: a parameter is a whole segment, {name}", seg)
		case seg == "{}" || seg == "{...}":
			return fmt.Errorf("segment %q: name the parameter, e.g. {id}", seg)
		case restSegment(seg) && more:
			return fmt.Errorf("segment %q matches the rest of the path, so it must be the last", seg)
		case strings.Contains(seg, "**") && !restSegment(seg):
			return fmt.Errorf("segment %q: ** is a whole segment, and the last", seg)
		}
	}
	return nil
}
