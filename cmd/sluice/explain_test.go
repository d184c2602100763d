package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRulesExplain(t *testing.T) {
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(`
version: 7
domain: api
custom_keys: [generic_key]
rules:
  - {id: tier-pro, match: [{key: tier, value: pro}, {key: api_key}], limit: 2, period: 1m}
  - {id: acme, replaces: [tier-pro], match: [{key: account, value: acme}], limit: 5, period: 1m}
  - {id: per-net, match: [{key: client_ip, cidr: "2001:db8::/32"}], limit: 9, period: 1s}
  - {id: slow, match: [{key: generic_key, value: slow}], limit: 1, period: 1s}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		var out bytes.Buffer
		cmd := explainCmd()
		cmd.SetOut(&out)
		cmd.SetErr(&out)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run(file, "api_key=k1", "tier=pro", "account=acme", "client_ip=2001:db8:5::1", "--all")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"rule set version 7",
		"REPLACED  tier-pro: matched, but acme replaces it",
		"APPLIES   acme: 5 per 1m0s, burst 5 (token bucket), enforce",
		`account "acme" passes = acme`,
		"APPLIES   per-net",
		`client_ip "2001:db8:5::/64" passes in cidr [2001:db8::/32]`,
		"no match  slow: the request has no generic_key",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain output lacks %q:\n%s", want, out)
		}
	}
	if out, _ := run(file, "generic_key=fast"); !strings.Contains(out, "no rule applies") {
		t.Errorf("a request no rule matches:\n%s", out)
	}
	if out, _ := run(file, "apikey=k1"); !strings.Contains(out, "note: no rule of this set matches on apikey") {
		t.Errorf("a key no rule uses (a typo):\n%s", out)
	}
	if _, err := run(file, "user=a", "user_id=b"); err == nil || !strings.Contains(err.Error(), "user is given twice") {
		t.Errorf("one key twice: %v", err)
	}
	if _, err := run(file, "api_key"); err == nil || !strings.Contains(err.Error(), "want KEY=VALUE") {
		t.Errorf("a pair without =: %v", err)
	}
}
