package rules

import (
	"strings"
	"testing"
	"time"
)

func TestParseGood(t *testing.T) {
	s, err := Parse("good.yaml", []byte(`
domain: api
rules:
  - id: per-ip
    match: [{key: client_ip}]
    limit: 10
    period: 13s
  - id: login
    match: [{key: route, value: /login}, {key: user}]
    limit: 5
    period: 15m
    burst: 2
    mode: shadow
    failure_mode: closed
    global: true
`))
	if err != nil {
		t.Fatal(err)
	}
	if s.Domain != "api" || len(s.Rules) != 2 || s.Version != 1 {
		t.Fatalf("%+v", s)
	}
	r := s.Rule("per-ip")
	if r.Burst != 10 || r.Period != 13*time.Second {
		t.Errorf("per-ip: burst %d period %s; want burst defaulting to limit", r.Burst, r.Period)
	}
	l := s.Rule("login")
	if l.Mode != Shadow || l.FailureMode != FailClosed || !l.Global || l.Burst != 2 || l.Match[0].Value != "/login" {
		t.Errorf("login: %+v", l)
	}
	var d Descriptors
	d[KeyRoute], d[KeyUser] = "/login", "u"
	if got := s.Match(&d, nil); len(got) != 1 || got[0] != l {
		t.Errorf("match: %v", got)
	}
	d[KeyClientIP] = "1.2.3.4"
	if got := s.Match(&d, nil); len(got) != 2 {
		t.Errorf("match: %v", got)
	}
}

// rule1 is a rule file with one rule of the given match entry.
func rule1(match string) string {
	return "domain: a\nrules:\n  - {id: x, match: [" + match + "], limit: 1, period: 1s}\n"
}

