package analytics

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/pipeline/stage"
	"github.com/sluice-rl/sluice/rules"
)

// fixture is a small traffic sample whose reports are computed by hand in
// TestReportsMatchTheFixture. Times are from t0 (2026-11-02 10:00:00 UTC);
// "-" is no API key (the key is then the client IP).
//
//	id   at     region key ip         matched            outcome          denying   shadow
//	r01  0:10   eu     A   10.0.0.1   per-key            allowed
//	r02  0:20   eu     A   10.0.0.1   per-key            denied           per-key
//	r03  0:30   eu     A   10.0.0.1   per-key            denied           per-key
//	r04  0:40   us     A   10.0.0.2   per-key            denied           per-key
//	r05  1:05   us     B   10.0.0.3   per-key            denied           per-key
//	r06  1:10   us     B   10.0.0.3   per-key,shadow-ip  shadow_denied    shadow-ip shadow-ip
//	r07  1:20   us     -   10.0.0.7   shadow-ip          shadow_denied    shadow-ip shadow-ip
//	r08  1:30   us     -   10.0.0.7   shadow-ip          shadow_denied    shadow-ip shadow-ip
//	r09  1:40   eu     C   10.0.0.4   per-key,shadow-ip  denied           per-key   shadow-ip
//	r10  2:00   eu     C   10.0.0.4   per-key            degraded_open
//	r11  2:10   eu     C   10.0.0.4   per-key            degraded_open
//	r12  2:20   us     A   10.0.0.2   per-key            degraded_closed  per-key
//	r13  2:30   us     -   10.0.0.9   dyn-hh-1           denied           dyn-hh-1
//	r14  2:40   us     -   10.0.0.9   dyn-hh-1           denied           dyn-hh-1
//	r15  2:50   us     -   10.0.0.9   dyn-hh-1           allowed
//	r19  3:20   eu     -   10.0.0.11  per-key,dyn-hh-1   denied           dyn-hh-1
//	r16  3:00   eu     -   10.0.0.10  dyn-hh-2           shadow_denied    dyn-hh-2  dyn-hh-2
//	(none) 3:10 eu     B   10.0.0.3   per-key            allowed
//	r18  65:00  eu     A   10.0.0.1   per-key            denied           per-key   (after the range)
func fixture() []decision.Record {
	type row struct {
		id              string
		at              string
		region, key, ip string
		matched         string
		outcome         decision.Outcome
		denying, shadow string
	}
	A, D, S, DO, DC := decision.Allowed, decision.Denied, decision.ShadowDenied, decision.DegradedOpen, decision.DegradedClosed
	rows := []row{
		{"r01", "0m10s", "eu", "A", "10.0.0.1", "per-key", A, "", ""},
		{"r02", "0m20s", "eu", "A", "10.0.0.1", "per-key", D, "per-key", ""},
		{"r03", "0m30s", "eu", "A", "10.0.0.1", "per-key", D, "per-key", ""},
		{"r04", "0m40s", "us", "A", "10.0.0.2", "per-key", D, "per-key", ""},
		{"r05", "1m05s", "us", "B", "10.0.0.3", "per-key", D, "per-key", ""},
		{"r06", "1m10s", "us", "B", "10.0.0.3", "per-key,shadow-ip", S, "shadow-ip", "shadow-ip"},
		{"r07", "1m20s", "us", "", "10.0.0.7", "shadow-ip", S, "shadow-ip", "shadow-ip"},
		{"r08", "1m30s", "us", "", "10.0.0.7", "shadow-ip", S, "shadow-ip", "shadow-ip"},
		{"r09", "1m40s", "eu", "C", "10.0.0.4", "per-key,shadow-ip", D, "per-key", "shadow-ip"},
		{"r10", "2m00s", "eu", "C", "10.0.0.4", "per-key", DO, "", ""},
		{"r11", "2m10s", "eu", "C", "10.0.0.4", "per-key", DO, "", ""},
		{"r12", "2m20s", "us", "A", "10.0.0.2", "per-key", DC, "per-key", ""},
		{"r13", "2m30s", "us", "", "10.0.0.9", "dyn-hh-1", D, "dyn-hh-1", ""},
		{"r14", "2m40s", "us", "", "10.0.0.9", "dyn-hh-1", D, "dyn-hh-1", ""},
		{"r15", "2m50s", "us", "", "10.0.0.9", "dyn-hh-1", A, "", ""},
		{"r16", "3m00s", "eu", "", "10.0.0.10", "dyn-hh-2", S, "dyn-hh-2", "dyn-hh-2"},
		{"", "3m10s", "eu", "B", "10.0.0.3", "per-key", A, "", ""},
		{"r18", "65m00s", "eu", "A", "10.0.0.1", "per-key", D, "per-key", ""},
		{"r19", "3m20s", "eu", "", "10.0.0.11", "per-key,dyn-hh-1", D, "dyn-hh-1", ""},
	}
	recs := make([]decision.Record, len(rows))
	for i, r := range rows {
		at, err := time.ParseDuration(r.at)
		if err != nil {
			panic(err)
		}
		var d rules.Descriptors
		if r.key != "" {
			d[rules.KeyAPIKey] = r.key
		}
		d[rules.KeyClientIP] = r.ip
		path := decision.PathRedis
		if r.outcome == DO || r.outcome == DC {
			path = decision.PathFallback
		}
		recs[i] = decision.Record{Time: t0.Add(at), Region: r.region, Instance: "gw", RequestID: r.id, Domain: "sluice",
			Descriptors: d, Matched: strings.Split(r.matched, ","), Outcome: r.outcome, DenyingRule: r.denying,
			ShadowRule: r.shadow, Path: path, Cost: 1}
	}
	return recs
}

