package replay_test

import (
	"strings"
	"testing"

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
