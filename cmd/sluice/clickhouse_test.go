package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/sluice-rl/sluice/decision"
	"github.com/sluice-rl/sluice/internal/clickhousetest"
	"github.com/sluice-rl/sluice/pipeline"
	"github.com/sluice-rl/sluice/rules"
)

var metricsAddr = regexp.MustCompile(`metrics=(127\.0\.0\.1:\d+)`)

// `sluice clickhouse migrate`, `sluice clickhouse sink` and `sluice report`
// against a clickhouse-server and Kafka (kfake over TCP): three denied
// decisions logged by an enforcer's producer come out of the report, and
// the sink's metrics count them.
func TestClickHouseCommands(t *testing.T) {
	srv := clickhousetest.New(t)
	t.Setenv("CLICKHOUSE_ADDR", "")
	ch := []string{"--clickhouse", srv.Addr(), "--database", "cmdtest"}
	out := must(t, append([]string{"clickhouse", "migrate"}, ch...)...)
	if want := "applied 0001_decisions.sql\n"; !strings.HasPrefix(out, want) {
		t.Errorf("first migrate:\n%s\nwant it to start with %q", out, want)
	}
	if out := must(t, append([]string{"clickhouse", "migrate"}, ch...)...); out != "the schema is up to date\n" {
		t.Errorf("second migrate: %q", out)
	}

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, pipeline.DefaultTopic, pipeline.DefaultOutputTopic))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	brokers := strings.Join(kc.ListenAddrs(), ",")
	log := runCommand(t, append([]string{"clickhouse", "sink", "--brokers", brokers, "--metrics", "127.0.0.1:0", "--flush-interval", "100ms"}, ch...),
		"clickhouse sink stopped")

	prod, err := pipeline.NewProducer(pipeline.ProducerOptions{Brokers: kc.ListenAddrs()})
	if err != nil {
		t.Fatal(err)
	}
	defer prod.Close()
	t0 := time.Date(2026, 11, 2, 10, 0, 0, 0, time.UTC)
	for i := range 4 {
		var d rules.Descriptors
		d[rules.KeyAPIKey] = "k1"
		o, deny := decision.Denied, "per-key"
		if i == 3 {
			o, deny = decision.Allowed, ""
		}
		prod.Log(decision.Record{Time: t0.Add(time.Duration(i) * time.Second), Region: "eu", RequestID: string(rune('a' + i)),
			Descriptors: d, Matched: []string{"per-key"}, Outcome: o, DenyingRule: deny, Path: decision.PathRedis, Cost: 1})
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := prod.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	want := "key         rule     denied  regions  first                last\n" +
		"api_key=k1  per-key  3       1        2026-11-02 10:00:00  2026-11-02 10:00:02\n"
	var got string
	for deadline := time.Now().Add(time.Minute); got != want; {
		if time.Now().After(deadline) {
			t.Fatalf("sluice report top_denied_keys:\n%s\nwant\n%s\nsink log:\n%s", got, want, log)
		}
		time.Sleep(100 * time.Millisecond)
		got = must(t, append([]string{"report", "top_denied_keys", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T11:00:00Z"}, ch...)...)
	}

	// One key's requests by hour and rule: the same three denials, and the
	// allowed request.
	want = "hour                 rule     requests  allowed  denied  unavailable\n" +
		"2026-11-02 10:00:00  (all)    4         1        3       0\n" +
		"2026-11-02 10:00:00  per-key  4         1        3       0\n"
	if got := must(t, append([]string{"report", "key_usage", "--api-key", "k1", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T11:00:00Z"}, ch...)...); got != want {
		t.Errorf("sluice report key_usage:\n%s\nwant\n%s", got, want)
	}
	if out, _, err := sluice(t, append([]string{"report", "key_usage", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T11:00:00Z"}, ch...)...); err == nil || !strings.Contains(err.Error(), "--api-key") {
		t.Errorf("key_usage without --api-key: %v\n%s", err, out)
	}

	m := metricsAddr.FindStringSubmatch(log.String())
	if m == nil {
		t.Fatalf("no metrics address in the log:\n%s", log)
	}
	// The sink counts rows once ClickHouse acknowledged their insert, which
	// comes after they show in a query (the reports above): on a loaded
	// machine, seconds after.
	for deadline := time.Now().Add(time.Minute); ; {
		resp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `sluice_clickhouse_rows_written_total{table="decisions"} 4`+"\n") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics has no 4 decision rows written within a minute:\n%s", grepLines(string(body), "sluice_clickhouse"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	resp, err := http.Get("http://" + m[1] + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz with ClickHouse up: %d", resp.StatusCode)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestClickHouseFlags(t *testing.T) {
	t.Setenv("CLICKHOUSE_ADDR", "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"clickhouse", "sink"}, "--brokers is required"},
		{[]string{"clickhouse", "sink", "--brokers", "127.0.0.1:1", "--batch-rows", "0"}, "want positive values"},
		{[]string{"clickhouse", "migrate", "--database", "no-dashes"}, `database "no-dashes"`},
		{[]string{"report", "top_denied_keys", "--from", "yesterday"}, "--from \"yesterday\": want RFC 3339"},
		{[]string{"report", "top_denied_keys", "--to", "2026-11-02"}, "want RFC 3339"},
		{[]string{"report", "top_denied_keys", "--from", "2026-11-02T10:00:00Z", "--to", "2026-11-02T09:00:00Z"}, "is empty"},
		{[]string{"report", "top_denied_keys", "--limit", "0"}, "--limit 0"},
		{[]string{"report", "a", "b"}, "accepts at most 1 arg"},
	} {
		_, _, err := sluice(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sluice %s: %v, want an error with %q", strings.Join(c.args, " "), err, c.want)
		}
	}
	out := must(t, "report")
	for _, name := range []string{"top_denied_keys", "shadow_would_block", "detector_audit", "region_shares", "degraded_over_time"} {
		if !strings.Contains(out, name) {
			t.Errorf("sluice report lists no %s:\n%s", name, out)
		}
	}
}