// fixtureOutput is the pipeline output beside the fixture: two dynamic
// rules (dyn-hh-1 in two versions), one outside the range, and the shares
// of two global rules.
func fixtureOutput() []stage.Output {
	ms := func(d time.Duration) int64 { return t0.Add(d).UnixMilli() }
	ip := func(v string) []rules.Match { return []rules.Match{{Key: rules.KeyClientIP, Value: v}} }
	dyn := func(id, origin string, mode rules.Mode, scope string, v time.Duration, ev map[string]string) rules.Rule {
		return rules.Rule{ID: id, Match: ip(scope), Limit: 10, Period: time.Minute, Burst: 10, Mode: mode, Origin: origin,
			Reason: "test", Evidence: ev, ExpiresAt: t0.Add(v + time.Hour), Version: ms(v)}
	}
	share := func(rule, key, region string, f float64, at time.Duration) rules.Share {
		return rules.Share{RuleID: rule, Key: key, Region: region, Fraction: f, Version: ms(at), ComputedAt: t0.Add(at)}
	}
	return []stage.Output{
		{Rules: []rules.Rule{
			dyn("dyn-old", "detector/heavy_hitters", rules.Enforce, "10.0.0.99", -2*time.Hour, map[string]string{"count": "9"}),
			dyn("dyn-hh-1", "detector/heavy_hitters", rules.Enforce, "10.0.0.9", 2*time.Minute, map[string]string{"count": "3", "baseline_per_client": "1.00"}),
		}, Shares: []rules.Share{
			share("per-key", "", "eu", 0.5, 30*time.Second), share("per-key", "", "us", 0.5, 30*time.Second),
			share("global-2", "", "eu", 1, 30*time.Second),
		}},
		{Rules: []rules.Rule{
			dyn("dyn-hh-1", "detector/heavy_hitters", rules.Enforce, "10.0.0.9", 3*time.Minute, map[string]string{"count": "5", "baseline_per_client": "1.00"}),
			dyn("dyn-hh-2", "detector/entropy", rules.Shadow, "10.0.0.10", 3*time.Minute, map[string]string{"entropy": "0.12"}),
		}, Shares: []rules.Share{
			share("per-key", "", "eu", 0.3, 90*time.Second), share("per-key", "", "us", 0.7, 90*time.Second),
			share("per-key", "api_key=A", "us", 1, 90*time.Second),
			share("per-key", "", "eu", 0.9, 2*time.Hour), share("per-key", "", "us", 0.1, 2*time.Hour),
		}},
	}
}

