package rules

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// The index must find exactly the rules that trying every rule finds, in
// set order, for every kind of condition.

func TestMatchConditions(t *testing.T) {
	s, err := Parse("conditions.yaml", []byte(`
domain: api
custom_keys: [generic_key, x-plan]
rules:
  - {id: exact, match: [{key: route, value: /login}], limit: 1, period: 1s}
  - {id: list, match: [{key: method, values: [PUT, DELETE]}], limit: 1, period: 1s}
  - {id: prefix, match: [{key: path, prefix: /admin/}], limit: 1, period: 1s}
  - {id: wildcard, match: [{key: user, wildcard: "bot-*-crawler"}], limit: 1, period: 1s}
  - {id: cidr, match: [{key: client_ip, cidr: [10.0.0.0/8, "2001:db8::/32"]}], limit: 1, period: 1s}
  - {id: narrow, match: [{key: client_ip, cidr: 10.1.2.0/24}], limit: 1, period: 1s}
  - {id: template, match: [{key: path, template: "/v1/users/{id}/orders"}], limit: 1, period: 1s}
  - {id: rest, match: [{key: path, template: "/v2/files/{p...}"}], limit: 1, period: 1s}
  - {id: not, match: [{key: tenant, not: [internal], not_prefix: [test-]}], limit: 1, period: 1s}
  - {id: custom, match: [{key: generic_key, value: slow}], limit: 1, period: 1s}
  - {id: custom-any, match: [{key: x-plan}], limit: 1, period: 1s}
  - {id: exact-keys, exact_keys: true, match: [{key: generic_key}], limit: 1, period: 1s}
  - {id: both, match: [{key: route, value: /login}, {key: client_ip, cidr: 10.0.0.0/8}], limit: 1, period: 1s}
`))
	if err != nil {
		t.Fatal(err)
	}
	type kv = [2]string
	for _, c := range []struct {
		kvs  []kv
		want []string
	}{
		{[]kv{{"route", "/login"}}, []string{"exact"}},
		{[]kv{{"route", "/login2"}}, nil},
		{[]kv{{"method", "DELETE"}}, []string{"list"}},
		{[]kv{{"method", "GET"}}, nil},
		{[]kv{{"path", "/admin/x"}}, []string{"prefix"}},
		{[]kv{{"path", "/admin"}}, []string{"prefix"}}, // /admin/ normalized: the admin root
		{[]kv{{"path", "/administrator"}}, nil},
		{[]kv{{"user", "bot-google-crawler"}}, []string{"wildcard"}},
		{[]kv{{"user", "bot--crawler"}}, []string{"wildcard"}},
		{[]kv{{"user", "bot-google-crawler2"}}, nil},
		{[]kv{{"client_ip", "10.9.9.9"}}, []string{"cidr"}},
		{[]kv{{"client_ip", "10.1.2.3"}}, []string{"cidr", "narrow"}},
		{[]kv{{"client_ip", "11.1.2.3"}}, nil},
		{[]kv{{"client_ip", "2001:db8:1:2::/64"}}, []string{"cidr"}}, // NormalizeIP's form of an IPv6 client
		{[]kv{{"client_ip", "2001:db9::/64"}}, nil},
		{[]kv{{"client_ip", "not-an-ip"}}, nil},
		{[]kv{{"path", "/v1/users/42/orders"}}, []string{"template"}},
		{[]kv{{"path", "/v1/users/42/orders?page=2"}}, []string{"template"}},
		{[]kv{{"path", "/v1/users//orders"}}, nil},
		{[]kv{{"path", "/v1/users/42/orders/7"}}, nil},
		{[]kv{{"path", "/v2/files/a/b/c"}}, []string{"rest"}},
		{[]kv{{"path", "/v2/files"}}, []string{"rest"}},
		{[]kv{{"tenant", "acme"}}, []string{"not"}},
		{[]kv{{"tenant", "internal"}}, nil},
		{[]kv{{"tenant", "test-1"}}, nil},
		{[]kv{{"generic_key", "slow"}}, []string{"custom", "exact-keys"}},
		{[]kv{{"generic_key", "fast"}}, []string{"exact-keys"}},
		{[]kv{{"generic_key", "slow"}, {"user", "u"}}, []string{"custom"}},        // exact_keys: another key
		{[]kv{{"generic_key", "fast"}, {"tier", "gold"}}, []string{"exact-keys"}}, // the key store's keys aside
		{[]kv{{"x-plan", "pro"}}, []string{"custom-any"}},
		{[]kv{{"route", "/login"}, {"client_ip", "10.0.0.1"}}, []string{"exact", "cidr", "both"}},
	} {
		var d Descriptors
		for _, p := range c.kvs {
			if k, _ := KeyFor(p[0]); k == KeyCustom {
				d.SetCustom(p[0], p[1])
			} else {
				d[k] = p[1]
			}
		}
		var got []string
		for _, r := range s.Match(&d, nil) {
			got = append(got, r.ID)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: matched %v, want %v", c.kvs, got, c.want)
		}
		if lin := linearMatch(s, &d); !slices.Equal(lin, s.Match(&d, nil)) {
			t.Errorf("%v: index %v, trying every rule %v", c.kvs, got, lin)
		}
	}
}

