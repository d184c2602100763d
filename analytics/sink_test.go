package analytics

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

var t0 = time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)

// generated returns n varied decision records from t0, 10 ms apart; every
// 100th has no request id.
func generated(n int) []decision.Record {
	regions := []string{"eu-west", "us-east", "ap-south"}
	outcomes := []decision.Outcome{decision.Allowed, decision.Denied, decision.ShadowDenied, decision.DegradedOpen, decision.DegradedClosed}
	recs := make([]decision.Record, n)
	for i := range recs {
		var d rules.Descriptors
		d[rules.KeyAPIKey] = fmt.Sprintf("key-%02d", i%50)
		d[rules.KeyClientIP] = fmt.Sprintf("192.0.2.%d", i%200)
		d[rules.KeyRoute] = "/v1/items"
		if i%3 == 0 {
			d.SetCustom("plan", "gold")
		}
		id := fmt.Sprintf("req-%05d", i)
		if i%100 == 0 {
			id = ""
		}
		recs[i] = decision.Record{Time: t0.Add(time.Duration(i) * 10 * time.Millisecond), Region: regions[i%3], Instance: "gw-1",
			RequestID: id, Domain: "sluice", Descriptors: d, UserAgent: "curl/8", Matched: []string{"per-key"},
			Outcome: outcomes[i%5], Path: decision.PathRedis, Cost: 1, Remaining: int64(i % 7), Latency: 300 * time.Microsecond}
	}
	return recs
}