// wantReports are the fixture's reports over [t0, t0+1h), worked out by
// hand from the tables above.
var wantReports = map[string]string{
	// Denied (not degraded_closed: r12) in the range (not r18): A by
	// per-key r02 r03 (eu) r04 (us); 10.0.0.9 by dyn-hh-1 r13 r14; B r05;
	// 10.0.0.11 by dyn-hh-1 r19;
	// C r09. Ties by key.
	"top_denied_keys": `
key                  rule      denied  regions  first                last
api_key=A            per-key   3       2        2026-11-02 10:00:20  2026-11-02 10:00:40
client_ip=10.0.0.9   dyn-hh-1  2       1        2026-11-02 10:02:30  2026-11-02 10:02:40
api_key=B            per-key   1       1        2026-11-02 10:01:05  2026-11-02 10:01:05
api_key=C            per-key   1       1        2026-11-02 10:01:40  2026-11-02 10:01:40
client_ip=10.0.0.11  dyn-hh-1  1       1        2026-11-02 10:03:20  2026-11-02 10:03:20
`,
	// shadow_rule set: dyn-hh-2 r16; shadow-ip r07 r08 (10.0.0.7), r06 (B),
	// r09 (C, which per-key denied anyway).
	"shadow_would_block": `
rule       key                 would_block  denied_anyway
dyn-hh-2   client_ip=10.0.0.10  1            0
shadow-ip  client_ip=10.0.0.7   2            0
shadow-ip  api_key=B            1            0
shadow-ip  api_key=C            1            1
`,
	// dyn-old's only version is before the range. dyn-hh-1: two versions,
	// the newest's evidence; matched r13 r14 r15 r19, denied r13 r14 r19.
	// dyn-hh-2: matched and would have denied r16.
	"detector_audit": `
rule      origin                  mode     scope                  evidence                          first_version        versions  matched  denied  would_deny
dyn-hh-1  detector/heavy_hitters  enforce  client_ip = 10.0.0.9   baseline_per_client=1.00 count=5  2026-11-02 10:02:00  2         4        3       0
dyn-hh-2  detector/entropy        shadow   client_ip = 10.0.0.10  entropy=0.12                      2026-11-02 10:03:00  1         1        0       1
`,
	// per-key: newest default shares before the end, eu 0.3 and us 0.7
	// (those at t0+2h are after it; the api_key=A share is not a default),
	// two versions each in the range. Requests matching per-key: eu r01
	// r02 r03 r09 r10 r11 r19 and the one without an id, 8; us r04 r05 r06
	// r12, 4; of 12: 8/12 = 0.6667, 4/12 = 0.3333. Denied or
	// degraded_closed by per-key: eu r02 r03 r09 (not r19, which dyn-hh-1
	// denied), us r04 r05 r12. global-2 has a share and no traffic.
	"region_shares": `
rule      region  share  versions  requests  denied  usage
global-2  eu      1      1         0         0       0
per-key   eu      0.3    2         8         3       0.6667
per-key   us      0.7    2         4         3       0.3333
`,
	// Key A in the range: r01 allowed, r02 r03 r04 denied by per-key, r12
	// degraded_closed by per-key (r18 is after the range); all in hour
	// 10:00 and all matched per-key only.
	"key_usage": `
hour                 rule     requests  allowed  denied  unavailable
2026-11-02 10:00:00  (all)    5         1        3       1
2026-11-02 10:00:00  per-key  5         1        3       1
`,
	// Minute 10:02: eu r10 r11 (both degraded_open) of 2; us r12
	// (degraded_closed) of r12 r13 r14 r15.
	"degraded_over_time": `
minute               region  degraded_open  degraded_closed  decisions  degraded_ratio
2026-11-02 10:02:00  eu      2              0                2          1
2026-11-02 10:02:00  us      0              1                4          0.25
`,
}

