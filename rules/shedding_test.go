package rules_test

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-rl/sluice/rules"
)

// TestShedding: a rule file's shedding block gives each request a priority
// (its own descriptor entry, else its route's default, else the default; a
// misspelt one is the default, never higher), sheds each priority from its
// threshold up, and survives Marshal.
func TestShedding(t *testing.T) {
	b, err := os.ReadFile("../testdata/rules/shedding.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := rules.Parse("shedding.good.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	sh := s.Shedding
	if sh == nil || sh.PriorityKey != "priority" {
		t.Fatalf("shedding %+v", sh)
	}
	for _, c := range []struct {
		given, route string
		want         rules.Priority
		ok           bool
	}{
		{"", "", rules.Normal, true},
		{"", "/v1/search", rules.Sheddable, true},
		{"", "/v1/charges", rules.Critical, true},
		{"critical", "/v1/search", rules.Critical, true},
		{"sheddable", "/v1/charges", rules.Sheddable, true},
		{"urgent", "/v1/search", rules.Sheddable, false},
		{"CRITICAL", "", rules.Normal, false},
	} {
		if p, ok := sh.Priority(c.given, c.route); p != c.want || ok != c.ok {
			t.Errorf("Priority(%q, %q) = %v, %v; want %v, %v", c.given, c.route, p, ok, c.want, c.ok)
		}
	}
	for _, c := range []struct {
		p    rules.Priority
		load float64
		want bool
	}{
		{rules.Sheddable, 0.69, false}, {rules.Sheddable, 0.7, true},
		{rules.Normal, 0.84, false}, {rules.Normal, 0.85, true},
		{rules.Critical, 0.99, false}, {rules.Critical, 1, true},
		{rules.PriorityUnset, 0.85, true}, // the default, normal
	} {
		if got := sh.Sheds(c.p, c.load); got != c.want {
			t.Errorf("Sheds(%v, %v) = %v, want %v", c.p, c.load, got, c.want)
		}
	}
	out, err := rules.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := rules.Parse("again.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if !reflect.DeepEqual(back.Shedding, s.Shedding) {
		t.Errorf("after Marshal: %+v, want %+v\n%s", back.Shedding, s.Shedding, out)
	}
}

// TestAdaptiveFloor: adaptive: {floor: F} makes a rule adaptive with that
// floor, {} with the default floor, and both survive Marshal.
func TestAdaptiveFloor(t *testing.T) {
	b, err := os.ReadFile("../testdata/rules/adaptive.good.yaml")
	if err != nil {
		t.Fatal(err)
	}
	s, err := rules.Parse("adaptive.good.yaml", b)
	if err != nil {
		t.Fatal(err)
	}
	if f := s.Rule("search").AdaptiveFloor; f != 0.2 {
		t.Errorf("search floor %v, want 0.2", f)
	}
	if f := s.Rule("per-key").AdaptiveFloor; f != rules.DefaultAdaptiveFloor {
		t.Errorf("per-key floor %v, want the default %v", f, rules.DefaultAdaptiveFloor)
	}
	out, err := rules.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	back, err := rules.Parse("again.yaml", out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, id := range []string{"search", "per-key"} {
		if back.Rule(id).AdaptiveFloor != s.Rule(id).AdaptiveFloor {
			t.Errorf("%s after Marshal: floor %v, want %v", id, back.Rule(id).AdaptiveFloor, s.Rule(id).AdaptiveFloor)
		}
	}
}

// TestSheddingAndAdaptiveRefuse: a key given twice, a quoted number and a
// route that is not a path are errors, as they are elsewhere in the format
// (a fresh user's findings: each was taken, the last key winning).
func TestSheddingAndAdaptiveRefuse(t *testing.T) {
	const rule = "domain: d\nrules:\n  - {id: r, match: [{key: user}], limit: 5, period: 1s"
	for _, c := range []struct{ yaml, want string }{
		{rule + "}\nshedding: {thresholds: {sheddable: 0.5, sheddable: 0.6}}\n", "thresholds: sheddable is given twice"},
		{rule + "}\nshedding: {default: normal, default: critical}\n", "shedding: default is given twice"},
		{rule + "}\nshedding: {thresholds: {sheddable: \"0.5\"}}\n", `"0.5" is not a number`},
		{rule + "}\nshedding: {routes: {\"\": critical}}\n", `route "": want a path that starts with /`},
		{rule + "}\nshedding: {routes: {v1/x: sheddable}}\n", `route "v1/x": want a path`},
		{rule + ", adaptive: {floor: 0.2, floor: 0.5}}\n", "floor is given twice"},
		{rule + ", adaptive: {floor: \"0.5\"}}\n", `floor "0.5" is not a number`},
	} {
		_, err := rules.Parse("t.yaml", []byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one with %q", c.yaml, err, c.want)
		}
	}
	// A plain number still parses, integer or not.
	if _, err := rules.Parse("t.yaml", []byte(rule+", adaptive: {floor: 1}}\nshedding: {thresholds: {sheddable: 0.5, normal: 1, critical: 2}}\n")); err != nil {
		t.Error(err)
	}
}
