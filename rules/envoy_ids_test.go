package rules

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// TestEnvoyReloadKeepsIDs: a reload that adds, before a named limit, another
// limit of the same name keeps the first one's id, and so its counters
// (hookaido #239: it was renamed shared-name-1f7d11 and refilled).
func TestEnvoyReloadKeepsIDs(t *testing.T) {
	v1 := `
domain: d
descriptors:
  - key: generic_key
    value: alpha
    rate_limit: {unit: hour, requests_per_unit: 3, name: shared-name}
`
	v2 := `
domain: d
descriptors:
  - key: generic_key
    value: beta
    rate_limit: {unit: hour, requests_per_unit: 50, name: shared-name}
  - key: generic_key
    value: alpha
    rate_limit: {unit: hour, requests_per_unit: 3, name: shared-name}
`
	alpha := func(src string) string {
		s, err := ParseEnvoy("v.yaml", []byte(src))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range s.Rules {
			if r.Match[0].Value == "alpha" {
				return r.ID
			}
		}
		t.Fatal("no alpha rule")
		return ""
	}
	if a1, a2 := alpha(v1), alpha(v2); a1 != a2 || a1 != "generic_key_alpha" {
		t.Errorf("alpha's id is %q in v1 and %q in v2, want generic_key_alpha in both", a1, a2)
	}
}

// TestEnvoyIDCollision: two paths that make one id are an error naming both
// lines, not a silent rename of one of them.
func TestEnvoyIDCollision(t *testing.T) {
	_, err := ParseEnvoy("c.yaml", []byte(`
domain: d
descriptors:
  - key: path
    value: /a?
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: path
    value: /a!
    rate_limit: {unit: hour, requests_per_unit: 3}
`))
	want := `c.yaml:7:5: descriptor path path_/a! makes the rule id "path_a", as path_/a? (line 4 column 5) does`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("got %v, want %s…", err, want)
	}
}

// envoyTree is a random envoyproxy/ratelimit config for the property test:
// nodes with keys from a small alphabet, some with values, some named.
type envoyTree struct {
	key, value, name string
	limit            int
	kids             []*envoyTree
}

func (n *envoyTree) write(b *strings.Builder, indent string) {
	fmt.Fprintf(b, "%s- key: %s\n", indent, n.key)
	if n.value != "" {
		fmt.Fprintf(b, "%s  value: %q\n", indent, n.value)
	}
	if n.limit > 0 {
		fmt.Fprintf(b, "%s  rate_limit: {unit: minute, requests_per_unit: %d", indent, n.limit)
		if n.name != "" {
			fmt.Fprintf(b, ", name: %s", n.name)
		}
		b.WriteString("}\n")
	}
	if len(n.kids) > 0 {
		fmt.Fprintf(b, "%s  descriptors:\n", indent)
		for _, k := range n.kids {
			k.write(b, indent+"    ")
		}
	}
}

func envoyTreeYAML(roots []*envoyTree) string {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for _, r := range roots {
		r.write(&b, "  ")
	}
	return b.String()
}

