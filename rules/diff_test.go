package rules

import (
	"fmt"
	"strings"
	"testing"
)

func TestDiff(t *testing.T) {
	old, err := Parse("old.yaml", []byte(`
domain: api
rules:
  - id: per-ip
    match: [{key: client_ip}]
    limit: 10
    period: 1s
  - id: gone
    match: [{key: user}]
    limit: 5
    period: 1m
  - id: same
    match: [{key: tenant}]
    limit: 1
    period: 1h
costs:
  /v1/search: 5
  /v1/old: 2
`))
	if err != nil {
		t.Fatal(err)
	}
	cur, err := Parse("new.yaml", []byte(`
domain: api2
rules:
  - id: same
    match: [{key: tenant}]
    limit: 1
    period: 1h
  - id: per-ip
    match: [{key: client_ip}, {key: route, value: /login}]
    limit: 20
    period: 1s
    burst: 10
    mode: shadow
  - id: added
    match: [{key: api_key}]
    algorithm: sliding_window
    limit: 100
    period: 1m
costs:
  /v1/search: 10
`))
	if err != nil {
		t.Fatal(err)
	}
	d := Diff(old, cur)
	var b strings.Builder
	if _, err := d.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	want := `domain: api → api2
+ added: 100 per 1m0s (sliding window), enforce
- gone: 5 per 1m0s, burst 5 (token bucket), enforce
~ per-ip: match client_ip → client_ip; route = /login, limit 10 → 20, mode enforce → shadow
~ cost /v1/old: 2 → (none)
~ cost /v1/search: 5 → 10
`
	if b.String() != want {
		t.Errorf("diff:\n%s\nwant:\n%s", b.String(), want)
	}
	if s := d.Summary(); s != "+1 -1 ~1, domain, costs" {
		t.Errorf("summary %q", s)
	}
	if d := Diff(old, old); !d.Empty() || d.Summary() != "+0 -0 ~0" {
		t.Errorf("a set against itself: %+v", d)
	}
	if d := Diff(nil, cur); len(d.Rules) != 3 || d.Rules[0].Kind != Added {
		t.Errorf("from nothing: %+v", d)
	}
}

// TestDiffMatchConditions: a change of any match condition, of a custom
// key, of exact_keys or of replaces is a change, worded as explain words
// conditions.
func TestDiffMatchConditions(t *testing.T) {
	parse := func(slow, prefix, not string, exact bool, replaces string) *Set {
		t.Helper()
		s, err := Parse("f.yaml", fmt.Appendf(nil, `
domain: api
custom_keys: [generic_key]
rules:
  - id: base
    match: [{key: user}]
    limit: 1
    period: 1m
  - id: other
    match: [{key: tenant}]
    limit: 1
    period: 1m
  - id: r
    match: [{key: generic_key, value: %s}, {key: path, prefix: %s, not: [%s]}]
    limit: 5
    period: 1m
    exact_keys: %t
    replaces: [%s]
`, slow, prefix, not, exact, replaces))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	old := parse("slow", "/admin/", "/admin/health", false, "base")
	for _, c := range []struct {
		name string
		cur  *Set
		want string
	}{
		{"custom value", parse("fast", "/admin/", "/admin/health", false, "base"),
			"~ r: match generic_key = slow; path prefix /admin/, not [/admin/health] → generic_key = fast; path prefix /admin/, not [/admin/health]\n"},
		{"prefix", parse("slow", "/adm/", "/admin/health", false, "base"),
			"~ r: match generic_key = slow; path prefix /admin/, not [/admin/health] → generic_key = slow; path prefix /adm/, not [/admin/health]\n"},
		{"exclusion", parse("slow", "/admin/", "/admin/ping", false, "base"),
			"~ r: match generic_key = slow; path prefix /admin/, not [/admin/health] → generic_key = slow; path prefix /admin/, not [/admin/ping]\n"},
		{"exact_keys", parse("slow", "/admin/", "/admin/health", true, "base"), "~ r: exact_keys false → true\n"},
		{"replaces", parse("slow", "/admin/", "/admin/health", false, "base, other"), "~ r: replaces base → base, other\n"},
	} {
		d := Diff(old, c.cur)
		var b strings.Builder
		d.WriteTo(&b)
		if b.String() != c.want {
			t.Errorf("%s:\n%s\nwant:\n%s", c.name, b.String(), c.want)
		}
	}
}
