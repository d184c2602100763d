package rules_test

import (
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/rules"
)

func TestRuleDescription(t *testing.T) {
	const in = `domain: d
rules:
  - id: per-key
    description: "100 requests a minute per API key"
    match: [{key: api_key}]
    limit: 100
    period: 1m
`
	s, err := rules.Parse("in.yaml", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Rule("per-key").Description; got != "100 requests a minute per API key" {
		t.Fatalf("description %q", got)
	}
	out, err := rules.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := rules.Parse("out.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := back.Rule("per-key").Description; got != "100 requests a minute per API key" {
		t.Errorf("after Marshal and Parse: description %q\n%s", got, out)
	}
	for name, desc := range map[string]string{
		"control character": `"a\u0007b"`,
		"too long":          strings.Repeat("x", 201),
	} {
		bad := strings.Replace(in, `"100 requests a minute per API key"`, desc, 1)
		if _, err := rules.Parse("bad.yaml", []byte(bad)); err == nil || !strings.Contains(err.Error(), "description") {
			t.Errorf("%s: %v, want an error that names the description", name, err)
		}
	}
}

// TestDiffShowsADescription: a set whose only change is a rule's
// description differs, so that a push applies it.
func TestDiffShowsADescription(t *testing.T) {
	parse := func(desc string) *rules.Set {
		s, err := rules.Parse("in.yaml", []byte("domain: d\nrules:\n  - {id: r, description: \""+desc+"\", match: [{key: user}], limit: 1, period: 1s}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if d := rules.Diff(parse("old words"), parse("new words")); d.Empty() {
		t.Error("a changed description: no difference")
	}
	if d := rules.Diff(parse("same"), parse("same")); !d.Empty() {
		t.Error("the same description: a difference")
	}
}