// TestEnvoyIDsDependOnlyOnTheirPath is a property test: random edits to a
// config (adding, removing, reordering and renaming other descriptors, and
// giving them names already in use) keep the id of every untouched leaf.
func TestEnvoyIDsDependOnlyOnTheirPath(t *testing.T) {
	rng := rand.New(rand.NewPCG(20, 5))
	keys := []string{"generic_key", "remote_address", "user_id", "tenant_id", "header_match", "destination_cluster"}
	names := []string{"", "", "shared-name", "other", "per_user"}
	var next int
	var grow func(depth int, used map[string]bool) *envoyTree
	grow = func(depth int, used map[string]bool) *envoyTree {
		next++
		n := &envoyTree{key: keys[rng.IntN(len(keys))], limit: 1 + rng.IntN(100), name: names[rng.IntN(len(names))]}
		for used[n.key] {
			n.key = keys[rng.IntN(len(keys))]
		}
		if rng.IntN(3) > 0 {
			n.value = fmt.Sprintf("v%d", next) // unique: no two siblings collide
		}
		if depth < 2 && rng.IntN(3) == 0 {
			inner := map[string]bool{n.key: true}
			for k := range used {
				inner[k] = true
			}
			if len(inner) < len(keys) {
				for range 1 + rng.IntN(2) {
					n.kids = append(n.kids, grow(depth+1, inner))
				}
			}
		}
		return n
	}
	// idsByLimit maps each leaf's requests_per_unit, unique per config, to its id.
	idsByLimit := func(src string) (map[int64]string, error) {
		s, err := ParseEnvoy("p.yaml", []byte(src))
		if err != nil {
			return nil, err
		}
		out := map[int64]string{}
		for _, r := range s.Rules {
			out[r.Limit] = r.ID
		}
		return out, nil
	}
	checked := 0
	for trial := range 300 {
		// Roots of one key only, so that no key repeats across levels in a
		// way the parser refuses (aliases of one sluice key).
		var roots []*envoyTree
		for range 1 + rng.IntN(5) {
			roots = append(roots, grow(0, map[string]bool{}))
		}
		limits := 0
		var number func(ns []*envoyTree)
		number = func(ns []*envoyTree) { // make every limit unique, to find leaves again
			for _, n := range ns {
				limits++
				n.limit = limits
				number(n.kids)
			}
		}
		number(roots)
		before, err := idsByLimit(envoyTreeYAML(roots))
		if err != nil {
			continue // a random config the parser refuses (a key and its alias); not this test's subject
		}
		// Edit: add a new root (perhaps with a name in use) at a random place,
		// remove one, or swap two, leaving the other subtrees as they are.
		edited := append([]*envoyTree(nil), roots...)
		touched := map[*envoyTree]bool{}
		switch rng.IntN(3) {
		case 0:
			n := grow(0, map[string]bool{})
			limits++
			n.limit, n.kids = limits, nil
			i := rng.IntN(len(edited) + 1)
			edited = append(edited[:i], append([]*envoyTree{n}, edited[i:]...)...)
		case 1:
			i := rng.IntN(len(edited))
			touched[edited[i]] = true
			edited = append(edited[:i], edited[i+1:]...)
		case 2:
			i, j := rng.IntN(len(edited)), rng.IntN(len(edited))
			edited[i], edited[j] = edited[j], edited[i]
		}
		if len(edited) == 0 {
			continue
		}
		src := envoyTreeYAML(edited)
		after, err := idsByLimit(src)
		if err != nil {
			continue
		}
		checked++
		var kept []*envoyTree
		var collect func(ns []*envoyTree)
		collect = func(ns []*envoyTree) {
			for _, n := range ns {
				kept = append(kept, n)
				collect(n.kids)
			}
		}
		for _, r := range roots {
			if !touched[r] {
				collect([]*envoyTree{r})
			}
		}
		for _, n := range kept {
			id, was := before[int64(n.limit)]
			if !was {
				continue // never reachable (a wildcard; not generated) or not a rule
			}
			// A leaf whose walk priority changed (a sibling with its key and
			// no value, now ahead) still keeps its id: the id is its path.
			if got := after[int64(n.limit)]; got != id {
				t.Fatalf("trial %d: the leaf with limit %d was %q and is %q after the edit\n%s", trial, n.limit, id, got, src)
			}
		}
	}
	if checked < 200 {
		t.Errorf("only %d of 300 random configs and their edits parsed: the generator needs fixing", checked)
	}
}