func linearMatch(s *Set, d *Descriptors) []*Rule {
	var out []*Rule
	for _, r := range s.Rules {
		if r.Matches(d) {
			out = append(out, r)
		}
	}
	return out
}

// TestIndexAgreesWithEveryRule: on random rule sets and requests, the index
// finds what trying every rule finds.
func TestIndexAgreesWithEveryRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	vals := []string{"a", "b", "c", "ab", "abc"}
	ips := []string{"10.0.0.1", "10.1.0.1", "192.0.2.1", "2001:db8::/64", "2001:db8:1::/64"}
	nets := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("2001:db8::/48")}
	keys := []Key{KeyUser, KeyTenant, KeyRoute, KeyCustom}
	cond := func(k Key) Match {
		m := Match{Key: k}
		if k == KeyCustom {
			m.Name = "g"
		}
		switch rng.IntN(6) {
		case 0:
			m.Value = vals[rng.IntN(len(vals))]
		case 1:
			m.Values = []string{vals[rng.IntN(len(vals))], vals[rng.IntN(len(vals))]}
		case 2:
			m.Prefix = vals[rng.IntN(len(vals))]
		case 3:
			m.Not = []string{vals[rng.IntN(len(vals))]}
		}
		return m
	}
	for trial := range 200 {
		var rs []*Rule
		for i := range 30 {
			r := &Rule{ID: fmt.Sprint("r", i), Limit: 1, Period: time.Second, ExactKeys: rng.IntN(4) == 0}
			for _, k := range keys {
				if rng.IntN(3) == 0 {
					r.Match = append(r.Match, cond(k))
				}
			}
			if rng.IntN(3) == 0 {
				r.Match = append(r.Match, Match{Key: KeyClientIP, CIDR: []netip.Prefix{nets[rng.IntN(len(nets))], nets[rng.IntN(len(nets))]}})
			}
			if len(r.Match) == 0 {
				r.Match = []Match{{Key: KeyUser}}
			}
			if err := r.Validate(); err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		s := NewSet("d", 1, rs)
		for range 50 {
			var d Descriptors
			for _, k := range keys[:3] {
				if rng.IntN(2) == 0 {
					d[k] = vals[rng.IntN(len(vals))]
				}
			}
			if rng.IntN(2) == 0 {
				d.SetCustom("g", vals[rng.IntN(len(vals))])
			}
			if rng.IntN(2) == 0 {
				d[KeyClientIP] = ips[rng.IntN(len(ips))]
			}
			if got, want := s.Match(&d, nil), linearMatch(s, &d); !slices.Equal(got, want) {
				t.Fatalf("trial %d: %v: index %v, every rule %v", trial, d, ruleIDs(got), ruleIDs(want))
			}
		}
	}
}

func ruleIDs(rs []*Rule) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestReplaced(t *testing.T) {
	tier := &Rule{ID: "tier-gold"}
	ovr := &Rule{ID: "acme", Replaces: []string{"tier-gold"}}
	ip := &Rule{ID: "per-ip"}
	got := Replaced([]*Rule{tier, ip, ovr})
	if !slices.Equal(got, []*Rule{ip, ovr}) {
		t.Errorf("Replaced: %v", ruleIDs(got))
	}
	// A rule that replaces a rule that replaces: both decisions use the
	// matched list as it was, not as it is being rewritten.
	a := &Rule{ID: "a", Replaces: []string{"b"}}
	b := &Rule{ID: "b", Replaces: []string{"c"}}
	c := &Rule{ID: "c"}
	if got := Replaced([]*Rule{c, b, a}); !slices.Equal(got, []*Rule{a}) {
		t.Errorf("chain: %v, want [a]", ruleIDs(got))
	}
	// An override in shadow mode replaces nothing: the limit it would
	// replace still holds while the override is tried.
	trial := &Rule{ID: "acme-trial", Mode: Shadow, Replaces: []string{"tier-gold"}}
	if got := Replaced([]*Rule{tier, trial}); !slices.Equal(got, []*Rule{tier, trial}) {
		t.Errorf("shadow override: %v, want both", ruleIDs(got))
	}
}

