package rules

import (
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
~ per-ip: match client_ip → client_ip, route=/login, limit 10 → 20, mode enforce → shadow
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