// TestEnvoyExactIPv6Entry: an exact IPv6 remote_address value (with
// unlimited: true, an allow-list entry) matches requests from that address,
// which the enforcer keys by its /64, and its siblings exclude it
// (envoyproxy/ratelimit #365); two addresses of one /64 are an error naming
// both lines.
func TestEnvoyExactIPv6Entry(t *testing.T) {
	s, err := ParseEnvoy("v6.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    value: 2001:db8::7
    rate_limit: {unlimited: true}
  - key: remote_address
    value: 2001:db8:0:1::9
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
`))
	if err != nil {
		t.Fatal(err)
	}
	match := func(ip string) []string {
		var d Descriptors
		d[KeyClientIP] = NormalizeIP(ip, 64)
		var ids []string
		for _, r := range s.Match(&d, nil) {
			ids = append(ids, r.ID)
		}
		return ids
	}
	if got := match("2001:db8::7"); len(got) != 0 {
		t.Errorf("the allow-listed 2001:db8::7 matches %q, want no rule", got)
	}
	if got := match("2001:db8:0:1::9"); len(got) != 1 || got[0] != "remote_address_2001-db8-0-1-9" {
		t.Errorf("2001:db8:0:1::9 matches %q, want its own limit", got)
	}
	if got := match("2001:db8:5::1"); len(got) != 1 || got[0] != "remote_address" {
		t.Errorf("another address matches %q, want the default limit", got)
	}
	_, err = ParseEnvoy("v6.yaml", []byte(`
domain: edge
descriptors:
  - key: remote_address
    value: 2001:db8::7
    rate_limit: {unlimited: true}
  - key: remote_address
    value: 2001:db8::8
    rate_limit: {unit: minute, requests_per_unit: 5}
`))
	want := "v6.yaml:7:5: descriptor remote_address=2001:db8::8 and remote_address=2001:db8::7 (line 4 column 5) are both the client 2001:db8::/64"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("two addresses of one /64: %v, want %s…", err, want)
	}
}

// TestCheckClientIP: addresses and networks pass, texts of address bytes
// that are none are ErrNotAnAddress, and anything else is a name.
func TestCheckClientIP(t *testing.T) {
	for _, c := range []struct {
		v          string
		name, fail bool
	}{
		{"1.2.3.4", false, false}, {" 1.2.3.4 ", false, false}, {"192.0.2.7:5555", false, false},
		{"[2001:db8::1]:443", false, false}, {"fe80::1%eth0", false, false}, {"2001:db8::/64", false, false},
		{"999.1.1.1", false, true}, {" 999.1.1.1", false, true}, {"01.2.3.4", false, true}, {"1.2.3", false, true},
		{"2001:db8::1::2", false, true}, {"[1.2.3.4]", false, true}, {"1.2.3.4:99999", false, true},
		{"piweba3y.prodigy.com", true, false}, {"cafe.be", true, false}, {"localhost", true, false},
	} {
		name, err := CheckClientIP(c.v)
		if name != c.name || (err != nil) != c.fail || (err != nil && !errors.Is(err, ErrNotAnAddress)) {
			t.Errorf("CheckClientIP(%q) = %v, %v; want name %v, error %v", c.v, name, err, c.name, c.fail)
		}
	}
}

// TestEnvoyRuleIDs is docs/rules-envoy.md's table of rule ids: the path in
// envoyproxy/ratelimit's stats form, * written any, other bytes a -, and a
// hash only when the id had to be shortened to 64 bytes.
func TestEnvoyRuleIDs(t *testing.T) {
	for _, c := range []struct {
		levels []envoyLevel
		want   string
	}{
		{[]envoyLevel{{"remote_address", ""}}, "remote_address"},
		{[]envoyLevel{{"remote_address", "50.0.0.5"}}, "remote_address_50.0.0.5"},
		{[]envoyLevel{{"generic_key", "api"}, {"destination_cluster", "billing-*"}, {"remote_address", ""}}, "generic_key_api.destination_cluster_billing-any.remote_address"},
		{[]envoyLevel{{"header_match", "*"}}, "header_match_any"},
		{[]envoyLevel{{"path", "/v1/users/*"}}, "path_v1-users-any"},
		{[]envoyLevel{{"remote_address", "2001:db8::7"}}, "remote_address_2001-db8-7"},
		{[]envoyLevel{{"generic_key", "api"}, {"destination_cluster", "billing-*"}, {"remote_address", "10.0.0.1"}}, "api.billing-any.remote_address_10.0.0.1-ee458605"},
		{[]envoyLevel{{"path", "/"}}, "path__"},
		// Too long even with values alone: the outer levels go.
		{[]envoyLevel{{"a", strings.Repeat("x", 40)}, {"b", strings.Repeat("y", 40)}}, "b_" + strings.Repeat("y", 40) + "-"},
		// One value too long alone: cut.
		{[]envoyLevel{{"k", strings.Repeat("z", 80)}}, strings.Repeat("z", 55) + "-"},
	} {
		var path []string
		for _, l := range c.levels {
			if l.value == "" {
				path = append(path, l.key)
			} else {
				path = append(path, l.key+"_"+l.value)
			}
		}
		got := envoyRuleID(c.levels, strings.Join(path, "."))
		if !ValidID(got) {
			t.Errorf("%q: %q is no valid id", path, got)
		}
		if strings.HasSuffix(c.want, "-") {
			if !strings.HasPrefix(got, c.want) || len(got) != len(c.want)+8 {
				t.Errorf("%q: id %q, want %q and 8 hex digits", path, got, c.want)
			}
		} else if got != c.want {
			t.Errorf("%q: id %q, want %q", path, got, c.want)
		}
	}
}
