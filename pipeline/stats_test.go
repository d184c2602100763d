package pipeline

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestStatsReadPlainCounters: Stats reads the counters as they are (atomics,
// no allocation: not a read-back through the Prometheus client), and the
// metrics show the same numbers.
func TestStatsReadPlainCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	am, err := newApplyMetrics(reg, "eu")
	if err != nil {
		t.Fatal(err)
	}
	mm, err := newMergeMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a, mg := &Applier{m: am}, &Merger{m: mm}
	am.records[KindRule][applyApplied].Add(3)
	am.bad.Inc()
	mm.outputs.Add(5)
	if s := a.Stats(); s.RulesApplied != 3 || s.Bad != 1 {
		t.Errorf("applier stats %+v, want 3 rules applied and 1 bad", s)
	}
	if s := mg.Stats(); s.Outputs != 5 {
		t.Errorf("merger stats %+v, want 5 outputs", s)
	}
	if n := testing.AllocsPerRun(100, func() { a.Stats(); mg.Stats() }); n != 0 {
		t.Errorf("Stats allocates %v times: it reads the counters back through the Prometheus client", n)
	}
	for name, want := range map[string]string{
		"sluice_apply_bad_records_total": "# HELP sluice_apply_bad_records_total Output records that did not decode, logged and skipped.\n# TYPE sluice_apply_bad_records_total counter\nsluice_apply_bad_records_total{region=\"eu\"} 1\n",
		"sluice_pipeline_outputs_total":  "# HELP sluice_pipeline_outputs_total Dynamic rules and shares written by finished windows.\n# TYPE sluice_pipeline_outputs_total counter\nsluice_pipeline_outputs_total 5\n",
	} {
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), name); err != nil {
			t.Error(err)
		}
	}
}
