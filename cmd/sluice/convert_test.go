package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/sluice-rl/sluice/rules"
)

// rulesRoot is `sluice rules convert`, as main wires it.
func rulesRoot(args ...string) (*cobra.Command, *bytes.Buffer) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"rules", "convert"}, args...))
	return root, &out
}

func TestConvert(t *testing.T) {
	in := filepath.Join("..", "..", "testdata", "rules", "envoy-priority.good.yaml")
	want, err := rules.Load(in)
	if err != nil {
		t.Fatal(err)
	}

	root, out := rulesRoot(in)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	got, err := rules.Parse("stdout", out.Bytes())
	if err != nil {
		t.Fatalf("the converted rules do not parse: %v\n%s", err, out)
	}
	if len(got.Rules) != len(want.Rules) || got.Domain != want.Domain || got.Rule("generic_key_api.destination_cluster_billing-any.remote_address") == nil { // the leaf named billing_ip
		t.Errorf("converted %d rules of domain %q, want %d of %q", len(got.Rules), got.Domain, len(want.Rules), want.Domain)
	}

	file := filepath.Join(t.TempDir(), "rules.yaml")
	root, out = rulesRoot(in, "-o", file)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 {
		t.Errorf("-o wrote to stdout too: %q", out)
	}
	if _, err := rules.Load(file); err != nil {
		t.Errorf("the written file: %v", err)
	}
}

func TestConvertErrors(t *testing.T) {
	dir := t.TempDir()
	sluiceFormat := filepath.Join("..", "..", "testdata", "rules", "tiers.good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{sluiceFormat}, "not an envoyproxy/ratelimit config"},
		{[]string{bad}, `bad.yaml:4:24: rate_limit unit "fortnight": want second, minute, hour, day, week, month or year`},
		{[]string{filepath.Join(dir, "missing.yaml")}, "reading the envoyproxy/ratelimit config"},
		{nil, "accepts 1 arg(s)"},
	} {
		root, _ := rulesRoot(c.args...)
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("convert %q: error %v, want %q", c.args, err, c.want)
		}
	}
}