// tenThousand is a rule set as a large API platform has it: per-customer
// overrides on API keys and accounts (exact values), blocked networks, a
// few dozen route rules and tier rules.
func tenThousand(tb testing.TB) *Set {
	var rs []*Rule
	add := func(r *Rule) {
		if err := r.Validate(); err != nil {
			tb.Fatal(err)
		}
		rs = append(rs, r)
	}
	for i := range 6000 {
		add(&Rule{ID: fmt.Sprint("key-", i), Match: []Match{{Key: KeyAPIKey, Value: fmt.Sprintf("k%05d", i)}}, Limit: 100, Period: time.Second})
	}
	for i := range 2500 {
		add(&Rule{ID: fmt.Sprint("acct-", i), Match: []Match{{Key: KeyAccount, Value: fmt.Sprintf("a%05d", i)}, {Key: KeyRoute, Values: []string{"/v1/search", "/v1/export"}}}, Limit: 10, Period: time.Second})
	}
	for i := range 1000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(20 + i/256), byte(i), 0, 0}), 16+i%9)
		add(&Rule{ID: fmt.Sprint("net-", i), Match: []Match{{Key: KeyClientIP, CIDR: []netip.Prefix{p.Masked()}}}, Limit: 0, Period: time.Second})
	}
	for i := range 480 {
		add(&Rule{ID: fmt.Sprint("route-", i), Match: []Match{{Key: KeyRoute, Value: fmt.Sprintf("/v1/r%d", i)}, {Key: KeyMethod}}, Limit: 50, Period: time.Second})
	}
	for _, t := range []string{"free", "pro", "enterprise"} {
		add(&Rule{ID: "tier-" + t, Match: []Match{{Key: KeyTier, Value: t}, {Key: KeyAPIKey}}, Limit: 10, Period: time.Second})
	}
	for i := range 17 { // rules no hash finds: tried one by one on every request
		add(&Rule{ID: fmt.Sprint("scan-", i), Match: []Match{{Key: KeyPath, Prefix: fmt.Sprintf("/internal/%d/", i)}}, Limit: 5, Period: time.Second})
	}
	if len(rs) != 10000 {
		tb.Fatalf("%d rules", len(rs))
	}
	return NewSet("api", 1, rs)
}

// benchRequest carries 9 descriptors and matches 3 of tenThousand's rules.
func benchRequest() Descriptors {
	var d Descriptors
	d[KeyAPIKey], d[KeyAccount], d[KeyTier] = "k04711", "a00042", "pro"
	d[KeyRoute], d[KeyMethod], d[KeyPath] = "/v1/search", "GET", "/v1/search"
	d[KeyClientIP], d[KeyUser], d[KeyTenant] = "198.51.100.7", "u-1", "acme"
	return d
}

func BenchmarkMatch10k(b *testing.B) {
	s, d := tenThousand(b), benchRequest()
	dst := make([]*Rule, 0, 64)
	if got := ruleIDs(s.Match(&d, dst)); !slices.Equal(got, []string{"key-4711", "acct-42", "tier-pro"}) {
		b.Fatalf("matched %v", got)
	}
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Match(&d, dst[:0])
	}
}

func BenchmarkMatch10kEveryRule(b *testing.B) {
	s, d := tenThousand(b), benchRequest()
	s.idx = nil // the set as a struct literal: every rule tried
	dst := make([]*Rule, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		dst = s.Match(&d, dst[:0])
	}
}

func TestMatch10kAllocatesNothing(t *testing.T) {
	s := tenThousand(t)
	var d Descriptors
	d[KeyAPIKey], d[KeyTier], d[KeyClientIP], d[KeyRoute] = "k00001", "free", "20.1.0.9", "/v1/r3"
	d[KeyMethod] = "GET"
	dst := make([]*Rule, 0, 64)
	if a := testing.AllocsPerRun(100, func() { dst = s.Match(&d, dst[:0]) }); a != 0 {
		t.Errorf("Match allocates %v times", a)
	}
	if got := ruleIDs(dst); !slices.Equal(got, []string{"key-1", "net-1", "route-3", "tier-free"}) {
		t.Errorf("matched %v", got)
	}
}

// FuzzMatch: whatever the request's values, the index finds what trying
// every rule finds, and the hand-written matchers (glob, template, network)
// neither panic nor disagree with a slow reference.
func FuzzMatch(f *testing.F) {
	s, err := Load("../testdata/rules/match-kinds.good.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add("/v1/users/42/orders", "10.1.2.3", "bot-x-crawler", "slow")
	f.Add("/v2/files/a/b", "2001:db8::/64", "", "")
	f.Add("/a?b/c", "::ffff:10.0.0.1", "**", "*")
	f.Fuzz(func(t *testing.T, path, ip, user, custom string) {
		var d Descriptors
		d[KeyPath], d[KeyRoute], d[KeyClientIP], d[KeyUser] = path, path, ip, user
		for _, name := range []string{"generic_key", "x-plan", "header_match"} {
			d.SetCustom(name, custom)
		}
		if got, want := s.Match(&d, nil), linearMatch(s, &d); !slices.Equal(got, want) {
			t.Fatalf("index %v, every rule %v", ruleIDs(got), ruleIDs(want))
		}
		for _, pat := range []string{"*", "a*b", "*a*", "bot-*-crawler", "**x"} {
			if Glob(pat, user) != globRef(pat, user) {
				t.Fatalf("glob %q on %q: %v", pat, user, Glob(pat, user))
			}
		}
	})
}

// globRef is the obvious recursive glob, as a reference.
func globRef(p, s string) bool {
	if p == "" {
		return s == ""
	}
	if p[0] == '*' {
		for i := 0; i <= len(s); i++ {
			if globRef(p[1:], s[i:]) {
				return true
			}
		}
		return false
	}
	return s != "" && s[0] == p[0] && globRef(p[1:], s[1:])
}