// TestReportsMatchTheFixture runs every report over the fixture, written by
// the sink from Kafka, and compares it with the hand-computed tables; then
// redelivers every record (a second sink group reads both topics again, with
// merges stopped so that every duplicate stays on disk) and checks the
// reports have not changed.
func TestReportsMatchTheFixture(t *testing.T) {
	conn, _ := migrated(t, shared(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, tb := range []string{"decisions", "decisions_per_minute", "dynamic_rules", "shares"} {
		if err := conn.Exec(ctx, "SYSTEM STOP MERGES "+tb); err != nil {
			t.Fatal(err)
		}
	}
	brokers := newKafka(t)
	recs := fixture()
	produce(t, brokers, recs)
	tw, err := pipeline.NewTopicWriter(pipeline.TopicWriterOptions{Brokers: brokers})
	if err != nil {
		t.Fatal(err)
	}
	defer tw.Close()
	var rulesN, sharesN int64
	for _, o := range fixtureOutput() {
		if err := tw.Write(ctx, o); err != nil {
			t.Fatal(err)
		}
		rulesN += int64(len(o.Rules))
		sharesN += int64(len(o.Shares))
	}
	written := func(s *Sink) func() (bool, string) {
		return func() (bool, string) {
			st := s.Stats()
			return st.Rows[TableDecisions] == int64(len(recs)) && st.Rows[TableRules] == rulesN &&
				st.Rows[TableShares] == sharesN && s.Lag() == 0, fmt.Sprintf("stats %+v, lag %d", st, s.Lag())
		}
	}
	first := runSink(t, brokers, "sink-first", conn, nil)
	waitFor(t, time.Minute, written(first))
	checkReports(t, conn)

	second := runSink(t, brokers, "sink-redelivery", conn, nil)
	waitFor(t, time.Minute, written(second))
	for tb, n := range map[string]int64{"decisions": int64(len(recs)), "dynamic_rules": rulesN, "shares": sharesN} {
		if raw, final := count(t, conn, "SELECT count() FROM "+tb), count(t, conn, "SELECT count() FROM "+tb+" FINAL"); raw != uint64(2*n) || final != uint64(n) {
			t.Errorf("%s: %d rows on disk and %d after FINAL: want every row twice, and once", tb, raw, final)
		}
	}
	checkReports(t, conn)
}

func checkReports(t *testing.T, conn driver.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := ReportParams{From: t0, To: t0.Add(time.Hour), APIKey: "A"}
	for _, r := range Reports() {
		tb, err := RunReport(ctx, conn, r.Name, p)
		if err != nil {
			t.Errorf("%s: %v", r.Name, err)
			continue
		}
		want, ok := wantReports[r.Name]
		if !ok {
			t.Errorf("report %s has no expected table", r.Name)
			continue
		}
		if got := table(t, tb); normalise(got) != normalise(want) {
			t.Errorf("report %s:\n%s\nwant\n%s", r.Name, got, want)
		}
	}
}

// normalise collapses runs of spaces (the expected tables are aligned by
// hand) and trims the ends.
func normalise(s string) string {
	var lines []string
	for l := range strings.SplitSeq(strings.TrimSpace(s), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	return strings.Join(lines, "\n")
}

func TestRunReportRejects(t *testing.T) {
	conn, _ := migrated(t, shared(t))
	ctx := context.Background()
	if _, err := RunReport(ctx, conn, "no_such_report", ReportParams{From: t0, To: t0.Add(time.Hour)}); !errors.Is(err, ErrUnknownReport) {
		t.Errorf("unknown report: %v, want ErrUnknownReport", err)
	}
	if _, err := RunReport(ctx, conn, "top_denied_keys", ReportParams{From: t0, To: t0}); err == nil {
		t.Error("an empty range: no error")
	}
	// Dashes work as underscores; an empty database gives an empty table.
	tb, err := RunReport(ctx, conn, "top-denied-keys", ReportParams{From: t0, To: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if got := normalise(table(t, tb)); got != "key rule denied regions first last\n(no rows)" {
		t.Errorf("empty report:\n%s", got)
	}
}