// TestSinkWritesEveryRecord: N decision records in, N rows out, each as it
// was logged; the output topic's rules and shares in their tables; a record
// that does not decode and the watermark markers skipped and counted.
func TestSinkWritesEveryRecord(t *testing.T) {
	const n = 2000
	conn, _ := migrated(t, shared(t))
	brokers := newKafka(t)
	recs := generated(n)
	produce(t, brokers, recs)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	punct, err := pipeline.Punctuate(ctx, brokers, pipeline.DefaultTopic, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: pipeline.DefaultTopic, Value: []byte("not a decision")},
		&kgo.Record{Topic: pipeline.DefaultOutputTopic, Key: []byte("rule/x"), Value: []byte("{")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	tw, err := pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	out := stage.Output{
		Rules: []rules.Rule{{ID: "dyn-1", Match: []rules.Match{{Key: rules.KeyClientIP, Value: "192.0.2.9"}}, Limit: 10, Period: time.Minute, Burst: 10,
			Mode: rules.Shadow, Origin: "detector/heavy_hitters", Reason: "a lot", Evidence: map[string]string{"z": "1", "count": "30"},
			ExpiresAt: t0.Add(2 * time.Hour), Version: t0.Add(time.Minute).UnixMilli()}},
		Shares: []rules.Share{
			{RuleID: "per-key", Region: "eu-west", Fraction: 0.25, Version: t0.Add(time.Minute).UnixMilli(), ComputedAt: t0.Add(time.Minute)},
			{RuleID: "per-key", Region: "us-east", Fraction: 0.5, Version: t0.Add(time.Minute).UnixMilli(), ComputedAt: t0.Add(time.Minute)},
			{RuleID: "per-key", Key: "api_key=key-01", Region: "us-east", Fraction: 1, Version: t0.Add(time.Minute).UnixMilli(), ComputedAt: t0.Add(time.Minute)},
		},
	}
	if err := tw.Write(ctx, out); err != nil {
		t.Fatal(err)
	}

	s := runSink(t, brokers, "sink-test", conn, func(o *SinkOptions) { o.BatchRows = 300 })
	waitFor(t, time.Minute, func() (bool, string) {
		st := s.Stats()
		ok := st.Rows[TableDecisions] >= n && st.Rows[TableRules] >= 1 && st.Rows[TableShares] >= 3 && s.Lag() == 0
		return ok, fmt.Sprintf("stats %+v, lag %d", st, s.Lag())
	})

	st := s.Stats()
	if st.Rows[TableDecisions] != n || st.Rows[TableRules] != 1 || st.Rows[TableShares] != 3 {
		t.Errorf("rows written %v: want %d decisions, 1 rule, 3 shares", st.Rows, n)
	}
	if st.Skipped[SkipBadDecision] != 1 || st.Skipped[SkipBadOutput] != 1 || st.Skipped[SkipPunctuation] != int64(punct) {
		t.Errorf("skipped %v: want 1 bad decision, 1 bad output record, %d punctuations", st.Skipped, punct)
	}
	if st.Batches < n/300 {
		t.Errorf("%d batches: want at least %d of at most 300 records", st.Batches, n/300)
	}
	if got := count(t, conn, "SELECT count() FROM decisions"); got != n {
		t.Errorf("%d rows in decisions: want %d", got, n)
	}
	if got := count(t, conn, "SELECT count() FROM decisions FINAL"); got != n {
		t.Errorf("%d rows in decisions FINAL: want %d", got, n)
	}
	if got := count(t, conn, "SELECT toUInt64(sum(request_id_derived)) FROM decisions"); got != n/100 {
		t.Errorf("%d derived request ids: want %d", got, n/100)
	}
	// Every record's request id, or its derived one, exactly once.
	ids := strs(t, conn, "SELECT request_id FROM decisions WHERE request_id_derived = 0 ORDER BY request_id")
	var want []string
	for _, r := range recs {
		if r.RequestID != "" {
			want = append(want, r.RequestID)
		}
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Errorf("%d request ids in decisions, want the %d logged (first differences hidden)", len(ids), len(want))
	}
	derived := strs(t, conn, "SELECT request_id FROM decisions WHERE request_id_derived = 1")
	for _, id := range derived {
		var p int32
		var off int64
		if _, err := fmt.Sscanf(id, "kafka:decisions/%d/%d", &p, &off); err != nil {
			t.Errorf("derived request id %q: want kafka:decisions/<partition>/<offset>", id)
		}
	}

	// One record, column by column: record 7 (us-east, shadow-denied, no custom descriptor).
	r := recs[7]
	row := conn.QueryRow(ctx, `SELECT event_time, event_time_ms, region, instance, domain, entity, api_key, client_ip, route,
		custom_keys, custom_values, user_agent, matched_rules, toString(outcome), toString(decision_path), cost, remaining, latency_us
		FROM decisions WHERE request_id = 'req-00007'`)
	var (
		et                                                      time.Time
		ms, remaining                                           int64
		region, instance, domain, entity, apiKey, ip, route, ua string
		outcome, path                                           string
		ck, cv, matched                                         []string
		cost, latency                                           uint32
	)
	if err := row.Scan(&et, &ms, &region, &instance, &domain, &entity, &apiKey, &ip, &route, &ck, &cv, &ua, &matched, &outcome, &path, &cost, &remaining, &latency); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(et.Unix(), ms, region, instance, domain, entity, apiKey, ip, route, ck, cv, ua, matched, outcome, path, cost, remaining, latency)
	wantRow := fmt.Sprint(r.Time.Unix(), r.Time.UnixMilli(), "us-east", "gw-1", "sluice", "api_key=key-07", "key-07", "192.0.2.7", "/v1/items",
		[]string{}, []string{}, "curl/8", []string{"per-key"}, "shadow_denied", "redis", 1, 0, 300)
	if got != wantRow {
		t.Errorf("record 7 reads back as\n%s\nwant\n%s", got, wantRow)
	}
	if got := strs(t, conn, "SELECT arrayStringConcat(custom_values, ',') FROM decisions WHERE request_id = 'req-00009'"); !slices.Equal(got, []string{"gold"}) {
		t.Errorf("record 9's custom values %q: want [gold]", got)
	}

	// The audit tables.
	if got := strs(t, conn, `SELECT concat(rule_id, ' ', mode, ' ', origin, ' ', scope, ' ', arrayStringConcat(evidence_keys, ','), ' ',
		arrayStringConcat(evidence_values, ','), ' ', toString(version_time), ' ', toString(expires_at)) FROM dynamic_rules`); !slices.Equal(got,
		[]string{"dyn-1 shadow detector/heavy_hitters client_ip = 192.0.2.9 count,z 30,1 2026-11-02 10:01:00 2026-11-02 12:00:00"}) {
		t.Errorf("dynamic_rules: %q", got)
	}
	if got := strs(t, conn, `SELECT concat(rule_id, '/', key, '/', region, ' ', toString(fraction), ' ', toString(computed_at)) FROM shares ORDER BY key, region`); !slices.Equal(got,
		[]string{"per-key//eu-west 0.25 2026-11-02 10:01:00", "per-key//us-east 0.5 2026-11-02 10:01:00", "per-key/api_key=key-01/us-east 1 2026-11-02 10:01:00"}) {
		t.Errorf("shares: %q", got)
	}
}

// TestSinkGivesUpABatchForARebalance: a sink whose ClickHouse is
// unreachable retries its batch; when a second member joins its group, it
// gives the batch up without committing, and once it leaves, the second
// member (which flushes rather than gives up its batches at rebalances)
// writes every record exactly once.
func TestSinkGivesUpABatchForARebalance(t *testing.T) {
	const n = 500
	conn, _ := migrated(t, shared(t))
	brokers := newKafka(t)
	produce(t, brokers, generated(n))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nowhere := l.Addr().String() // nothing listens once closed
	l.Close()
	dead, err := Open(ConnOptions{Addr: nowhere, Database: "default", DialTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	stuck := runSink(t, brokers, "sink-rebalance", dead, func(o *SinkOptions) { o.RetryMax = 200 * time.Millisecond })
	waitFor(t, time.Minute, func() (bool, string) {
		return stuck.Stats().InsertFailures >= 2, fmt.Sprintf("stats %+v", stuck.Stats())
	})
	good := runSink(t, brokers, "sink-rebalance", conn, nil)
	waitFor(t, time.Minute, func() (bool, string) {
		return stuck.Stats().Abandoned >= 1, fmt.Sprintf("stuck member %+v", stuck.Stats())
	})
	stuck.Close()
	waitFor(t, time.Minute, func() (bool, string) {
		n := count(t, conn, "SELECT count() FROM decisions")
		return n >= 500 && good.Lag() == 0, fmt.Sprintf("%d rows, lag %d, the good member %+v", n, good.Lag(), good.Stats())
	})
	if st := stuck.Stats(); st.Rows[TableDecisions] != 0 || st.Batches != 0 {
		t.Errorf("the member without ClickHouse wrote %+v", st)
	}
	// The member with ClickHouse flushes what it holds when a rebalance
	// waits, rather than giving it up.
	if st := good.Stats(); st.Abandoned != 0 {
		t.Errorf("the member with ClickHouse gave up %d batches", st.Abandoned)
	}
	if got := count(t, conn, "SELECT count() FROM decisions FINAL"); got != n {
		t.Errorf("%d records written: want %d", got, n)
	}
	if got := count(t, conn, "SELECT uniqExact(request_id) FROM decisions"); got != n {
		t.Errorf("%d distinct request ids: want %d", got, n)
	}
}