func TestParseBad(t *testing.T) {
	for _, c := range []struct{ yaml, want string }{
		{"", "empty rule file"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n    bogus: 1\n", "bad.yaml:7:5: field bogus not found in a rule (known: id, description, match"},
		{"rules: []\n", "domain is missing"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1.5\n    period: 1s\n", "bad.yaml:5:12: \"1.5\" is not a whole number"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n    global: \"yes\"\n", "bad.yaml:7:13: \"yes\" is not true or false"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: ten\n    period: 1s\n", "bad.yaml:5:12: \"ten\" is not a whole number"},
		// Found by a fresh user: said "is not a whole number".
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 99999999999999999999\n    period: 1s\n", "bad.yaml:5:12: 99999999999999999999 is too large: at most 2^52"},
		// Found by a fresh user: read as YAML 1.1 numbers (0x10 = 16, 1_000 = 1000).
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 0x10\n    period: 1s\n", "bad.yaml:5:12: 0x10: write a whole number in decimal digits"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 0b101\n    period: 1s\n", "decimal digits"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1_000\n    period: 1s\n", "decimal digits"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n---\ndomain: b\n", "bad.yaml:7:1: a second YAML document (---) starts here"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: nope}]\n    limit: 1\n    period: 1s\n", `bad.yaml:4:12: rule 1: invalid rule "x": unknown descriptor key "nope"`},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: -1\n    period: 1s\n", "limit must be >= 0"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: soon\n", "write a Go duration"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1500us\n", "whole number of milliseconds"},
		{"domain: a\nrules:\n  - id: 'a b'\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n", "id must be"},
		{"domain: a\nrules:\n  - id: x\n    limit: 1\n    period: 1s\n", "match is empty"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n", "bad.yaml:7:5: rule 2"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n    mode: loud\n", "want enforce or shadow"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}, {key: user}]\n    limit: 1\n    period: 1s\n", "matched twice"},
		{"domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 10000h\n    burst: 100000000\n", "exceeds 2^52"},
		{rule1("{key: client_ip, value: 10.0.0.0/8}"), `match client_ip: "10.0.0.0/8": a network: write cidr: [10.0.0.0/8]`},
		{rule1("{key: client_ip, value: '::ffff:1.2.3.4'}"), "an IPv4-mapped address is keyed as IPv4: write 1.2.3.4"},
		{rule1("{key: client_ip, values: ['2001:db8::1']}"), "IPv6 clients are keyed by their network"},
		{rule1("{key: client_ip, not: [010.1.2.3]}"), ""}, // not an address to netip: text, allowed
		{rule1("{key: user}") + "---\n", ""},              // an empty trailing document
		{rule1("{key: user}") + "---\n# the end\n---\n", ""},
		{rule1("{key: path, template: '/{a...}/x'}"), "matches the rest of the path, so it must be the last"},
		{rule1("{key: path, template: '/v1/**/orders'}"), "must be the last"},
		{rule1("{key: path, template: '/v1/{id'}"), `segment "{id": a parameter is a whole segment`},
		{rule1("{key: path, template: '/v1/x{id}'}"), "a parameter is a whole segment"},
		{rule1("{key: path, template: '/v1//x'}"), "an empty segment (//) matches only a path with // in it"},
		{rule1("{key: path, template: '/v1/{id}/{id}'}"), "parameter {id} is named twice"},
		{"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s, global: true, pinned: true, g_counter: true}\n", `pinned and g_counter are two ways to hold a global limit: choose one`},
		{"domain: a\nrules:\n  - {id: x, match: [{key: user}], algorithm: concurrency, limit: 1, global: true, pinned: true}\n", `a concurrency rule cannot be pinned`},
		{"domain: a\nrules:\n  - {id: x, match: [{key: user}], algorithm: fixed_window, calendar: day, limit: 1, g_counter: true}\n", `g_counter applies only to global rules: add global: true`},
		{"domain: a\nrules:\n  - {id: x, match: [{key: user}], limit: 1, period: 1s, global: true, pinned: yes}\n", `"yes" is not true or false`},
		{"domain: a\ncustom_keys: [g, g]\nrules:\n  - {id: x, match: [{key: g}], limit: 1, period: 1s}\n", `bad.yaml:2:15: custom_keys: "g" is declared twice`},
		{"domain: a\ncustom_keys: [c1, c2, c3, c4, c5, c6, c7, c8, c9]\nrules:\n  - {id: x, match: [{key: c1}, {key: c2}, {key: c3}, {key: c4}, {key: c5}, {key: c6}, {key: c7}, {key: c8}, {key: c9}], limit: 1, period: 1s}\n", "9 custom keys: a request carries at most 8"},
		{"domain: a\nrules:\n  - {id: x, replaces: [y], match: [{key: user}], limit: 1, period: 1s}\n  - {id: y, replaces: [x], match: [{key: user}], limit: 1, period: 1s}\n", `bad.yaml:3:5: rule 1: invalid rule "x": replaces go round in a circle (x replaces y replaces x)`},
	} {
		_, err := Parse("bad.yaml", []byte(c.yaml))
		if c.want == "" { // accepted on purpose
			if err != nil {
				t.Errorf("%q: %v, want it accepted", c.yaml, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want it to contain %q", c.yaml, err, c.want)
		}
	}
}

func TestEntityTagSeparatesValues(t *testing.T) {
	r := &Rule{Match: []Match{{Key: KeyUser}, {Key: KeyTenant}}}
	a := Descriptors{KeyUser: "ab", KeyTenant: "c"}
	b := Descriptors{KeyUser: "a", KeyTenant: "bc"}
	if EntityTag(r, &a) == EntityTag(r, &b) {
		t.Error("length prefixes must keep (ab, c) and (a, bc) apart")
	}
	if len(EntityTag(r, &a)) != 32 || strings.ContainsAny(EntityTag(r, &a), "{}") {
		t.Error(EntityTag(r, &a))
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: 1\n    period: 1s\n"))
	f.Add([]byte("domain: [\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Parse("fuzz.yaml", b)
		if err != nil {
			return
		}
		for _, r := range s.Rules {
			// A blocking rule (limit: 0) has no bucket, so no burst.
			if r.Validate() != nil || r.Burst <= 0 && !r.Blocks() {
				t.Fatalf("Parse accepted an invalid rule %+v", r)
			}
		}
	})
}

func TestNormalizeIP(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.7": "192.0.2.7", " 192.0.2.7 ": "192.0.2.7", "192.0.2.7:5555": "192.0.2.7", "192.0.2.7%eth0": "192.0.2.7",
		"::ffff:192.0.2.7": "192.0.2.7", "[::ffff:192.0.2.7]:80": "192.0.2.7",
		"2001:db8:1:2::1": "2001:db8:1:2::/64", "[2001:db8:1:2::1]:443": "2001:db8:1:2::/64", "fe80::1%eth0": "fe80::/64",
		"host.example": "host.example", "": "", "192.000.002.007": "192.000.002.007",
		"2001:db8:1:2:3:4:5:6": "2001:db8:1:2::/64", "pppa006.compuserve.com": "pppa006.compuserve.com",
	} {
		if got := NormalizeIP(in, 64); got != want {
			t.Errorf("NormalizeIP(%q) = %q, want %q", in, got, want)
		}
	}
	if got := NormalizeIP("2001:db8:1:2::1", 128); got != "2001:db8:1:2::1" {
		t.Errorf("/128: %q", got)
	}
}

// TestEnvoyMaskedAddress: an Envoy config keys a network as the text that
// Envoy's masked_remote_address action sends; it loads (Envoy's format has
// no cidr) and matches that text, where sluice's own format points to cidr.
func TestEnvoyMaskedAddress(t *testing.T) {
	s, err := Parse("envoy.yaml", []byte("domain: e\ndescriptors:\n  - key: masked_remote_address\n    value: 10.1.0.0/16\n    rate_limit: {unit: second, requests_per_unit: 5}\n  - key: masked_remote_address\n    value: '2001:db8::1'\n    rate_limit: {unit: second, requests_per_unit: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	var d Descriptors
	d[KeyClientIP] = "10.1.0.0/16"
	if got := s.Match(&d, nil); len(got) != 1 || got[0].Limit != 5 {
		t.Errorf("masked address: %v", ruleIDs(got))
	}
	if _, err := Parse("bad.yaml", []byte(rule1("{key: client_ip, value: 10.1.0.0/16}"))); err == nil || !strings.Contains(err.Error(), "write cidr: [10.1.0.0/16]") {
		t.Errorf("sluice's format: %v", err)
	}
	if _, err := Parse("bad.yaml", []byte(rule1("{key: client_ip, value: 10.1.2.3/16}"))); err == nil || !strings.Contains(err.Error(), "10.1.0.0/16") {
		t.Errorf("an unmasked network: %v", err)
	}
}

// TestLimitIsDecimal: found by a fresh user. "limit: 010" was 8 (YAML
// 1.1's octal, which yaml.v3 keeps) while the Envoy format read 10; a
// zero-padded number is decimal, as in YAML 1.2.
func TestLimitIsDecimal(t *testing.T) {
	for _, v := range []string{"010", "0010", "+10", "10"} {
		s, err := Parse("d.yaml", []byte("domain: a\nrules:\n  - id: x\n    match: [{key: user}]\n    limit: "+v+"\n    period: 1s\n"))
		if err != nil {
			t.Fatalf("limit: %s: %v", v, err)
		}
		if got := s.Rules[0].Limit; got != 10 {
			t.Errorf("limit: %s read as %d, want 10", v, got)
		}
	}
}
