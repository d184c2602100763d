package replay_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-rl/sluice/replay"
	"github.com/sluice-rl/sluice/rules"
)

// The report says which global rules a replay enforces per region only.
func TestReportNamesRulesHeldPerRegion(t *testing.T) {
	set, err := rules.Parse("g.yaml", []byte(`
domain: g
rules:
  - {id: paid, match: [{key: api_key}], limit: 10, period: 1h, global: true, pinned: true}
  - {id: daily, match: [{key: api_key}], algorithm: fixed_window, calendar: day, limit: 100, global: true, g_counter: true}
  - {id: shared, match: [{key: api_key}], limit: 10, period: 1s, global: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	(&replay.Report{Rules: set}).Print(&b)
	if !strings.Contains(b.String(), "global:     paid, daily hold per region in a replay") {
		t.Errorf("the report does not name the pinned and G-Counter rules:\n%s", b.String())
	}
}

// A rule the detector emits again (it still sees the abuse) is one rule in
// the report, shown once with its latest expiry and its count of emissions.
func TestReportCountsReEmittedRulesOnce(t *testing.T) {
	set, err := rules.Parse("r.yaml", []byte("domain: d\nrules:\n  - {id: per-ip, match: [{key: client_ip}], limit: 1, period: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	rule := func(id string, expires time.Time) rules.Rule {
		return rules.Rule{ID: id, Origin: "detector/heavy-hitter", Match: []rules.Match{{Key: rules.KeyClientIP, Value: "192.0.2.1"}},
			Limit: 10, Burst: 10, Period: 10 * time.Second, Mode: rules.Shadow, ExpiresAt: expires}
	}
	t0 := time.Date(2026, 1, 1, 0, 10, 0, 0, time.UTC)
	again := rule("dyn-a", t0.Add(time.Minute))
	again.Limit, again.Burst = 20, 20 // re-emitted with another limit
	rep := &replay.Report{Rules: set, DynamicRulesEmitted: 3, DynamicRules: []rules.Rule{
		rule("dyn-a", t0), rule("dyn-b", t0), again,
	}}
	// The per-rule table and the HTML page's chart titles describe a rule
	// by RuleByID: the latest emission, as the list of emitted rules.
	if r := rep.RuleByID("dyn-a"); r == nil || r.Limit != 20 || !r.ExpiresAt.Equal(t0.Add(time.Minute)) {
		t.Errorf("RuleByID(dyn-a) = %+v, want the latest emission (limit 20)", r)
	}
	var b strings.Builder
	rep.Print(&b)
	out := b.String()
	if !strings.Contains(out, "Dynamic rules emitted by the detector: 2 (3 emissions)") {
		t.Errorf("want 2 rules of 3 emissions:\n%s", out)
	}
	if n := strings.Count(out, "  dyn-a ("); n != 1 {
		t.Errorf("dyn-a listed %d times, want once:\n%s", n, out)
	}
	if !strings.Contains(out, "expires 2026-01-01T00:11:00Z, emitted 2 times") {
		t.Errorf("dyn-a: want its latest expiry and 2 emissions:\n%s", out)
	}
}
