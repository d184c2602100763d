package archtest

import "testing"

// TestVerdict pins down how the table reads: own row, listed rows by root,
// the internal/ harnesses, and the never rules for cmd and replay.
func TestVerdict(t *testing.T) {
	for _, c := range []struct {
		from, to string
		test, ok bool
	}{
		{"decision", "decision/decisionpb", false, true},
		{"decision", "rules", false, true},
		{"decision", "rules/store", false, false},
		{"rules", "rules/store", false, false},
		{"rules/store", "rules", false, true},
		{"rules", "enforcer", true, false},
		{"sketch", "detector/enrich", true, false},
		{"detector", "detector/enrich", false, true},
		{"detector", "pipeline/stage", false, true},
		{"detector", "pipeline", false, false},
		{"detector", "aggregator", true, false},
		{"enforcer/backoff", "enforcer", false, true},
		{"enforcer", "enforcer/sidecar", false, false},
		{"enforcer", "pipeline/stage", false, false},
		{"enforcer/sidecar", "enforcer/backoff", false, true},
		{"enforcer/sidecar", "rules/store", false, false},
		{"enforcer/sidecar", "pipeline", false, false},
		{"pipeline", "pipeline/stage", false, true},
		{"pipeline/stage", "pipeline", false, false},
		{"pipeline", "enforcer", false, false},
		{"aggregator", "pipeline/gcounter", false, false},
		{"pipeline/gcounter", "pipeline", false, true},
		{"pipeline/gcounter", "decision", false, true},
		{"pipeline/gcounter", "rules/store", false, true},
		{"pipeline/gcounter", "enforcer", false, false},
		{"pipeline/gcounter", "enforcer", true, false},
		{"aggregator", "rules/store", false, false},
		{"analytics", "deploy/clickhouse", false, true},
		{"detector", "deploy/clickhouse", false, false},
		{"deploy/clickhouse", "rules", false, false},
		{"rules", "internal/redistest", true, true},
		{"rules", "internal/redistest", false, false},
		{"cmd/sluice", "internal/redistest", false, false},
		{"internal/clickhousetest", "deploy/clickhouse", false, true},
		{"internal/redistest", "cmd/sluice", true, false},
		{"internal/redistest", "replay", false, false},
		{"cmd/sluice", "replay", false, true},
		{"replay", "cmd/sluice", false, false},
		{"replay/accesslog", "detector/enrich", false, true},
		{"cmd/sluice", "pipeline/gcounter", false, true},
		{"rules", "nowhere", false, false},
		{"nowhere", "rules", false, false},
	} {
		if why := verdict(c.from, c.to, c.test); (why == "") != c.ok {
			t.Errorf("verdict(%s -> %s, test %v) = %q; want ok %v", c.from, c.to, c.test, why, c.ok)
		}
	}
}
